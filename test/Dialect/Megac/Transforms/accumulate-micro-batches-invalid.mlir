// RUN: megac-opt %s --split-input-file --megac-accumulate-micro-batches=micro-batches=2 -verify-diagnostics
// RUN: not megac-opt %s --split-input-file --megac-accumulate-micro-batches=micro-batches=0 2>&1 | FileCheck %s --check-prefix=ZERO
// Tests that the option itself is checked, before any function.
// RUN: not megac-opt %S/accumulate-micro-batches.mlir --split-input-file --megac-autodiff --megac-accumulate-micro-batches=micro-batches=9223372036854775807 2>&1 | FileCheck %s --check-prefix=OVERFLOW
// ZERO: error: the number of micro-batches must be from 1 to 1048576, got 0
// OVERFLOW: error: the number of micro-batches must be from 1 to 1048576, got 9223372036854775807

// Tests that accumulation needs the gradients of megac-autodiff.
// expected-error@+1 {{megac-accumulate-micro-batches found no 'grad:' results; run megac-autodiff first}}
func.func @no_gradients(%l: tensor<f32>) -> (tensor<f32> {megac.name = "loss"}) {
  return %l : tensor<f32>
}

// -----

// Tests that it needs to know the loss.
// expected-error@+1 {{megac-accumulate-micro-batches needs the loss: a scalar result named 'loss' (megac.name) or the only scalar f32 result}}
func.func @two_scalars(%a: tensor<f32>, %b: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  return %a, %b : tensor<f32>, tensor<f32>
}
