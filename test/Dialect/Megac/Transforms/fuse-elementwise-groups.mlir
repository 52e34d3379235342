// RUN: megac-opt %s --megac-fuse-elementwise=groups=a | FileCheck %s
// RUN: megac-opt %s --megac-fuse-elementwise | FileCheck %s --check-prefix=ALL
// RUN: not megac-opt %s --megac-fuse-elementwise=groups=ax 2>&1 | FileCheck %s --check-prefix=BAD

// Tests megac-fuse-elementwise's `groups` option, as `megac compile
// --target cpu` sets it (groups=a): an attention's three gradient steps
// are one group (the CPU backend recomputes the probabilities once for
// them), while the product, its bias and its GeLU stay ops of their own,
// as do the chain after them. With every kind (the default, a GPU
// target's), the product takes its bias and GeLU as its epilogue (g0).
// CHECK-LABEL: func.func @layer
// CHECK: megac.linear
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.add
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.gelu
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.mul
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.add
// CHECK-NOT: megac.fusion
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// CHECK-NEXT: return
// ALL-LABEL: func.func @layer
// ALL: megac.linear {{.*}}megac.fusion = "g0"
// ALL-NEXT: megac.add {{.*}}megac.fusion = "g0"
// ALL-NEXT: megac.gelu {{.*}}megac.fusion = "g0"
// ALL-NEXT: megac.mul {{.*}}megac.fusion = "e0"
// ALL-NEXT: megac.add {{.*}}megac.fusion = "e0"
// ALL-NEXT: megac.attention_grad {{.*}}megac.fusion = "a0"
// BAD: error: megac-fuse-elementwise: 'x' in groups=ax names no kind of group (expected letters of abcdegnrtw)
func.func @layer(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>,
                 %s: tensor<2x8x16xf32>, %q: tensor<2x8x16xf32>, %k: tensor<2x8x16xf32>,
                 %v: tensor<2x8x16xf32>, %dy: tensor<2x8x16xf32>)
    -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  %h = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %hb = megac.add %h, %b : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %g = megac.gelu %hb : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %m = megac.mul %g, %s : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = megac.add %m, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gq = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gk = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %gv = megac.attention_grad %q, %k, %v, %dy {num_heads = 2 : i64, operand = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %y, %gq, %gk, %gv : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}
