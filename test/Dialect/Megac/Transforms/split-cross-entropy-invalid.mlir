// RUN: megac-opt %s --split-input-file --megac-split-cross-entropy -verify-diagnostics

// Tests that logits split over a vocabulary the split does not divide are
// refused with a message when the pass runs without propagation before it
// (which refuses such a split): it aborted creating the statistics.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @indivisible(%logits: tensor<2x4x3xf32> {megac.sharding = #megac.sharding<[_, _, tp]>}, %labels: tensor<2x4xi32>) -> tensor<f32> {
    // expected-error@+1 {{the logits' vocabulary (3) cannot be split 2 ways: 2 does not divide it}}
    %0 = megac.cross_entropy %logits, %labels : (tensor<2x4x3xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// Tests that a dynamic vocabulary is named as such.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @dynamic(%logits: tensor<2x4x?xf32> {megac.sharding = #megac.sharding<[_, _, tp]>}, %labels: tensor<2x4xi32>) -> tensor<f32> {
    // expected-error@+1 {{the logits' vocabulary is split 2 ways but its size is dynamic (megac-specialize-shapes makes it static)}}
    %0 = megac.cross_entropy %logits, %labels : (tensor<2x4x?xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// The loss's gradient alone is checked alike.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @gradient(%logits: tensor<2x4x3xf32> {megac.sharding = #megac.sharding<[_, _, tp]>}, %labels: tensor<2x4xi32>, %one: tensor<f32>) -> tensor<2x4x3xf32> {
    // expected-error@+1 {{the logits' vocabulary (3) cannot be split 2 ways: 2 does not divide it}}
    %dl = megac.cross_entropy_grad %logits, %labels, %one : (tensor<2x4x3xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<2x4x3xf32>
    return %dl : tensor<2x4x3xf32>
  }
}
