// RUN: megac-opt %s --split-input-file --megac-round-after-epilogue | FileCheck %s

// Tests a bf16 MLP block as megac-mixed-precision leaves it: each
// product's rounding goes, so the bias is added to the fp32 product and
// the sum rounded once; the GeLU reads the fp32 sum, the backward pass's
// GeLU gradient the rounded one.
// CHECK-LABEL: func.func @mlp
// CHECK-NEXT: %[[H:.*]] = megac.linear %arg0, %arg1
// CHECK-NEXT: %[[S:.*]] = megac.add %[[H]], %arg2
// CHECK-NEXT: %[[PRE:.*]] = megac.round_bf16 %[[S]]
// CHECK-NEXT: %[[G:.*]] = megac.gelu %[[S]]
// CHECK-NEXT: %[[GR:.*]] = megac.round_bf16 %[[G]]
// CHECK-NEXT: %[[O:.*]] = megac.linear %[[GR]], %arg3
// CHECK-NEXT: %[[OS:.*]] = megac.add %[[O]], %arg4
// CHECK-NEXT: %[[OR:.*]] = megac.round_bf16 %[[OS]]
// CHECK-NEXT: megac.gelu_grad %[[PRE]], %arg5
// CHECK-NOT: megac.round_bf16
// CHECK: return %[[OR]]
func.func @mlp(%x: tensor<2x8x16xf32>, %w1: tensor<16x64xf32>, %b1: tensor<64xf32>,
               %w2: tensor<64x16xf32>, %b2: tensor<16xf32>, %dy: tensor<2x8x64xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x64xf32>) {
  %h = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %s = megac.add %hr, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %pre = megac.round_bf16 %s : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu %pre : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr = megac.round_bf16 %g : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %o = megac.linear %gr, %w2 : (tensor<2x8x64xf32>, tensor<64x16xf32>) -> tensor<2x8x16xf32>
  %or0 = megac.round_bf16 %o : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %os = megac.add %or0, %b2 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %or = megac.round_bf16 %os : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %dg = megac.gelu_grad %pre, %dy : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %or, %dg : tensor<2x8x16xf32>, tensor<2x8x64xf32>
}

// -----

// Tests inference: the rounded sum has no reader left once the GeLU reads
// the fp32 sum, and goes.
// CHECK-LABEL: func.func @inference
// CHECK-NEXT: %[[H:.*]] = megac.linear
// CHECK-NEXT: %[[S:.*]] = megac.add %[[H]], %arg2
// CHECK-NEXT: %[[G:.*]] = megac.gelu %[[S]]
// CHECK-NEXT: %[[GR:.*]] = megac.round_bf16 %[[G]]
// CHECK-NEXT: return %[[GR]]
func.func @inference(%x: tensor<2x8x16xf32>, %w1: tensor<16x64xf32>, %b1: tensor<64xf32>) -> tensor<2x8x64xf32> {
  %h = megac.linear %x, %w1 : (tensor<2x8x16xf32>, tensor<16x64xf32>) -> tensor<2x8x64xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %s = megac.add %hr, %b1 : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %pre = megac.round_bf16 %s : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu %pre : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr = megac.round_bf16 %g : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %gr : tensor<2x8x64xf32>
}

// -----

// Tests a projection joining the residual stream: the product's and the
// sum's roundings go, so the bias and then the residual are added to the
// fp32 product and rounded once (cuBLASLt's C), whichever operand of the
// add the sum is.
// CHECK-LABEL: func.func @residual
// CHECK-NEXT: %[[P:.*]] = megac.linear %arg0, %arg1
// CHECK-NEXT: %[[S:.*]] = megac.add %[[P]], %arg2
// CHECK-NEXT: %[[R:.*]] = megac.add %arg0, %[[S]]
// CHECK-NEXT: %[[RR:.*]] = megac.round_bf16 %[[R]]
// CHECK-NEXT: %[[Q:.*]] = megac.linear %[[RR]], %arg1
// CHECK-NEXT: %[[T:.*]] = megac.add %[[Q]], %arg2
// CHECK-NEXT: %[[U:.*]] = megac.add %[[T]], %[[RR]]
// CHECK-NEXT: %[[UR:.*]] = megac.round_bf16 %[[U]]
// CHECK-NEXT: return %[[UR]]
func.func @residual(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>) -> tensor<2x8x16xf32> {
  %p = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %pr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %r = megac.add %x, %sr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %rr = megac.round_bf16 %r : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %q = megac.linear %rr, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %qr = megac.round_bf16 %q : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %qr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %u = megac.add %tr, %rr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ur = megac.round_bf16 %u : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %ur : tensor<2x8x16xf32>
}

// -----

