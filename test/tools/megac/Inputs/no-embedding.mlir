func.func @f(%wpe: tensor<32x8xf32> {megac.param = {name = "wpe", init = "ones"}},
             %ids: tensor<2x4xi32> {megac.input = "tokens"}) -> tensor<4x8xf32> {
  %0 = megac.position_embedding %wpe, %ids : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
