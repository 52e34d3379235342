// RUN: megac-opt %s --split-input-file --megac-propagate-sharding | FileCheck %s

// Tests the rules of ops the GPT-2 tests do not reach: dimensions that must
// stay whole (normalized, softmax, reshaped, the loss), batch dimensions
// that pass through, and permutations.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
  // CHECK-LABEL: func.func @whole_dims
  func.func @whole_dims(%x: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, _, tp]>},
                        %g: tensor<16xf32>) -> tensor<4x8x16xf32> {
    // The normalized dimension is required whole, the batch stays split.
    // CHECK: megac.layer_norm {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _, _]>, #megac.sharding<[_]>, #megac.sharding<[_]>], megac.sharding = #megac.sharding<[dp, _, _]>
    %0 = megac.layer_norm %x, %g, %g : (tensor<4x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x8x16xf32>
    // CHECK: megac.softmax {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _, _]>], megac.sharding = #megac.sharding<[dp, _, _]>
    %1 = megac.softmax %x : (tensor<4x8x16xf32>) -> tensor<4x8x16xf32>
    return %0 : tensor<4x8x16xf32>
  }

  // CHECK-LABEL: func.func @stack_micro_batches
  func.func @stack_micro_batches(%x: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, _, tp]>}) -> tensor<8x8x16xf32> {
    // Each micro-batch's rows are whole before they stack (a dp split of
    // the rows would interleave ranks and micro-batches).
    // CHECK: megac.stack_micro_batches {{.*}}megac.operand_shardings = [#megac.sharding<[_, _, _]>], megac.sharding = #megac.sharding<[_, _, _]>
    %0 = megac.stack_micro_batches %x {count = 2 : i64} : (tensor<4x8x16xf32>) -> tensor<8x8x16xf32>
    return %0 : tensor<8x8x16xf32>
  }

  // CHECK-LABEL: func.func @layer_norm_gain_grad
  func.func @layer_norm_gain_grad(%x: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, tp, _]>},
                                  %dy: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, tp, _]>}) -> tensor<16xf32> {
    // Rows split over batch and sequence give partial sums over both axes
    // (summed right away: the function returns them); the normalized
    // dimension stays whole.
    // CHECK: megac.layer_norm_gain_grad {{.*}}megac.operand_shardings = [#megac.sharding<[dp, tp, _]>, #megac.sharding<[dp, tp, _]>], megac.reduce_result = ["dp", "tp"], megac.sharding = #megac.sharding<[_]>
    %0 = megac.layer_norm_gain_grad %x, %dy : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16xf32>
    return %0 : tensor<16xf32>
  }

  // CHECK-LABEL: func.func @batched_matmul
  func.func @batched_matmul(%a: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, _, tp]>},
                            %b: tensor<4x16x8xf32>) -> tensor<4x8x8xf32> {
    // Batch split passes through; the split K makes the result partial
    // (summed right away: the function returns it) and the whole rhs is
    // required split on K to match.
    // CHECK: megac.matmul {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _, tp]>, #megac.sharding<[dp, tp, _]>], megac.reduce_result = ["tp"], megac.sharding = #megac.sharding<[dp, _, _]>
    %0 = megac.matmul %a, %b : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    return %0 : tensor<4x8x8xf32>
  }

  // CHECK-LABEL: func.func @permute_and_reshape
  func.func @permute_and_reshape(%x: tensor<4x8x16xf32> {megac.sharding = #megac.sharding<[dp, _, tp]>}) -> tensor<4x128xf32> {
    // CHECK: megac.transpose {{.*}}megac.sharding = #megac.sharding<[dp, tp, _]>
    %0 = megac.transpose %x {permutation = array<i64: 0, 2, 1>} : (tensor<4x8x16xf32>) -> tensor<4x16x8xf32>
    // The leading dimension survives the reshape; the merged ones go whole.
    // CHECK: megac.reshape {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _, _]>], megac.sharding = #megac.sharding<[dp, _]>
    %1 = megac.reshape %0 {shape = array<i64: 4, 128>} : (tensor<4x16x8xf32>) -> tensor<4x128xf32>
    return %1 : tensor<4x128xf32>
  }

  // CHECK-LABEL: func.func @embedding_batch_and_loss
  func.func @embedding_batch_and_loss(%wpe: tensor<32x16xf32>, %ids: tensor<4x8xi32> {megac.sharding = #megac.sharding<[dp, _]>},
                                      %logits: tensor<4x8x64xf32> {megac.sharding = #megac.sharding<[dp, _, tp]>}) -> tensor<f32> {
    // A batch-split ids tensor does not split the position embedding.
    // CHECK: megac.position_embedding {{.*}}megac.sharding = #megac.sharding<[_, _]>
    %0 = megac.position_embedding %wpe, %ids : (tensor<32x16xf32>, tensor<4x8xi32>) -> tensor<8x16xf32>
    // The loss sums over tokens (divided by the global count): split rows
    // make it a partial sum; the vocabulary must be whole (its
    // vocab-parallel form is still to come).
    // CHECK: megac.cross_entropy {{.*}}megac.operand_shardings = [#megac.sharding<[dp, _, _]>, #megac.sharding<[dp, _]>], megac.reduce_result = ["dp"], megac.sharding = #megac.sharding<[]>
    %1 = megac.cross_entropy %logits, %ids : (tensor<4x8x64xf32>, tensor<4x8xi32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
}
