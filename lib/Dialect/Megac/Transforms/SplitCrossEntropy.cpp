//===- SplitCrossEntropy.cpp - Vocabulary-parallel cross-entropy ----------===//
//
// A cross-entropy needs whole softmax rows, so over vocabulary-split logits
// propagation would all-gather [B, S, V]. The loss only needs, per token,
// each block's max, sum of exponentials and the label's logit: this pass
// rewrites the loss (and its gradient) to compute those per block and
// combine them, so the all-gather moves 3 scalars per token and rank.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

namespace megac {
#define GEN_PASS_DEF_SPLITCROSSENTROPYPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

/// Whether the function holding `op` has gradient results (a training or
/// gradient step).
bool isDifferentiated(Operation *op) {
  auto func = op->getParentOfType<func::FuncOp>();
  for (unsigned i = 0; i < func.getNumResults(); ++i)
    if (auto name = func.getResultAttrOfType<StringAttr>(
            i, MegacDialect::kResultNameAttrName))
      if (name.getValue().starts_with("grad:"))
        return true;
  // After megac-apply-optimizer the gradients became updates.
  return !func.getOps<AdamWOp>().empty();
}

/// True when some other user of `logits` (returning them, say) needs them
/// whole along the vocabulary anyway: the loss then reads that gathered
/// copy and needs no collective of its own.
bool gatheredAnyway(Value logits) {
  for (OpOperand &use : logits.getUses()) {
    Operation *user = use.getOwner();
    if (isa<CrossEntropyOp, CrossEntropyGradOp>(user))
      continue;
    // The logits a differentiated step returns serve generation only; the
    // training step skips gathering them.
    if (isa<func::ReturnOp>(user) && isDifferentiated(user))
      continue;
    auto required =
        user->getAttrOfType<ArrayAttr>(MegacDialect::kOperandShardingsAttrName);
    if (!required)
      continue;
    auto want = cast<ShardingAttr>(required[use.getOperandNumber()]);
    if (want.getDimAxis(2).empty())
      return true;
  }
  return false;
}

/// How many ways propagation split the vocabulary (last) dimension of
/// `logits`; 1 when it is whole or gathered whole for another user.
int64_t vocabularyShards(MeshAttr mesh, Value logits) {
  ShardingAttr sharding = getShardingOrReplicated(logits);
  if (gatheredAnyway(logits))
    return 1;
  return getAxisSizeOrOne(mesh, sharding.getDimAxis(2));
}

struct SplitCrossEntropyPass
    : public megac::impl::SplitCrossEntropyPassBase<SplitCrossEntropyPass> {
  void runOnOperation() override {
    MeshAttr mesh = getMesh(getOperation());
    if (!mesh)
      return;
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(rewrite(mesh, func)))
        return signalPassFailure();
  }

  /// Fails unless `shards` divides the vocabulary of `logits` (propagation
  /// refuses such a split; this pass may run on IR that skipped it).
  static LogicalResult checkDivides(Operation *loss, Value logits,
                                    int64_t shards) {
    auto type = cast<RankedTensorType>(logits.getType());
    const int64_t vocab = type.getDimSize(type.getRank() - 1);
    if (ShapedType::isDynamic(vocab))
      return loss->emitError()
             << "the logits' vocabulary is split " << shards
             << " ways but its size is dynamic (megac-specialize-shapes "
                "makes it static)";
    if (vocab % shards == 0)
      return success();
    return loss->emitError()
           << "the logits' vocabulary (" << vocab << ") cannot be split "
           << shards << " ways: " << shards << " does not divide it";
  }

  LogicalResult rewrite(MeshAttr mesh, func::FuncOp func) {
    // The loss and its gradient read the same logits and labels: they share
    // one set of statistics (and one all-gather).
    llvm::DenseMap<std::pair<Value, Value>, Value> statsOf;
    auto getStats = [&](OpBuilder &b, Location loc, Value logits,
                        Value labels, int64_t shards, IntegerAttr classes) {
      Value &stats = statsOf[{logits, labels}];
      if (!stats)
        stats = CrossEntropyStatsOp::create(
            b, loc, logits, labels, b.getI64IntegerAttr(shards), classes);
      return stats;
    };
    for (Operation &op : llvm::make_early_inc_range(func.getOps())) {
      if (auto loss = dyn_cast<CrossEntropyOp>(op)) {
        int64_t shards = vocabularyShards(mesh, loss.getLogits());
        if (shards <= 1)
          continue;
        if (failed(checkDivides(loss, loss.getLogits(), shards)))
          return failure();
        OpBuilder b(loss);
        Value stats = getStats(b, loss.getLoc(), loss.getLogits(),
                               loss.getLabels(), shards, loss.getClassesAttr());
        Value combined =
            CrossEntropyFromStatsOp::create(b, loss.getLoc(), stats);
        loss.getResult().replaceAllUsesWith(combined);
        loss.erase();
      } else if (auto grad = dyn_cast<CrossEntropyGradOp>(op)) {
        int64_t shards = vocabularyShards(mesh, grad.getLogits());
        if (shards <= 1 || grad.getStats())
          continue;
        if (failed(checkDivides(grad, grad.getLogits(), shards)))
          return failure();
        OpBuilder b(grad);
        Value stats = getStats(b, grad.getLoc(), grad.getLogits(),
                               grad.getLabels(), shards, grad.getClassesAttr());
        Value split = CrossEntropyGradOp::create(
            b, grad.getLoc(), grad.getLogits(), grad.getLabels(),
            grad.getLossGrad(), stats, grad.getClassesAttr());
        grad.getResult().replaceAllUsesWith(split);
        grad.erase();
      }
    }
    return success();
  }
};
} // namespace
