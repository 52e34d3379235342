// RUN: megac-opt %s -split-input-file -verify-diagnostics

// Tests embedding_c1: the ids must be rank 2.
func.func @embedding_c1(%t: tensor<512x128xf32>, %ids: tensor<4xi32>) {
  // expected-error@+1 {{embedding_c1: expected a rank-2 table and rank-2 ids}}
  %0 = megac.embedding %t, %ids : (tensor<512x128xf32>, tensor<4xi32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests position_embedding_c1: the table must be rank 2.
func.func @position_embedding_c1(%t: tensor<128xf32>, %ids: tensor<4x64xi32>) {
  // expected-error@+1 {{position_embedding_c1}}
  %0 = megac.position_embedding %t, %ids : (tensor<128xf32>, tensor<4x64xi32>) -> tensor<64x128xf32>
  return
}

// -----

// Tests position_embedding_c2: the sequence may not exceed the table.
func.func @position_embedding_c2(%t: tensor<32x128xf32>, %ids: tensor<4x64xi32>) {
  // expected-error@+1 {{position_embedding_c2: sequence length 64 exceeds the 32 positions of the table}}
  %0 = megac.position_embedding %t, %ids : (tensor<32x128xf32>, tensor<4x64xi32>) -> tensor<64x128xf32>
  return
}

// -----

// Tests linear_c1: the weight must be rank 2.
func.func @linear_c1(%x: tensor<4x128xf32>, %w: tensor<128xf32>) {
  // expected-error@+1 {{linear_c1: expected a rank-2 weight}}
  %0 = megac.linear %x, %w : (tensor<4x128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests linear_c2: the contracted sizes must agree.
func.func @linear_c2(%x: tensor<4x64xf32>, %w: tensor<128x256xf32>) {
  // expected-error@+1 {{linear_c2: input [4x64] has last dimension 64 but the weight [128x256] contracts 128}}
  %0 = megac.linear %x, %w : (tensor<4x64xf32>, tensor<128x256xf32>) -> tensor<4x256xf32>
  return
}

// -----

// Tests linear_c2 with a transposed weight: K is the weight's second dimension.
func.func @linear_c2_transposed(%x: tensor<4x128xf32>, %w: tensor<128x256xf32>) {
  // expected-error@+1 {{contracts 256 (transposed)}}
  %0 = megac.linear %x, %w {transpose_weight} : (tensor<4x128xf32>, tensor<128x256xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests matmul_c1: operands must share a rank of at least 2.
func.func @matmul_c1(%a: tensor<2x4x8xf32>, %b: tensor<8x4xf32>) {
  // expected-error@+1 {{matmul_c1: operands must have the same rank >= 2}}
  %0 = megac.matmul %a, %b : (tensor<2x4x8xf32>, tensor<8x4xf32>) -> tensor<2x4x4xf32>
  return
}

// -----

// Tests matmul_c2: batch dimensions must agree.
func.func @matmul_c2(%a: tensor<2x4x8xf32>, %b: tensor<3x8x4xf32>) {
  // expected-error@+1 {{matmul_c2: batch dimension 0 differs}}
  %0 = megac.matmul %a, %b : (tensor<2x4x8xf32>, tensor<3x8x4xf32>) -> tensor<2x4x4xf32>
  return
}

// -----

// Tests matmul_c3: contracted sizes must agree.
func.func @matmul_c3(%a: tensor<2x4x8xf32>, %b: tensor<2x6x4xf32>) {
  // expected-error@+1 {{matmul_c3: lhs [2x4x8] contracts 8 but rhs [2x6x4] has 6}}
  %0 = megac.matmul %a, %b : (tensor<2x4x8xf32>, tensor<2x6x4xf32>) -> tensor<2x4x4xf32>
  return
}

// -----

// Tests add_c1: rhs may not have a higher rank.
func.func @add_c1(%a: tensor<8xf32>, %b: tensor<2x8xf32>) {
  // expected-error@+1 {{add_c1: rhs [2x8] has a higher rank than lhs [8]}}
  %0 = megac.add %a, %b : (tensor<8xf32>, tensor<2x8xf32>) -> tensor<8xf32>
  return
}

// -----

// Tests add_c2: rhs must be a suffix of lhs.
func.func @add_c2(%a: tensor<2x8xf32>, %b: tensor<4xf32>) {
  // expected-error@+1 {{add_c2: rhs [4] is not a suffix of lhs [2x8]}}
  %0 = megac.add %a, %b : (tensor<2x8xf32>, tensor<4xf32>) -> tensor<2x8xf32>
  return
}

// -----

// Tests mul_c1: rhs may not have a higher rank.
func.func @mul_c1(%a: tensor<8xf32>, %b: tensor<2x8xf32>) {
  // expected-error@+1 {{mul_c1}}
  %0 = megac.mul %a, %b : (tensor<8xf32>, tensor<2x8xf32>) -> tensor<8xf32>
  return
}

// -----

// Tests mul_c2: rhs must be a suffix of lhs.
func.func @mul_c2(%a: tensor<2x8xf32>, %b: tensor<2xf32>) {
  // expected-error@+1 {{mul_c2}}
  %0 = megac.mul %a, %b : (tensor<2x8xf32>, tensor<2xf32>) -> tensor<2x8xf32>
  return
}

// -----

// Tests softmax_c1: a scalar has no dimension to normalize.
func.func @softmax_c1(%a: tensor<f32>) {
  // expected-error@+1 {{softmax_c1: the input must have rank >= 1}}
  %0 = megac.softmax %a : (tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests layer_norm_c1: gamma must match the normalized dimension.
func.func @layer_norm_c1(%x: tensor<4x128xf32>, %g: tensor<64xf32>, %b: tensor<128xf32>) {
  // expected-error@+1 {{layer_norm_c1: gamma and beta must be vectors of the input's last dimension (128), got [64]}}
  %0 = megac.layer_norm %x, %g, %b : (tensor<4x128xf32>, tensor<64xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests layer_norm_c2: epsilon must be positive.
func.func @layer_norm_c2(%x: tensor<4x128xf32>, %g: tensor<128xf32>) {
  // expected-error@+1 {{layer_norm_c2: epsilon must be positive and finite}}
  %0 = megac.layer_norm %x, %g, %g {epsilon = 0.0 : f64} : (tensor<4x128xf32>, tensor<128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests layer_norm_c2: an infinite epsilon is no epsilon.
func.func @layer_norm_c2_inf(%x: tensor<4x128xf32>, %g: tensor<128xf32>) {
  // expected-error@+1 {{layer_norm_c2: epsilon must be positive and finite}}
  %0 = megac.layer_norm %x, %g, %g {epsilon = 0x7FF0000000000000 : f64} : (tensor<4x128xf32>, tensor<128xf32>, tensor<128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests attention_c1: q, k and v must share one rank-3 shape.
func.func @attention_c1(%q: tensor<4x64x128xf32>, %k: tensor<4x32x128xf32>) {
  // expected-error@+1 {{attention_c1: query, key and value must be rank-3 [B, S, H] of one shape}}
  %0 = megac.attention %q, %k, %q {num_heads = 4 : i64} : (tensor<4x64x128xf32>, tensor<4x32x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_c2: the heads must divide the hidden size.
func.func @attention_c2(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_c2: num_heads = 3 must be positive and divide the hidden size 128}}
  %0 = megac.attention %q, %q, %q {num_heads = 3 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests reshape_c1: element counts must agree.
func.func @reshape_c1(%x: tensor<4x64xf32>) {
  // expected-error@+1 {{reshape_c1: cannot reshape [4x64] into [4x32]}}
  %0 = megac.reshape %x {shape = array<i64: 4, 32>} : (tensor<4x64xf32>) -> tensor<4x32xf32>
  return
}

// -----

// Tests transpose_c1: the permutation must be a permutation.
func.func @transpose_c1(%x: tensor<4x64xf32>) {
  // expected-error@+1 {{transpose_c1: the permutation is not a permutation of the input's 2 dimensions}}
  %0 = megac.transpose %x {permutation = array<i64: 0, 0>} : (tensor<4x64xf32>) -> tensor<4x4xf32>
  return
}

// -----

// Tests cross_entropy_c1: labels must match the logits' batch and sequence.
func.func @cross_entropy_c1(%l: tensor<4x64x512xf32>, %y: tensor<4x32xi32>) {
  // expected-error@+1 {{cross_entropy_c1: logits [4x64x512] and labels [4x32] must be [B, S, V] and [B, S]}}
  %0 = megac.cross_entropy %l, %y : (tensor<4x64x512xf32>, tensor<4x32xi32>) -> tensor<f32>
  return
}

// -----

// Tests cross_entropy_c2: a padded vocabulary's classes lie in (0, V].
func.func @cross_entropy_c2(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>) {
  // expected-error@+1 {{cross_entropy_c2: classes = 600 must be positive and at most the vocabulary (512)}}
  %0 = megac.cross_entropy %l, %y {classes = 600 : i64} : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<f32>
  return
}

// -----

// Tests cross_entropy_grad_c2: classes are positive.
func.func @cross_entropy_grad_classes(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>, %d: tensor<f32>) {
  // expected-error@+1 {{cross_entropy_grad_c2: classes must be positive}}
  %0 = megac.cross_entropy_grad %l, %y, %d {classes = 0 : i64} : (tensor<4x64x512xf32>, tensor<4x64xi32>, tensor<f32>) -> tensor<4x64x512xf32>
  return
}

// -----

// Tests cross_entropy_stats_c2: classes are positive.
func.func @cross_entropy_stats_classes(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>) {
  // expected-error@+1 {{cross_entropy_stats_c2: classes must be positive}}
  %0 = megac.cross_entropy_stats %l, %y {classes = -3 : i64, shards = 2 : i64} : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<4x64x6xf32>
  return
}

// -----

// Tests attention_c3: the probability dropout rate lies in [0, 1).
func.func @attention_c3(%q: tensor<2x8x16xf32>) {
  // expected-error@+1 {{attention_c3: dropout = 1.000000e+00 must lie in [0, 1)}}
  %0 = megac.attention %q, %q, %q {num_heads = 2 : i64, dropout = 1.0 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// Tests attention_grad_c4: the same rule for the gradient.
func.func @attention_grad_c4(%q: tensor<2x8x16xf32>) {
  // expected-error@+1 {{attention_grad_c4: dropout = -5.000000e-01 must lie in [0, 1)}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 2 : i64, operand = 0 : i64, dropout = -0.5 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// Tests cross_entropy_stats_c1: labels must match the logits' batch and
// sequence.
func.func @cross_entropy_stats_c1(%l: tensor<4x64x512xf32>, %y: tensor<4x32xi32>) {
  // expected-error@+1 {{cross_entropy_stats_c1: logits [4x64x512] and labels [4x32] must be [B, S, V] and [B, S]}}
  %0 = megac.cross_entropy_stats %l, %y {shards = 2 : i64} : (tensor<4x64x512xf32>, tensor<4x32xi32>) -> tensor<4x64x6xf32>
  return
}

// -----

// Tests cross_entropy_stats_c2: the blocks must divide the vocabulary.
func.func @cross_entropy_stats_c2(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>) {
  // expected-error@+1 {{cross_entropy_stats_c2: shards = 3 must be positive and divide the vocabulary (512)}}
  %0 = megac.cross_entropy_stats %l, %y {shards = 3 : i64} : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<4x64x9xf32>
  return
}

// -----

// Tests cross_entropy_from_stats_c1: three statistics per block.
func.func @cross_entropy_from_stats_c1(%st: tensor<4x64x4xf32>) {
  // expected-error@+1 {{cross_entropy_from_stats_c1: stats [4x64x4] must be [B, S, 3n]}}
  %0 = megac.cross_entropy_from_stats %st : (tensor<4x64x4xf32>) -> tensor<f32>
  return
}

// -----

// Tests cross_entropy_grad_c1: a scalar loss gradient.
func.func @cross_entropy_grad_c1(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>, %d: tensor<4xf32>) {
  // expected-error@+1 {{cross_entropy_grad_c1: expected logits [B, S, V], labels [B, S] and a scalar loss_grad}}
  %0 = megac.cross_entropy_grad %l, %y, %d : (tensor<4x64x512xf32>, tensor<4x64xi32>, tensor<4xf32>) -> tensor<4x64x512xf32>
  return
}

// -----

// Tests cross_entropy_grad_c2: the statistics hold three numbers a block.
func.func @cross_entropy_grad_c2(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>, %d: tensor<f32>, %st: tensor<4x64x8xf32>) {
  // expected-error@+1 {{cross_entropy_grad_c2: stats [4x64x8] must be [B, S, 3n] for logits [4x64x512]}}
  %0 = megac.cross_entropy_grad %l, %y, %d, %st : (tensor<4x64x512xf32>, tensor<4x64xi32>, tensor<f32>, tensor<4x64x8xf32>) -> tensor<4x64x512xf32>
  return
}

// -----

// Tests layer_norm_gain_grad_c1: the output gradient has the input's shape.
func.func @layer_norm_gain_grad_c1(%x: tensor<4x128xf32>, %dy: tensor<4x64xf32>) {
  // expected-error@+1 {{layer_norm_gain_grad_c1: the input must have rank >= 1 and output_grad its shape}}
  %0 = megac.layer_norm_gain_grad %x, %dy : (tensor<4x128xf32>, tensor<4x64xf32>) -> tensor<128xf32>
  return
}

// -----

// Tests layer_norm_gain_grad_c1: a scalar has no dimension to normalize.
func.func @layer_norm_gain_grad_c1_scalar(%x: tensor<f32>) {
  // expected-error@+1 {{layer_norm_gain_grad_c1}}
  %0 = megac.layer_norm_gain_grad %x, %x : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests that the gain's gradient has the normalized dimension's shape.
func.func @layer_norm_gain_grad_result(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{'megac.layer_norm_gain_grad' op inferred type(s) 'tensor<128xf32>' are incompatible with return type(s) of operation 'tensor<4x128xf32>'}}
  %0 = megac.layer_norm_gain_grad %x, %x : (tensor<4x128xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests that a result type disagreeing with the inferred one is rejected.
func.func @inferred_result_mismatch(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{'megac.gelu' op inferred type(s) 'tensor<4x128xf32>' are incompatible with return type(s) of operation 'tensor<4x64xf32>'}}
  %0 = megac.gelu %x : (tensor<4x128xf32>) -> tensor<4x64xf32>
  return
}

// -----

// Tests all_reduce_bucket_c1: every sum keeps its input's type.
func.func @all_reduce_bucket_c1(%x: tensor<4x128xf32>, %y: tensor<8xf32>) {
  // expected-error@+1 {{all_reduce_bucket_c1: expected at least one input and result types equal to the input types}}
  %0:2 = megac.all_reduce_bucket %x, %y {axis = "dp"} : (tensor<4x128xf32>, tensor<8xf32>) -> (tensor<8xf32>, tensor<4x128xf32>)
  return
}

// -----

// Tests all_reduce_c1: an all-reduce keeps its type.
func.func @all_reduce_c1(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{all_reduce_c1: result type must equal the input type}}
  %0 = megac.all_reduce %x {axis = "tp"} : (tensor<4x128xf32>) -> tensor<4x256xf32>
  return
}

// -----

// Tests all_gather_c1: the gathered dimension must exist.
func.func @all_gather_c1(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{all_gather_c1: dim 2 is not a dimension of the input}}
  %0 = megac.all_gather %x {axis = "tp", dim = 2 : i64} : (tensor<4x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests all_gather_c2: gathering may not shrink a dimension.
func.func @all_gather_c2(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{all_gather_c2: [4x128] -> [4x64] changes more than dimension 1 or resizes it the wrong way}}
  %0 = megac.all_gather %x {axis = "tp", dim = 1 : i64} : (tensor<4x128xf32>) -> tensor<4x64xf32>
  return
}

// -----

// Tests slice_shard_c1: the sliced dimension must exist.
func.func @slice_shard_c1(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{slice_shard_c1: dim -1 is not a dimension of the input}}
  %0 = megac.slice_shard %x {axis = "tp", dim = -1 : i64} : (tensor<4x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests slice_shard_c2: slicing may not grow a dimension or touch another.
func.func @slice_shard_c2(%x: tensor<4x128xf32>) {
  // expected-error@+1 {{slice_shard_c2: [4x128] -> [2x64] changes more than dimension 1}}
  %0 = megac.slice_shard %x {axis = "tp", dim = 1 : i64} : (tensor<4x128xf32>) -> tensor<2x64xf32>
  return
}

// -----

// Tests slice_shard_c3: the element type is kept.
func.func @slice_shard_c3(%x: tensor<4x128xi32>) {
  // expected-error@+1 {{slice_shard_c3: the result's element type must be the input's}}
  %0 = megac.slice_shard %x {axis = "tp", dim = 1 : i64} : (tensor<4x128xi32>) -> tensor<4x64xf32>
  return
}

// -----

// Tests sharding_constraint_c1: one entry per dimension, nothing partial.
func.func @sharding_constraint_c1(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{sharding_constraint_c1: the sharding needs one entry per dimension of [4x8] and no partial axis}}
  %0 = megac.sharding_constraint %x {sharding = #megac.sharding<[dp]>} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests assign_c1: the value must have the parameter's shape.
func.func @assign_c1(%p: tensor<4x8xf32>, %v: tensor<4x4xf32>) {
  // expected-error@+1 {{assign_c1: the value must have the parameter's shape [4x8]}}
  %0 = megac.assign %p, %v : (tensor<4x8xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests reduce_scatter_c1: the scattered dimension must exist.
func.func @reduce_scatter_c1(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{reduce_scatter_c1: dim 3 is not a dimension of the input}}
  %0 = megac.reduce_scatter %x {axis = "dp", dim = 3 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests reduce_scatter_c2: scattering may not grow a dimension.
func.func @reduce_scatter_c2(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{reduce_scatter_c2: [4x8] -> [8x8] changes more than dimension 0 or resizes it the wrong way}}
  %0 = megac.reduce_scatter %x {axis = "dp", dim = 0 : i64} : (tensor<4x8xf32>) -> tensor<8x8xf32>
  return
}

// -----

// Tests reduce_scatter_c2 on an empty dimension: a size of 0 splits into
// nothing (it once divided by zero).
func.func @reduce_scatter_c2_empty(%x: tensor<0x8xf32>) {
  // expected-error@+1 {{reduce_scatter_c2: [0x8] -> [0x8] changes more than dimension 0 or resizes it the wrong way}}
  %0 = megac.reduce_scatter %x {axis = "dp", dim = 0 : i64} : (tensor<0x8xf32>) -> tensor<0x8xf32>
  return
}

// -----

// Tests all_gather_c2 from an empty dimension.
func.func @all_gather_c2_empty(%x: tensor<0x8xf32>) {
  // expected-error@+1 {{all_gather_c2: [0x8] -> [4x8] changes more than dimension 0 or resizes it the wrong way}}
  %0 = megac.all_gather %x {axis = "tp", dim = 0 : i64} : (tensor<0x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests dropout_c1: the rate lies in [0, 1).
func.func @dropout_c1(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{dropout_c1: rate = 1.000000e+00 must lie in [0, 1)}}
  %0 = megac.dropout %x {rate = 1.0 : f64, stream = 0 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @transfer_same_stage(%x: tensor<4xf32>) {
  // expected-error @+1 {{transfer_c1: expected two different non-negative stages, got 1 and 1}}
  megac.transfer %x {src_stage = 1 : i64, dst_stage = 1 : i64, src_phase = "forward", dst_phase = "forward"} : tensor<4xf32>
  return
}

// -----

func.func @transfer_back_in_time(%x: tensor<4xf32>) {
  // expected-error @+1 {{transfer_c2: a value made in the step phase cannot be received in the backward phase, which runs before it}}
  megac.transfer %x {src_stage = 0 : i64, dst_stage = 1 : i64, src_phase = "step", dst_phase = "backward"} : tensor<4xf32>
  return
}

// -----

func.func @transfer_bad_phase(%x: tensor<4xf32>) {
  // expected-error @+1 {{transfer_c2: phases must be forward, backward or step, got 'fwd' and 'forward'}}
  megac.transfer %x {src_stage = 0 : i64, dst_stage = 1 : i64, src_phase = "fwd", dst_phase = "forward"} : tensor<4xf32>
  return
}
