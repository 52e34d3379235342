// RUN: megac-opt %s --split-input-file --megac-propagate-sharding | FileCheck %s

// Tests Megatron's MLP: the column-parallel product stays split through bias
// and GeLU; the row-parallel product is a partial sum, which the replicated
// bias add must see whole.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @mlp
  func.func @mlp(%x: tensor<4x16xf32>,
                 %w1: tensor<16x64xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                 %b1: tensor<64xf32> {megac.sharding = #megac.sharding<[tp]>},
                 %w2: tensor<64x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                 %b2: tensor<16xf32>) -> tensor<4x16xf32> {
    // CHECK: megac.linear {{.*}}megac.sharding = #megac.sharding<[_, tp]>
    %0 = megac.linear %x, %w1 : (tensor<4x16xf32>, tensor<16x64xf32>) -> tensor<4x64xf32>
    // CHECK: megac.add {{.*}}megac.sharding = #megac.sharding<[_, tp]>
    %1 = megac.add %0, %b1 : (tensor<4x64xf32>, tensor<64xf32>) -> tensor<4x64xf32>
    // CHECK: megac.gelu {{.*}}megac.sharding = #megac.sharding<[_, tp]>
    %2 = megac.gelu %1 : (tensor<4x64xf32>) -> tensor<4x64xf32>
    // The product is a partial sum that its only user needs whole: it is
    // reduced right where it is produced (megac.reduce_result), so users
    // see it whole.
    // CHECK: megac.linear {{.*}}megac.reduce_result = ["tp"], megac.sharding = #megac.sharding<[_, _]>
    %3 = megac.linear %2, %w2 : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
    // The sum needs both operands partial or both whole: both are whole.
    // CHECK: megac.add {{.*}}megac.operand_shardings = [#megac.sharding<[_, _]>, #megac.sharding<[_]>], megac.sharding = #megac.sharding<[_, _]>
    %4 = megac.add %3, %b2 : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    // CHECK: return {megac.operand_shardings = [#megac.sharding<[_, _]>]}
    return %4 : tensor<4x16xf32>
  }
}

// -----

// Tests that a partial sum flows through ops linear in it (another product,
// a scaling, a sum of partials) and is reduced only at the non-linear GeLU.
module attributes {megac.mesh = #megac.mesh<tp = 4>} {
  // CHECK-LABEL: func.func @deferred_reduction
  func.func @deferred_reduction(%x: tensor<8x32xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                                %w: tensor<32x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                                %v: tensor<16x16xf32>, %s: tensor<16xf32>) -> tensor<8x16xf32> {
    // CHECK: megac.linear {{.*}}megac.sharding = #megac.sharding<[_, _], partial = [tp]>
    %0 = megac.linear %x, %w : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.linear {{.*}}megac.operand_shardings = [#megac.sharding<[_, _], partial = [tp]>, #megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _], partial = [tp]>
    %1 = megac.linear %0, %v : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.mul {{.*}}megac.sharding = #megac.sharding<[_, _], partial = [tp]>
    %2 = megac.mul %1, %s : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
    // The sum of partials is still partial; its only user needs it whole,
    // so the one reduction happens right after it.
    // CHECK: megac.add {{.*}}megac.operand_shardings = [#megac.sharding<[_, _], partial = [tp]>, #megac.sharding<[_, _], partial = [tp]>], megac.reduce_result = ["tp"], megac.sharding = #megac.sharding<[_, _]>
    %3 = megac.add %2, %0 : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.gelu {{.*}}megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _]>
    %4 = megac.gelu %3 : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %4 : tensor<8x16xf32>
  }
}

// -----

// Tests the vocabulary-parallel embedding: a split vocabulary makes the
// lookup a partial sum; the whole position embedding needs it summed, so it
// is reduced where it is produced.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @embedding
  func.func @embedding(%wte: tensor<512x32xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                       %wpe: tensor<64x32xf32>, %ids: tensor<2x16xi32>) -> tensor<2x16x32xf32> {
    // CHECK: megac.embedding {{.*}}megac.operand_shardings = [#megac.sharding<[tp, _]>, #megac.sharding<[_, _]>], megac.reduce_result = ["tp"], megac.sharding = #megac.sharding<[_, _, _]>
    %0 = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<2x16xi32>) -> tensor<2x16x32xf32>
    %1 = megac.position_embedding %wpe, %ids : (tensor<64x32xf32>, tensor<2x16xi32>) -> tensor<16x32xf32>
    // CHECK: megac.add {{.*}}megac.operand_shardings = [#megac.sharding<[_, _, _]>, #megac.sharding<[_, _]>]
    %2 = megac.add %0, %1 : (tensor<2x16x32xf32>, tensor<16x32xf32>) -> tensor<2x16x32xf32>
    return %2 : tensor<2x16x32xf32>
  }
}

// -----

