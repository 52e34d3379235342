// RUN: megac-opt %s --split-input-file --megac-sequence-parallel | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-sequence-parallel --megac-propagate-sharding --megac-insert-collectives | FileCheck %s --check-prefix=COLL

// Tests the pins of sequence parallelism: the LayerNorm input (residual
// stream) and the row-parallel product's partial sum, each right after it
// is produced; the column-parallel product is left alone.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @block
  // COLL-LABEL: func.func @block
  func.func @block(%x: tensor<2x8x16xf32>, %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                   %w1: tensor<16x32xf32> {megac.param = {name = "w1", init = "zeros"}, megac.sharding = #megac.sharding<[_, tp]>},
                   %w2: tensor<32x16xf32> {megac.param = {name = "w2", init = "zeros"}, megac.sharding = #megac.sharding<[tp, _]>}) -> tensor<2x8x16xf32> {
    // CHECK: %[[X:.*]] = megac.sharding_constraint %arg0 {sharding = #megac.sharding<[_, tp, _]>}
    // CHECK-NEXT: megac.layer_norm %[[X]]
    %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    // CHECK-NEXT: megac.linear
    // CHECK-NOT: sharding_constraint
    %h = megac.linear %n, %w1 : (tensor<2x8x16xf32>, tensor<16x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: %[[Y:.*]] = megac.linear
    // CHECK-NEXT: %[[P:.*]] = megac.sharding_constraint %[[Y]] {sharding = #megac.sharding<[_, tp, _]>}
    // CHECK-NEXT: megac.add %[[X]], %[[P]]
    %y = megac.linear %h, %w2 : (tensor<2x8x32xf32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
    %r = megac.add %x, %y : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    return %r : tensor<2x8x16xf32>
  }
  // After propagation: the stream is sliced (it arrives whole), the
  // column-parallel product gathers its sequence-split input (the weight
  // keeps its split), and the row-parallel partial sum is reduce-scattered
  // into the stream; the result is gathered for the return.
  // COLL: megac.slice_shard %arg0 {axis = "tp", dim = 1 : i64
  // COLL: megac.layer_norm
  // COLL-NEXT: %[[G:.*]] = megac.all_gather %{{.*}} {axis = "tp", dim = 1 : i64
  // COLL-NEXT: megac.linear %[[G]], %arg2
  // COLL: megac.linear
  // COLL-NEXT: megac.reduce_scatter %{{.*}} {axis = "tp", dim = 1 : i64
  // COLL-NOT: megac.all_reduce
}

// -----

// Tests that without the axis nothing changes.
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  // CHECK-LABEL: func.func @no_tp
  // CHECK-NOT: sharding_constraint
  func.func @no_tp(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>) -> tensor<2x8x16xf32> {
    %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    return %n : tensor<2x8x16xf32>
  }
}

// -----

// Tests that with data parallelism the pin keeps the batch split over dp
// (the data inputs' split), adding only the sequence split over tp: every
// dp rank works on its own rows, not on the whole batch.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
  // CHECK-LABEL: func.func @data_parallel
  func.func @data_parallel(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "zeros"}, megac.sharding = #megac.sharding<[tp, _]>},
                           %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                           %ids: tensor<4x8xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>}) -> tensor<4x8x16xf32> {
    // CHECK: megac.embedding
    // CHECK-NEXT: megac.sharding_constraint %{{.*}} {sharding = #megac.sharding<[dp, tp, _]>}
    %x = megac.embedding %wte, %ids : (tensor<64x16xf32>, tensor<4x8xi32>) -> tensor<4x8x16xf32>
    %n = megac.layer_norm %x, %g, %g : (tensor<4x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x8x16xf32>
    return %n : tensor<4x8x16xf32>
  }
}
