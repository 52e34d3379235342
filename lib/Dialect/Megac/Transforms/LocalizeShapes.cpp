//===- LocalizeShapes.cpp - Global shapes to per-rank shapes --------------===//
//
// After this pass the IR describes what one rank computes: every split
// dimension is divided by its axis size (the grid is regular, so all ranks
// share one program up to their coordinates, which the plan emitter fills
// in), and attention counts only its local heads.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

namespace megac {
#define GEN_PASS_DEF_LOCALIZESHAPESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct LocalizeShapesPass
    : public megac::impl::LocalizeShapesPassBase<LocalizeShapesPass> {
  /// On a grid, local shapes come from the shardings propagation chose and
  /// the collectives megac-insert-collectives placed: every op that has a
  /// sharding rule and operands carries its shardings, and every operand
  /// is as its op requires (else a partial sum would stay partial, or a
  /// split operand meet an op expecting it whole).
  static LogicalResult checkCollectivesInserted(ModuleOp module) {
    WalkResult result = module.walk([&](Operation *op) {
      auto required =
          op->getAttrOfType<ArrayAttr>(MegacDialect::kOperandShardingsAttrName);
      if (!required) {
        if (isa<ShardingRuleOpInterface>(op) && op->getNumOperands() > 0 &&
            !op->hasAttr(MegacDialect::kShardingAttrName)) {
          op->emitOpError("has no shardings; run megac-propagate-sharding "
                          "before megac-localize-shapes");
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      }
      if (required.size() != op->getNumOperands())
        return WalkResult::advance();
      for (auto [index, want] : llvm::enumerate(required)) {
        ShardingAttr have = getShardingOrReplicated(op->getOperand(index));
        if (have == want)
          continue;
        op->emitOpError("operand ")
            << index << " is " << have << " but the op requires " << want
            << "; run megac-insert-collectives before megac-localize-shapes";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    return failure(result.wasInterrupted());
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module->hasAttr(MegacDialect::kLocalizedAttrName)) {
      module.emitError("the module is already localized");
      return signalPassFailure();
    }
    MeshAttr mesh = getMesh(module);
    if (mesh && failed(checkCollectivesInserted(module)))
      return signalPassFailure();
    auto localize = [&](Value value) {
      if (auto type = dyn_cast<RankedTensorType>(value.getType()))
        value.setType(getLocalType(type, getSharding(value), mesh));
    };
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      Block &body = func.getBody().front();
      for (BlockArgument arg : body.getArguments())
        localize(arg);
      for (Operation &op : body) {
        for (Value result : op.getResults())
          localize(result);
        // Attention and its gradient count only their local heads.
        auto localHeads = [&](auto attention) {
          ShardingAttr sharding = getShardingOrReplicated(attention.getResult());
          int64_t size = getAxisSizeOrOne(mesh, sharding.getDimAxis(2));
          attention.setNumHeads(attention.getNumHeads() / size);
        };
        if (auto attention = dyn_cast<AttentionOp>(op))
          localHeads(attention);
        if (auto attentionGrad = dyn_cast<AttentionGradOp>(op))
          localHeads(attentionGrad);
        // A reshape's and a fill's shape attribute is their result's shape:
        // the local one now.
        auto localShape = [](Value result) {
          return cast<RankedTensorType>(result.getType()).getShape();
        };
        if (auto reshape = dyn_cast<ReshapeOp>(op))
          reshape.setShape(localShape(reshape.getResult()));
        if (auto fill = dyn_cast<FillOp>(op))
          fill.setShape(localShape(fill.getResult()));
        // Cross-entropy statistics count only the local vocabulary blocks.
        if (auto stats = dyn_cast<CrossEntropyStatsOp>(op)) {
          ShardingAttr sharding = getShardingOrReplicated(stats.getResult());
          int64_t size = getAxisSizeOrOne(mesh, sharding.getDimAxis(2));
          stats.setShards(stats.getShards() / size);
        }
      }
      func.setFunctionType(FunctionType::get(
          func.getContext(), body.getArgumentTypes(),
          body.getTerminator()->getOperandTypes()));
    }
    module->setAttr(MegacDialect::kLocalizedAttrName, UnitAttr::get(&getContext()));
  }
};
} // namespace
