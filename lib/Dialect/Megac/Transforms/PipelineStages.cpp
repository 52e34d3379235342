//===- PipelineStages.cpp - Placing ops on pipeline stages ----------------===//
//
// Pipeline parallelism in two passes. megac-assign-stages cuts the forward
// pass into stages by cost before differentiation (so autodiff can place
// each gradient op with the op it differentiates); megac-pipeline-stages
// places what the later passes added and inserts a megac.transfer wherever
// a value crosses from one stage to another.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"
#include "megac/Pipeline/Partition.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

namespace megac {
#define GEN_PASS_DEF_ASSIGNSTAGESPASS
#define GEN_PASS_DEF_PIPELINESTAGESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

struct AssignStagesPass
    : public megac::impl::AssignStagesPassBase<AssignStagesPass> {
  using AssignStagesPassBase::AssignStagesPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t pp = getAxisSizeOrOne(getMesh(module), "pp");
    if (virtualStages < 1) {
      module.emitError("megac-assign-stages: virtual-stages must be "
                       "positive, got ")
          << static_cast<int64_t>(virtualStages);
      return signalPassFailure();
    }
    // (Past a grid's rank limit no model has the blocks, and the product
    // could overflow.)
    if (virtualStages > kMaxGridRanks) {
      module.emitError("megac-assign-stages: virtual-stages ")
          << static_cast<int64_t>(virtualStages) << " is too large (at most "
          << kMaxGridRanks << ")";
      return signalPassFailure();
    }
    int64_t stages = pp * virtualStages;
    if (stages <= 1)
      return;
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      std::string error;
      FailureOr<StagePartition> partition =
          partitionStages(func, pp, virtualStages, error);
      if (failed(partition)) {
        func.emitError("megac-assign-stages: ") << error;
        return signalPassFailure();
      }
      std::vector<int64_t> segment = segmentOfOps(func);
      size_t index = 0;
      for (Operation &op : func.getBody().front().without_terminator())
        setPlacement(&op, {stageOfSegment(*partition, segment[index++])},
                     "forward");
    }
    module->setAttr(MegacDialect::kPipelineStagesAttrName,
                    IntegerAttr::get(IntegerType::get(&getContext(), 64),
                                     stages));
  }
};

/// Where a value is available per micro-batch or per step.
int valuePhase(Value value) {
  Operation *def = value.getDefiningOp();
  if (!def)
    return -1; // parameters and inputs: every rank has its own
  if (isa<AccumulateOp>(def))
    return 2; // the sum over the step's micro-batches
  return phaseRank(getPhase(def));
}

StringRef phaseName(int rank) {
  return rank == 0 ? "forward" : rank == 1 ? "backward" : "step";
}

/// The parameter (a block argument) an update writes, through constraints.
Value updatedParameter(Operation *op) {
  Value value;
  if (auto adamw = dyn_cast<AdamWOp>(op))
    value = adamw.getParam();
  else if (auto assign = dyn_cast<AssignOp>(op))
    value = assign.getParam();
  else
    return {};
  while (Operation *def = value.getDefiningOp()) {
    if (def->getNumOperands() == 0)
      return {};
    value = def->getOperand(0);
  }
  return value;
}

