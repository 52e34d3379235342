//===- TransformUtils.cpp - Helpers shared by megac passes ----------------===//

#include "TransformUtils.h"

#include "megac/Dialect/Megac/IR/MegacDialect.h"

using namespace mlir;

namespace megac {

FailureOr<unsigned> findLoss(func::FuncOp func, StringRef pass) {
  std::optional<unsigned> scalar;
  unsigned scalars = 0;
  for (unsigned i = 0; i < func.getNumResults(); ++i) {
    auto name = func.getResultAttrOfType<StringAttr>(
        i, MegacDialect::kResultNameAttrName);
    if (name && name.getValue() == "loss")
      return i;
    if (name && name.getValue().starts_with("grad:"))
      continue;
    if (cast<RankedTensorType>(func.getResultTypes()[i]).getRank() == 0) {
      scalar = i;
      ++scalars;
    }
  }
  if (scalars == 1)
    return *scalar;
  return func.emitError() << pass
                          << " needs the loss: a scalar result named 'loss' "
                             "(megac.name) or the only scalar result";
}

} // namespace megac
