// RUN: megac-opt %s --split-input-file --megac-localize-shapes -verify-diagnostics

// Tests that localizing twice is refused (shapes would shrink again).
// expected-error@+1 {{the module is already localized}}
module attributes {megac.localized, megac.mesh = #megac.mesh<tp = 2>} {
}

// -----

// Tests that an op without the shardings propagation chooses is refused:
// the split argument would shrink under a product whose type stays global.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @unpropagated(%x: tensor<4x16xf32>,
                          %w: tensor<16x32xf32> {megac.sharding = #megac.sharding<[_, tp]>}) -> tensor<4x32xf32> {
    // expected-error@+1 {{'megac.linear' op has no shardings; run megac-propagate-sharding before megac-localize-shapes}}
    %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
    return %0 : tensor<4x32xf32>
  }
}

// -----

// Tests that an operand not as its op requires is refused: without
// megac-insert-collectives the split product would meet the softmax's
// whole-row requirement unreduced (once localized silently).
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @uncollected(%x: tensor<4x16xf32> {megac.sharding = #megac.sharding<[_, tp]>}) -> tensor<4x16xf32> {
    // expected-error@+1 {{'megac.softmax' op operand 0 is #megac.sharding<[_, tp]> but the op requires #megac.sharding<[_, _]>; run megac-insert-collectives before megac-localize-shapes}}
    %0 = megac.softmax %x {megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _]>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return %0 : tensor<4x16xf32>
  }
}