struct PipelineStagesPass
    : public megac::impl::PipelineStagesPassBase<PipelineStagesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!module->hasAttr(MegacDialect::kPipelineStagesAttrName))
      return;
    // The step's part reads the micro-batches' only through their sums,
    // which megac-accumulate-micro-batches makes (it marks the module).
    if (!module->hasAttr(MegacDialect::kMicroBatchesAttrName)) {
      module.emitError("megac-pipeline-stages needs the micro-batch sums: "
                       "run megac-accumulate-micro-batches first");
      return signalPassFailure();
    }
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() &&
          (failed(place(func)) || failed(insertTransfers(func))))
        return signalPassFailure();
  }

  /// Stages of the forward and backward ops that read each parameter,
  /// directly or through ops later passes added and nothing placed yet (a
  /// bf16 copy, a ZeRO slice).
  static llvm::DenseMap<Value, SmallVector<int64_t>>
  parameterStages(Block &body) {
    llvm::DenseMap<Value, SmallVector<int64_t>> stages;
    for (BlockArgument arg : body.getArguments()) {
      SmallVector<int64_t> list;
      llvm::DenseSet<Operation *> seen;
      SmallVector<Value> worklist = {arg};
      while (!worklist.empty()) {
        Value value = worklist.pop_back_val();
        for (Operation *user : value.getUsers()) {
          if (!seen.insert(user).second || updatedParameter(user))
            continue;
          int phase = phaseRank(getPhase(user));
          if (phase == 0 || phase == 1) {
            for (int64_t stage : getStages(user))
              if (!llvm::is_contained(list, stage))
                list.push_back(stage);
          } else if (phase < 0) {
            llvm::append_range(worklist, user->getResults());
          }
        }
      }
      if (!list.empty()) {
        llvm::sort(list);
        stages[arg] = list;
      }
    }
    return stages;
  }

  LogicalResult place(func::FuncOp func) {
    Block &body = func.getBody().front();
    auto paramStages = parameterStages(body);
    SmallVector<Operation *> unplaced;
    for (Operation &op : body.without_terminator()) {
      if (!getStages(&op).empty())
        continue;
      // An update runs wherever its parameter is read, so every copy of
      // a parameter several stages hold stays the same.
      if (Value param = updatedParameter(&op)) {
        auto it = paramStages.find(param);
        SmallVector<int64_t> stages =
            it != paramStages.end() ? it->second : SmallVector<int64_t>{0};
        setPlacement(&op, stages, "step");
        continue;
      }
      // Otherwise the latest phase of its operands, on the stage of the
      // last operand in that phase (a running sum, like the gradient
      // norm's, then moves to another stage only where its addends do).
      int phase = -1;
      Operation *from = nullptr;
      for (Value operand : op.getOperands()) {
        // An operand not placed yet says nothing: its op is placed below
        // from its users, this one among them.
        Operation *def = operand.getDefiningOp();
        if (def && getStages(def).empty())
          continue;
        int p = valuePhase(operand);
        if (p >= 0 && p >= phase) {
          phase = p;
          from = operand.getDefiningOp();
        }
      }
      if (!from) {
        unplaced.push_back(&op);
        continue;
      }
      setPlacement(&op, getStages(from), phaseName(phase));
    }
    // Constants and ops on parameters alone: wherever they are used, as
    // early as the first use.
    for (Operation *op : llvm::reverse(unplaced)) {
      SmallVector<int64_t> stages;
      int phase = 2;
      for (Operation *user : op->getUsers()) {
        if (isa<func::ReturnOp>(user))
          continue;
        for (int64_t stage : getStages(user))
          if (!llvm::is_contained(stages, stage))
            stages.push_back(stage);
        int p = phaseRank(getPhase(user));
        if (p >= 0)
          phase = std::min(phase, p);
      }
      if (stages.empty()) {
        stages = {0}; // used by nothing that runs: anywhere will do
        phase = 1;
      }
      // A sum over the micro-batches takes an addend from each, however
      // late its users run (a parameter the loss does not read has a
      // constant zero gradient that is summed like any other).
      if (isa<AccumulateOp>(op))
        phase = std::min(phase, 1);
      llvm::sort(stages);
      setPlacement(op, stages, phaseName(phase));
    }
    // Phases must follow the data: a per-micro-batch op cannot read a
    // once-per-step value, and a once-per-step op reads per-micro-batch
    // values only through their sums.
    for (Operation &op : body.without_terminator()) {
      int phase = phaseRank(getPhase(&op));
      for (Value operand : op.getOperands()) {
        int p = valuePhase(operand);
        if (p < 0)
          continue;
        if ((phase < 2 && p == 2) || (phase == 2 && p < 2))
          return op.emitOpError("megac-pipeline-stages: runs in the ")
                 << phaseName(phase) << " phase but reads a value of the "
                 << phaseName(p) << " phase (internal error)";
      }
    }
    return success();
  }

  LogicalResult insertTransfers(func::FuncOp func) {
    Block &body = func.getBody().front();
    // One transfer per value and destination stage, before its first use
    // there.
    llvm::DenseSet<std::pair<Value, int64_t>> sent;
    SmallVector<Operation *> ops;
    for (Operation &op : body.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops) {
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (!def)
          continue;
        ArrayRef<int64_t> have = getStages(def);
        for (int64_t stage : getStages(op)) {
          if (llvm::is_contained(have, stage) ||
              !sent.insert({operand, stage}).second)
            continue;
          OpBuilder b(op);
          TransferOp::create(b, op->getLoc(), operand, have.front(), stage,
                             phaseName(valuePhase(operand)), getPhase(op));
        }
      }
    }
    return success();
  }
};

} // namespace