// Tests what keeps its roundings: a rounded product read by more than its
// bias add, a product whose rounding feeds a collective before the bias
// (each rank rounds its partial sum), and a rounded sum read by a
// residual add and returned (the sum's rounding stays; the product's
// goes).
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-3: megac.round_bf16
// CHECK: megac.all_reduce
// CHECK: megac.round_bf16
// CHECK-NEXT: %[[T:.*]] = megac.linear
// CHECK-NEXT: %[[TS:.*]] = megac.add %[[T]], %arg2
// CHECK-NEXT: %[[TSR:.*]] = megac.round_bf16 %[[TS]]
// CHECK-NEXT: megac.add %arg0, %[[TSR]]
// CHECK-NEXT: megac.round_bf16
// CHECK: return
func.func @kept(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %h = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %hr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %p = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sum = megac.all_reduce %pr {axis = "tp"} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ps = megac.add %sum, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %psr = megac.round_bf16 %ps : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ts = megac.add %tr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %tsr = megac.round_bf16 %ts : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tres = megac.add %x, %tsr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tresr = megac.round_bf16 %tres : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %sr, %hr, %psr, %tresr, %tsr : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests the backward pass through fc1's GeLU: the input gradient of fc2
// (a rounded product) is the GeLU gradient's output gradient; its
// rounding goes, so the gradient reads the fp32 product, as cuBLASLt's
// DGELU epilogue does. A product the gradient reads as its input (x)
// keeps its rounding.
// CHECK-LABEL: func.func @gelu_grad
// CHECK-NEXT: %[[P:.*]] = megac.linear %arg0, %arg1
// CHECK-NEXT: %[[G:.*]] = megac.gelu_grad %arg2, %[[P]]
// CHECK-NEXT: %[[GR:.*]] = megac.round_bf16 %[[G]]
// CHECK-NEXT: %[[Q:.*]] = megac.linear %arg0, %arg1
// CHECK-NEXT: %[[QR:.*]] = megac.round_bf16 %[[Q]]
// CHECK-NEXT: megac.gelu_grad %[[QR]], %arg2
func.func @gelu_grad(%dy: tensor<2x8x16xf32>, %w: tensor<64x16xf32>, %pre: tensor<2x8x64xf32>)
    -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %p = megac.linear %dy, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %g = megac.gelu_grad %pre, %pr : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %gr = megac.round_bf16 %g : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %q = megac.linear %dy, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %qr = megac.round_bf16 %q : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %h = megac.gelu_grad %qr, %pre : (tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %gr, %hr : tensor<2x8x64xf32>, tensor<2x8x64xf32>
}

// -----

// Tests the residual stream's gradient meeting a LayerNorm's input
// gradient: the norm gradient's rounding goes, so the residual gradient
// is added to the fp32 norm gradient and the sum rounded once (as the
// norm gradient's kernel adds it). A rounded norm gradient read twice,
// or whose sum is not rounded, keeps its rounding.
// CHECK-LABEL: func.func @norm_grad
// CHECK-NEXT: %[[G:.*]] = megac.layer_norm_grad %arg0, %arg1, %arg2
// CHECK-NEXT: %[[S:.*]] = megac.add %arg3, %[[G]]
// CHECK-NEXT: %[[SR:.*]] = megac.round_bf16 %[[S]]
// CHECK-NEXT: %[[H:.*]] = megac.layer_norm_grad %arg0, %arg1, %arg2
// CHECK-NEXT: %[[HR:.*]] = megac.round_bf16 %[[H]]
// CHECK-NEXT: megac.add %arg3, %[[HR]]
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: %[[K:.*]] = megac.layer_norm_grad %arg0, %arg1, %arg2
// CHECK-NEXT: %[[KR:.*]] = megac.round_bf16 %[[K]]
// CHECK-NEXT: megac.add %[[KR]], %arg3
// CHECK-NEXT: return
func.func @norm_grad(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>, %dy: tensor<2x8x16xf32>, %r: tensor<2x8x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %n = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %nr = megac.round_bf16 %n : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %r, %nr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // Read twice: by the sum and returned.
  %h = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %hr = megac.round_bf16 %h : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %r, %hr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // The sum not rounded.
  %k = megac.layer_norm_grad %x, %g, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %kr = megac.round_bf16 %k : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %u = megac.add %kr, %r : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %sr, %tr, %hr, %u : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests products added to another tensor of their shape, which a GEMM
// takes as C: the gradient reaching q, k and v's shared input, three
// rounded products summed with the sums rounded. The first product keeps
// its rounding (the second takes it as its C: the later of two products
// takes the earlier); the second and third lose theirs, each sum reading
// the fp32 product and rounded once. A product added to an argument loses
// its rounding too.
// CHECK-LABEL: func.func @accumulate
// CHECK-NEXT: %[[V:.*]] = megac.linear %arg0, %arg3
// CHECK-NEXT: %[[VR:.*]] = megac.round_bf16 %[[V]]
// CHECK-NEXT: %[[K:.*]] = megac.linear %arg1, %arg3
// CHECK-NEXT: %[[S:.*]] = megac.add %[[VR]], %[[K]]
// CHECK-NEXT: %[[SR:.*]] = megac.round_bf16 %[[S]]
// CHECK-NEXT: %[[Q:.*]] = megac.linear %arg2, %arg3
// CHECK-NEXT: %[[T:.*]] = megac.add %[[SR]], %[[Q]]
// CHECK-NEXT: %[[TR:.*]] = megac.round_bf16 %[[T]]
// CHECK-NEXT: %[[P:.*]] = megac.linear %arg0, %arg3
// CHECK-NEXT: %[[U:.*]] = megac.add %[[P]], %arg1
// CHECK-NEXT: %[[UR:.*]] = megac.round_bf16 %[[U]]
// CHECK-NEXT: return %[[TR]], %[[UR]]
func.func @accumulate(%dv: tensor<2x8x16xf32>, %dk: tensor<2x8x16xf32>, %dq: tensor<2x8x16xf32>, %w: tensor<16x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %v = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %vr = megac.round_bf16 %v : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %k = megac.linear %dk, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %kr = megac.round_bf16 %k : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %vr, %kr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %q = megac.linear %dq, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %qr = megac.round_bf16 %q : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %sr, %qr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %p = megac.linear %dv, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %u = megac.add %pr, %dk : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ur = megac.round_bf16 %u : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %tr, %ur : tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// -----

// Tests products that keep their roundings where their add belongs to
// another group, or is not rounded: added to a LayerNorm's input gradient
// (its "n" group adds the product as its residual), to a product with its
// bias (the "g" group's residual add, whichever product comes first), to
// the embedding's gradient (its "t" group) or added but not rounded.
// CHECK-LABEL: func.func @accumulate_kept
// CHECK-NEXT: megac.layer_norm_grad
// CHECK-NEXT: megac.linear
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: megac.add
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: %[[B:.*]] = megac.linear
// CHECK-NEXT: %[[BS:.*]] = megac.add %[[B]], %arg3
// CHECK-NEXT: %[[P:.*]] = megac.linear
// CHECK-NEXT: %[[PR:.*]] = megac.round_bf16 %[[P]]
// CHECK-NEXT: megac.add %[[BS]], %[[PR]]
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: %[[P2:.*]] = megac.linear
// CHECK-NEXT: %[[P2R:.*]] = megac.round_bf16 %[[P2]]
// CHECK-NEXT: %[[B2:.*]] = megac.linear
// CHECK-NEXT: %[[B2S:.*]] = megac.add %[[B2]], %arg3
// CHECK-NEXT: megac.add %[[P2R]], %[[B2S]]
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: %[[E:.*]] = megac.embedding_grad
// CHECK-NEXT: %[[ER:.*]] = megac.round_bf16 %[[E]]
// CHECK-NEXT: %[[O:.*]] = megac.linear
// CHECK-NEXT: %[[OR:.*]] = megac.round_bf16 %[[O]]
// CHECK-NEXT: megac.add %[[ER]], %[[OR]]
// CHECK-NEXT: megac.round_bf16
// CHECK-NEXT: %[[N:.*]] = megac.linear
// CHECK-NEXT: %[[NR:.*]] = megac.round_bf16 %[[N]]
// CHECK-NEXT: megac.add %[[NR]], %arg0
// CHECK-NEXT: return
func.func @accumulate_kept(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>, %ids: tensor<2x8xi32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<2x8x16xf32>) {
  %n = megac.layer_norm_grad %x, %g, %x {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %nr = megac.round_bf16 %n : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %l = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %lr = megac.round_bf16 %l : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %s = megac.add %nr, %lr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sr = megac.round_bf16 %s : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %bp = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %bpr = megac.round_bf16 %bp : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %bs = megac.add %bpr, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %bsr = megac.round_bf16 %bs : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %p = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %pr = megac.round_bf16 %p : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = megac.add %bsr, %pr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %tr = megac.round_bf16 %t : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // The same with the product before the product with its bias (the pass
  // meets it first, the bias sum still rounded).
  %p2 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %p2r = megac.round_bf16 %p2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %bp2 = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %bp2r = megac.round_bf16 %bp2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %bs2 = megac.add %bp2r, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %bs2r = megac.round_bf16 %bs2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t2 = megac.add %p2r, %bs2r : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t2r = megac.round_bf16 %t2 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %e = megac.embedding_grad %w, %ids, %x : (tensor<16x16xf32>, tensor<2x8xi32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
  %er = megac.round_bf16 %e : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %o = megac.linear %w, %w : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %or = megac.round_bf16 %o : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %eo = megac.add %er, %or : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %eor = megac.round_bf16 %eo : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %m = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %mr = megac.round_bf16 %m : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %u = megac.add %mr, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %sr, %tr, %t2r, %eor, %u : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<2x8x16xf32>
}
