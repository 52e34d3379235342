// RUN: megac-opt %s -split-input-file -verify-diagnostics

// Verifier errors of the backward and optimizer ops (MegacGradOps.cpp) that
// invalid.mlir does not already test.

// Tests linear_weight_grad_c1: the leading (token) dimensions must agree.
func.func @linear_weight_grad_c1(%x: tensor<4x64x128xf32>, %dy: tensor<4x32x512xf32>) {
  // expected-error@+1 {{linear_weight_grad_c1: input [4x64x128] and output_grad [4x32x512] must share their rank and leading dimensions}}
  %0 = megac.linear_weight_grad %x, %dy : (tensor<4x64x128xf32>, tensor<4x32x512xf32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests linear_weight_grad_c1: input and output_grad must share their rank.
func.func @linear_weight_grad_c1_rank(%x: tensor<256x128xf32>, %dy: tensor<4x64x512xf32>) {
  // expected-error@+1 {{linear_weight_grad_c1: input [256x128] and output_grad [4x64x512] must share their rank and leading dimensions}}
  %0 = megac.linear_weight_grad %x, %dy : (tensor<256x128xf32>, tensor<4x64x512xf32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests linear_weight_grad_c1: a scalar has no contracted dimension.
func.func @linear_weight_grad_c1_scalar(%x: tensor<f32>) {
  // expected-error@+1 {{linear_weight_grad_c1: input [] and output_grad [] must share their rank and leading dimensions}}
  %0 = megac.linear_weight_grad %x, %x : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests gelu_grad_c1: input and output_grad must have one shape.
func.func @gelu_grad_c1(%x: tensor<4x512xf32>, %dy: tensor<4x256xf32>) {
  // expected-error@+1 {{gelu_grad_c1: input and output_grad must have one shape}}
  %0 = megac.gelu_grad %x, %dy : (tensor<4x512xf32>, tensor<4x256xf32>) -> tensor<4x512xf32>
  return
}

// -----

// Tests normalize_c1: a scalar has no dimension to normalize.
func.func @normalize_c1(%x: tensor<f32>) {
  // expected-error@+1 {{normalize_c1: the input must have rank >= 1}}
  %0 = megac.normalize %x {epsilon = 1.0e-05 : f64} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests layer_norm_grad_c1: gamma must match the input's last dimension.
func.func @layer_norm_grad_c1(%x: tensor<4x128xf32>, %g: tensor<64xf32>) {
  // expected-error@+1 {{layer_norm_grad_c1: gamma must be a vector of the input's last dimension and output_grad must have the input's shape}}
  %0 = megac.layer_norm_grad %x, %g, %x : (tensor<4x128xf32>, tensor<64xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests layer_norm_grad_c1: gamma must be a vector.
func.func @layer_norm_grad_c1_gamma_rank(%x: tensor<4x128xf32>, %g: tensor<1x128xf32>) {
  // expected-error@+1 {{layer_norm_grad_c1: gamma must be a vector of the input's last dimension and output_grad must have the input's shape}}
  %0 = megac.layer_norm_grad %x, %g, %x : (tensor<4x128xf32>, tensor<1x128xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests layer_norm_grad_c1: output_grad must have the input's shape.
func.func @layer_norm_grad_c1_output_grad(%x: tensor<4x128xf32>, %g: tensor<128xf32>, %dy: tensor<8x128xf32>) {
  // expected-error@+1 {{layer_norm_grad_c1: gamma must be a vector of the input's last dimension and output_grad must have the input's shape}}
  %0 = megac.layer_norm_grad %x, %g, %dy : (tensor<4x128xf32>, tensor<128xf32>, tensor<8x128xf32>) -> tensor<4x128xf32>
  return
}

// -----

// Tests layer_norm_grad_c1: a scalar input has no last dimension.
func.func @layer_norm_grad_c1_scalar(%x: tensor<f32>, %g: tensor<1xf32>) {
  // expected-error@+1 {{layer_norm_grad_c1: gamma must be a vector of the input's last dimension and output_grad must have the input's shape}}
  %0 = megac.layer_norm_grad %x, %g, %x : (tensor<f32>, tensor<1xf32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests attention_grad_c1: the key must have the query's shape.
func.func @attention_grad_c1(%q: tensor<4x64x128xf32>, %k: tensor<4x32x128xf32>) {
  // expected-error@+1 {{attention_grad_c1: query, key, value and output_grad must be rank-3 of one shape}}
  %0 = megac.attention_grad %q, %k, %q, %q {num_heads = 4 : i64, operand = 0 : i64} : (tensor<4x64x128xf32>, tensor<4x32x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c1: the output gradient must have the query's shape.
func.func @attention_grad_c1_output_grad(%q: tensor<4x64x128xf32>, %dy: tensor<4x64x256xf32>) {
  // expected-error@+1 {{attention_grad_c1: query, key, value and output_grad must be rank-3 of one shape}}
  %0 = megac.attention_grad %q, %q, %q, %dy {num_heads = 4 : i64, operand = 2 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x256xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c1: the operands must be rank 3.
func.func @attention_grad_c1_rank(%q: tensor<64x128xf32>) {
  // expected-error@+1 {{attention_grad_c1: query, key, value and output_grad must be rank-3 of one shape}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 4 : i64, operand = 1 : i64} : (tensor<64x128xf32>, tensor<64x128xf32>, tensor<64x128xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  return
}

// -----

// Tests attention_grad_c2: the heads must divide the hidden size.
func.func @attention_grad_c2(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_grad_c2: num_heads = 3 must be positive and divide 128}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 3 : i64, operand = 0 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c2: num_heads must be positive.
func.func @attention_grad_c2_zero(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_grad_c2: num_heads = 0 must be positive and divide 128}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 0 : i64, operand = 0 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c2: a negative num_heads is rejected too.
func.func @attention_grad_c2_negative(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_grad_c2: num_heads = -4 must be positive and divide 128}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = -4 : i64, operand = 0 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c3: operand selects the query, key or value.
func.func @attention_grad_c3(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_grad_c3: operand must be 0 (query), 1 (key) or 2 (value)}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 4 : i64, operand = 3 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests attention_grad_c3: a negative operand is not 0, 1 or 2.
func.func @attention_grad_c3_negative(%q: tensor<4x64x128xf32>) {
  // expected-error@+1 {{attention_grad_c3: operand must be 0 (query), 1 (key) or 2 (value)}}
  %0 = megac.attention_grad %q, %q, %q, %q {num_heads = 4 : i64, operand = -1 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  return
}

// -----

// Tests softmax_grad_c1: output and output_grad must have one shape.
func.func @softmax_grad_c1(%y: tensor<4x512xf32>, %dy: tensor<4x256xf32>) {
  // expected-error@+1 {{softmax_grad_c1: output and output_grad must have one shape of rank >= 1}}
  %0 = megac.softmax_grad %y, %dy : (tensor<4x512xf32>, tensor<4x256xf32>) -> tensor<4x512xf32>
  return
}

// -----

// Tests softmax_grad_c1: a scalar has no dimension to normalize.
func.func @softmax_grad_c1_scalar(%y: tensor<f32>) {
  // expected-error@+1 {{softmax_grad_c1: output and output_grad must have one shape of rank >= 1}}
  %0 = megac.softmax_grad %y, %y : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests embedding_grad_c1: output_grad must have the table's hidden size.
func.func @embedding_grad_c1(%t: tensor<512x128xf32>, %ids: tensor<4x64xi32>, %dy: tensor<4x64x256xf32>) {
  // expected-error@+1 {{embedding_grad_c1: expected table [V, H], ids [B, S] and output_grad [B, S, H], got [512x128], [4x64], [4x64x256]}}
  %0 = megac.embedding_grad %t, %ids, %dy : (tensor<512x128xf32>, tensor<4x64xi32>, tensor<4x64x256xf32>) -> tensor<512x128xf32>
  return
}

// -----

// Tests embedding_grad_c1: output_grad must have the ids' batch and sequence.
func.func @embedding_grad_c1_tokens(%t: tensor<512x128xf32>, %ids: tensor<4x64xi32>, %dy: tensor<4x32x128xf32>) {
  // expected-error@+1 {{embedding_grad_c1: expected table [V, H], ids [B, S] and output_grad [B, S, H], got [512x128], [4x64], [4x32x128]}}
  %0 = megac.embedding_grad %t, %ids, %dy : (tensor<512x128xf32>, tensor<4x64xi32>, tensor<4x32x128xf32>) -> tensor<512x128xf32>
  return
}

// -----

// Tests embedding_grad_c1: the ids must be rank 2.
func.func @embedding_grad_c1_ids_rank(%t: tensor<512x128xf32>, %ids: tensor<256xi32>, %dy: tensor<4x64x128xf32>) {
  // expected-error@+1 {{embedding_grad_c1: expected table [V, H], ids [B, S] and output_grad [B, S, H], got [512x128], [256], [4x64x128]}}
  %0 = megac.embedding_grad %t, %ids, %dy : (tensor<512x128xf32>, tensor<256xi32>, tensor<4x64x128xf32>) -> tensor<512x128xf32>
  return
}

// -----

// Tests embedding_grad_c1: the table must be rank 2.
func.func @embedding_grad_c1_table_rank(%t: tensor<128xf32>, %ids: tensor<4x64xi32>, %dy: tensor<4x64x128xf32>) {
  // expected-error@+1 {{embedding_grad_c1: expected table [V, H], ids [B, S] and output_grad [B, S, H], got [128], [4x64], [4x64x128]}}
  %0 = megac.embedding_grad %t, %ids, %dy : (tensor<128xf32>, tensor<4x64xi32>, tensor<4x64x128xf32>) -> tensor<128xf32>
  return
}

// -----

// Tests position_embedding_grad_c1: the sequence may not exceed the table.
func.func @position_embedding_grad_c1(%t: tensor<32x128xf32>, %dy: tensor<64x128xf32>) {
  // expected-error@+1 {{position_embedding_grad_c1: expected table [P, H] and output_grad [S, H] with S <= P, got [32x128] and [64x128]}}
  %0 = megac.position_embedding_grad %t, %dy : (tensor<32x128xf32>, tensor<64x128xf32>) -> tensor<32x128xf32>
  return
}

// -----

// Tests position_embedding_grad_c1: the hidden sizes must agree.
func.func @position_embedding_grad_c1_hidden(%t: tensor<128x128xf32>, %dy: tensor<64x256xf32>) {
  // expected-error@+1 {{position_embedding_grad_c1: expected table [P, H] and output_grad [S, H] with S <= P, got [128x128] and [64x256]}}
  %0 = megac.position_embedding_grad %t, %dy : (tensor<128x128xf32>, tensor<64x256xf32>) -> tensor<128x128xf32>
  return
}

// -----

// Tests position_embedding_grad_c1: output_grad must be rank 2.
func.func @position_embedding_grad_c1_rank(%t: tensor<128x128xf32>, %dy: tensor<4x64x128xf32>) {
  // expected-error@+1 {{position_embedding_grad_c1: expected table [P, H] and output_grad [S, H] with S <= P, got [128x128] and [4x64x128]}}
  %0 = megac.position_embedding_grad %t, %dy : (tensor<128x128xf32>, tensor<4x64x128xf32>) -> tensor<128x128xf32>
  return
}

// -----

// Tests sum_leading_c1: keep may not exceed the input's rank.
func.func @sum_leading_c1(%x: tensor<4x512xf32>) {
  // expected-error@+1 {{sum_leading_c1: keep = 3 must lie in [0, 2]}}
  %0 = megac.sum_leading %x {keep = 3 : i64} : (tensor<4x512xf32>) -> tensor<4x512xf32>
  return
}

// -----

// Tests sum_leading_c1: keep may not be negative.
func.func @sum_leading_c1_negative(%x: tensor<4x512xf32>) {
  // expected-error@+1 {{sum_leading_c1: keep = -1 must lie in [0, 2]}}
  %0 = megac.sum_leading %x {keep = -1 : i64} : (tensor<4x512xf32>) -> tensor<512xf32>
  return
}

// -----

// Tests clip_coefficient_c1: total must be a scalar.
func.func @clip_coefficient_c1(%total: tensor<4xf32>) {
  // expected-error@+1 {{clip_coefficient_c1: total must be a scalar}}
  %0 = megac.clip_coefficient %total {max_norm = 1.0 : f64} : (tensor<4xf32>) -> tensor<f32>
  return
}

// -----

// Tests clip_coefficient_c2: max_norm must be positive, not zero.
func.func @clip_coefficient_c2(%total: tensor<f32>) {
  // expected-error@+1 {{clip_coefficient_c2: max_norm must be positive}}
  %0 = megac.clip_coefficient %total {max_norm = 0.0 : f64} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests clip_coefficient_c2: max_norm must be positive, not negative.
func.func @clip_coefficient_c2_negative(%total: tensor<f32>) {
  // expected-error@+1 {{clip_coefficient_c2: max_norm must be positive}}
  %0 = megac.clip_coefficient %total {max_norm = -1.0 : f64} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests fill_c1: the shape has no negative size.
func.func @fill_c1() {
  // expected-error@+1 {{fill_c1: sizes must not be negative}}
  %0 = megac.fill {shape = array<i64: 4, -1>, value = 0.0 : f64} : () -> tensor<4x?xf32>
  return
}

// -----

// Tests adamw_c1: grad must have the parameter's shape.
func.func @adamw_c1(%p: tensor<128x512xf32>, %g: tensor<512x128xf32>, %c: tensor<f32>) {
  // expected-error@+1 {{adamw_c1: grad must have the parameter's shape [128x512]}}
  %0 = megac.adamw %p, %g, %c {beta1 = 0.9 : f64, beta2 = 0.95 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.1 : f64} : (tensor<128x512xf32>, tensor<512x128xf32>, tensor<f32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests adamw_c2: the coefficient must be a scalar.
func.func @adamw_c2(%p: tensor<128x512xf32>, %c: tensor<1xf32>) {
  // expected-error@+1 {{adamw_c2: the coefficient must be a scalar}}
  %0 = megac.adamw %p, %p, %c {beta1 = 0.9 : f64, beta2 = 0.95 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.1 : f64} : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<1xf32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests adamw_c3: beta1 lies in [0, 1).
func.func @adamw_c3_beta1(%p: tensor<128x512xf32>, %c: tensor<f32>) {
  // expected-error@+1 {{adamw_c3: betas must lie in [0, 1), epsilon and weight_decay must not be negative}}
  %0 = megac.adamw %p, %p, %c {beta1 = 1.0 : f64, beta2 = 0.95 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.1 : f64} : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<f32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests adamw_c3: beta2 lies in [0, 1).
func.func @adamw_c3_beta2(%p: tensor<128x512xf32>, %c: tensor<f32>) {
  // expected-error@+1 {{adamw_c3: betas must lie in [0, 1), epsilon and weight_decay must not be negative}}
  %0 = megac.adamw %p, %p, %c {beta1 = 0.9 : f64, beta2 = -0.5 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.1 : f64} : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<f32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests adamw_c3: epsilon is not negative.
func.func @adamw_c3_epsilon(%p: tensor<128x512xf32>, %c: tensor<f32>) {
  // expected-error@+1 {{adamw_c3: betas must lie in [0, 1), epsilon and weight_decay must not be negative}}
  %0 = megac.adamw %p, %p, %c {beta1 = 0.9 : f64, beta2 = 0.95 : f64, epsilon = -1.0e-08 : f64, weight_decay = 0.1 : f64} : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<f32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests adamw_c3: weight_decay is not negative.
func.func @adamw_c3_weight_decay(%p: tensor<128x512xf32>, %c: tensor<f32>) {
  // expected-error@+1 {{adamw_c3: betas must lie in [0, 1), epsilon and weight_decay must not be negative}}
  %0 = megac.adamw %p, %p, %c {beta1 = 0.9 : f64, beta2 = 0.95 : f64, epsilon = 1.0e-08 : f64, weight_decay = -0.1 : f64} : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<f32>) -> tensor<128x512xf32>
  return
}

// -----

// Tests cross_entropy_grad_c1: labels must match the logits' batch and
// sequence (invalid.mlir tests only the scalar loss_grad).
func.func @cross_entropy_grad_c1_labels(%l: tensor<4x64x512xf32>, %y: tensor<4x32xi32>, %d: tensor<f32>) {
  // expected-error@+1 {{cross_entropy_grad_c1: expected logits [B, S, V], labels [B, S] and a scalar loss_grad}}
  %0 = megac.cross_entropy_grad %l, %y, %d : (tensor<4x64x512xf32>, tensor<4x32xi32>, tensor<f32>) -> tensor<4x64x512xf32>
  return
}

// -----

// Tests cross_entropy_grad_c2: the stats must have the logits' batch and
// sequence (invalid.mlir tests only the 3n width).
func.func @cross_entropy_grad_c2_tokens(%l: tensor<4x64x512xf32>, %y: tensor<4x64xi32>, %d: tensor<f32>, %st: tensor<4x32x6xf32>) {
  // expected-error@+1 {{cross_entropy_grad_c2: stats [4x32x6] must be [B, S, 3n] for logits [4x64x512]}}
  %0 = megac.cross_entropy_grad %l, %y, %d, %st : (tensor<4x64x512xf32>, tensor<4x64xi32>, tensor<f32>, tensor<4x32x6xf32>) -> tensor<4x64x512xf32>
  return
}

// -----

// Tests sharding_constraint_c1: a constraint may not name a partial axis
// (invalid.mlir tests only the entry count).
func.func @sharding_constraint_c1_partial(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{sharding_constraint_c1: the sharding needs one entry per dimension of [4x8] and no partial axis}}
  %0 = megac.sharding_constraint %x {sharding = #megac.sharding<[dp, _], partial = [tp]>} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests stack_micro_batches_c1: a scalar has no rows to stack.
func.func @stack_micro_batches_c1_scalar(%x: tensor<f32>) {
  // expected-error@+1 {{stack_micro_batches_c1: the input must have rank >= 1 and count must be positive}}
  %0 = megac.stack_micro_batches %x {count = 2 : i64} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

// Tests stack_micro_batches_c1: the count must be positive.
func.func @stack_micro_batches_c1_count(%x: tensor<2x8xf32>) {
  // expected-error@+1 {{stack_micro_batches_c1: the input must have rank >= 1 and count must be positive}}
  %0 = megac.stack_micro_batches %x {count = 0 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

// Tests that the result holds count times the input's rows.
func.func @stack_micro_batches_rows(%x: tensor<2x8xf32>) {
  // expected-error@+1 {{inferred type(s) 'tensor<6x8xf32>' are incompatible with return type(s) of operation 'tensor<4x8xf32>'}}
  %0 = megac.stack_micro_batches %x {count = 3 : i64} : (tensor<2x8xf32>) -> tensor<4x8xf32>
  return
}
