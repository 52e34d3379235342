//===- Recompute.cpp - Full activation recomputation ----------------------===//
//
// The backward pass reads forward values; keeping all of them is the
// activation memory of training. With full recomputation only each
// transformer block's input (the residual stream entering it) is kept: the
// first backward op that needs any other forward value gets the forward
// ops that produce it cloned right before it, from the kept values. The
// backward pass visits the layers in reverse, so one layer's forward is
// recomputed just before its backward, and its values die right after.
// Dropout and attention-probability dropout redraw the same masks (they are
// keyed by position, not by a generator state), so the step is unchanged.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ModelStructure.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

#include <functional>

namespace megac {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct RecomputePass : public megac::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    if (mode == "none" || mode == "selective")
      return; // selective: the fused attention already recomputes its
              // probabilities and never keeps them
    if (mode != "full") {
      getOperation().emitError("megac-recompute: mode must be none, "
                               "selective or full, got '")
          << mode << "'";
      return signalPassFailure();
    }
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(recompute(func)))
        return signalPassFailure();
  }

  LogicalResult recompute(func::FuncOp func) {
    FailureOr<unsigned> lossIndex = findLoss(func, "megac-recompute");
    if (failed(lossIndex))
      return failure();
    Block &body = func.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    // The forward pass: what the loss depends on.
    llvm::DenseSet<Operation *> forward;
    SmallVector<Value> worklist = {ret.getOperand(*lossIndex)};
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val().getDefiningOp();
      if (op && forward.insert(op).second)
        llvm::append_range(worklist, op->getOperands());
    }
    // Kept: each block's input (the residual stream where it enters a
    // LayerNorm that leads to attention) and the loss.
    llvm::DenseSet<Value> kept = {ret.getOperand(*lossIndex)};
    for (Operation *op : forward)
      if (auto ln = dyn_cast<LayerNormOp>(op))
        if (opensTransformerBlock(ln))
          kept.insert(ln.getInput());
    llvm::DenseMap<Value, Value> recomputed;
    // Clones the forward ops producing `value` before `user`.
    std::function<Value(Value, OpBuilder &)> clone = [&](Value value,
                                                         OpBuilder &b) {
      Operation *def = value.getDefiningOp();
      if (!def || !forward.contains(def) || kept.contains(value))
        return value;
      if (Value done = recomputed.lookup(value))
        return done;
      IRMapping mapping;
      for (Value operand : def->getOperands())
        mapping.map(operand, clone(operand, b));
      Operation *copy = b.clone(*def, mapping);
      // On a pipeline the copy runs with the backward pass of its stage.
      if (!getStages(copy).empty())
        setPlacement(copy, getStages(copy), "backward");
      for (auto [orig, now] : llvm::zip(def->getResults(), copy->getResults()))
        recomputed[orig] = now;
      return recomputed.lookup(value);
    };
    SmallVector<Operation *> backward;
    for (Operation &op : body.without_terminator())
      if (!forward.contains(&op))
        backward.push_back(&op);
    for (Operation *op : backward) {
      OpBuilder b(op);
      for (OpOperand &use : op->getOpOperands()) {
        Operation *def = use.get().getDefiningOp();
        if (def && forward.contains(def) && !kept.contains(use.get()))
          use.set(clone(use.get(), b));
      }
    }
    return success();
  }
};
} // namespace
