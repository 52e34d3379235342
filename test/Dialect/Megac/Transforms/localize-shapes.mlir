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
