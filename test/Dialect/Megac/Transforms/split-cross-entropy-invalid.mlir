// RUN: megac-opt %s --megac-split-cross-entropy -verify-diagnostics

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
