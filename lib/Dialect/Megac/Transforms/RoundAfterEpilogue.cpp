//===- RoundAfterEpilogue.cpp - A product's epilogue before its rounding -===//
//
// megac-mixed-precision rounds every product, then every bias add (or GeLU
// gradient, or residual add) after it, and every LayerNorm gradient before
// the residual gradient is added to it. A GEMM with an epilogue applies it to
// its fp32 accumulation and rounds once; this pass makes the program say so on
// every target, so that the fused GPU plan and the CPU plan compute the
// same numbers.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/GemmEpilogue.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace megac {
#define GEN_PASS_DEF_ROUNDAFTEREPILOGUEPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

struct RoundAfterEpiloguePass
    : public megac::impl::RoundAfterEpiloguePassBase<RoundAfterEpiloguePass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      SmallVector<LinearOp> products;
      func.walk([&](LinearOp linear) { products.push_back(linear); });
      for (LinearOp linear : products)
        fold(linear);
      SmallVector<LayerNormGradOp> normGrads;
      func.walk([&](LayerNormGradOp grad) { normGrads.push_back(grad); });
      for (LayerNormGradOp grad : normGrads)
        foldResidual(grad);
    }
  }

  /// linear -> round -> add bias -> round [-> gelu]: the first rounding
  /// goes, and a GeLU reads the unrounded sum. linear -> round -> add bias
  /// -> round -> add residual -> round: both first roundings go, the
  /// residual is added to the fp32 sum (cuBLASLt's C). linear -> round -> GeLU
  /// gradient (the product its output gradient) -> round: the first
  /// rounding goes. linear -> round -> add of another tensor of its type,
  /// which the product takes as its C (takesAddendAsC) -> round: the first
  /// rounding goes, the other is added to the fp32 product.
  static void fold(LinearOp linear) {
    auto productRound =
        dyn_cast_or_null<RoundBf16Op>(soleUser(linear.getResult()));
    if (!productRound)
      return;
    Value rounded = productRound.getResult();
    if (auto grad = dyn_cast_or_null<GeluGradOp>(soleUser(rounded));
        grad && grad.getOutputGrad() == rounded && grad.getInput() != rounded &&
        isa_and_nonnull<RoundBf16Op>(soleUser(grad.getResult()))) {
      grad.getOutputGradMutable().assign(linear.getResult());
      productRound.erase();
      return;
    }
    auto add = dyn_cast_or_null<AddOp>(soleUser(productRound.getResult()));
    if (!add)
      return;
    if (!addsBias(add, rounded)) {
      if (takesAddendAsC(add, rounded) &&
          isa_and_nonnull<RoundBf16Op>(soleUser(add.getResult()))) {
        add->replaceUsesOfWith(rounded, linear.getResult());
        productRound.erase();
      }
      return;
    }
    auto sumRound = dyn_cast_or_null<RoundBf16Op>(soleUser(add.getResult()));
    if (!sumRound)
      return;
    add.setOperand(0, linear.getResult());
    productRound.erase();
    for (OpOperand &use :
         llvm::make_early_inc_range(sumRound.getResult().getUses()))
      if (isa<GeluOp>(use.getOwner()))
        use.set(add.getResult());
    if (auto residual = dyn_cast_or_null<AddOp>(soleUser(sumRound.getResult()));
        residual && residualOf(residual, sumRound.getResult()) &&
        isa_and_nonnull<RoundBf16Op>(soleUser(residual.getResult())))
      residual->replaceUsesOfWith(sumRound.getResult(), add.getResult());
    if (sumRound.getResult().use_empty())
      sumRound.erase();
  }

  /// layer_norm_grad -> round -> add residual -> round: the first
  /// rounding goes; the residual gradient is added to the fp32 norm
  /// gradient, as the norm gradient's kernel adds it.
  static void foldResidual(LayerNormGradOp grad) {
    auto gradRound = dyn_cast_or_null<RoundBf16Op>(soleUser(grad.getResult()));
    if (!gradRound)
      return;
    auto residual = dyn_cast_or_null<AddOp>(soleUser(gradRound.getResult()));
    if (!residual || !residualOf(residual, gradRound.getResult()) ||
        !isa_and_nonnull<RoundBf16Op>(soleUser(residual.getResult())))
      return;
    residual->replaceUsesOfWith(gradRound.getResult(), grad.getResult());
    gradRound.erase();
  }
};

} // namespace
