// RUN: megac-opt %s | megac-opt | FileCheck %s

// Tests that grids, shardings (with partial axes), parameter specs and input
// markers round-trip.
// CHECK: module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 4>}
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 4>} {
  // CHECK-LABEL: func.func @annotated
  // CHECK-SAME: megac.sharding = #megac.sharding<[_, tp]>
  // CHECK-SAME: megac.input = "tokens"
  func.func @annotated(
      %w: tensor<128x512xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64, hf_name = "h.0.mlp.c_fc.weight", hf_offset = array<i64: 0, 0>},
                               megac.sharding = #megac.sharding<[_, tp]>},
      %ids: tensor<4x64xi32> {megac.input = "tokens"}) -> tensor<4x64x512xf32> {
    %x = megac.embedding %w, %ids : (tensor<128x512xf32>, tensor<4x64xi32>) -> tensor<4x64x512xf32>
    // CHECK: megac.sharding = #megac.sharding<[_, _, tp], partial = [dp]>
    %y = megac.gelu %x {megac.sharding = #megac.sharding<[_, _, tp], partial = [dp]>} : (tensor<4x64x512xf32>) -> tensor<4x64x512xf32>
    return %y : tensor<4x64x512xf32>
  }
}
