func.func @f(%x: tensor<4x8xf32> {megac.param = {name = "x", init = "ones"}}) -> tensor<4x8xf32> {
  %0 = megac.gelu %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func @g(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  return %x : tensor<4x8xf32>
}
