//===- env.h - Reading the launcher's environment -------------*- C++ -*-===//
//
// Launchers (mpirun, torchrun, srun) and users speak to megac-run through
// environment variables. A number there is taken whole or refused: atoi
// would take "abc" for 0 and "3x" for 3 and run on the wrong device or as
// the wrong rank.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_ENV_H
#define MEGAC_RT_ENV_H

#include <optional>
#include <string>

namespace megac_rt {

/// Environment variable \p Name as a whole number in [\p Lo, \p Hi];
/// nullopt where it is unset or empty. Anything else (a sign, letters,
/// trailing text, a number out of range) throws RunError
/// "<Name> is '<value>': expected <What>", where an empty \p What reads
/// "a whole number from <Lo> to <Hi>".
std::optional<long> envWholeNumber(const char *Name, long Lo, long Hi,
                                   const std::string &What = "");

} // namespace megac_rt

#endif // MEGAC_RT_ENV_H
