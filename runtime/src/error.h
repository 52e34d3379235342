//===- error.h - The runtime's user-facing error type ---------*- C++ -*-===//
//
// Every problem a user can cause (bad plan, weights, tokens, launch) is
// thrown as a RunError whose message is the complete text after
// "megac-run: error: ", usually "<file>: <what>". megac-run catches it at
// the top level, agrees with the other ranks and exits 1.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_ERROR_H
#define MEGAC_RT_ERROR_H

#include <stdexcept>
#include <string>

namespace megac_rt {

class RunError : public std::runtime_error {
public:
  explicit RunError(const std::string &Msg) : std::runtime_error(Msg) {}
};

/// Text read from a file (a lock's holder, a checkpoint's record), fit
/// for a message line: control characters become '?', so none reaches
/// the terminal.
inline std::string printableText(std::string Text) {
  for (char &C : Text)
    if (static_cast<unsigned char>(C) < ' ' || C == 0x7f)
      C = '?';
  return Text;
}

} // namespace megac_rt

#endif // MEGAC_RT_ERROR_H
