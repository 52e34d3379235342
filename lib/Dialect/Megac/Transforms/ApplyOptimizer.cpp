//===- ApplyOptimizer.cpp - Gradients to AdamW updates --------------------===//
//
// Turns the `grad:<name>` results of megac-autodiff into in-place AdamW
// updates with global-norm clipping. The norm sums squared gradients split
// the same way first: their squares are partial sums over the same axes and
// add up without communication, so one all-reduce per group completes them.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include <cmath>

namespace megac {
#define GEN_PASS_DEF_APPLYOPTIMIZERPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
struct ApplyOptimizerPass
    : public megac::impl::ApplyOptimizerPassBase<ApplyOptimizerPass> {
  using ApplyOptimizerPassBase::ApplyOptimizerPassBase;

  LogicalResult apply(func::FuncOp func) {
    Block &body = func.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    llvm::StringMap<BlockArgument> params;
    for (BlockArgument arg : body.getArguments())
      if (auto spec = func.getArgAttrOfType<DictionaryAttr>(
              arg.getArgNumber(), MegacDialect::kParamAttrName))
        params[spec.getAs<StringAttr>("name").getValue()] = arg;

    // Split the results into kept ones and (parameter, gradient) pairs.
    SmallVector<Value> kept;
    SmallVector<DictionaryAttr> keptAttrs;
    SmallVector<std::pair<BlockArgument, Value>> updates;
    llvm::DenseSet<BlockArgument> updated; // (a set: deep models have many)
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto name = func.getResultAttrOfType<StringAttr>(
          i, MegacDialect::kResultNameAttrName);
      if (name && name.getValue().starts_with("grad:")) {
        auto it = params.find(name.getValue().drop_front(5));
        if (it == params.end())
          return func.emitError("gradient result '")
                 << name.getValue() << "' names no parameter";
        // The update needs the gradient in the parameter's shape (global
        // shapes: before megac-localize-shapes, where the two agree).
        if (it->second.getType() != ret.getOperand(i).getType())
          return func.emitError("gradient result '")
                 << name.getValue() << "' has type "
                 << ret.getOperand(i).getType()
                 << " but its parameter has type " << it->second.getType()
                 << (func->getParentOfType<ModuleOp>()->hasAttr(
                         MegacDialect::kLocalizedAttrName)
                         ? " (the module is localized: run "
                           "megac-apply-optimizer before "
                           "megac-localize-shapes)"
                         : "");
        if (!updated.insert(it->second).second)
          return func.emitError("parameter '")
                 << name.getValue().drop_front(5)
                 << "' has two gradient results; it would be updated twice";
        updates.push_back({it->second, ret.getOperand(i)});
        continue;
      }
      kept.push_back(ret.getOperand(i));
      keptAttrs.push_back(func.getResultAttrDict(i));
    }
    if (updates.empty())
      return func.emitError("megac-apply-optimizer found no 'grad:' results; "
                            "run megac-autodiff first");

    OpBuilder b(ret);
    Location loc = ret.getLoc();
    // ZeRO-1: gradients are reduce-scattered first, so the norm below and
    // the updates read this rank's slices.
    SmallVector<ShardingAttr> sliced;
    for (auto &[param, grad] : updates) {
      sliced.push_back(zeroSharding(func, param));
      if (sliced.back())
        grad = ShardingConstraintOp::create(b, loc, grad, sliced.back());
    }
    Value coefficient;
    if (maxGradNorm > 0) {
      // Squares of gradients split the same way are partial sums over the
      // same axes and add up without communication: sum each such group
      // first (tensor-parallel split? ZeRO slice?), then the group totals.
      auto isSharded = [&](BlockArgument arg) {
        return static_cast<bool>(func.getArgAttr(
            arg.getArgNumber(), MegacDialect::kShardingAttrName));
      };
      Value total;
      for (bool tensorParallel : {true, false})
        for (bool zeroSliced : {true, false}) {
          Value group;
          for (auto [index, update] : llvm::enumerate(updates)) {
            if (isSharded(update.first) != tensorParallel ||
                static_cast<bool>(sliced[index]) != zeroSliced)
              continue;
            Value squares = SumSquaresOp::create(b, loc, update.second);
            group = group ? Value(AddOp::create(b, loc, group, squares))
                          : squares;
          }
          if (group)
            total = total ? Value(AddOp::create(b, loc, total, group)) : group;
        }
      coefficient = ClipCoefficientOp::create(b, loc, total,
                                              b.getF64FloatAttr(maxGradNorm));
    } else {
      coefficient = FillOp::create(b, loc, b.getDenseI64ArrayAttr({}), b.getF64FloatAttr(1.0));
    }
    for (auto [index, update] : llvm::enumerate(updates)) {
      auto [param, grad] = update;
      // Decay matrices only, as GPT-2/Megatron recipes do.
      bool decay = cast<RankedTensorType>(param.getType()).getRank() >= 2;
      auto adamw = [&](Value target, Value gradient) {
        return AdamWOp::create(b, loc, target, gradient, coefficient,
                               b.getF64FloatAttr(beta1),
                               b.getF64FloatAttr(beta2),
                               b.getF64FloatAttr(epsilon),
                               b.getF64FloatAttr(decay ? weightDecay : 0.0));
      };
      if (!sliced[index]) {
        adamw(param, grad);
        continue;
      }
      // ZeRO-1: update this rank's slice (its moments are a slice too),
      // gather the slices and write them back.
      auto whole = func.getArgAttrOfType<ShardingAttr>(
          param.getArgNumber(), MegacDialect::kShardingAttrName);
      if (!whole)
        whole = ShardingAttr::getReplicated(
            &getContext(), cast<RankedTensorType>(param.getType()).getRank());
      Value paramSlice =
          ShardingConstraintOp::create(b, loc, param, sliced[index]);
      Value updated = adamw(paramSlice, grad);
      Value gathered = ShardingConstraintOp::create(b, loc, updated, whole);
      AssignOp::create(b, loc, param, gathered);
    }
    func::ReturnOp::create(b, loc, kept);
    ret.erase();
    func.setFunctionType(FunctionType::get(func.getContext(),
                                           body.getArgumentTypes(),
                                           ValueRange(kept).getTypes()));
    func.setAllResultAttrs(keptAttrs);

    ModuleOp module = getOperation();
    module->setAttr(
        MegacDialect::kTrainAttrName,
        b.getDictionaryAttr({
            b.getNamedAttr("max_lr", b.getF64FloatAttr(lr)),
            b.getNamedAttr("min_lr", b.getF64FloatAttr(minLr)),
            b.getNamedAttr("warmup_steps", b.getI64IntegerAttr(warmupSteps)),
            b.getNamedAttr("total_steps", b.getI64IntegerAttr(totalSteps)),
        }));
    return success();
  }

