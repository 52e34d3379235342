// Ops that passes write for a training step, written in a model
// (compile-errors.test).
func.func @forward(%w: tensor<4x4xf32> {megac.param = {name = "w", init = "ones"}}) -> (tensor<4x4xf32> {megac.name = "y"}) {
  %x = megac.assign %w, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  return %x : tensor<4x4xf32>
}
