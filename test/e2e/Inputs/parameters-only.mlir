// A model without data inputs: a function of its parameters only.
func.func @f(%x: tensor<4x8xf32> {megac.param = {name = "x", init = "normal", std = 1.0 : f64}, megac.sharding = #megac.sharding<[_, tp]>}) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = megac.gelu %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0, %x : tensor<4x8xf32>, tensor<4x8xf32>
}