  /// The sharding that slices `param` over the ZeRO axis (its own sharding
  /// plus the axis on the first dimension that is free and divisible), or
  /// null when ZeRO is off, the grid has no such axis, or no dimension fits.
  ShardingAttr zeroSharding(func::FuncOp func, BlockArgument param) {
    if (zeroStage < 1)
      return {};
    MeshAttr mesh = getMesh(getOperation());
    int64_t size = getAxisSizeOrOne(mesh, zeroAxis);
    if (size <= 1)
      return {};
    auto type = cast<RankedTensorType>(param.getType());
    auto given = func.getArgAttrOfType<ShardingAttr>(
        param.getArgNumber(), MegacDialect::kShardingAttrName);
    SmallVector<StringAttr> dims;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      StringRef axis = given ? given.getDimAxis(d) : "";
      // Axes the grid does not have leave the dimension whole.
      dims.push_back(StringAttr::get(
          &getContext(), getAxisSizeOrOne(mesh, axis) > 1 ? axis : ""));
    }
    for (int64_t d = 0; d < type.getRank(); ++d) {
      if (dims[d].getValue().empty() && type.getDimSize(d) % size == 0) {
        dims[d] = StringAttr::get(&getContext(), zeroAxis);
        return ShardingAttr::get(&getContext(), dims, {});
      }
    }
    return {};
  }

  /// Why ZeRO cannot shard over zeroAxis in \p func ("" if it can, or
  /// where it is off or the grid lacks the axis). ZeRO shards the state
  /// over ranks that hold the same weights and average their gradients:
  /// the axis that splits the batch. Another (tp, pp) sliced a weight
  /// over an axis that already split it, or put collectives over pp that
  /// one stage alone runs.
  std::string zeroAxisProblem(func::FuncOp func) {
    if (zeroStage < 1 ||
        getAxisSizeOrOne(getMesh(getOperation()), zeroAxis) <= 1)
      return "";
    if (zeroAxis == "pp")
      return "splits the layers into pipeline stages";
    if (StringRef data = batchAxis(func); !data.empty() && data != zeroAxis)
      return "does not split the batch (the data inputs are split over '" +
             data.str() + "')";
    for (BlockArgument arg : func.getArguments()) {
      auto sharding = func.getArgAttrOfType<ShardingAttr>(
          arg.getArgNumber(), MegacDialect::kShardingAttrName);
      if (sharding &&
          func.getArgAttr(arg.getArgNumber(), MegacDialect::kParamAttrName) &&
          llvm::is_contained(sharding.getDims(),
                             StringAttr::get(&getContext(), zeroAxis)))
        return "splits " + describeArgument(func, arg.getArgNumber());
    }
    return "";
  }

  void runOnOperation() override {
    // (Checked here, since an AdamW op built from them would not verify.)
    ApplyOptimizerPassOptions options;
    options.lr = lr;
    options.minLr = minLr;
    options.warmupSteps = warmupSteps;
    options.totalSteps = totalSteps;
    options.weightDecay = weightDecay;
    options.maxGradNorm = maxGradNorm;
    options.beta1 = beta1;
    options.beta2 = beta2;
    options.epsilon = epsilon;
    options.zeroStage = zeroStage;
    if (std::string problem = optimizerOptionsProblem(options);
        !problem.empty()) {
      getOperation().emitError(problem);
      return signalPassFailure();
    }
    if (std::string problem = missingAxisProblem(
            getOperation(), "megac-apply-optimizer: zero-axis", zeroAxis,
            ApplyOptimizerPassOptions().zeroAxis);
        zeroStage >= 1 && !problem.empty()) {
      getOperation().emitError(problem);
      return signalPassFailure();
    }
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      if (std::string why = zeroAxisProblem(func); !why.empty()) {
        func.emitError() << "megac-apply-optimizer: zero-axis '" << zeroAxis
                         << "' " << why
                         << ": ZeRO shards the optimizer state over the "
                            "data-parallel ranks (the axis that splits the "
                            "batch, each rank with the whole weights)";
        return signalPassFailure();
      }
      if (failed(apply(func)))
        return signalPassFailure();
    }
  }
};
} // namespace

