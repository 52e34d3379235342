// A hand-written model (not from `megac import`) that uses ops GPT-2 does
// not: a whole bias sliced to meet a split activation, a scaling, a
// transpose and a batched product of a partial sum with itself, a softmax.
module attributes {megac.model = "handwritten"} {
  func.func @forward(
      %wte: tensor<64x32xf32> {megac.param = {name = "wte", init = "normal", std = 0.5 : f64},
                               megac.sharding = #megac.sharding<[tp, _]>},
      %w1: tensor<32x64xf32> {megac.param = {name = "w1", init = "normal", std = 0.2 : f64},
                              megac.sharding = #megac.sharding<[_, tp]>},
      %b1: tensor<64xf32> {megac.param = {name = "b1", init = "normal", std = 0.1 : f64}},
      %scale: tensor<64xf32> {megac.param = {name = "scale", init = "ones"},
                              megac.sharding = #megac.sharding<[tp]>},
      %w2: tensor<64x32xf32> {megac.param = {name = "w2", init = "normal", std = 0.2 : f64},
                              megac.sharding = #megac.sharding<[tp, _]>},
      %ids: tensor<2x8xi32> {megac.input = "tokens"})
      -> (tensor<2x8x32xf32> {megac.name = "y"}, tensor<2x8x8xf32> {megac.name = "probs"}) {
    %x = megac.embedding %wte, %ids : (tensor<64x32xf32>, tensor<2x8xi32>) -> tensor<2x8x32xf32>
    %h = megac.linear %x, %w1 : (tensor<2x8x32xf32>, tensor<32x64xf32>) -> tensor<2x8x64xf32>
    %hb = megac.add %h, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %m = megac.mul %hb, %scale : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %g = megac.gelu %m : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    %y = megac.linear %g, %w2 : (tensor<2x8x64xf32>, tensor<64x32xf32>) -> tensor<2x8x32xf32>
    %t = megac.transpose %y {permutation = array<i64: 0, 2, 1>} : (tensor<2x8x32xf32>) -> tensor<2x32x8xf32>
    %s = megac.matmul %y, %t : (tensor<2x8x32xf32>, tensor<2x32x8xf32>) -> tensor<2x8x8xf32>
    %p = megac.softmax %s : (tensor<2x8x8xf32>) -> tensor<2x8x8xf32>
    return %y, %p : tensor<2x8x32xf32>, tensor<2x8x8xf32>
  }
}
