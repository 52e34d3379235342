//===- BucketAllReduces.cpp - Fuse gradient all-reduces into buckets ------===//
//
// Data parallelism all-reduces every parameter's gradient: dozens of small
// messages per step for a small model, thousands for a large one, each
// paying the collective's latency. Gradients are produced during the
// backward pass but read only by the optimizer at its end, so their sums
// can wait and travel together. This pass delays each all-reduce until one
// of its sums is needed (or its bucket is full) and fuses the delayed ones
// of an axis into one megac.all_reduce_bucket.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ModelStructure.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

#include <map>

namespace megac {
#define GEN_PASS_DEF_BUCKETALLREDUCESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

int64_t bytesOf(Value value) {
  auto type = cast<RankedTensorType>(value.getType());
  return type.getNumElements() *
         static_cast<int64_t>(type.getElementTypeBitWidth() / 8);
}

struct Bucket {
  SmallVector<AllReduceOp> members;
  int64_t bytes = 0;
};

struct BucketAllReducesPass
    : public megac::impl::BucketAllReducesPassBase<BucketAllReducesPass> {
  using BucketAllReducesPassBase::BucketAllReducesPassBase;

  void runOnOperation() override {
    // (A negative size read as "no buckets": a slip, not a choice.)
    if (bucketBytes < 0) {
      getOperation().emitError("megac-bucket-all-reduces: bucket-bytes must "
                               "be >= 0 (0: one all-reduce per gradient), "
                               "got ")
          << static_cast<int64_t>(bucketBytes);
      return signalPassFailure();
    }
    if (bucketBytes == 0)
      return;
    // Buckets count real (per-rank) bytes, and localizing a bucket later
    // would shrink its operands under its results. (Without a grid the
    // shapes are one rank's already.)
    if (getOperation()->hasAttr(MegacDialect::kMeshAttrName) &&
        !getOperation()->hasAttr(MegacDialect::kLocalizedAttrName)) {
      getOperation().emitError("megac-bucket-all-reduces runs on per-rank "
                               "IR: run megac-localize-shapes first");
      return signalPassFailure();
    }
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal())
        bucketFunction(func.getBody().front());
  }

  /// Replaces the bucket's all-reduces by one fused op before `before`.
  static void flush(Bucket &bucket, Operation *before) {
    if (bucket.members.size() > 1) {
      OpBuilder b(before);
      SmallVector<Value> inputs;
      SmallVector<Type> types;
      for (AllReduceOp member : bucket.members) {
        inputs.push_back(member.getInput());
        types.push_back(member.getType());
      }
      auto fused = AllReduceBucketOp::create(
          b, bucket.members.front().getLoc(), types, inputs,
          bucket.members.front().getAxisAttr());
      Operation *first = bucket.members.front();
      if (!getStages(first).empty())
        setPlacement(fused, getStages(first), getPhase(first));
      for (auto [member, sum] : llvm::zip(bucket.members, fused.getResults())) {
        member.getResult().replaceAllUsesWith(sum);
        member.erase();
      }
    }
    bucket = Bucket();
  }

  void bucketFunction(Block &body) {
    llvm::DenseSet<Operation *> keep = returnedCone(body);
    // Open buckets per axis (and, on a pipeline, per stage and phase: a
    // bucket is one collective of one stage's ranks), in the order they
    // opened (deterministic).
    llvm::MapVector<std::string, Bucket, std::map<std::string, unsigned>> open;
    // Which open bucket holds the all-reduce producing a value.
    llvm::DenseMap<Value, std::string> pending;
    auto bucketKey = [](AllReduceOp op) {
      std::string key = op.getAxis().str() + "|" + getPhase(op).str();
      for (int64_t stage : getStages(op))
        key += " " + std::to_string(stage);
      return key;
    };
    SmallVector<Operation *> ops;
    for (Operation &op : body)
      ops.push_back(&op);
    for (Operation *op : ops) {
      // A user of a pending sum needs its bucket first.
      for (Value operand : op->getOperands()) {
        auto it = pending.find(operand);
        if (it == pending.end())
          continue;
        std::string key = it->second;
        for (AllReduceOp member : open[key].members)
          pending.erase(member.getResult());
        flush(open[key], op);
      }
      if (isa<func::ReturnOp>(op)) {
        for (auto &entry : open)
          flush(entry.second, op);
        continue;
      }
      auto allReduce = dyn_cast<AllReduceOp>(op);
      if (!allReduce || keep.contains(op))
        continue;
      std::string key = bucketKey(allReduce);
      Bucket &bucket = open[key];
      bucket.members.push_back(allReduce);
      bucket.bytes += bytesOf(allReduce.getInput());
      pending[allReduce.getResult()] = key;
      if (bucket.bytes >= bucketBytes) {
        for (AllReduceOp member : bucket.members)
          pending.erase(member.getResult());
        flush(bucket, op->getNextNode());
      }
    }
  }
};
} // namespace
