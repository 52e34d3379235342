// RUN: megac-opt %s --split-input-file --megac-fuse-elementwise | FileCheck %s

// Tests the kernel groups of a GPT MLP block at inference: the first
// product takes its bias and GeLU as a cuBLASLt epilogue (g0), the second
// its bias (g1). The residual add reads a GEMM group's result, so it stays
// a kernel of its own.
// CHECK-LABEL: func.func @mlp
// CHECK: megac.linear {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.gelu {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add
// CHECK-NOT: megac.fusion
// CHECK: return
func.func @mlp(%x: tensor<2x8x16xf32>, %w1: tensor<16x64xf32>, %b1: tensor<64xf32>,
               %w2: tensor<64x16xf32>, %b2: tensor<16xf32>) -> tensor<2x8x16xf32> {
  %h = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %hb = megac.add %h, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu %hb : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %o = megac.linear %g, %w2 : (tensor<2x8x64xf32>, tensor<64x16xf32>) -> tensor<2x8x16xf32>
  %ob = megac.add %o, %b2 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %y = megac.add %x, %ob : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

// Tests an elementwise chain of a backward pass: three gradient
// contributions summed, scaled, through GeLU's gradient and rounded to
// bf16, all one kernel (e0) that reads its five inputs once and writes one
// result. The pre-activation the training step keeps for the backward pass
// has a second reader, so its GeLU joins no GEMM epilogue; a value read
// twice (the rounded gradient, %twice) ends a chain.
// CHECK-LABEL: func.func @backward
// CHECK: megac.linear
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.gelu
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.add %arg3, %arg4 {megac.fusion = "e0"}
// CHECK-NEXT: megac.add {{.*}} {megac.fusion = "e0"}
// CHECK-NEXT: megac.mul {{.*}} {megac.fusion = "e0"}
// CHECK-NEXT: megac.gelu_grad {{.*}} {megac.fusion = "e0"}
// CHECK-NEXT: megac.round_bf16 {{.*}} {megac.fusion = "e0"}
// CHECK-NEXT: megac.add %{{[0-9]+}}, %arg3 :
// CHECK-NEXT: megac.add
// CHECK-NOT: megac.fusion
func.func @backward(%x: tensor<2x8x16xf32>, %w1: tensor<16x64xf32>, %b1: tensor<64xf32>,
                    %d1: tensor<2x8x64xf32>, %d2: tensor<2x8x64xf32>, %d3: tensor<2x8x64xf32>,
                    %s: tensor<64xf32>) -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %h = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %hb = megac.add %h, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu %hb : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %a = megac.add %d1, %d2 : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %b = megac.add %a, %d3 : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %c = megac.mul %b, %s : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %dg = megac.gelu_grad %hb, %c : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %r = megac.round_bf16 %dg : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %twice = megac.add %r, %d1 : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %t2 = megac.add %twice, %twice : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %g, %t2, %twice, %r : tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>
}

// -----

// Tests that ops on different pipeline stages form no group.
// CHECK-LABEL: func.func @stages
// CHECK-NOT: megac.fusion
func.func @stages(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %x = megac.add %a, %b {megac.stage = array<i64: 0>, megac.phase = "forward"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = megac.gelu %x {megac.stage = array<i64: 1>, megac.phase = "forward"} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
