func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = megac.gelu %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
