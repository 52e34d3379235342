// RUN: megac-opt %s --split-input-file --megac-propagate-sharding --megac-split-cross-entropy --megac-propagate-sharding | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-propagate-sharding --megac-split-cross-entropy --megac-propagate-sharding --megac-insert-collectives --megac-localize-shapes | FileCheck %s --check-prefix=LOCAL

// Tests the loss and its gradient over logits split on the vocabulary (a
// vocabulary-parallel output layer): both read one set of per-block
// statistics, 2 blocks for tp = 2, split like the logits; the loss needs
// them whole (gathered), the gradient stays split.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @split_vocabulary
  func.func @split_vocabulary(%x: tensor<4x8x16xf32>, %wte: tensor<64x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                              %labels: tensor<4x8xi32>) -> (tensor<f32>, tensor<64x16xf32>) {
    // CHECK: %[[LOGITS:.*]] = megac.linear
    // CHECK-SAME: megac.sharding = #megac.sharding<[_, _, tp]>
    %logits = megac.linear %x, %wte {transpose_weight} : (tensor<4x8x16xf32>, tensor<64x16xf32>) -> tensor<4x8x64xf32>
    // CHECK-NEXT: %[[STATS:.*]] = megac.cross_entropy_stats %[[LOGITS]], %arg2
    // CHECK-SAME: megac.sharding = #megac.sharding<[_, _, tp]>, shards = 2 : i64}
    // CHECK-SAME: -> tensor<4x8x6xf32>
    // CHECK-NEXT: %[[LOSS:.*]] = megac.cross_entropy_from_stats %[[STATS]]
    // CHECK-SAME: megac.operand_shardings = [#megac.sharding<[_, _, _]>]
    // CHECK-NOT: megac.cross_entropy
    %loss = megac.cross_entropy %logits, %labels : (tensor<4x8x64xf32>, tensor<4x8xi32>) -> tensor<f32>
    %one = megac.fill {shape = array<i64>, value = 1.0 : f64} : () -> tensor<f32>
    // CHECK: %[[DL:.*]] = megac.cross_entropy_grad %[[LOGITS]], %arg2, %{{.*}}, %[[STATS]]
    // CHECK-SAME: megac.operand_shardings = [#megac.sharding<[_, _, tp]>, #megac.sharding<[_, _]>, #megac.sharding<[]>, #megac.sharding<[_, _, _]>]
    // CHECK-SAME: megac.sharding = #megac.sharding<[_, _, tp]>
    %dl = megac.cross_entropy_grad %logits, %labels, %one : (tensor<4x8x64xf32>, tensor<4x8xi32>, tensor<f32>) -> tensor<4x8x64xf32>
    // CHECK: %[[DW:.*]] = megac.linear_weight_grad %arg0, %[[DL]]
    // CHECK-SAME: megac.sharding = #megac.sharding<[tp, _]>
    %dw = megac.linear_weight_grad %x, %dl {transpose_weight} : (tensor<4x8x16xf32>, tensor<4x8x64xf32>) -> tensor<64x16xf32>
    // CHECK: return {{.*}} %[[LOSS]], %[[DW]]
    return %loss, %dw : tensor<f32>, tensor<64x16xf32>
  }
}

// After partitioning: each rank computes its block's 3 numbers per token,
// and one all-gather of those (not of the logits) serves the loss and the
// gradient.
// LOCAL-LABEL: func.func @split_vocabulary
// LOCAL: %[[LOGITS:.*]] = megac.linear {{.*}} -> tensor<4x8x32xf32>
// LOCAL-NEXT: %[[STATS:.*]] = megac.cross_entropy_stats %[[LOGITS]], %arg2 {{.*}}shards = 1 : i64} : (tensor<4x8x32xf32>, tensor<4x8xi32>) -> tensor<4x8x3xf32>
// LOCAL-NEXT: %[[ALL:.*]] = megac.all_gather %[[STATS]] {axis = "tp", dim = 2 : i64{{.*}} -> tensor<4x8x6xf32>
// LOCAL-NEXT: megac.cross_entropy_from_stats %[[ALL]]
// LOCAL: megac.cross_entropy_grad %[[LOGITS]], %arg2, %{{.*}}, %[[ALL]] {{.*}} -> tensor<4x8x32xf32>
// LOCAL-NOT: megac.all_gather {{.*}} tensor<4x8x64xf32>

