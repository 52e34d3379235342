// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-mixed-precision | FileCheck %s
// Run twice, the pass rounds nothing more:
// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-mixed-precision > %t.once.mlir
// RUN: megac-opt %s --split-input-file --megac-autodiff --megac-mixed-precision --megac-mixed-precision > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir

// Tests which values bf16 mixed precision rounds: the parameter's compute
// copy (read by the forward product, while the f32 parameter remains for
// the optimizer), the activations and the activation gradients; not the
// loss, not the weight gradient (f32 main gradients), and a reshape of a
// rounded value is not rounded again.
// CHECK-LABEL: func.func @mlp
// CHECK: %[[W:.*]] = megac.round_bf16 %arg0 : (tensor<16x32xf32>)
// CHECK: %[[X:.*]] = megac.round_bf16 %arg2 : (tensor<4x16xf32>)
// CHECK: %[[Y:.*]] = megac.linear %[[X]], %[[W]]
// CHECK-NEXT: %[[YR:.*]] = megac.round_bf16 %[[Y]]
// CHECK-NEXT: %[[H:.*]] = megac.gelu %[[YR]]
// CHECK-NEXT: %[[HR:.*]] = megac.round_bf16 %[[H]]
// CHECK-NEXT: megac.reshape %[[HR]]
// CHECK-NEXT: %[[LOSS:.*]] = megac.cross_entropy
// CHECK-NEXT: megac.fill
// CHECK-NEXT: %[[DL:.*]] = megac.cross_entropy_grad
// CHECK-NEXT: %[[DLR:.*]] = megac.round_bf16 %[[DL]]
// CHECK-NEXT: megac.reshape %[[DLR]]
// CHECK-NEXT: %[[DH:.*]] = megac.gelu_grad
// CHECK-NEXT: %[[DHR:.*]] = megac.round_bf16 %[[DH]]
// The input gradient is an activation gradient (bf16); the weight
// gradient stays f32:
// CHECK-NEXT: %[[DX:.*]] = megac.linear %[[DHR]], %[[W]] {transpose_weight}
// CHECK-NEXT: %[[DXR:.*]] = megac.round_bf16 %[[DX]]
// CHECK-NEXT: %[[DW:.*]] = megac.linear_weight_grad %[[X]], %[[DHR]]
// CHECK-NEXT: return %[[LOSS]], %[[DW]], %[[DXR]]
func.func @mlp(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}},
               %labels: tensor<4x1xi32> {megac.input = "labels"},
               %x: tensor<4x16xf32> {megac.param = {name = "x", init = "normal", std = 1.0 : f64}}) -> (tensor<f32> {megac.name = "loss"}) {
  %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
  %2 = megac.gelu %0 : (tensor<4x32xf32>) -> tensor<4x32xf32>
  %3 = megac.reshape %2 {shape = array<i64: 4, 1, 32>} : (tensor<4x32xf32>) -> tensor<4x1x32xf32>
  %4 = megac.cross_entropy %3, %labels : (tensor<4x1x32xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %4 : tensor<f32>
}

// -----

// Tests the other weight gradients: a LayerNorm gain's and bias's (sums
// over tokens) and the tied embedding's two contributions and their sum
// stay f32.
// CHECK-LABEL: func.func @block
// CHECK: %[[GG:.*]] = megac.layer_norm_gain_grad
// CHECK-NEXT: %[[GB:.*]] = megac.sum_leading
// CHECK-NOT: megac.round_bf16 %[[GG]]
// CHECK-NOT: megac.round_bf16 %[[GB]]
// CHECK: %[[E:.*]] = megac.embedding_grad
// CHECK-NEXT: %[[T:.*]] = megac.add %{{.*}}, %[[E]]
// CHECK-NEXT: return %{{.*}}, %[[T]],
func.func @block(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                 %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                 %ids: tensor<2x8xi32> {megac.input = "tokens"},
                 %labels: tensor<2x8xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %x = megac.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %l = megac.linear %n, %wte {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = megac.cross_entropy %l, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
