//===- AccumulateMicroBatches.cpp - Gradient accumulation -----------------===//
//
// A step over a batch too large for memory runs as m micro-batches: the
// forward and backward part once per micro-batch, the loss and gradients
// summed, the optimizer once. The IR describes one micro-batch; this pass
// marks the sums (megac.accumulate) and the plan emitter turns the part up
// to the last of them into a loop the runtime runs m times.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

namespace megac {
#define GEN_PASS_DEF_ACCUMULATEMICROBATCHESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct AccumulateMicroBatchesPass
    : public megac::impl::AccumulateMicroBatchesPassBase<
          AccumulateMicroBatchesPass> {
  using AccumulateMicroBatchesPassBase::AccumulateMicroBatchesPassBase;

  LogicalResult accumulate(func::FuncOp func) {
    FailureOr<unsigned> lossIndex =
        findLoss(func, "megac-accumulate-micro-batches");
    if (failed(lossIndex))
      return failure();
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    bool anyGradient = false;
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto name = func.getResultAttrOfType<StringAttr>(
          i, MegacDialect::kResultNameAttrName);
      bool isGradient = name && name.getValue().starts_with("grad:");
      anyGradient |= isGradient;
      if (!isGradient && i != *lossIndex)
        continue;
      Value value = ret.getOperand(i);
      // The loss is summed right where it is computed, so the forward part
      // (all generation runs) ends there; gradients at the end.
      OpBuilder b(ret);
      if (i == *lossIndex)
        if (Operation *def = value.getDefiningOp())
          b.setInsertionPointAfter(def);
      ret.setOperand(i, AccumulateOp::create(b, value.getLoc(), value));
    }
    if (!anyGradient)
      return func.emitError("megac-accumulate-micro-batches found no 'grad:' "
                            "results; run megac-autodiff first");
    return success();
  }

  void runOnOperation() override {
    if (microBatches < 1) {
      getOperation().emitError("the number of micro-batches must be positive");
      return signalPassFailure();
    }
    if (microBatches == 1)
      return;
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(accumulate(func)))
        return signalPassFailure();
    getOperation()->setAttr(
        MegacDialect::kMicroBatchesAttrName,
        IntegerAttr::get(IntegerType::get(&getContext(), 64), microBatches));
  }
};
} // namespace
