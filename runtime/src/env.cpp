//===- env.cpp - Reading the launcher's environment -----------------------===//

#include "env.h"
#include "error.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace megac_rt {

std::optional<long> envWholeNumber(const char *Name, long Lo, long Hi,
                                   const std::string &What) {
  const char *V = std::getenv(Name);
  if (!V || !*V)
    return std::nullopt;
  char *End = nullptr;
  errno = 0;
  const long N = std::strtol(V, &End, 10);
  // (strtol skips leading blanks and takes a sign: neither is a whole
  // number as written.)
  if (*End || errno || N < Lo || N > Hi ||
      !std::isdigit(static_cast<unsigned char>(*V)))
    throw RunError(std::string(Name) + " is '" + V + "': expected " +
                   (What.empty() ? "a whole number from " + std::to_string(Lo) +
                                       " to " + std::to_string(Hi)
                                 : What));
  return N;
}

} // namespace megac_rt
