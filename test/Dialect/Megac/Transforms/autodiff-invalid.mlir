// RUN: megac-opt %s --split-input-file --megac-autodiff -verify-diagnostics

// Tests that the loss must be identifiable.
// expected-error@+1 {{megac-autodiff needs the loss: a scalar result named 'loss' (megac.name) or the only scalar result}}
func.func @no_loss(%x: tensor<4xf32> {megac.param = {name = "x", init = "zeros"}}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// Tests that the loss may only flow through differentiable ops.
func.func @collective(%x: tensor<4x1x8xf32> {megac.param = {name = "x", init = "zeros"}},
                      %y: tensor<4x1xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  // expected-error@+1 {{'megac.all_reduce' op is not differentiable; megac-autodiff cannot propagate the loss gradient through it}}
  %0 = megac.all_reduce %x {axis = "tp"} : (tensor<4x1x8xf32>) -> tensor<4x1x8xf32>
  %1 = megac.cross_entropy %0, %y : (tensor<4x1x8xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %1 : tensor<f32>
}
