//===- InsertCollectives.cpp - Reconcile shardings with collectives -------===//
//
// Propagation recorded what each op needs of its operands; this pass makes
// the IR say how to get there. Partial sums are reduced first (while the
// data may still be split, so less of it moves), then split dimensions are
// gathered and whole ones sliced.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ModelStructure.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

namespace megac {
#define GEN_PASS_DEF_INSERTCOLLECTIVESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

/// Builds the chain of collectives taking `value` from `from` to `to`.
Value reshard(OpBuilder &builder, Location loc, Value value, ShardingAttr from,
              ShardingAttr to) {
  MLIRContext *ctx = builder.getContext();
  SmallVector<StringAttr> dims(from.getDims());
  SmallVector<StringAttr> partial(from.getPartial());
  auto record = [&](Value v) {
    setSharding(v, ShardingAttr::get(ctx, dims, partial));
    return v;
  };
  for (StringAttr axis : from.getPartial()) {
    if (to.isPartialOn(axis.getValue()))
      continue;
    llvm::erase(partial, axis);
    // Summed and then split over the same axis along a whole dimension: a
    // reduce-scatter moves half the bytes of an all-reduce and slices free.
    auto target = llvm::find(to.getDims(), axis);
    if (target != to.getDims().end()) {
      int64_t d = target - to.getDims().begin();
      if (dims[d].getValue().empty()) {
        dims[d] = axis;
        value = record(ReduceScatterOp::create(
            builder, loc, value.getType(), value, axis,
            builder.getI64IntegerAttr(d)));
        continue;
      }
    }
    value = record(AllReduceOp::create(builder, loc, value.getType(), value,
                                               axis));
  }
  for (int64_t d = 0; d < static_cast<int64_t>(dims.size()); ++d) {
    StringAttr want = to.getDims()[d];
    if (dims[d] == want)
      continue;
    if (!dims[d].getValue().empty()) {
      StringAttr axis = dims[d];
      dims[d] = StringAttr::get(ctx, "");
      value = record(AllGatherOp::create(builder, 
          loc, value.getType(), value, axis, builder.getI64IntegerAttr(d)));
    }
    if (!want.getValue().empty()) {
      dims[d] = want;
      value = record(SliceShardOp::create(builder, 
          loc, value.getType(), value, want, builder.getI64IntegerAttr(d)));
    }
  }
  return value;
}

/// Whether going from `from` to `to` gathers a split dimension.
bool gathers(ShardingAttr from, ShardingAttr to) {
  for (auto [have, want] : llvm::zip(from.getDims(), to.getDims()))
    if (!have.getValue().empty() && have != want)
      return true;
  return false;
}

struct InsertCollectivesPass
    : public megac::impl::InsertCollectivesPassBase<InsertCollectivesPass> {
  using InsertCollectivesPassBase::InsertCollectivesPassBase;

  /// An op marked megac.reduce_result produces partial sums that every user
  /// sees summed: the all-reduces go right after it and take over its uses.
  /// The op's own sharding becomes the raw (partial) one.
  static void reduceResultEagerly(Operation *op) {
    auto axes =
        op->getAttrOfType<ArrayAttr>(MegacDialect::kReduceResultAttrName);
    if (!axes)
      return;
    Value result = op->getResult(0);
    ShardingAttr visible = getShardingOrReplicated(result);
    SmallVector<StringAttr> partial(visible.getPartial());
    for (Attribute axis : axes)
      partial.push_back(cast<StringAttr>(axis));
    ShardingAttr raw =
        ShardingAttr::get(op->getContext(), visible.getDims(), partial);
    OpBuilder builder(op->getContext());
    builder.setInsertionPointAfter(op);
    Value reduced = reshard(builder, op->getLoc(), result, raw, visible);
    result.replaceAllUsesExcept(reduced, reduced.getDefiningOp() == nullptr
                                             ? nullptr
                                             : firstOfChain(result));
    setSharding(result, raw);
    op->removeAttr(MegacDialect::kReduceResultAttrName);
  }

  /// The first op of the reduction chain reading `value`.
  static Operation *firstOfChain(Value value) {
    for (Operation *user : value.getUsers())
      if (isa<AllReduceOp>(user))
        return user;
    return nullptr;
  }

  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      // A value resharded once is reused by later users needing the same
      // (with `regather`, the backward pass's gathers apart).
      llvm::DenseMap<std::tuple<Value, Attribute, unsigned>, Value> resharded;
      llvm::DenseSet<Operation *> forward;
      if (regather)
        forward = returnedCone(func.getBody().front());
      SmallVector<Operation *> ops;
      for (Operation &op : func.getBody().front())
        ops.push_back(&op);
      for (Operation *op : ops) {
        reduceResultEagerly(op);
        auto required = op->getAttrOfType<ArrayAttr>(
            MegacDialect::kOperandShardingsAttrName);
        if (!required)
          continue;
        OpBuilder builder(op);
        for (auto [index, want] : llvm::enumerate(required)) {
          // A returned value is resharded right where it is produced, so the
          // forward part of a step ends with it (generation runs only that).
          if (isa<func::ReturnOp>(op)) {
            Value operand = op->getOperand(index);
            if (Operation *def = operand.getDefiningOp())
              builder.setInsertionPointAfter(def);
            else
              builder.setInsertionPointToStart(operand.getParentBlock());
          }
          Value operand = op->getOperand(index);
          ShardingAttr have = getShardingOrReplicated(operand);
          auto to = cast<ShardingAttr>(want);
          if (have == to)
            continue;
          for (StringAttr axis : to.getPartial())
            if (!have.isPartialOn(axis.getValue())) {
              op->emitOpError("operand ")
                  << index << " is required partial over '" << axis.getValue()
                  << "' but is not: the shardings are stale (ops added "
                     "after megac-propagate-sharding? run it again)";
              return signalPassFailure();
            }
          bool again = regather && !isa<func::ReturnOp>(op) &&
                       !forward.contains(op) && gathers(have, to);
          Value &cached = resharded[{operand, want, again ? 1u : 0u}];
          if (!cached) {
            Operation *before = op->getPrevNode();
            cached = reshard(builder, op->getLoc(), operand, have, to);
            // On a pipeline the gather runs with the backward op it serves.
            if (again && !getStages(op).empty())
              for (Operation *made = before ? before->getNextNode()
                                            : &op->getBlock()->front();
                   made != op; made = made->getNextNode())
                setPlacement(made, getStages(op), getPhase(op));
          }
          op->setOperand(index, cached);
        }
      }
    }
  }
};
} // namespace
