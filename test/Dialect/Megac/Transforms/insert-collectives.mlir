// RUN: megac-opt %s --split-input-file --megac-insert-collectives | FileCheck %s

// Tests that a partial operand required whole gets one all-reduce.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @all_reduce
  func.func @all_reduce(%x: tensor<4x16xf32>, %b: tensor<16xf32>) -> tensor<4x16xf32> {
    %0 = megac.gelu %x {megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _], partial = [tp]>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    // CHECK: %[[P:.*]] = megac.gelu
    // CHECK-NEXT: %[[R:.*]] = megac.all_reduce %[[P]] {axis = "tp", megac.sharding = #megac.sharding<[_, _]>}
    // CHECK-NEXT: megac.add %[[R]], %{{.*}}
    %1 = megac.add %0, %b {megac.operand_shardings = [#megac.sharding<[_, _]>, #megac.sharding<[_]>], megac.sharding = #megac.sharding<[_, _]>} : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    return {megac.operand_shardings = [#megac.sharding<[_, _]>]} %1 : tensor<4x16xf32>
  }
}

// -----

// Tests that a split value required whole is gathered, once, even with two
// users (the second reuses the first's all-gather).
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @all_gather_shared
  func.func @all_gather_shared(%x: tensor<4x16xf32> {megac.sharding = #megac.sharding<[_, tp]>}) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    // CHECK: %[[G:.*]] = megac.all_gather %{{.*}} {axis = "tp", dim = 1 : i64, megac.sharding = #megac.sharding<[_, _]>}
    // CHECK-NOT: megac.all_gather
    // CHECK: %[[S:.*]] = megac.softmax %[[G]]
    %0 = megac.softmax %x {megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _]>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    // CHECK: return {{.*}} %[[S]], %[[G]]
    return {megac.operand_shardings = [#megac.sharding<[_, _]>, #megac.sharding<[_, _]>]} %0, %x : tensor<4x16xf32>, tensor<4x16xf32>
  }
}

// -----

// Tests that a whole value required split is sliced (no communication), and
// a value split on the wrong axis is gathered and re-sliced.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
  // CHECK-LABEL: func.func @slice_and_reshard
  func.func @slice_and_reshard(%a: tensor<8x16xf32> {megac.sharding = #megac.sharding<[dp, _]>},
                               %b: tensor<8x16xf32>, %c: tensor<8x16xf32> {megac.sharding = #megac.sharding<[tp, _]>}) -> tensor<8x16xf32> {
    // CHECK: %[[SB:.*]] = megac.slice_shard %arg1 {axis = "dp", dim = 0 : i64
    // CHECK: megac.add %arg0, %[[SB]]
    // CHECK: %[[GC:.*]] = megac.all_gather %arg2 {axis = "tp", dim = 0 : i64
    // CHECK: %[[SC:.*]] = megac.slice_shard %[[GC]] {axis = "dp", dim = 0 : i64
    %0 = megac.add %a, %b {megac.operand_shardings = [#megac.sharding<[dp, _]>, #megac.sharding<[dp, _]>], megac.sharding = #megac.sharding<[dp, _]>} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.add %{{.*}}, %[[SC]]
    %1 = megac.add %0, %c {megac.operand_shardings = [#megac.sharding<[dp, _]>, #megac.sharding<[dp, _]>], megac.sharding = #megac.sharding<[dp, _]>} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %1 : tensor<8x16xf32>
  }
}

// -----

// Tests that matching shardings need nothing.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @nothing_to_do
  // CHECK-NOT: megac.all_
  // CHECK-NOT: megac.slice_shard
  func.func @nothing_to_do(%x: tensor<4x16xf32> {megac.sharding = #megac.sharding<[_, tp]>}) -> tensor<4x16xf32> {
    %0 = megac.gelu %x {megac.operand_shardings = [#megac.sharding<[_, tp]>], megac.sharding = #megac.sharding<[_, tp]>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return %0 : tensor<4x16xf32>
  }
}

// -----

// Tests that a partial sum required split over the same axis becomes one
// reduce-scatter (half the traffic of an all-reduce, no slice after it).
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  // CHECK-LABEL: func.func @reduce_scatter
  func.func @reduce_scatter(%g: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = megac.gelu %g {megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _], partial = [dp]>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
    // CHECK: %[[P:.*]] = megac.gelu
    // CHECK-NEXT: %[[S:.*]] = megac.reduce_scatter %[[P]] {axis = "dp", dim = 0 : i64, megac.sharding = #megac.sharding<[dp, _]>}
    // CHECK-NEXT: megac.sharding_constraint %[[S]]
    // CHECK-NOT: megac.all_reduce
    %1 = megac.sharding_constraint %0 {sharding = #megac.sharding<[dp, _]>, megac.operand_shardings = [#megac.sharding<[dp, _]>], megac.sharding = #megac.sharding<[dp, _]>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %1 : tensor<8x16xf32>
  }
}
