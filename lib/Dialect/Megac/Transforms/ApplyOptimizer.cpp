//===- ApplyOptimizer.cpp - Gradients to AdamW updates --------------------===//
//
// Turns the `grad:<name>` results of megac-autodiff into in-place AdamW
// updates with global-norm clipping. The norm sums squared gradients of
// sharded parameters first: their squares are partial sums over the
// sharding axis and add up without communication, so one all-reduce
// completes them before the replicated parameters' squares are added.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"

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
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto name = func.getResultAttrOfType<StringAttr>(
          i, MegacDialect::kResultNameAttrName);
      if (name && name.getValue().starts_with("grad:")) {
        auto it = params.find(name.getValue().drop_front(5));
        if (it == params.end())
          return func.emitError("gradient result '")
                 << name.getValue() << "' names no parameter";
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
    Value coefficient;
    if (maxGradNorm > 0) {
      // Sharded parameters' squares first (see the file comment).
      auto isSharded = [&](BlockArgument arg) {
        return static_cast<bool>(func.getArgAttr(
            arg.getArgNumber(), MegacDialect::kShardingAttrName));
      };
      SmallVector<std::pair<BlockArgument, Value>> ordered;
      for (bool sharded : {true, false})
        for (auto &update : updates)
          if (isSharded(update.first) == sharded)
            ordered.push_back(update);
      Value total;
      for (auto &[param, grad] : ordered) {
        Value squares = SumSquaresOp::create(b, loc, grad);
        total = total ? Value(AddOp::create(b, loc, total, squares)) : squares;
      }
      coefficient = ClipCoefficientOp::create(b, loc, total,
                                              b.getF64FloatAttr(maxGradNorm));
    } else {
      coefficient = FillOp::create(b, loc, b.getDenseI64ArrayAttr({}), b.getF64FloatAttr(1.0));
    }
    for (auto &[param, grad] : updates) {
      // Decay matrices only, as GPT-2/Megatron recipes do.
      bool decay = cast<RankedTensorType>(param.getType()).getRank() >= 2;
      AdamWOp::create(b, loc, param, grad, coefficient,
                      b.getF64FloatAttr(beta1), b.getF64FloatAttr(beta2),
                      b.getF64FloatAttr(epsilon),
                      b.getF64FloatAttr(decay ? weightDecay : 0.0));
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

  void runOnOperation() override {
    if (lr <= 0 || minLr < 0 || minLr > lr || warmupSteps < 0 ||
        totalSteps <= 0) {
      getOperation().emitError("invalid learning-rate schedule: need 0 <= "
                               "min-lr <= lr, lr > 0, warmup-steps >= 0 and "
                               "total-steps > 0");
      return signalPassFailure();
    }
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(apply(func)))
        return signalPassFailure();
  }
};
} // namespace
