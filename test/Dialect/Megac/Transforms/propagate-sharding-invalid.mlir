// RUN: megac-opt %s --split-input-file --megac-propagate-sharding -verify-diagnostics

// Tests that a split must divide the annotated dimension.
module attributes {megac.mesh = #megac.mesh<tp = 4>} {
  // expected-error@+1 {{dimension 0 (size 50257) of parameter 'wte.weight' is not divisible by grid axis 'tp' (size 4)}}
  func.func @not_divisible(%wte: tensor<50257x32xf32> {megac.param = {name = "wte.weight", init = "zeros"}, megac.sharding = #megac.sharding<[tp, _]>}) {
    return
  }
}

// -----

// Tests that attention splits only in whole heads.
module attributes {megac.mesh = #megac.mesh<tp = 4>} {
  func.func @heads(%q: tensor<2x8x48xf32> {megac.sharding = #megac.sharding<[_, _, tp]>}) -> tensor<2x8x48xf32> {
    // expected-error@+1 {{cannot split its 6 heads over grid axis 'tp' (size 4): the axis size must divide the heads}}
    %0 = megac.attention %q, %q, %q {num_heads = 6 : i64} : (tensor<2x8x48xf32>, tensor<2x8x48xf32>, tensor<2x8x48xf32>) -> tensor<2x8x48xf32>
    return %0 : tensor<2x8x48xf32>
  }
}

// -----

// Tests that collectives are not accepted in models: they have no rule.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @collective(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    // expected-error@+1 {{has no sharding rule; megac cannot partition it}}
    %0 = megac.all_reduce %x {axis = "tp"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}