// Tests attention split by heads, and the tied output layer: the transposed
// embedding weight splits the logits' vocabulary dimension.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @heads_and_logits
  func.func @heads_and_logits(%x: tensor<2x8x32xf32>,
                              %wq: tensor<32x32xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                              %wte: tensor<512x32xf32> {megac.sharding = #megac.sharding<[tp, _]>}) -> tensor<2x8x512xf32> {
    %q = megac.linear %x, %wq : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: megac.attention {{.*}}megac.sharding = #megac.sharding<[_, _, tp]>, num_heads = 4 : i64}
    %a = megac.attention %q, %q, %q {num_heads = 4 : i64} : (tensor<2x8x32xf32>, tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: megac.linear {{.*}}megac.sharding = #megac.sharding<[_, _, tp]>, transpose_weight}
    %l = megac.linear %x, %wte {transpose_weight} : (tensor<2x8x32xf32>, tensor<512x32xf32>) -> tensor<2x8x512xf32>
    return %l : tensor<2x8x512xf32>
  }
}

// -----

// Tests that axes missing from the grid or of size 1 leave tensors whole,
// so one annotated model compiles for any grid.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 1>} {
  // CHECK-LABEL: func.func @absent_axes
  // CHECK-SAME: megac.sharding = #megac.sharding<[_, _]>
  // CHECK-SAME: megac.sharding = #megac.sharding<[_, _]>
  func.func @absent_axes(%w: tensor<16x64xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                         %v: tensor<16x64xf32> {megac.sharding = #megac.sharding<[ep, _]>}) -> tensor<16x64xf32> {
    %0 = megac.add %w, %v : (tensor<16x64xf32>, tensor<16x64xf32>) -> tensor<16x64xf32>
    return %0 : tensor<16x64xf32>
  }
}

// -----

// Tests a conflict: both operands split the same factor over different axes;
// the first operand's axis wins and the second is required in that layout.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
  // CHECK-LABEL: func.func @conflict
  func.func @conflict(%a: tensor<8x16xf32> {megac.sharding = #megac.sharding<[dp, _]>},
                      %b: tensor<8x16xf32> {megac.sharding = #megac.sharding<[tp, _]>}) -> tensor<8x16xf32> {
    // CHECK: megac.add {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _]>, #megac.sharding<[dp, _]>], megac.sharding = #megac.sharding<[dp, _]>
    %0 = megac.add %a, %b : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}

// -----

// Tests eager reduction: a partial value with one user that needs it whole
// (GeLU) and one that could keep it partial (the scaling) is reduced once,
// where it is produced, and both users read the sum; deferring would cost a
// second all-reduce for the scaled copy.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @eager
  func.func @eager(%x: tensor<8x32xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                   %w: tensor<32x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                   %s: tensor<16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
    // CHECK: megac.linear {{.*}}megac.reduce_result = ["tp"], megac.sharding = #megac.sharding<[_, _]>
    %0 = megac.linear %x, %w : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.gelu {{.*}}megac.sharding = #megac.sharding<[_, _]>
    %1 = megac.gelu %0 : (tensor<8x16xf32>) -> tensor<8x16xf32>
    // CHECK: megac.mul {{.*}}megac.operand_shardings = [#megac.sharding<[_, _]>, #megac.sharding<[_]>], megac.sharding = #megac.sharding<[_, _]>
    %2 = megac.mul %0, %s : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
    return %1, %2 : tensor<8x16xf32>, tensor<8x16xf32>
  }
}

// -----

// Tests the choice when operands want the same axis for different factors:
// a parameter's split wins over an activation's (the sequence-split input
// of a column-parallel product is gathered, not the weight), and a
// parallel factor wins over a reduction (the weight gradient keeps the
// weight's split and needs no all-reduce; the sequence-split input is
// required whole).
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  // CHECK-LABEL: func.func @conflicts
  func.func @conflicts(%x: tensor<2x8x16xf32> {megac.sharding = #megac.sharding<[_, tp, _]>},
                       %w: tensor<16x32xf32> {megac.param = {name = "w", init = "zeros"}, megac.sharding = #megac.sharding<[_, tp]>},
                       %dy: tensor<2x8x32xf32> {megac.sharding = #megac.sharding<[_, _, tp]>}) -> (tensor<2x8x32xf32>, tensor<16x32xf32>) {
    // CHECK: megac.linear %arg0, %arg1 {megac.operand_shardings = [#megac.sharding<[_, _, _]>, #megac.sharding<[_, tp]>], megac.sharding = #megac.sharding<[_, _, tp]>}
    %y = megac.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x32xf32>) -> tensor<2x8x32xf32>
    // CHECK: megac.linear_weight_grad %arg0, %arg2 {megac.operand_shardings = [#megac.sharding<[_, _, _]>, #megac.sharding<[_, _, tp]>], megac.sharding = #megac.sharding<[_, tp]>}
    %dw = megac.linear_weight_grad %x, %dy : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<16x32xf32>
    return %y, %dw : tensor<2x8x32xf32>, tensor<16x32xf32>
  }
}
