// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-accumulate-micro-batches=micro-batches=2 -verify-diagnostics | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-accumulate-micro-batches=micro-batches=1 -verify-diagnostics | FileCheck %s --check-prefix=ONE

// Tests that the loss is summed right after it is computed (the forward
// part stays short) and every gradient right before the return, and that
// the module records the micro-batch count for the plan.
// CHECK: module attributes {megac.micro_batches = 2 : i64}
// CHECK-LABEL: func.func @mlp
// CHECK: %[[LOSS:.*]] = megac.cross_entropy
// CHECK-NEXT: %[[SUM:.*]] = megac.accumulate %[[LOSS]] : (tensor<f32>) -> tensor<f32>
// CHECK: %[[DW:.*]] = megac.linear_weight_grad
// CHECK-NEXT: %[[ADW:.*]] = megac.accumulate %[[DW]] : (tensor<16x32xf32>) -> tensor<16x32xf32>
// CHECK-NEXT: %[[ADB:.*]] = megac.accumulate %{{.*}} : (tensor<32xf32>) -> tensor<32xf32>
// CHECK-NEXT: return %[[SUM]], %[[ADW]], %[[ADB]]
// One micro-batch needs no accumulation.
// ONE-NOT: megac.accumulate
// ONE-NOT: megac.micro_batches
func.func @mlp(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}},
               %b: tensor<32xf32> {megac.param = {name = "b", init = "zeros"}},
               %x: tensor<4x16xf32>,
               %labels: tensor<4x1xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
  %1 = megac.add %0, %b : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32>
  %3 = megac.reshape %1 {shape = array<i64: 4, 1, 32>} : (tensor<4x32xf32>) -> tensor<4x1x32xf32>
  %4 = megac.cross_entropy %3, %labels : (tensor<4x1x32xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %4 : tensor<f32>
}
