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

  /// accumulate(value), placed where value is computed. On a pipeline a
  /// sum of contributions from different stages becomes the sum of their
  /// accumulations, which runs once per step.
  static Value accumulateByStage(OpBuilder &b, Value value) {
    Operation *def = value.getDefiningOp();
    if (auto add = dyn_cast_or_null<AddOp>(def)) {
      Operation *lhs = add.getLhs().getDefiningOp();
      Operation *rhs = add.getRhs().getDefiningOp();
      if (lhs && rhs && !getStages(lhs).empty() && !getStages(rhs).empty() &&
          getStages(lhs) != getStages(rhs) &&
          add.getLhs().getType() == add.getRhs().getType()) {
        Value l = accumulateByStage(b, add.getLhs());
        Value r = accumulateByStage(b, add.getRhs());
        Value sum = AddOp::create(b, add.getLoc(), l, r);
        // The per-micro-batch sum is dead once only the result read it.
        if (llvm::all_of(add->getUsers(),
                         [](Operation *u) { return isa<func::ReturnOp>(u); })) {
          add->replaceAllUsesWith(ValueRange{sum});
          add->erase();
        }
        return sum;
      }
    }
    auto acc = AccumulateOp::create(b, value.getLoc(), value);
    if (def && !getStages(def).empty())
      setPlacement(acc, getStages(def), getPhase(def));
    return acc;
  }

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
      ret.setOperand(i, accumulateByStage(b, value));
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
    // A pipeline accumulates even one micro-batch (see the description).
    bool pipelined = getOperation()->hasAttr(
        MegacDialect::kPipelineStagesAttrName);
    if (microBatches == 1 && !pipelined)
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
