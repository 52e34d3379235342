// RUN: megac-opt %s --split-input-file --megac-autodiff | FileCheck %s

// Tests the backward pass of a small model: the loss gradient seeds at 1,
// each op contributes its vector-Jacobian product in reverse order
// (reshape's inverse, GeLU's derivative, the bias gradient summed over
// tokens, both products of the linear layer), and every parameter gets a
// gradient result, zeros when it does not affect the loss.
// CHECK-LABEL: func.func @mlp
// CHECK-SAME: -> (tensor<f32> {megac.name = "loss"}, tensor<16x32xf32> {megac.name = "grad:w"}, tensor<32xf32> {megac.name = "grad:b"}, tensor<8xf32> {megac.name = "grad:unused"}, tensor<4x16xf32> {megac.name = "grad:x"})
// CHECK: %[[H:.*]] = megac.add
// CHECK: %[[LOSS:.*]] = megac.cross_entropy %[[LOGITS:.*]], %[[LABELS:.*]] :
// CHECK: %[[ONE:.*]] = megac.fill {shape = array<i64>, value = 1.000000e+00 : f64} : () -> tensor<f32>
// CHECK: %[[DL:.*]] = megac.cross_entropy_grad %[[LOGITS]], %[[LABELS]], %[[ONE]]
// CHECK: %[[DG:.*]] = megac.reshape %[[DL]] {shape = array<i64: 4, 32>}
// CHECK: %[[DH:.*]] = megac.gelu_grad %[[H]], %[[DG]]
// CHECK: %[[DB:.*]] = megac.sum_leading %[[DH]] {keep = 1 : i64} : (tensor<4x32xf32>) -> tensor<32xf32>
// CHECK: %[[DX:.*]] = megac.linear %[[DH]], %arg0 {transpose_weight}
// CHECK: %[[DW:.*]] = megac.linear_weight_grad %arg3, %[[DH]] : (tensor<4x16xf32>, tensor<4x32xf32>) -> tensor<16x32xf32>
// CHECK: %[[Z:.*]] = megac.fill {shape = array<i64: 8>, value = 0.000000e+00 : f64}
// CHECK: return %[[LOSS]], %[[DW]], %[[DB]], %[[Z]], %[[DX]]
func.func @mlp(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}},
               %b: tensor<32xf32> {megac.param = {name = "b", init = "zeros"}},
               %unused: tensor<8xf32> {megac.param = {name = "unused", init = "zeros"}},
               %x: tensor<4x16xf32> {megac.param = {name = "x", init = "normal", std = 1.0 : f64}},
               %labels: tensor<4x1xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
  %1 = megac.add %0, %b : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32>
  %2 = megac.gelu %1 : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %3 = megac.reshape %2 {shape = array<i64: 4, 1, 32>} : (tensor<4x32xf32>) -> tensor<4x1x32xf32>
  %4 = megac.cross_entropy %3, %labels : (tensor<4x1x32xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

// Tests gradient accumulation for a value with several users (the sum of
// their contributions, in reverse program order), LayerNorm's three
// gradients (the gain's in one op over x and dy, no x-hat), attention's
// three, and the tied embedding's two.
// CHECK-LABEL: func.func @block
// CHECK: megac.attention_grad {{.*}}operand = 0
// CHECK: megac.attention_grad {{.*}}operand = 1
// CHECK: megac.attention_grad {{.*}}operand = 2
// CHECK: %[[DA:.*]] = megac.add
// CHECK-NEXT: megac.add %[[DA]]
// CHECK: megac.layer_norm_grad %[[LNX:[0-9a-z_]+]], %{{[0-9a-z_]+}}, %[[LNDY:[0-9a-z_]+]] :
// CHECK-NEXT: megac.layer_norm_gain_grad %[[LNX]], %[[LNDY]] : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16xf32>
// CHECK-NEXT: megac.sum_leading %[[LNDY]] {keep = 1 : i64}
// CHECK-NOT: megac.normalize
// CHECK: megac.embedding_grad
// CHECK: return
func.func @block(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                 %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                 %ids: tensor<2x8xi32> {megac.input = "tokens"},
                 %labels: tensor<2x8xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %x = megac.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %a = megac.attention %n, %n, %n {num_heads = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %l = megac.linear %a, %wte {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = megac.cross_entropy %l, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
