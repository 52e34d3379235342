// RUN: megac-opt %s --split-input-file --megac-apply-optimizer -verify-diagnostics
// RUN: not megac-opt %s --split-input-file --megac-apply-optimizer="lr=0.001 min-lr=0.01" 2>&1 | FileCheck %s --check-prefix=SCHEDULE

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

// SCHEDULE: error: invalid learning-rate schedule: need 0 <= min-lr <= lr, lr > 0, warmup-steps >= 0 and total-steps > 0