// -----

// Tests that logits already gathered whole for another user (returned)
// keep the plain loss on that gathered copy: statistics would add a
// collective and save none.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @gathered_anyway
  // LOCAL-LABEL: func.func @gathered_anyway
  func.func @gathered_anyway(%x: tensor<4x8x16xf32>, %wte: tensor<64x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                             %labels: tensor<4x8xi32>) -> (tensor<f32>, tensor<4x8x64xf32>) {
    %logits = megac.linear %x, %wte {transpose_weight} : (tensor<4x8x16xf32>, tensor<64x16xf32>) -> tensor<4x8x64xf32>
    // CHECK-NOT: megac.cross_entropy_stats
    // CHECK: megac.cross_entropy %
    %loss = megac.cross_entropy %logits, %labels : (tensor<4x8x64xf32>, tensor<4x8xi32>) -> tensor<f32>
    return %loss, %logits : tensor<f32>, tensor<4x8x64xf32>
  }
}

// -----

// Tests that whole logits (no split vocabulary) are left alone.
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  // CHECK-LABEL: func.func @whole_vocabulary
  func.func @whole_vocabulary(%logits: tensor<4x8x64xf32> {megac.sharding = #megac.sharding<[dp, _, _]>},
                              %labels: tensor<4x8xi32> {megac.sharding = #megac.sharding<[dp, _]>}) -> tensor<f32> {
    // CHECK-NOT: megac.cross_entropy_stats
    // CHECK: megac.cross_entropy %arg0, %arg1
    %loss = megac.cross_entropy %logits, %labels : (tensor<4x8x64xf32>, tensor<4x8xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Tests that a padded vocabulary's classes reach the statistics and the
// split gradient (each rank leaves out the padding in its block).
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @padded
  // LOCAL-LABEL: func.func @padded
  func.func @padded(%x: tensor<4x8x16xf32>, %wte: tensor<64x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                    %labels: tensor<4x8xi32>) -> (tensor<f32>, tensor<64x16xf32>) {
    %logits = megac.linear %x, %wte {transpose_weight} : (tensor<4x8x16xf32>, tensor<64x16xf32>) -> tensor<4x8x64xf32>
    // CHECK: megac.cross_entropy_stats {{.*}}{classes = 50 : i64,
    // LOCAL: megac.cross_entropy_stats {{.*}}{classes = 50 : i64,{{.*}} -> tensor<4x8x3xf32>
    %loss = megac.cross_entropy %logits, %labels {classes = 50 : i64} : (tensor<4x8x64xf32>, tensor<4x8xi32>) -> tensor<f32>
    %one = megac.fill {shape = array<i64>, value = 1.0 : f64} : () -> tensor<f32>
    // CHECK: megac.cross_entropy_grad {{.*}}{classes = 50 : i64,
    // LOCAL: megac.cross_entropy_grad {{.*}}{classes = 50 : i64,{{.*}} -> tensor<4x8x32xf32>
    %dl = megac.cross_entropy_grad %logits, %labels, %one {classes = 50 : i64} : (tensor<4x8x64xf32>, tensor<4x8xi32>, tensor<f32>) -> tensor<4x8x64xf32>
    %dw = megac.linear_weight_grad %x, %dl {transpose_weight} : (tensor<4x8x16xf32>, tensor<4x8x64xf32>) -> tensor<64x16xf32>
    return %loss, %dw : tensor<f32>, tensor<64x16xf32>
  }
}
