// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-accumulate-micro-batches=micro-batches=2 -verify-diagnostics | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-accumulate-micro-batches=micro-batches=1 -verify-diagnostics | FileCheck %s --check-prefix=ONE
// RUN: megac-opt %s --split-input-file --megac-autodiff '--megac-accumulate-micro-batches=micro-batches=2 stack-rows=false' -verify-diagnostics | FileCheck %s --check-prefix=NOSTACK

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

// -----

// A result with a row per micro-batch row (the logits, computed from the
// data inputs) becomes the whole step's rows, stacked right where it is
// computed (generation runs the forward part alone); a result that reads
// no data input stays as it is.
// CHECK-LABEL: func.func @logits
// CHECK-SAME: -> (tensor<f32> {megac.name = "loss"}, tensor<8x32xf32> {megac.name = "logits"}, tensor<32xf32> {megac.name = "bias"}
// CHECK: %[[Y:.*]] = megac.add
// CHECK-NEXT: %[[ROWS:.*]] = megac.stack_micro_batches %[[Y]] {count = 2 : i64} : (tensor<4x32xf32>) -> tensor<8x32xf32>
// CHECK: return %{{[0-9]+}}, %[[ROWS]], %{{[0-9]+}},
// ONE-LABEL: func.func @logits
// ONE-NOT: megac.stack_micro_batches
// A training step's logits, which only generation reads, stay unstacked:
// NOSTACK-LABEL: func.func @logits
// NOSTACK-SAME: tensor<4x32xf32> {megac.name = "logits"}
// NOSTACK-NOT: megac.stack_micro_batches
func.func @logits(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}},
                  %b: tensor<32xf32> {megac.param = {name = "b", init = "zeros"}},
                  %x: tensor<4x16xf32>,
                  %labels: tensor<4x1xi32> {megac.input = "labels"})
    -> (tensor<f32> {megac.name = "loss"}, tensor<4x32xf32> {megac.name = "logits"}, tensor<32xf32> {megac.name = "bias"}) {
  %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
  %1 = megac.add %0, %b : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32>
  %3 = megac.reshape %1 {shape = array<i64: 4, 1, 32>} : (tensor<4x32xf32>) -> tensor<4x1x32xf32>
  %4 = megac.cross_entropy %3, %labels : (tensor<4x1x32xf32>, tensor<4x1xi32>) -> tensor<f32>
  %5 = megac.add %b, %b : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
  return %4, %1, %5 : tensor<f32>, tensor<4x32xf32>, tensor<32xf32>
}