std::string
megac::optimizerOptionsProblem(const ApplyOptimizerPassOptions &options,
                               llvm::StringRef prefix,
                               llvm::StringRef zeroName) {
  auto text = numberText;
  std::string p = prefix.str();
  if (options.zeroStage < 0 || options.zeroStage > 1)
    return p + zeroName.str() + " must be 0 or 1, got " +
           std::to_string(options.zeroStage) +
           " (ZeRO stages 2 and 3 are not implemented)";
  // Written as "not within" so that a NaN fails too.
  if (!(options.lr > 0 && std::isfinite(options.lr)))
    return p + "lr must be a finite number > 0, got " + text(options.lr);
  if (!(options.minLr >= 0 && options.minLr <= options.lr))
    return p + "min-lr must lie in [0, " + p + "lr] = [0, " + text(options.lr) +
           "], got " + text(options.minLr);
  if (options.warmupSteps < 0)
    return p + "warmup-steps must be >= 0, got " +
           std::to_string(options.warmupSteps);
  if (options.totalSteps <= 0)
    return p + "total-steps must be positive, got " +
           std::to_string(options.totalSteps);
  for (auto [name, value] :
       {std::pair<const char *, double>{"beta1", options.beta1},
        {"beta2", options.beta2}})
    if (!(value >= 0 && value < 1))
      return p + name + " must lie in [0, 1), got " + text(value);
  struct NonNegative {
    const char *name;
    double value;
    const char *note;
  };
  for (const NonNegative &option :
       {NonNegative{"epsilon", options.epsilon, ""},
        NonNegative{"weight-decay", options.weightDecay, ""},
        NonNegative{"max-grad-norm", options.maxGradNorm, " (0: no clipping)"}})
    if (!(option.value >= 0 && std::isfinite(option.value)))
      return p + option.name + " must be a finite number >= 0" + option.note +
             ", got " + text(option.value);
  return "";
}
