//===- MixedPrecision.cpp - bf16 compute by rounding ----------------------===//
//
// A bf16 program stores its weights' compute copies, activations and
// activation gradients in bf16 and accumulates inside each kernel in f32.
// Rounding each such tensor to bf16 right where it is produced gives the
// same numbers on a backend that computes in f32 (the CPU runtime), and
// states in the IR exactly which values are bf16.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"

namespace megac {
#define GEN_PASS_DEF_MIXEDPRECISIONPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

/// Ops whose result a bf16 program holds in bf16: activations and
/// activation gradients. Reshape and transpose move already-rounded values;
/// normalize (x-hat) only serves a LayerNorm gain's f32 gradient.
bool producesBf16(Operation *op) {
  return isa<EmbeddingOp, PositionEmbeddingOp, LinearOp, MatMulOp, AddOp, MulOp,
             GeluOp, SoftmaxOp, LayerNormOp, AttentionOp, DropoutOp,
             GeluGradOp, LayerNormGradOp, AttentionGradOp, SoftmaxGradOp,
             CrossEntropyGradOp>(op);
}

/// Weight gradients, which Megatron keeps in f32 ("main gradients"): the
/// results of the weight-gradient ops (a LayerNorm gain's among them), sums
/// of such contributions (a tied embedding's), and products only a token sum
/// reads (a broadcast factor's gradient). Activation gradients, the inputs
/// of these ops, are bf16.
llvm::DenseSet<Value> weightGradients(func::FuncOp func) {
  llvm::DenseSet<Value> weights;
  for (Operation &op : func.getBody().front()) {
    if (op.getNumResults() != 1)
      continue;
    Value result = op.getResult(0);
    bool isWeightGradient =
        isa<LinearWeightGradOp, EmbeddingGradOp, PositionEmbeddingGradOp,
            SumLeadingOp, LayerNormGainGradOp>(op) ||
        (isa<AddOp>(op) &&
         llvm::all_of(op.getOperands(),
                      [&](Value v) { return weights.contains(v); })) ||
        (isa<MulOp>(op) && !result.use_empty() &&
         llvm::all_of(result.getUsers(),
                      [](Operation *user) { return isa<SumLeadingOp>(user); }));
    if (isWeightGradient)
      weights.insert(result);
  }
  return weights;
}

struct MixedPrecisionPass
    : public megac::impl::MixedPrecisionPassBase<MixedPrecisionPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal())
        convert(func);
  }

  static void roundAfter(OpBuilder &b, Value value) {
    // A value this pass rounded already (it ran twice) feeds its round
    // alone: rounding it again would only add an op.
    if (value.hasOneUse() && isa<RoundBf16Op>(*value.getUsers().begin()))
      return;
    auto round = RoundBf16Op::create(b, value.getLoc(), value);
    value.replaceAllUsesExcept(round.getResult(), round.getOperation());
  }

  void convert(func::FuncOp func) {
    llvm::DenseSet<Value> keepF32 = weightGradients(func);
    Block &body = func.getBody().front();
    OpBuilder b(func.getContext());
    // The bf16 compute copy of each parameter: what every model op reads.
    // The optimizer, added later, updates the f32 argument itself.
    b.setInsertionPointToStart(&body);
    for (BlockArgument arg : body.getArguments())
      if (func.getArgAttr(arg.getArgNumber(), MegacDialect::kParamAttrName) &&
          !arg.use_empty())
        roundAfter(b, arg);
    SmallVector<Operation *> ops;
    for (Operation &op : body)
      if (producesBf16(&op) && !keepF32.contains(op.getResult(0)))
        ops.push_back(&op);
    for (Operation *op : ops) {
      b.setInsertionPointAfter(op);
      roundAfter(b, op->getResult(0));
    }
  }
};
} // namespace
