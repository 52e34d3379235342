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

#include <limits>

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

  /// Result \p i, if it holds a row per micro-batch row (computed from the
  /// data inputs, with their leading dimension), becomes the step's rows:
  /// megac.stack_micro_batches right where it is computed, so that
  /// generation, which runs the forward part alone, still fills it.
  LogicalResult stackPerRowResult(func::FuncOp func, func::ReturnOp ret,
                                  unsigned i) {
    if (microBatches < 2 || !stackRows)
      return success();
    Value value = ret.getOperand(i);
    auto type = dyn_cast<RankedTensorType>(value.getType());
    Operation *def = value.getDefiningOp();
    if (!type || type.getRank() < 1 || !def ||
        !isa<MegacDialect>(def->getDialect()))
      return success();
    std::optional<int64_t> rows = microBatchRowsReaching(value);
    if (!rows || *rows != type.getDimSize(0))
      return success();
    if (*rows > std::numeric_limits<int64_t>::max() / microBatches)
      return func.emitError("megac-accumulate-micro-batches: ")
             << *rows << " rows times " << static_cast<int64_t>(microBatches)
             << " micro-batches overflow a dimension";
    OpBuilder b(func.getContext());
    b.setInsertionPointAfter(def);
    auto stack = StackMicroBatchesOp::create(
        b, value.getLoc(), value, static_cast<int64_t>(microBatches));
    if (!getStages(def).empty())
      setPlacement(stack, getStages(def), getPhase(def));
    ret.setOperand(i, stack);
    FunctionType type0 = func.getFunctionType();
    SmallVector<Type> results(type0.getResults());
    results[i] = stack.getType();
    func.setType(
        FunctionType::get(func.getContext(), type0.getInputs(), results));
    return success();
  }

  /// The leading dimension of the data inputs (arguments that are not
  /// parameters) \p value is computed from; none if it reads none, or
  /// inputs of different leading dimensions.
  static std::optional<int64_t> microBatchRowsReaching(Value value) {
    std::optional<int64_t> rows;
    bool agree = true;
    llvm::DenseSet<Value> seen;
    SmallVector<Value> worklist{value};
    while (!worklist.empty()) {
      Value v = worklist.pop_back_val();
      if (!seen.insert(v).second)
        continue;
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        auto func = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
        auto type = dyn_cast<RankedTensorType>(arg.getType());
        if (!func || !type || type.getRank() < 1 ||
            func.getArgAttr(arg.getArgNumber(), MegacDialect::kParamAttrName))
          continue;
        if (rows && *rows != type.getDimSize(0))
          agree = false;
        rows = type.getDimSize(0);
        continue;
      }
      llvm::append_range(worklist, v.getDefiningOp()->getOperands());
    }
    return agree ? rows : std::nullopt;
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
      if (!isGradient && i != *lossIndex) {
        if (failed(stackPerRowResult(func, ret, i)))
          return failure();
        continue;
      }
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
    if (microBatches < 1 || microBatches > MegacDialect::kMaxMicroBatches) {
      getOperation().emitError("the number of micro-batches must be from 1 to ")
          << MegacDialect::kMaxMicroBatches << ", got "
          << static_cast<int64_t>(microBatches);
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
