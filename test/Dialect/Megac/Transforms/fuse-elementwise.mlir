// RUN: megac-opt %s --split-input-file --megac-fuse-elementwise | FileCheck %s

// Tests the kernel groups of a GPT MLP block at inference: the first
// product takes its bias and GeLU as a cuBLASLt epilogue (g0), the second
// its bias and the residual add after it (g1: the residual is the
// product's C).
// CHECK-LABEL: func.func @mlp
// CHECK: megac.linear {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.gelu {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add %arg0, {{.*}}megac.fusion = "g1"
// CHECK-NEXT: return
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
// has a second reader after the group, so the GeLU joins the GEMM
// epilogue, which writes the pre-activation too; a value read twice (the
// rounded gradient, %twice) ends a chain.
// CHECK-LABEL: func.func @backward
// CHECK: megac.linear {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.gelu {{.*}}megac.fusion = "g0"
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

// Tests the GEMM groups of a bf16 training step (after
// megac-round-after-epilogue): the product, its bias add, the sum's rounding
// (the pre-activation the backward pass reads), the GeLU of the fp32 sum
// and its rounding: one group (g0), written once by cuBLASLt's epilogue.
// A product whose rounded sum is its only reader is a group too (g1). A
// rounded sum read before the GeLU's rounding keeps the group from
// forming (no g2), and so does an fp32 sum read by anything but its
// rounding and the GeLU.
// CHECK-LABEL: func.func @bf16_mlp
// CHECK: megac.linear {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.gelu {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.gelu_grad
// CHECK-NOT: "g2"
// CHECK: return
func.func @bf16_mlp(%x: tensor<2x8x16xf32>, %w1: tensor<16x64xf32>, %b1: tensor<64xf32>,
                    %w2: tensor<64x16xf32>, %b2: tensor<16xf32>, %dy: tensor<2x8x64xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %h = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %s = megac.add %h, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %pre = megac.round_bf16 %s : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu %s : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr = megac.round_bf16 %g : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %o = megac.linear %gr, %w2 : (tensor<2x8x64xf32>, tensor<64x16xf32>) -> tensor<2x8x16xf32>
  %os = megac.add %o, %b2 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %or = megac.round_bf16 %os : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %dg = megac.gelu_grad %pre, %dy : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  // Read too early: the rounded sum's reader comes before the GeLU.
  %h2 = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %s2 = megac.add %h2, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %pre2 = megac.round_bf16 %s2 : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %early = megac.gelu_grad %pre2, %dy : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %g2 = megac.gelu %s2 : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr2 = megac.round_bf16 %g2 : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %or, %dg, %early, %gr2, %gr2 : tensor<2x8x16xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>
}

// -----

