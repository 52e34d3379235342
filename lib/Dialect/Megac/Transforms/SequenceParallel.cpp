//===- SequenceParallel.cpp - Sequence-split residual stream --------------===//
//
// Under tensor parallelism, LayerNorm, dropout and the residual adds run
// replicated: every rank holds the whole [B, S, H] residual stream. Pinning
// that stream to a sequence split makes them run on 1/tp of the tokens and
// turns each all-reduce around a tensor-parallel block into a
// reduce-scatter (into the split stream) and an all-gather (out of it) of
// the same total bytes. Only the pins are placed here; propagation derives
// the collectives.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SetVector.h"

namespace megac {
#define GEN_PASS_DEF_SEQUENCEPARALLELPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct SequenceParallelPass
    : public megac::impl::SequenceParallelPassBase<SequenceParallelPass> {
  using SequenceParallelPassBase::SequenceParallelPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (std::string problem =
            missingAxisProblem(module, "megac-sequence-parallel: axis", axis,
                               SequenceParallelPassOptions().axis);
        !problem.empty()) {
      module.emitError(problem);
      return signalPassFailure();
    }
    int64_t size = getAxisSizeOrOne(getMesh(module), axis);
    if (size <= 1)
      return;
    MLIRContext *ctx = &getContext();
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      // The residual stream: what the LayerNorms read, and the partial sums
      // that enter it (row-parallel products, the vocabulary-parallel
      // embedding), which become reduce-scatters instead of all-reduces.
      llvm::SetVector<Value> stream;
      // The batch stays split the way the data inputs are (over dp): the
      // pin only adds the sequence split, over an axis of its own (one
      // that split both, `[dp, dp, _]`, lost half of each rank's rows).
      StringAttr batchAxis = StringAttr::get(ctx, megac::batchAxis(func));
      if (batchAxis.getValue() == axis || axis == "pp") {
        func.emitError() << "megac-sequence-parallel: axis '" << axis << "' "
                         << (axis == "pp" ? "splits the layers into pipeline "
                                            "stages"
                                          : "splits the batch (the data "
                                            "inputs)")
                         << "; the sequence is split over a tensor-parallel "
                            "axis (one that splits the weights)";
        return signalPassFailure();
      }
      auto splitOver = [&](Value weight, int64_t dim) {
        auto arg = dyn_cast<BlockArgument>(weight);
        if (!arg)
          return false;
        auto sharding = func.getArgAttrOfType<ShardingAttr>(
            arg.getArgNumber(), MegacDialect::kShardingAttrName);
        return sharding && sharding.getDimAxis(dim) == axis;
      };
      func.walk([&](Operation *op) {
        Value value;
        if (auto ln = dyn_cast<LayerNormOp>(op))
          value = ln.getInput();
        else if (auto linear = dyn_cast<LinearOp>(op);
                 linear && splitOver(linear.getWeight(),
                                     linear.getTransposeWeight() ? 1 : 0))
          value = linear.getResult();
        else if (auto embedding = dyn_cast<EmbeddingOp>(op);
                 embedding && splitOver(embedding.getTable(), 0))
          value = embedding.getResult();
        if (value && cast<RankedTensorType>(value.getType()).getRank() == 3)
          stream.insert(value);
      });
      for (Value value : stream) {
        auto type = cast<RankedTensorType>(value.getType());
        if (!type.isDynamicDim(1) && type.getDimSize(1) % size != 0) {
          func.emitError() << "--sequence-parallel: the sequence length "
                           << type.getDimSize(1)
                           << " is not divisible by grid axis '" << axis
                           << "' (size " << size << ")";
          return signalPassFailure();
        }
        if (value.getDefiningOp<ShardingConstraintOp>())
          continue;
        OpBuilder b(ctx);
        if (Operation *def = value.getDefiningOp())
          b.setInsertionPointAfter(def);
        else
          b.setInsertionPointToStart(cast<BlockArgument>(value).getOwner());
        auto none = StringAttr::get(ctx, "");
        auto sharding = ShardingAttr::get(
            ctx, {batchAxis, StringAttr::get(ctx, axis), none}, {});
        auto pin = ShardingConstraintOp::create(b, value.getLoc(), value, sharding);
        value.replaceAllUsesExcept(pin.getResult(), pin.getOperation());
      }
    }
  }
};
} // namespace
