// RUN: megac-opt %s --split-input-file --megac-apply-optimizer -verify-diagnostics
// RUN: not megac-opt %s --split-input-file --megac-apply-optimizer="lr=0.001 min-lr=0.01" 2>&1 | FileCheck %s --check-prefix=MINLR

// Tests that there must be gradients to apply.
// expected-error@+1 {{megac-apply-optimizer found no 'grad:' results; run megac-autodiff first}}
func.func @no_grads(%x: tensor<4xf32> {megac.param = {name = "x", init = "zeros"}}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// Tests that a gradient must name a parameter.
// expected-error@+1 {{gradient result 'grad:y' names no parameter}}
func.func @unknown(%x: tensor<4xf32> {megac.param = {name = "x", init = "zeros"}}) -> (tensor<4xf32> {megac.name = "grad:y"}) {
  return %x : tensor<4xf32>
}

// -----

// Tests that a gradient must have its parameter's type (AdamW once aborted
// on per-rank gradients of global parameters).
// expected-error@+1 {{gradient result 'grad:w' has type 'tensor<16x4xf32>' but its parameter has type 'tensor<8x4xf32>'}}
func.func @shape(%w: tensor<8x4xf32> {megac.param = {init = "zeros", name = "w"}}, %g: tensor<16x4xf32>) -> (tensor<16x4xf32> {megac.name = "grad:w"}) {
  return %g : tensor<16x4xf32>
}

// -----

// Tests that a parameter has one gradient (two would update it twice).
// expected-error@+1 {{parameter 'w' has two gradient results; it would be updated twice}}
func.func @twice(%w: tensor<8x4xf32> {megac.param = {init = "zeros", name = "w"}}, %g: tensor<8x4xf32>) -> (tensor<8x4xf32> {megac.name = "grad:w"}, tensor<8x4xf32> {megac.name = "grad:w"}) {
  return %g, %g : tensor<8x4xf32>, tensor<8x4xf32>
}

// MINLR: error: min-lr must lie in [0, lr] = [0, 0.001], got 0.01

// Out-of-range hyperparameters are named, not left to AdamW's verifier
// (an op that cannot be built), NaN among them.
// RUN: not megac-opt %s --megac-apply-optimizer="beta1=1.5" 2>&1 | FileCheck %s --check-prefix=BETA1
// RUN: not megac-opt %s --megac-apply-optimizer="beta2=1" 2>&1 | FileCheck %s --check-prefix=BETA2
// RUN: not megac-opt %s --megac-apply-optimizer="weight-decay=-1" 2>&1 | FileCheck %s --check-prefix=DECAY
// RUN: not megac-opt %s --megac-apply-optimizer="max-grad-norm=nan" 2>&1 | FileCheck %s --check-prefix=CLIP
// RUN: not megac-opt %s --megac-apply-optimizer="epsilon=-1e-8" 2>&1 | FileCheck %s --check-prefix=EPS
// RUN: not megac-opt %s --megac-apply-optimizer="lr=nan" 2>&1 | FileCheck %s --check-prefix=LRNAN
// BETA1: error: beta1 must lie in [0, 1), got 1.5
// BETA2: error: beta2 must lie in [0, 1), got 1
// DECAY: error: weight-decay must be a finite number >= 0, got -1
// CLIP: error: max-grad-norm must be a finite number >= 0 (0: no clipping), got nan
// EPS: error: epsilon must be a finite number >= 0, got -1e-08
// LRNAN: error: lr must be a finite number > 0, got nan
