// RUN: megac-opt %s --megac-apply-optimizer="lr=0.001 min-lr=0.0001 warmup-steps=5 total-steps=50" | FileCheck %s
// RUN: megac-opt %s --megac-apply-optimizer="max-grad-norm=0" | FileCheck %s --check-prefix=NOCLIP

// Tests that gradient results become in-place AdamW updates: the global
// norm sums the sharded parameter's squares first, the clipping coefficient
// scales every update, matrices decay and vectors do not, the gradient
// results disappear and the schedule is stored for the plan.
// CHECK: module attributes {megac.train = {max_lr = 1.000000e-03 : f64, min_lr = 1.000000e-04 : f64, total_steps = 50 : i64, warmup_steps = 5 : i64}}
// CHECK-LABEL: func.func @step
// CHECK-SAME: -> (tensor<f32> {megac.name = "loss"})
// CHECK: %[[SQW:.*]] = megac.sum_squares %arg3
// CHECK: %[[SQB:.*]] = megac.sum_squares %arg4
// CHECK: %[[TOTAL:.*]] = megac.add %[[SQW]], %[[SQB]]
// CHECK: %[[C:.*]] = megac.clip_coefficient %[[TOTAL]] {max_norm = 1.000000e+00 : f64}
// CHECK: megac.adamw %arg1, %arg4, %[[C]] {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK: megac.adamw %arg0, %arg3, %[[C]] {{.*}}weight_decay = 1.000000e-01 : f64}
// CHECK: return %arg2 : tensor<f32>
// NOCLIP: %[[ONE:.*]] = megac.fill {shape = array<i64>, value = 1.000000e+00 : f64}
// NOCLIP-NOT: sum_squares
// NOCLIP: megac.adamw %arg1, %arg4, %[[ONE]]
func.func @step(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[_, tp]>},
                %b: tensor<32xf32> {megac.param = {name = "b", init = "zeros"}},
                %loss: tensor<f32>, %gw: tensor<16x32xf32>, %gb: tensor<32xf32>)
    -> (tensor<f32> {megac.name = "loss"}, tensor<32xf32> {megac.name = "grad:b"}, tensor<16x32xf32> {megac.name = "grad:w"}) {
  return %loss, %gb, %gw : tensor<f32>, tensor<32xf32>, tensor<16x32xf32>
}
