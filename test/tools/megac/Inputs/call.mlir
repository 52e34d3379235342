func.func @f(%x: tensor<4x8xf32> {megac.param = {name = "x", init = "ones"}}) -> tensor<4x8xf32> {
  %0 = func.call @f(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
