func.func @f(%x: tensor<4x8xf32> {megac.param = {name = "x", init = "ones"}}) -> tensor<4x8xf32> {
  %c = arith.constant 1.0 : f32
  return %x : tensor<4x8xf32>
}
