//===- DisableDropout.cpp - Remove dropout for inference ------------------===//
//
// Dropout belongs to training; a forward plan computes the model's
// deterministic function, so each megac.dropout is replaced by its input.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/IR/BuiltinOps.h"

namespace megac {
#define GEN_PASS_DEF_DISABLEDROPOUTPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct DisableDropoutPass
    : public megac::impl::DisableDropoutPassBase<DisableDropoutPass> {
  void runOnOperation() override {
    getOperation().walk([](DropoutOp dropout) {
      dropout.getResult().replaceAllUsesWith(dropout.getInput());
      dropout.erase();
    });
    getOperation().walk([](AttentionOp attention) {
      attention.setDropout(llvm::APFloat(0.0));
      attention.setStream(0);
    });
  }
};
} // namespace