// Tests residual adds in a bf16 plan (after megac-round-after-epilogue):
// a residual added to the fp32 sum, then rounded, joins the group (g0),
// whichever operand of the add the sum is (g1). A residual add of the
// rounded sum (its rounding kept) stays out of the group (g2: the sum's
// rounding only), and so does an fp32 sum read twice (g3), and the add of
// a broadcast vector after a product's bias (g4: not a residual).
// CHECK-LABEL: func.func @bf16_residual
// CHECK: megac.linear {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add %{{[0-9]+}}, %arg2 {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.add %{{[0-9]+}}, %arg0 {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add %{{[0-9]+}}, %arg2 {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.add %arg0, %{{[0-9]+}} {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g1"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g2"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g2"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "g2"
// CHECK-NEXT: megac.add
// CHECK-NOT: "g2"
// CHECK-NEXT: megac.round_bf16
// CHECK-NOT: "g2"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g3"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g3"
// CHECK-NEXT: megac.add
// CHECK-NOT: "g3"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "g4"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "g4"
// CHECK-NEXT: megac.add
// CHECK-NOT: "g4"
// CHECK: return
func.func @bf16_residual(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %p = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %p, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r = megac.add %s, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rr = megac.round_bf16 %r : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %p1 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s1 = megac.add %p1, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r1 = megac.add %x, %s1 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rr1 = megac.round_bf16 %r1 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // The rounded sum read by the residual add: no fp32 sum to add to.
  %p2 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s2 = megac.add %p2, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %sr2 = megac.round_bf16 %s2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %r2 = megac.add %x, %sr2 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rr2 = megac.round_bf16 %r2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // The fp32 sum read by the residual add and returned.
  %p3 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s3 = megac.add %p3, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r3 = megac.add %x, %s3 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // A second vector added: a bias, not a residual.
  %p4 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s4 = megac.add %p4, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r4 = megac.add %s4, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return %rr, %rr1, %rr2, %r3, %s3, %r4 : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests GeLU's gradient as a product's epilogue (cuBLASLt's DGELU): the
// product as the output gradient, with the gradient's rounding in a bf16
// plan (d0) and without in an fp32 one (d1). A product read by more than
// the gradient forms no group.
// CHECK-LABEL: func.func @gelu_grad
// CHECK: megac.linear {{.*}}megac.fusion = "d0"
// CHECK-NEXT: megac.gelu_grad {{.*}}megac.fusion = "d0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "d0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "d1"
// CHECK-NEXT: megac.gelu_grad {{.*}}megac.fusion = "d1"
// CHECK-NOT: "d2"
// CHECK: return
func.func @gelu_grad(%dy: tensor<2x8x16xf32>, %w: tensor<64x16xf32>, %pre: tensor<2x8x64xf32>)
    -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %p = megac.linear %dy, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu_grad %pre, %p : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr = megac.round_bf16 %g : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %q = megac.linear %dy, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %h = megac.gelu_grad %pre, %q : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %r = megac.linear %dy, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %k = megac.gelu_grad %pre, %r : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %gr, %h, %k, %r : tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>
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

// -----

// Tests that a chain reading more than 32 inputs (a running sum of 40
// scalars, like the gradient norm's) is cut into kernels of at most 32.
// CHECK-LABEL: func.func @long_sum
// CHECK-COUNT-31: megac.fusion = "e0"
// CHECK-COUNT-8: megac.fusion = "e1"
// CHECK-NOT: megac.fusion
func.func @long_sum(%x: tensor<40xf32>) -> tensor<f32> {
  %s0 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s1 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s2 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s3 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s4 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s5 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s6 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s7 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s8 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s9 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s10 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s11 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s12 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s13 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s14 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s15 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s16 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s17 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s18 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s19 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s20 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s21 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s22 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s23 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s24 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s25 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s26 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s27 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s28 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s29 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s30 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s31 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s32 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s33 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s34 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s35 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s36 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s37 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s38 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %s39 = megac.sum_squares %x : (tensor<40xf32>) -> tensor<f32>
  %t1 = megac.add %s0, %s1 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t2 = megac.add %t1, %s2 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t3 = megac.add %t2, %s3 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t4 = megac.add %t3, %s4 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t5 = megac.add %t4, %s5 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t6 = megac.add %t5, %s6 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t7 = megac.add %t6, %s7 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t8 = megac.add %t7, %s8 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t9 = megac.add %t8, %s9 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t10 = megac.add %t9, %s10 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t11 = megac.add %t10, %s11 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t12 = megac.add %t11, %s12 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t13 = megac.add %t12, %s13 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t14 = megac.add %t13, %s14 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t15 = megac.add %t14, %s15 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t16 = megac.add %t15, %s16 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t17 = megac.add %t16, %s17 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t18 = megac.add %t17, %s18 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t19 = megac.add %t18, %s19 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t20 = megac.add %t19, %s20 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t21 = megac.add %t20, %s21 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t22 = megac.add %t21, %s22 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t23 = megac.add %t22, %s23 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t24 = megac.add %t23, %s24 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t25 = megac.add %t24, %s25 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t26 = megac.add %t25, %s26 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t27 = megac.add %t26, %s27 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t28 = megac.add %t27, %s28 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t29 = megac.add %t28, %s29 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t30 = megac.add %t29, %s30 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t31 = megac.add %t30, %s31 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t32 = megac.add %t31, %s32 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t33 = megac.add %t32, %s33 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t34 = megac.add %t33, %s34 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t35 = megac.add %t34, %s35 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t36 = megac.add %t35, %s36 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t37 = megac.add %t36, %s37 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t38 = megac.add %t37, %s38 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %t39 = megac.add %t38, %s39 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %t39 : tensor<f32>
}

// -----

// Tests roundings joining the op they round ("r" groups): the LayerNorm's,
// the attention's and the product's, each their op's only reader, join
// them. A rounding of a value with a second reader (%a, also added below)
// stays apart; a rounding inside an elementwise chain stays in the chain
// (e0).
// CHECK-LABEL: func.func @roundings
// CHECK: megac.layer_norm {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.attention {{.*}}megac.fusion = "r1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r1"
// CHECK-NEXT: megac.attention
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.round_bf16
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "r2"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r2"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "e0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "e0"
// CHECK-NEXT: return
func.func @roundings(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>, %b: tensor<16xf32>,
                     %w: tensor<16x16xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %n = megac.layer_norm %x, %g, %b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %nr = megac.round_bf16 %n : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = megac.attention %nr, %nr, %nr {num_heads = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %yr = megac.round_bf16 %y : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %a = megac.attention %yr, %yr, %yr {num_heads = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ar = megac.round_bf16 %a : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %p = megac.linear %ar, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %a, %pr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %yr, %ar, %pr, %sr : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// Tests a product's rounding that a bias add reads: it joins the product
// (cuBLAS writes the rounded product in bf16), not the chain of the add,
// which would then read the product in fp32.
// CHECK-LABEL: func.func @product_rounding_before_its_bias
// CHECK: megac.linear {{.*}}megac.fusion = "[[R:r[0-9]+]]"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "[[R]]"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "[[E:e[0-9]+]]"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "[[E]]"
// CHECK-NEXT: return
func.func @product_rounding_before_its_bias(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>,
                                            %b: tensor<16xf32>) -> tensor<2x8x16xf32> {
  %p = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %pr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %sr : tensor<2x8x16xf32>
}

// -----

// Tests a LayerNorm's input gradient with the residual stream's gradient
// added to it: one group (n0: the norm gradient's kernel adds it as it
// writes, and rounds the sum in a bf16 plan), whichever operand of the
// add it is (n1, an fp32 plan's: no rounding). A norm gradient read twice
// whose rounding is read twice stays out (the rounding joins it: r0), and
// so does the add of a vector.
// CHECK-LABEL: func.func @norm_grad
// CHECK-NEXT: megac.layer_norm_grad {{.*}}megac.fusion = "n0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "n0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "n0"
// CHECK-NEXT: megac.layer_norm_grad {{.*}}megac.fusion = "n1"
// CHECK-NEXT: megac.add %{{[0-9]+}}, %arg3 {{.*}}megac.fusion = "n1"
// CHECK-NEXT: megac.layer_norm_grad {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.add
// CHECK-NOT: "n2"
// CHECK: return
func.func @norm_grad(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>, %dy: tensor<2x8x16xf32>, %r: tensor<2x8x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %n = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %r, %n : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %m = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %m, %r : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // Read twice: by its rounding's sum and returned (rounded).
  %h = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %u = megac.add %hr, %r : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // A vector added: not a residual.
  %k = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %v = megac.add %k, %g : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return %sr, %t, %u, %hr, %v : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests a LayerNorm's gain and bias gradients: both sum over dy's rows, so
// they are one group (b0, one pass over dy) whichever comes first (b1). A
// bias gradient written into a micro-batch sum (an accumulate its only
// reader) stays an op of its own, and so does a column sum of another
// tensor.
// CHECK-LABEL: func.func @norm_params
// CHECK-NEXT: megac.layer_norm_gain_grad {{.*}}megac.fusion = "b0"
// CHECK-NEXT: megac.sum_leading {{.*}}megac.fusion = "b0"
// CHECK-NEXT: megac.sum_leading {{.*}}megac.fusion = "b1"
// CHECK-NEXT: megac.layer_norm_gain_grad {{.*}}megac.fusion = "b1"
// CHECK-NEXT: megac.layer_norm_gain_grad
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.sum_leading
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.accumulate
// CHECK-NEXT: megac.layer_norm_gain_grad
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.sum_leading
// CHECK-NOT: megac.fusion
// CHECK: return
func.func @norm_params(%x: tensor<2x8x16xf32>, %dy: tensor<2x8x16xf32>, %dz: tensor<2x8x16xf32>,
                       %dw: tensor<2x8x16xf32>, %dv: tensor<2x8x16xf32>)
    -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) {
  %g = megac.layer_norm_gain_grad %x, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16xf32>
  %b = megac.sum_leading %dy {keep = 1 : i64} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  %b1 = megac.sum_leading %dz {keep = 1 : i64} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  %g1 = megac.layer_norm_gain_grad %x, %dz {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16xf32>
  // The bias gradient into a micro-batch sum.
  %g2 = megac.layer_norm_gain_grad %x, %x {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16xf32>
  %b2 = megac.sum_leading %x {keep = 1 : i64} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  %acc = megac.accumulate %b2 : (tensor<16xf32>) -> tensor<16xf32>
  // A column sum of another tensor.
  %g3 = megac.layer_norm_gain_grad %x, %dw {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16xf32>
  %b3 = megac.sum_leading %dv {keep = 1 : i64} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  return %g, %b, %b1, %g1, %g2, %acc, %g3, %b3 : tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
}

// -----

// Tests a product's weight and bias gradients: cuBLASLt's BGRAD epilogue
// sums dy's rows as the weight gradient's product reads them, so the two
// are one group (w0) whichever comes first (w1, a weight used transposed).
// A gradient written into a micro-batch sum (either of the two) stays an
// op of its own, and so do a column sum of another tensor and a bias
// gradient read before the weight gradient.
// CHECK-LABEL: func.func @weight_bias
// CHECK-NEXT: megac.linear_weight_grad {{.*}}megac.fusion = "w0"
// CHECK-NEXT: megac.sum_leading {{.*}}megac.fusion = "w0"
// CHECK-NEXT: megac.sum_leading {{.*}}megac.fusion = "w1"
// CHECK-NEXT: megac.linear_weight_grad {{.*}}megac.fusion = "w1"
// CHECK-NOT: megac.fusion
// CHECK: return
func.func @weight_bias(%x: tensor<2x8x16xf32>, %dy: tensor<2x8x32xf32>,
                       %dz: tensor<2x8x32xf32>, %du: tensor<2x8x32xf32>,
                       %dv: tensor<2x8x32xf32>, %dq: tensor<2x8x32xf32>,
                       %dp: tensor<2x8x32xf32>, %dr: tensor<2x8x32xf32>)
    -> (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32x16xf32>,
        tensor<16x32xf32>, tensor<32xf32>, tensor<16x32xf32>, tensor<32xf32>,
        tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<16x32xf32>) {
  %w = megac.linear_weight_grad %x, %dy : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
  %b = megac.sum_leading %dy {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  %b1 = megac.sum_leading %dz {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  %w1 = megac.linear_weight_grad %x, %dz {transpose_weight} : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<32x16xf32>
  // The bias gradient into a micro-batch sum.
  %w2 = megac.linear_weight_grad %x, %du : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
  %b2 = megac.sum_leading %du {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  %acc = megac.accumulate %b2 : (tensor<32xf32>) -> tensor<32xf32>
  // The weight gradient into a micro-batch sum.
  %w3 = megac.linear_weight_grad %x, %dv : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
  %acc3 = megac.accumulate %w3 : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %b3 = megac.sum_leading %dv {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  // A column sum of another tensor.
  %w4 = megac.linear_weight_grad %x, %dq : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
  %b4 = megac.sum_leading %dp {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  // A bias gradient read before its weight gradient.
  %b5 = megac.sum_leading %dr {keep = 1 : i64} : (tensor<2x8x32xf32>) -> tensor<32xf32>
  %r5 = megac.gelu %b5 : (tensor<32xf32>) -> tensor<32xf32>
  %w5 = megac.linear_weight_grad %x, %dr : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
  return %w, %b, %b1, %w1, %w2, %acc, %acc3, %b3, %w4, %b4, %r5, %w5
      : tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32x16xf32>,
        tensor<16x32xf32>, tensor<32xf32>, tensor<16x32xf32>, tensor<32xf32>,
        tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<16x32xf32>
}

// -----

// Tests the embedding's gradient with another gradient of the table added
// to it (a tied embedding's output layer's): one group (t0), the add in
// the embedding gradient's kernel. An embedding gradient read by more than
// the add, and one added to a vector (a bias, not a gradient of the
// table), stay apart.
// CHECK-LABEL: func.func @tied
// CHECK-NEXT: megac.linear_weight_grad
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.embedding_grad {{.*}}megac.fusion = "t0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "t0"
// CHECK-NOT: megac.fusion
// CHECK: return
func.func @tied(%wte: tensor<32x8xf32>, %ids: tensor<2x4xi32>,
                %dy: tensor<2x4x8xf32>, %x: tensor<2x4x8xf32>,
                %dl: tensor<2x4x32xf32>, %b: tensor<8xf32>)
    -> (tensor<32x8xf32>, tensor<32x8xf32>, tensor<32x8xf32>, tensor<32x8xf32>) {
  %hg = megac.linear_weight_grad %x, %dl {transpose_weight} : (tensor<2x4x8xf32>, tensor<2x4x32xf32>) -> tensor<32x8xf32>
  %eg = megac.embedding_grad %wte, %ids, %dy : (tensor<32x8xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>) -> tensor<32x8xf32>
  %sum = megac.add %hg, %eg : (tensor<32x8xf32>, tensor<32x8xf32>) -> tensor<32x8xf32>
  // Read by more than the add.
  %eg1 = megac.embedding_grad %wte, %ids, %dy : (tensor<32x8xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>) -> tensor<32x8xf32>
  %sum1 = megac.add %hg, %eg1 : (tensor<32x8xf32>, tensor<32x8xf32>) -> tensor<32x8xf32>
  // A vector added.
  %eg2 = megac.embedding_grad %wte, %ids, %dy : (tensor<32x8xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>) -> tensor<32x8xf32>
  %sum2 = megac.add %eg2, %b : (tensor<32x8xf32>, tensor<8xf32>) -> tensor<32x8xf32>
  return %sum, %sum1, %eg1, %sum2 : tensor<32x8xf32>, tensor<32x8xf32>, tensor<32x8xf32>, tensor<32x8xf32>
}

// -----

// Tests products that add another tensor of their shape as they write it
// (cuBLAS's C): the gradient reaching q, k and v's shared input in a bf16
// plan (after megac-round-after-epilogue), v's product rounded as it is
// written (r0), k's adding it (c0) and q's adding that sum (c1), each
// with the sum's rounding; an fp32 sum of two products, the later taking
// the earlier as C (c2); and a product added to an argument (c3). A
// product added to a LayerNorm's input gradient stays apart: the norm
// gradient's group (n0) adds it. So does a product whose add reads it
// twice.
// CHECK-LABEL: func.func @accumulate
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "c0"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "c0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "c0"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "c1"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "c1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "c1"
// CHECK-NEXT: megac.linear %arg0, %arg3 {transpose_weight} :
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "c2"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "c2"
// CHECK-NEXT: megac.linear {{.*}}megac.fusion = "c3"
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "c3"
// CHECK-NEXT: megac.layer_norm_grad {{.*}}megac.fusion = "n0"
// CHECK-NEXT: megac.linear %arg0, %arg3 {transpose_weight} :
// CHECK-NEXT: megac.add {{.*}}megac.fusion = "n0"
// CHECK-NEXT: megac.linear %arg0, %arg3 {transpose_weight} :
// CHECK-NEXT: megac.add %{{[0-9]+}}, %{{[0-9]+}} :
// CHECK-NEXT: return
func.func @accumulate(%dv: tensor<2x8x16xf32>, %dk: tensor<2x8x16xf32>, %dq: tensor<2x8x16xf32>, %w: tensor<16x16xf32>, %g: tensor<16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %v = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %vr = megac.round_bf16 %v : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %k = megac.linear %dk, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %vr, %k : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %q = megac.linear %dq, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %sr, %q : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // fp32: the later product takes the earlier.
  %a = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %b = megac.linear %dk, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %ab = megac.add %a, %b : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // An argument as C.
  %c = megac.linear %dq, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %cx = megac.add %dk, %c : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // A LayerNorm's input gradient: the norm gradient's group adds the
  // product.
  %n = megac.layer_norm_grad %dv, %g, %dk {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %m = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %nm = megac.add %n, %m : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // Added to itself.
  %d = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %dd = megac.add %d, %d : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %tr, %ab, %cx, %nm, %dd : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests an attention's gradient steps: the query's, the key's and the
// value's are one group (a0, one pass of the attention kernels for dq, dk
// and dv) with their roundings in a bf16 plan. Steps of another dy (a1:
// without roundings, an fp32 plan's, and without a query step: dk and dv
// alone), a key step whose result is read before the value step (no
// group), and a key step whose value step takes another dropout stream
// (no group) stay apart.
// CHECK-LABEL: func.func @key_value
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a1"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a1"
// CHECK-NEXT: megac.attention_grad
// CHECK-NOT: "a
// CHECK-NEXT: megac.add
// CHECK-NEXT: megac.attention_grad
// CHECK-NOT: "a
// CHECK-NEXT: megac.attention_grad
// CHECK-NOT: "a
// CHECK-NEXT: megac.attention_grad
// CHECK-NOT: "a
// CHECK: return
func.func @key_value(%q: tensor<2x8x16xf32>, %k: tensor<2x8x16xf32>, %v: tensor<2x8x16xf32>,
                     %dy: tensor<2x8x16xf32>, %dz: tensor<2x8x16xf32>, %dw: tensor<2x8x16xf32>, %du: tensor<2x8x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>,
        tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %gq = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rq = megac.round_bf16 %gq : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gk = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rk = megac.round_bf16 %gk : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gv = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rv = megac.round_bf16 %gv : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %k2 = megac.attention_grad %q, %k, %v, %dz {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %v2 = megac.attention_grad %q, %k, %v, %dz {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // The key's gradient read before the value's step.
  %k3 = megac.attention_grad %q, %k, %v, %dw {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %early = megac.add %k3, %k3 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %v3 = megac.attention_grad %q, %k, %v, %dw {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // Another dropout stream.
  %k4 = megac.attention_grad %q, %k, %v, %du {num_heads = 2 : i64, operand = 1 : i64, dropout = 1.0e-01 : f64, stream = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %v4 = megac.attention_grad %q, %k, %v, %du {num_heads = 2 : i64, operand = 2 : i64, dropout = 1.0e-01 : f64, stream = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %rq, %rk, %rv, %k2, %v2, %early, %v3, %k4, %v4 : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests query steps that stay out of their attention's group: one not
// rounded where the key's and the value's are (no group; a0 holds those
// two), and one whose result is read between the group's steps (a1: dk
// and dv alone; the query's step joins its rounding, r0).
// CHECK-LABEL: func.func @query_apart
// CHECK-NEXT: megac.attention_grad
// CHECK-NOT: fusion
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "r0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a1"
// CHECK-NEXT: megac.add
// CHECK-NOT: fusion
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a1"
// CHECK-NEXT: megac.round_bf16 {{.*}}megac.fusion = "a1"
// CHECK: return
func.func @query_apart(%q: tensor<2x8x16xf32>, %k: tensor<2x8x16xf32>, %v: tensor<2x8x16xf32>,
                       %dy: tensor<2x8x16xf32>, %dz: tensor<2x8x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %gq = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gk = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rk = megac.round_bf16 %gk : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gv = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rv = megac.round_bf16 %gv : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %q2 = megac.attention_grad %q, %k, %v, %dz {num_heads = 2 : i64, operand = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rq2 = megac.round_bf16 %q2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %k2 = megac.attention_grad %q, %k, %v, %dz {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rk2 = megac.round_bf16 %k2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %early = megac.add %rq2, %rq2 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %v2 = megac.attention_grad %q, %k, %v, %dz {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rv2 = megac.round_bf16 %v2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %gq, %rk, %rv, %early, %rk2, %rv2 : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}
