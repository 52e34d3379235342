// RUN: megac-opt %s --megac-autodiff --megac-recompute=mode=full | FileCheck %s
// RUN: megac-opt %s --megac-autodiff --megac-recompute=mode=selective | FileCheck %s --check-prefix=SELECTIVE
// RUN: not megac-opt %s --megac-autodiff --megac-recompute=mode=most 2>&1 | FileCheck %s --check-prefix=BAD

// Tests full recomputation on one block: the block input (the embedding,
// which enters the LayerNorm that leads to attention) is kept; the
// LayerNorm, the attention and the output product are computed again
// inside the backward pass, once each, and the backward ops read those
// copies. Selective recomputation changes nothing (the fused attention
// always recomputes its probabilities).
// CHECK-LABEL: func.func @block
// CHECK: %[[X:.*]] = megac.embedding
// CHECK: %[[N:.*]] = megac.layer_norm %[[X]]
// CHECK: megac.fill {{.*}}value = 1.0
// CHECK: %[[N2:.*]] = megac.layer_norm %[[X]]
// CHECK: %[[A2:.*]] = megac.attention %[[N2]], %[[N2]], %[[N2]]
// CHECK-NOT: megac.layer_norm %
// CHECK: megac.attention_grad %[[N2]], %[[N2]], %[[N2]]
// SELECTIVE-COUNT-1: megac.layer_norm %
// SELECTIVE-NOT: megac.layer_norm %
// BAD: megac-recompute: mode must be none, selective or full, got 'most'
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
