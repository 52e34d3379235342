// RUN: megac-opt %s --split-input-file --megac-autodiff -verify-diagnostics

// Tests that the loss must be identifiable.
// expected-error@+1 {{megac-autodiff needs the loss: a scalar result named 'loss' (megac.name) or the only scalar f32 result}}
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

// -----

// Tests that the loss must be one f32 number: an integer "loss" has no
// gradient, and a tensor is not a loss.
// expected-error@+1 {{megac-autodiff: the result named 'loss' must be a scalar f32 (tensor<f32>), got 'tensor<2x8xi32>'}}
func.func @int_loss(%x: tensor<4xf32> {megac.param = {name = "x", init = "zeros"}},
                    %y: tensor<2x8xi32> {megac.input = "labels"}) -> (tensor<4xf32>, tensor<2x8xi32> {megac.name = "loss"}) {
  return %x, %y : tensor<4xf32>, tensor<2x8xi32>
}

// -----

// expected-error@+1 {{megac-autodiff: the result named 'loss' must be a scalar f32 (tensor<f32>), got 'tensor<4xf32>'}}
func.func @vector_loss(%x: tensor<4xf32> {megac.param = {name = "x", init = "zeros"}}) -> (tensor<4xf32> {megac.name = "loss"}) {
  return %x : tensor<4xf32>
}

// -----

// Two results named 'loss': which one to train is not the pass's guess.
// expected-error@+1 {{megac-autodiff: results 0 and 1 are both named 'loss'; name one loss}}
func.func @two_losses(%x: tensor<f32> {megac.param = {name = "x", init = "zeros"}}) -> (tensor<f32> {megac.name = "loss"}, tensor<f32> {megac.name = "loss"}) {
  return %x, %x : tensor<f32>, tensor<f32>
}

// -----

// Tests that a function that returns gradients is not differentiated
// again (each gradient would be returned twice).
// expected-error@+1 {{megac-autodiff: the function is differentiated already (it returns 'grad:x'); give the forward model}}
func.func @twice(%x: tensor<4x1x8xf32> {megac.param = {name = "x", init = "zeros"}},
                 %y: tensor<4x1xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}, tensor<4x1x8xf32> {megac.name = "grad:x"}) {
  %0 = megac.cross_entropy %x, %y : (tensor<4x1x8xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %0, %x : tensor<f32>, tensor<4x1x8xf32>
}

// -----

// Tests that dynamic shapes are refused with a message (a gradient op
// built from them aborted): megac-specialize-shapes makes them static.
// expected-error@+1 {{megac-autodiff needs static shapes (megac-specialize-shapes gives them): argument 0 has type 'tensor<?x?x64xf32>'}}
func.func @dynamic_argument(%q: tensor<?x?x64xf32>, %labels: tensor<2x4xi32> {megac.input = "labels"}) -> tensor<f32> {
  %l = megac.cross_entropy %q, %labels : (tensor<?x?x64xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @dynamic_result(%q: tensor<2x4x8xf32>, %labels: tensor<2x4xi32> {megac.input = "labels"}) -> tensor<f32> {
  // expected-error@+1 {{megac-autodiff needs static shapes (megac-specialize-shapes gives them): this result has type 'tensor<?x4x8xf32>'}}
  %d = builtin.unrealized_conversion_cast %q : tensor<2x4x8xf32> to tensor<?x4x8xf32>
  %l = megac.cross_entropy %d, %labels : (tensor<?x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
