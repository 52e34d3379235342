// A sum over micro-batches, written in a model (compile-errors.test).
func.func @forward(%w: tensor<2x4x8xf32> {megac.param = {name = "w", init = "ones"}}) -> (tensor<4x4x8xf32> {megac.name = "y"}) {
  %a = megac.stack_micro_batches %w {count = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<4x4x8xf32>
  return %a : tensor<4x4x8xf32>
}
