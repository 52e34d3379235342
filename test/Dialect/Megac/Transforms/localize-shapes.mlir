// RUN: megac-opt %s --split-input-file --megac-localize-shapes | FileCheck %s

// Tests that split dimensions shrink by their axis size, in the signature
// and in results; attention keeps only its local heads; an all-gather's
// result stays whole, so its operand is the smaller.
// CHECK: module attributes {megac.localized, megac.mesh = #megac.mesh<tp = 4>}
module attributes {megac.mesh = #megac.mesh<tp = 4>} {
  // CHECK-LABEL: func.func @local
  // CHECK-SAME: (%{{.*}}: tensor<2x8x32xf32> {{.*}}, %{{.*}}: tensor<32x8xf32> {{.*}}) -> tensor<2x8x32xf32>
  func.func @local(%x: tensor<2x8x32xf32> {megac.sharding = #megac.sharding<[_, _, _]>},
                   %w: tensor<32x32xf32> {megac.sharding = #megac.sharding<[_, tp]>}) -> tensor<2x8x32xf32> {
    // CHECK: megac.linear {{.*}} -> tensor<2x8x8xf32>
    %q = megac.linear %x, %w {megac.sharding = #megac.sharding<[_, _, tp]>} : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: megac.attention {{.*}}num_heads = 1 : i64{{.*}} -> tensor<2x8x8xf32>
    %a = megac.attention %q, %q, %q {num_heads = 4 : i64, megac.sharding = #megac.sharding<[_, _, tp]>} : (tensor<2x8x32xf32>, tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: megac.all_gather {{.*}} : (tensor<2x8x8xf32>) -> tensor<2x8x32xf32>
    %g = megac.all_gather %a {axis = "tp", dim = 2 : i64, megac.sharding = #megac.sharding<[_, _, _]>} : (tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
    return %g : tensor<2x8x32xf32>
  }
}

// -----

// Tests that a module without a grid is one rank: nothing changes but the mark.
// CHECK: module attributes {megac.localized}
// CHECK: megac.gelu {{.*}} -> tensor<4x16xf32>
func.func @single(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %0 = megac.gelu %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// -----

// Tests that a reshape's and a fill's shape attribute, which is their
// result's shape, becomes the local one (a reshape after a dp-split
// embedding once failed reshape_c1 here).
// CHECK-LABEL: func.func @shape_attributes
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  func.func @shape_attributes(%x: tensor<2x8xf32> {megac.sharding = #megac.sharding<[dp, _]>}) -> tensor<2x2x4xf32> {
    // CHECK: megac.reshape %{{.*}} {{{.*}}shape = array<i64: 1, 2, 4>} : (tensor<1x8xf32>) -> tensor<1x2x4xf32>
    %0 = megac.reshape %x {shape = array<i64: 2, 2, 4>, megac.sharding = #megac.sharding<[dp, _, _]>} : (tensor<2x8xf32>) -> tensor<2x2x4xf32>
    // CHECK: megac.fill {{{.*}}shape = array<i64: 1, 2, 4>{{.*}}} : () -> tensor<1x2x4xf32>
    %1 = megac.fill {shape = array<i64: 2, 2, 4>, value = 1.0 : f64, megac.sharding = #megac.sharding<[dp, _, _]>} : () -> tensor<2x2x4xf32>
    %2 = megac.add %0, %1 {megac.sharding = #megac.sharding<[dp, _, _]>} : (tensor<2x2x4xf32>, tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    return %2 : tensor<2x2x4xf32>
  }
}
