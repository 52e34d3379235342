// RUN: megac-opt %s --megac-partition-pipeline="mesh=tp=2 batch=2 seq=8" | FileCheck %s

// Tests the whole pipeline on one transformer MLP block: per-rank shapes,
// exactly one all-reduce (after the row-parallel product, before its bias).
// CHECK: module attributes {megac.localized, megac.mesh = #megac.mesh<tp = 2>}
// CHECK-LABEL: func.func @block
// CHECK-SAME: tensor<32x64xf32>
// CHECK-SAME: tensor<64x32xf32>
// CHECK-SAME: tensor<2x8xi32>
// CHECK: megac.linear {{.*}} -> tensor<2x8x64xf32>
// CHECK: megac.gelu {{.*}} -> tensor<2x8x64xf32>
// CHECK: %[[P:.*]] = megac.linear {{.*}} -> tensor<2x8x32xf32>
// CHECK-NEXT: %[[R:.*]] = megac.all_reduce %[[P]] {axis = "tp"
// CHECK-NEXT: megac.add %[[R]]
// CHECK-NOT: megac.all_
func.func @block(%wte: tensor<512x32xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                 %w1: tensor<32x128xf32> {megac.param = {name = "w1", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[_, tp]>},
                 %w2: tensor<128x32xf32> {megac.param = {name = "w2", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[tp, _]>},
                 %b2: tensor<32xf32> {megac.param = {name = "b2", init = "zeros"}},
                 %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?x32xf32> {
  %x = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
  %h = megac.linear %x, %w1 : (tensor<?x?x32xf32>, tensor<32x128xf32>) -> tensor<?x?x128xf32>
  %g = megac.gelu %h : (tensor<?x?x128xf32>) -> tensor<?x?x128xf32>
  %p = megac.linear %g, %w2 : (tensor<?x?x128xf32>, tensor<128x32xf32>) -> tensor<?x?x32xf32>
  %y = megac.add %p, %b2 : (tensor<?x?x32xf32>, tensor<32xf32>) -> tensor<?x?x32xf32>
  return %y : tensor<?x?x32xf32>
}
