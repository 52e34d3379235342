// A hand-written model with reshapes after a data-parallel split (the
// batch rows): each rank reshapes its own rows (reshape-dp.test).
module {
  func.func @forward(%w: tensor<16x8xf32> {megac.param = {init = "normal", std = 0.02 : f64, name = "wte.weight"}},
               %tok: tensor<4x4xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>},
               %lab: tensor<4x4xi32> {megac.input = "labels", megac.sharding = #megac.sharding<[dp, _]>}) -> (tensor<f32> {megac.name = "loss"}) {
    %e = megac.embedding %w, %tok : (tensor<16x8xf32>, tensor<4x4xi32>) -> tensor<4x4x8xf32>
    %r = megac.reshape %e {shape = array<i64: 4, 4, 2, 4>} : (tensor<4x4x8xf32>) -> tensor<4x4x2x4xf32>
    %r2 = megac.reshape %r {shape = array<i64: 4, 4, 8>} : (tensor<4x4x2x4xf32>) -> tensor<4x4x8xf32>
    %l = megac.linear %r2, %w {transpose_weight} : (tensor<4x4x8xf32>, tensor<16x8xf32>) -> tensor<4x4x16xf32>
    %loss = megac.cross_entropy %l, %lab : (tensor<4x4x16xf32>, tensor<4x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
