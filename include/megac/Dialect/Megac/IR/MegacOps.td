//===- MegacOps.td - megac operations ---------------------*- tablegen -*-===//
//
// The tensor ops a GPT-style decoder needs, on global shapes, plus the
// collectives that the partitioner inserts. Each verifier rule has a label
// (`linear_c2`) that appears in the description, the verifier's message and
// the name of its test case in test/Dialect/Megac/invalid.mlir.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACOPS_TD
#define MEGAC_DIALECT_MEGAC_IR_MEGACOPS_TD

include "megac/Dialect/Megac/IR/MegacBase.td"
include "megac/Dialect/Megac/IR/MegacAttrs.td"
include "megac/Dialect/Megac/IR/MegacInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"

def Megac_F32Tensor : RankedTensorOf<[F32]>;
def Megac_Differentiable
    : DeclareOpInterfaceMethods<Megac_DifferentiableOpInterface>;
def Megac_I32Tensor : RankedTensorOf<[I32]>;
def Megac_F32OrI32Tensor : RankedTensorOf<[F32, I32]>;

class Megac_Op<string mnemonic, list<Trait> traits = []>
    : Op<Megac_Dialect, mnemonic, traits>;

// A model op: its result type follows from its operands, and it has a
// sharding rule. Pure unless it says otherwise.
class Megac_ModelOp<string mnemonic, list<Trait> traits = [], bit pure = 1>
    : Megac_Op<mnemonic, !listconcat(traits, !if(pure, [Pure], []), [
        InferTypeOpAdaptor,
        DeclareOpInterfaceMethods<Megac_ShardingRuleOpInterface>])> {
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  // Shape rules are checked once, by the verifier, with their labels; type
  // inference during verification stays silent when the rules fail (see
  // refineByInference in MegacOps.cpp), so each error is reported once.
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    static ::llvm::LogicalResult refineReturnTypes(
        ::mlir::MLIRContext *context, std::optional<::mlir::Location> location,
        ::mlir::ValueRange operands, ::mlir::DictionaryAttr attributes,
        ::mlir::OpaqueProperties properties, ::mlir::RegionRange regions,
        ::llvm::SmallVectorImpl<::mlir::Type> &returnTypes);
  }];
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::refineReturnTypes(
        ::mlir::MLIRContext *context, std::optional<::mlir::Location> location,
        ::mlir::ValueRange operands, ::mlir::DictionaryAttr attributes,
        ::mlir::OpaqueProperties properties, ::mlir::RegionRange regions,
        ::llvm::SmallVectorImpl<::mlir::Type> &returnTypes) {
      return ::megac::detail::refineByInference<$cppClass>(
          context, location, operands, attributes, properties, regions,
          returnTypes);
    }
    ::llvm::LogicalResult $cppClass::verify() {
      return ::megac::detail::verifyByInference(*this);
    }
  }];
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

def Megac_EmbeddingOp : Megac_ModelOp<"embedding", [Megac_Differentiable]> {
  let summary = "Token embedding lookup";
  let description = [{
    `result[b, s, :] = table[ids[b, s], :]`. When the table's vocabulary
    dimension is split over an axis, each rank looks up only its rows and
    yields zeros elsewhere, so the result is a partial sum over that axis
    (Megatron's vocab-parallel embedding).

    ```mlir
    %e = megac.embedding %wte, %ids
        : (tensor<512x128xf32>, tensor<4x64xi32>) -> tensor<4x64x128xf32>
    ```

    Rules: `embedding_c1` the table has rank 2 and the ids rank 2.
  }];
  let arguments = (ins Megac_F32Tensor:$table, Megac_I32Tensor:$ids);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_PositionEmbeddingOp : Megac_ModelOp<"position_embedding", [Megac_Differentiable]> {
  let summary = "Learned absolute position embedding for positions 0..S-1";
  let description = [{
    `result[s, :] = table[s, :]` for `s < S`, where `S` is the sequence
    length of `ids` (`ids` only supplies that length).

    ```mlir
    %p = megac.position_embedding %wpe, %ids
        : (tensor<128x128xf32>, tensor<4x64xi32>) -> tensor<64x128xf32>
    ```

    Rules: `position_embedding_c1` the table has rank 2 and the ids rank 2;
    `position_embedding_c2` the sequence is no longer than the table.
  }];
  let arguments = (ins Megac_F32Tensor:$table, Megac_I32Tensor:$ids);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Contractions
//===----------------------------------------------------------------------===//

def Megac_LinearOp : Megac_ModelOp<"linear", [Megac_Differentiable]> {
  let summary = "Product of an activation with a weight matrix";
  let description = [{
    `result[..., n] = sum_k input[..., k] * weight[k, n]`; with
    `transpose_weight` the weight is stored `[N, K]` (used for the output
    layer tied to the token embedding). Biases are separate `megac.add`s so
    that a row-parallel product can be all-reduced before its bias.

    ```mlir
    %y = megac.linear %x, %w
        : (tensor<4x64x128xf32>, tensor<128x512xf32>) -> tensor<4x64x512xf32>
    ```

    Rules: `linear_c1` the weight has rank 2 and the input rank >= 1;
    `linear_c2` the input's last dimension equals the weight's K.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$weight,
                       UnitAttr:$transpose_weight);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_MatMulOp : Megac_ModelOp<"matmul", [Megac_Differentiable]> {
  let summary = "Batched matrix product";
  let description = [{
    `result[..., m, n] = sum_k lhs[..., m, k] * rhs[..., k, n]`.

    ```mlir
    %c = megac.matmul %a, %b
        : (tensor<8x16x32xf32>, tensor<8x32x16xf32>) -> tensor<8x16x16xf32>
    ```

    Rules: `matmul_c1` both operands have the same rank, at least 2;
    `matmul_c2` the batch dimensions agree; `matmul_c3` lhs's K equals rhs's K.
  }];
  let arguments = (ins Megac_F32Tensor:$lhs, Megac_F32Tensor:$rhs);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

class Megac_BroadcastBinaryOp<string mnemonic, string label>
    : Megac_ModelOp<mnemonic, [Megac_Differentiable]> {
  let arguments = (ins Megac_F32Tensor:$lhs, Megac_F32Tensor:$rhs);
  let results = (outs Megac_F32Tensor:$result);
  string ruleText = [{
    `rhs`'s shape must be a suffix of `lhs`'s: it is broadcast over the
    leading dimensions (a bias over tokens, a position table over the batch).

    Rules: `}] # label # [{_c1` rhs's rank is at most lhs's;
    `}] # label # [{_c2` rhs's dimensions equal lhs's trailing dimensions.
  }];
}

def Megac_AddOp : Megac_BroadcastBinaryOp<"add", "add"> {
  let summary = "Elementwise sum with trailing broadcast";
  let description = [{
    ```mlir
    %y = megac.add %x, %bias
        : (tensor<4x64x512xf32>, tensor<512xf32>) -> tensor<4x64x512xf32>
    ```
  }] # ruleText;
}

def Megac_MulOp : Megac_BroadcastBinaryOp<"mul", "mul"> {
  let summary = "Elementwise product with trailing broadcast";
  let description = [{
    ```mlir
    %y = megac.mul %x, %scale
        : (tensor<4x64x512xf32>, tensor<512xf32>) -> tensor<4x64x512xf32>
    ```
  }] # ruleText;
}

def Megac_GeluOp : Megac_ModelOp<"gelu", [Megac_Differentiable]> {
  let summary = "GeLU, tanh approximation";
  let description = [{
    `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, as GPT-2 uses.

    ```mlir
    %y = megac.gelu %x : (tensor<4x64x512xf32>) -> tensor<4x64x512xf32>
    ```
  }];
  let arguments = (ins Megac_F32Tensor:$input);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_RoundBf16Op : Megac_ModelOp<"round_bf16"> {
  let summary = "Round to the nearest bfloat16, keeping f32 storage";
  let description = [{
    Each element becomes the nearest bfloat16 value (ties to even; NaN stays
    NaN, overflow gives infinity), still stored as f32. Mixed precision
    (megac-mixed-precision) puts one after every activation and on every
    parameter's compute copy, so a program computes what a bf16 program
    with fp32 accumulation does: bf16 tensors in memory, each kernel
    accumulating in f32 or wider. Applied to a partial sum it rounds each
    rank's part, as a bf16 program on that grid would.

    ```mlir
    %y = megac.round_bf16 %x : (tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
    ```
  }];
  let arguments = (ins Megac_F32Tensor:$input);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_SoftmaxOp : Megac_ModelOp<"softmax", [Megac_Differentiable]> {
  let summary = "Softmax over the last dimension";
  let description = [{
    ```mlir
    %p = megac.softmax %x : (tensor<4x64x512xf32>) -> tensor<4x64x512xf32>
    ```

    Rules: `softmax_c1` the input has rank >= 1.
  }];
  let arguments = (ins Megac_F32Tensor:$input);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Normalization and attention
//===----------------------------------------------------------------------===//

def Megac_LayerNormOp : Megac_ModelOp<"layer_norm", [Megac_Differentiable]> {
  let summary = "Layer normalization over the last dimension";
  let description = [{
    `(x - mean) / sqrt(var + epsilon) * gamma + beta`, with the biased
    variance, over the last dimension.

    ```mlir
    %y = megac.layer_norm %x, %g, %b {epsilon = 1.0e-05 : f64}
        : (tensor<4x64x128xf32>, tensor<128xf32>, tensor<128xf32>)
        -> tensor<4x64x128xf32>
    ```

    Rules: `layer_norm_c1` gamma and beta are vectors as long as the input's
    last dimension; `layer_norm_c2` epsilon is positive and finite.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$gamma,
                       Megac_F32Tensor:$beta,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_AttentionOp : Megac_ModelOp<"attention", [Megac_Differentiable]> {
  let summary = "Multi-head scaled dot-product attention as one op";
  let description = [{
    `q`, `k`, `v` are `[B, S, H]` with heads laid out contiguously along `H`
    (head `h` owns columns `h*H/n .. (h+1)*H/n`). Scores are scaled by
    `1/sqrt(H/n)`; with `causal` (default) position `i` sees `j <= i`. The
    heads dimension may be split over a grid axis in whole heads.

    ```mlir
    %o = megac.attention %q, %k, %v {num_heads = 4 : i64}
        : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>)
        -> tensor<4x64x128xf32>
    ```

    With `dropout` p > 0 the attention probabilities are dropped out (kept
    with probability 1 - p, scaled by 1 / (1 - p)) before they weight the
    values, as GPT-2's attn_pdrop. The mask of probability `(b, h, i, j)` is
    keyed by the run's seed, `stream`, the step and that element's index in
    the whole `[B, heads, S, S]` tensor, like megac.dropout: ranks holding
    other heads draw other masks, and every grid draws the one-rank mask.

    Rules: `attention_c1` q, k and v have rank 3 and the same shape;
    `attention_c2` num_heads is positive and divides H; `attention_c3`
    dropout lies in [0, 1).
  }];
  let arguments = (ins Megac_F32Tensor:$query, Megac_F32Tensor:$key,
                       Megac_F32Tensor:$value,
                       I64Attr:$num_heads,
                       DefaultValuedAttr<BoolAttr, "true">:$causal,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_DropoutOp : Megac_ModelOp<"dropout", [Megac_Differentiable]> {
  let summary = "Dropout with a mask that depends on global positions only";
  let description = [{
    Keeps each element with probability `1 - rate` and scales it by
    `1 / (1 - rate)`. Whether element `g` (its flat index in the whole,
    unsharded tensor) is kept is a counter-based random function of the run's
    seed, `stream`, the training step and `g`, so:
    - ranks holding the same elements (a tensor whole over a tensor-parallel
      group) draw the same mask and ranks holding different ones draw
      different masks: Megatron's RNG rules without per-region streams;
    - every grid draws the same mask: a sharded run reproduces one rank;
    - the gradient is the same dropout (same stream) of the output gradient.

    Training only: `megac compile` without `--train` or `--gradients`
    removes dropout (megac-disable-dropout).

    ```mlir
    %y = megac.dropout %x {rate = 0.1 : f64, stream = 3 : i64}
        : (tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
    ```

    Rules: `dropout_c1` the rate lies in [0, 1).
  }];
  let arguments = (ins Megac_F32Tensor:$input, F64Attr:$rate, I64Attr:$stream);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

def Megac_ReshapeOp : Megac_ModelOp<"reshape", [Megac_Differentiable]> {
  let summary = "Reinterpret a tensor with a new static shape";
  let description = [{
    ```mlir
    %y = megac.reshape %x {shape = array<i64: 4, 64, 4, 32>}
        : (tensor<4x64x128xf32>) -> tensor<4x64x4x32xf32>
    ```

    Rules: `reshape_c1` the input is static and the element counts agree.
  }];
  let arguments = (ins Megac_F32Tensor:$input, DenseI64ArrayAttr:$shape);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_TransposeOp : Megac_ModelOp<"transpose", [Megac_Differentiable]> {
  let summary = "Permute dimensions";
  let description = [{
    `result` dimension `i` is input dimension `permutation[i]`.

    ```mlir
    %y = megac.transpose %x {permutation = array<i64: 0, 2, 1>}
        : (tensor<4x64x128xf32>) -> tensor<4x128x64xf32>
    ```

    Rules: `transpose_c1` the permutation is a permutation of the input's
    dimensions.
  }];
  let arguments = (ins Megac_F32Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def Megac_CrossEntropyOp : Megac_ModelOp<"cross_entropy", [Megac_Differentiable]> {
  let summary = "Mean token cross-entropy of logits against labels";
  let description = [{
    `mean over (b, s) of logsumexp(logits[b, s, :]) - logits[b, s, labels[b, s]]`.

    ```mlir
    %l = megac.cross_entropy %logits, %labels
        : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<f32>
    ```

    With `classes`, only the first `classes` logits of a row are classes:
    the rest (a vocabulary padded so that a grid axis divides it, as
    Megatron pads it) take no part, as if they were minus infinity.

    Rules: `cross_entropy_c1` logits have rank 3, labels rank 2, and their
    batch and sequence dimensions agree; `cross_entropy_c2` `classes`, if
    given, is positive and at most the vocabulary.
  }];
  let arguments = (ins Megac_F32Tensor:$logits, Megac_I32Tensor:$labels,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_CrossEntropyStatsOp : Megac_ModelOp<"cross_entropy_stats"> {
  let summary = "Per-token softmax statistics of each vocabulary block";
  let description = [{
    Splits the vocabulary into `shards` equal blocks and, for every token and
    block `k`, yields three numbers at `result[b, s, 3k .. 3k+2]`: the block's
    largest logit `m_k`, `sum exp(logit - m_k)` over the block, and the
    label's logit if the label falls in the block (else 0).

    This is the first half of Megatron's vocabulary-parallel cross-entropy:
    with the vocabulary split over an axis of `shards` ranks, each rank
    computes its own block, and gathering these per-token scalars (not the
    logits) gives every rank what `megac.cross_entropy_from_stats` and
    `megac.cross_entropy_grad` need. megac-split-cross-entropy creates it.

    ```mlir
    %st = megac.cross_entropy_stats %logits, %labels {shards = 2 : i64}
        : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<4x64x6xf32>
    ```

    With `classes` (of the whole vocabulary), logits from column `classes`
    on take no part: a block with none left yields minus infinity and 0.

    Rules: `cross_entropy_stats_c1` logits `[B, S, V]` and labels `[B, S]`;
    `cross_entropy_stats_c2` `shards` is positive and divides `V`;
    `classes`, if given, is positive.
  }];
  let arguments = (ins Megac_F32Tensor:$logits, Megac_I32Tensor:$labels,
                       I64Attr:$shards, OptionalAttr<I64Attr>:$classes);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_CrossEntropyFromStatsOp : Megac_ModelOp<"cross_entropy_from_stats"> {
  let summary = "Mean token cross-entropy from per-block softmax statistics";
  let description = [{
    Combines the blocks of `megac.cross_entropy_stats` into the loss:
    with `M = max_k m_k`, each token contributes
    `M + log(sum_k s_k exp(m_k - M)) - sum_k t_k`, and the result is their
    mean, exactly `megac.cross_entropy` of the logits the statistics came
    from.

    ```mlir
    %l = megac.cross_entropy_from_stats %stats
        : (tensor<4x64x6xf32>) -> tensor<f32>
    ```

    Rules: `cross_entropy_from_stats_c1` stats `[B, S, 3n]`.
  }];
  let arguments = (ins Megac_F32Tensor:$stats);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Backward ops (created by megac-autodiff)
//===----------------------------------------------------------------------===//

def Megac_LinearWeightGradOp : Megac_ModelOp<"linear_weight_grad"> {
  let summary = "Weight gradient of megac.linear";
  let description = [{
    `result = sum over leading dims of input^T * output_grad`: `[K, N]`, or
    `[N, K]` with `transpose_weight` (the layout of the forward weight).
    Splitting the leading (token) dimensions makes the result a partial sum,
    which is how data parallelism's gradient reduction arises.

    ```mlir
    %dw = megac.linear_weight_grad %x, %dy
        : (tensor<4x64x128xf32>, tensor<4x64x512xf32>) -> tensor<128x512xf32>
    ```

    Rules: `linear_weight_grad_c1` input and output_grad have the same rank
    >= 1 and the same leading dimensions.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$output_grad,
                       UnitAttr:$transpose_weight);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_GeluGradOp : Megac_ModelOp<"gelu_grad"> {
  let summary = "Input gradient of megac.gelu";
  let description = [{
    `result = output_grad * gelu'(input)` for the tanh form.

    ```mlir
    %dx = megac.gelu_grad %x, %dy
        : (tensor<4x512xf32>, tensor<4x512xf32>) -> tensor<4x512xf32>
    ```

    Rules: `gelu_grad_c1` both operands have one shape.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$output_grad);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_NormalizeOp : Megac_ModelOp<"normalize"> {
  let summary = "Layer normalization without scale and shift";
  let description = [{
    `(x - mean) / sqrt(var + epsilon)` over the last dimension; the
    backward pass of LayerNorm uses it for the gradient of gamma.

    ```mlir
    %xhat = megac.normalize %x {epsilon = 1.0e-05 : f64}
        : (tensor<4x128xf32>) -> tensor<4x128xf32>
    ```

    Rules: `normalize_c1` the input has rank >= 1.
  }];
  let arguments = (ins Megac_F32Tensor:$input,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_LayerNormGainGradOp : Megac_ModelOp<"layer_norm_gain_grad"> {
  let summary = "Gradient of megac.layer_norm's gain";
  let description = [{
    `sum over the leading dimensions of output_grad * normalize(input)`:
    the column sums of the output gradient times the normalized input,
    in one pass over `input` and `output_grad`, with neither the
    normalized input nor the product ever stored. Each element is the
    f32 product of `output_grad` and the f32 normalized input, exactly
    as `megac.mul` of `megac.normalize` would give it, and the sum runs
    in f64 as `megac.sum_leading`'s.

    ```mlir
    %dgamma = megac.layer_norm_gain_grad %x, %dy {epsilon = 1.0e-05 : f64}
        : (tensor<4x128xf32>, tensor<4x128xf32>) -> tensor<128xf32>
    ```

    Rules: `layer_norm_gain_grad_c1` the input has rank >= 1 and
    output_grad has its shape.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$output_grad,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_LayerNormGradOp : Megac_ModelOp<"layer_norm_grad"> {
  let summary = "Input gradient of megac.layer_norm";
  let description = [{
    ```mlir
    %dx = megac.layer_norm_grad %x, %gamma, %dy {epsilon = 1.0e-05 : f64}
        : (tensor<4x128xf32>, tensor<128xf32>, tensor<4x128xf32>) -> tensor<4x128xf32>
    ```

    Rules: `layer_norm_grad_c1` gamma is a vector of the input's last
    dimension and output_grad has the input's shape.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_F32Tensor:$gamma,
                       Megac_F32Tensor:$output_grad,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_AttentionGradOp : Megac_ModelOp<"attention_grad"> {
  let summary = "Gradient of megac.attention for one of its operands";
  let description = [{
    Recomputes the attention probabilities and returns the gradient for the
    query (`operand = 0`), key (1) or value (2).

    ```mlir
    %dq = megac.attention_grad %q, %k, %v, %dy {num_heads = 4 : i64, operand = 0 : i64}
        : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>,
           tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
    ```

    `dropout` and `stream` are the forward op's: the same mask is drawn
    again.

    Rules: `attention_grad_c1` all four operands are rank-3 of one shape;
    `attention_grad_c2` num_heads is positive and divides H;
    `attention_grad_c3` operand is 0, 1 or 2; `attention_grad_c4` dropout
    lies in [0, 1).
  }];
  let arguments = (ins Megac_F32Tensor:$query, Megac_F32Tensor:$key,
                       Megac_F32Tensor:$value, Megac_F32Tensor:$output_grad,
                       I64Attr:$num_heads,
                       DefaultValuedAttr<BoolAttr, "true">:$causal,
                       I64Attr:$operand,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_SoftmaxGradOp : Megac_ModelOp<"softmax_grad"> {
  let summary = "Input gradient of megac.softmax, from its output";
  let description = [{
    `result = output * (output_grad - sum(output_grad * output))` over the
    last dimension.

    ```mlir
    %dx = megac.softmax_grad %y, %dy
        : (tensor<4x512xf32>, tensor<4x512xf32>) -> tensor<4x512xf32>
    ```

    Rules: `softmax_grad_c1` both operands have one shape of rank >= 1.
  }];
  let arguments = (ins Megac_F32Tensor:$output, Megac_F32Tensor:$output_grad);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_EmbeddingGradOp : Megac_ModelOp<"embedding_grad"> {
  let summary = "Table gradient of megac.embedding";
  let description = [{
    Scatter-adds each token's output gradient into its table row. The table
    operand supplies the shape and the vocabulary split only.

    ```mlir
    %dt = megac.embedding_grad %wte, %ids, %dy
        : (tensor<512x128xf32>, tensor<4x64xi32>, tensor<4x64x128xf32>) -> tensor<512x128xf32>
    ```

    Rules: `embedding_grad_c1` table `[V, H]`, ids `[B, S]`, output_grad
    `[B, S, H]`.
  }];
  let arguments = (ins Megac_F32Tensor:$table, Megac_I32Tensor:$ids,
                       Megac_F32Tensor:$output_grad);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_PositionEmbeddingGradOp : Megac_ModelOp<"position_embedding_grad"> {
  let summary = "Table gradient of megac.position_embedding";
  let description = [{
    Rows below the sequence length are the output gradient, the rest zero.

    ```mlir
    %dt = megac.position_embedding_grad %wpe, %dy
        : (tensor<128x128xf32>, tensor<64x128xf32>) -> tensor<128x128xf32>
    ```

    Rules: `position_embedding_grad_c1` table `[P, H]` and output_grad
    `[S, H]` with `S <= P`.
  }];
  let arguments = (ins Megac_F32Tensor:$table, Megac_F32Tensor:$output_grad);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_CrossEntropyGradOp : Megac_ModelOp<"cross_entropy_grad"> {
  let summary = "Logits gradient of megac.cross_entropy";
  let description = [{
    `(softmax(logits) - onehot(labels)) * loss_grad / (number of tokens)`.

    With the optional `stats` (all vocabulary blocks of
    `megac.cross_entropy_stats`), the softmax normalizer comes from them
    instead of the row itself: the logits may then be one block of a
    vocabulary split, and each rank computes only its block of the gradient
    (Megatron's vocabulary-parallel cross-entropy, backward).

    ```mlir
    %dl = megac.cross_entropy_grad %logits, %labels, %dloss
        : (tensor<4x64x512xf32>, tensor<4x64xi32>, tensor<f32>) -> tensor<4x64x512xf32>
    ```

    With `classes` (of the whole vocabulary, as on `megac.cross_entropy`),
    the gradient of every logit from column `classes` on is 0.

    Rules: `cross_entropy_grad_c1` logits `[B, S, V]`, labels `[B, S]`,
    loss_grad a scalar; `cross_entropy_grad_c2` stats, if given, are
    `[B, S, 3n]` (the logits being the whole vocabulary or one of its `n`
    blocks); `classes`, if given, is positive.
  }];
  let arguments = (ins Megac_F32Tensor:$logits, Megac_I32Tensor:$labels,
                       Megac_F32Tensor:$loss_grad,
                       Optional<Megac_F32Tensor>:$stats,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_SumLeadingOp : Megac_ModelOp<"sum_leading"> {
  let summary = "Sum over leading dimensions, keeping the trailing ones";
  let description = [{
    The gradient of a broadcast operand: sums all but the last `keep`
    dimensions.

    ```mlir
    %db = megac.sum_leading %dy {keep = 1 : i64}
        : (tensor<4x64x512xf32>) -> tensor<512xf32>
    ```

    Rules: `sum_leading_c1` 0 <= keep <= the input's rank.
  }];
  let arguments = (ins Megac_F32Tensor:$input, I64Attr:$keep);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_SumSquaresOp : Megac_ModelOp<"sum_squares"> {
  let summary = "Sum of squared elements (for gradient norms)";
  let description = [{
    ```mlir
    %s = megac.sum_squares %g : (tensor<128x512xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Megac_F32Tensor:$input);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_ClipCoefficientOp : Megac_ModelOp<"clip_coefficient"> {
  let summary = "Gradient scale for global-norm clipping";
  let description = [{
    `min(1, max_norm / (sqrt(total) + 1e-6))` for the total sum of squared
    gradients `total`.

    ```mlir
    %c = megac.clip_coefficient %total {max_norm = 1.0 : f64}
        : (tensor<f32>) -> tensor<f32>
    ```

    Rules: `clip_coefficient_c1` total is a scalar; `clip_coefficient_c2`
    max_norm is positive.
  }];
  let arguments = (ins Megac_F32Tensor:$total, F64Attr:$max_norm);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_FillOp : Megac_ModelOp<"fill"> {
  let summary = "A tensor of one value";
  let description = [{
    ```mlir
    %one = megac.fill {shape = array<i64>, value = 1.0 : f64} : () -> tensor<f32>
    ```

    Rules: `fill_c1` the shape has no negative size.
  }];
  let arguments = (ins DenseI64ArrayAttr:$shape, F64Attr:$value);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Optimizer (created by megac-apply-optimizer)
//===----------------------------------------------------------------------===//

def Megac_AccumulateOp : Megac_ModelOp<"accumulate", [], /*pure=*/0> {
  let summary = "Sum of a value over the micro-batches of a step";
  let description = [{
    With gradient accumulation the step runs its forward and backward part
    once per micro-batch; `accumulate` yields the sum of its input over all
    of them (the first micro-batch stores it, later ones add to it). Its
    users, the optimizer and the returned loss, run once, after the last
    micro-batch. Created by megac-accumulate-micro-batches.

    ```mlir
    %g = megac.accumulate %dw : (tensor<128x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins Megac_F32Tensor:$input);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_StackMicroBatchesOp
    : Megac_ModelOp<"stack_micro_batches", [], /*pure=*/0> {
  let summary = "Rows of a value over the micro-batches of a step, in order";
  let description = [{
    With gradient accumulation the forward part runs once per micro-batch,
    so a per-row result (the logits of a gradients plan) holds one
    micro-batch's rows. `stack_micro_batches` yields the whole step's rows:
    micro-batch `k` writes its input into rows `[k * r, (k + 1) * r)` of the
    result, where `r` is the input's leading dimension. The result is read
    after the last micro-batch. Created by megac-accumulate-micro-batches
    for the results that are neither the loss nor a gradient.

    The input stays whole on every rank (its rows are one micro-batch of
    the global batch, the order the result stacks them in).

    ```mlir
    %all = megac.stack_micro_batches %logits {count = 2 : i64}
        : (tensor<2x8x64xf32>) -> tensor<4x8x64xf32>
    ```

    Rule: `stack_micro_batches_c1` the input has rank >= 1 and `count` is
    positive. The result is the input with its leading dimension times
    `count`.
  }];
  let arguments = (ins Megac_F32OrI32Tensor:$input, I64Attr:$count);
  let results = (outs Megac_F32OrI32Tensor:$result);
}

def Megac_AdamWOp : Megac_ModelOp<"adamw", [MemoryEffects<[MemWrite]>],
                                  /*pure=*/0> {
  let summary = "AdamW update of a parameter, in place";
  let description = [{
    Updates `param` with `grad * coefficient` (the clipping scale); the
    result is the updated parameter and occupies the parameter's storage.
    The moments and the learning rate (the plan's schedule at the current
    step) are runtime state. Weight decay is decoupled.

    ```mlir
    %p2 = megac.adamw %p, %g, %c {beta1 = 0.9 : f64, beta2 = 0.95 : f64,
                                  epsilon = 1.0e-08 : f64, weight_decay = 0.1 : f64}
        : (tensor<128x512xf32>, tensor<128x512xf32>, tensor<f32>) -> tensor<128x512xf32>
    ```

    Rules: `adamw_c1` grad has the parameter's shape; `adamw_c2` the
    coefficient is a scalar; `adamw_c3` the betas lie in [0, 1) and epsilon
    and weight decay are not negative.
  }];
  let arguments = (ins Megac_F32Tensor:$param, Megac_F32Tensor:$grad,
                       Megac_F32Tensor:$coefficient,
                       F64Attr:$beta1, F64Attr:$beta2, F64Attr:$epsilon,
                       F64Attr:$weight_decay);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_ShardingConstraintOp : Megac_ModelOp<"sharding_constraint",
                                              [Megac_Differentiable]> {
  let summary = "Identity that pins its value to a sharding";
  let description = [{
    Its operand is required in `sharding` and its result has it; the
    collectives that get there are inserted like any other. Axes the grid
    lacks (or has with size 1) are dropped. megac-apply-optimizer uses it for
    ZeRO: gradients reduce-scattered over `dp`, updated slices gathered back;
    megac-sequence-parallel splits the residual stream with it. Its gradient
    is the same constraint on the output gradient.

    ```mlir
    %g2 = megac.sharding_constraint %g {sharding = #megac.sharding<[dp, tp]>}
        : (tensor<128x512xf32>) -> tensor<128x512xf32>
    ```

    Rules: `sharding_constraint_c1` the sharding has one entry per dimension
    and no partial axis.
  }];
  let arguments = (ins Megac_F32Tensor:$input, Megac_ShardingAttr:$sharding);
  let results = (outs Megac_F32Tensor:$result);
}

def Megac_AssignOp : Megac_ModelOp<"assign", [MemoryEffects<[MemWrite]>],
                                   /*pure=*/0> {
  let summary = "Overwrite a parameter's storage with a value";
  let description = [{
    The result is the parameter's new value and occupies its storage (like
    megac.adamw). Under ZeRO, the updated slices gathered over `dp` are
    assigned back to the whole parameter.

    ```mlir
    %p2 = megac.assign %p, %updated
        : (tensor<128x512xf32>, tensor<128x512xf32>) -> tensor<128x512xf32>
    ```

    Rules: `assign_c1` the value has the parameter's shape.
  }];
  let arguments = (ins Megac_F32Tensor:$param, Megac_F32Tensor:$value);
  let results = (outs Megac_F32Tensor:$result);
}

//===----------------------------------------------------------------------===//
// Collectives (inserted by megac-insert-collectives)
//===----------------------------------------------------------------------===//

class Megac_CollectiveOp<string mnemonic> : Megac_Op<mnemonic, [Pure]> {
  let assemblyFormat =
      "$input attr-dict `:` functional-type(operands, results)";
}

def Megac_AllReduceOp : Megac_CollectiveOp<"all_reduce"> {
  let summary = "Sum a partial-sum tensor over the ranks of a grid axis";
  let description = [{
    Turns a value that is partial over `axis` into the full sum on every
    rank of the axis' group. Shapes are unchanged.

    ```mlir
    %y = megac.all_reduce %x {axis = "tp"}
        : (tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
    ```

    Rules: `all_reduce_c1` the result type equals the input type.
  }];
  let arguments = (ins Megac_F32Tensor:$input, StrAttr:$axis);
  let results = (outs Megac_F32Tensor:$result);
  let hasVerifier = 1;
}

def Megac_AllReduceBucketOp : Megac_Op<"all_reduce_bucket", [Pure]> {
  let summary = "One all-reduce for several partial-sum tensors (a bucket)";
  let description = [{
    Sums each input over the ranks of `axis`, as one `megac.all_reduce`
    each would, but in one collective of their concatenation: data-parallel
    gradients (one per parameter) then cost one collective per bucket
    instead of one per parameter, and each message is large enough to reach
    the network's bandwidth rather than its latency. Created by
    megac-bucket-all-reduces on per-rank IR.

    ```mlir
    %a, %b = megac.all_reduce_bucket %x, %y {axis = "dp"}
        : (tensor<128x64xf32>, tensor<64xf32>) -> (tensor<128x64xf32>, tensor<64xf32>)
    ```

    Rules: `all_reduce_bucket_c1` at least one input, and the result types
    equal the input types, in order.
  }];
  let arguments = (ins Variadic<Megac_F32Tensor>:$inputs, StrAttr:$axis);
  let results = (outs Variadic<Megac_F32Tensor>:$results);
  let assemblyFormat =
      "$inputs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Megac_TransferOp : Megac_Op<"transfer", [MemoryEffects<[MemWrite]>]> {
  let summary = "Hand a value from one pipeline stage to another";
  let description = [{
    Pipeline parallelism: `input` is computed on the ranks of stage
    `src_stage` and used on those of `dst_stage`. The plan emitter turns it
    into a send on the first (in the segment of `src_phase`: forward,
    backward or step) and a receive on the second (in `dst_phase`), between
    ranks that agree on every grid coordinate but `pp`; the receiving ranks
    then read the received copy wherever the program reads `input`. Created
    by megac-pipeline-stages right before the value's first use on
    `dst_stage`. It has no result, so it can neither be folded away nor
    change what any op reads.

    ```mlir
    megac.transfer %h {src_stage = 0 : i64, dst_stage = 1 : i64,
                       src_phase = "forward", dst_phase = "forward"}
        : tensor<2x64x128xf32>
    ```

    Rules: `transfer_c1` the stages differ and are not negative;
    `transfer_c2` the phases are forward, backward or step, and a value
    is not received in a phase that runs before the one that makes it.
  }];
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$src_stage,
                   I64Attr:$dst_stage, StrAttr:$src_phase, StrAttr:$dst_phase);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Megac_ReduceScatterOp : Megac_CollectiveOp<"reduce_scatter"> {
  let summary = "Sum over a grid axis, each rank keeping its chunk";
  let description = [{
    Turns a value that is partial over `axis` into its sum split along `dim`
    over the same axis: the bytes of an all-reduce, half the traffic. Before
    partitioning the types are equal; afterwards the dimension is divided by
    the axis size.

    ```mlir
    %y = megac.reduce_scatter %x {axis = "dp", dim = 0 : i64}
        : (tensor<128x512xf32>) -> tensor<64x512xf32>
    ```

    Rules: `reduce_scatter_c1` `dim` is a dimension of the input;
    `reduce_scatter_c2` the other dimensions are unchanged and the scattered
    one does not grow.
  }];
  let arguments = (ins Megac_F32Tensor:$input, StrAttr:$axis, I64Attr:$dim);
  let results = (outs Megac_F32Tensor:$result);
  let hasVerifier = 1;
}

def Megac_AllGatherOp : Megac_CollectiveOp<"all_gather"> {
  let summary = "Concatenate the chunks of a split dimension from a grid axis";
  let description = [{
    Before partitioning (global shapes) the types are equal; after
    `megac-localize-shapes` the gathered dimension is the axis size times
    larger.

    ```mlir
    %y = megac.all_gather %x {axis = "tp", dim = 2 : i64}
        : (tensor<4x64x256xf32>) -> tensor<4x64x512xf32>
    ```

    Rules: `all_gather_c1` `dim` is a dimension of the input;
    `all_gather_c2` the other dimensions are unchanged and the gathered one
    does not shrink.
  }];
  let arguments = (ins Megac_F32Tensor:$input, StrAttr:$axis, I64Attr:$dim);
  let results = (outs Megac_F32Tensor:$result);
  let hasVerifier = 1;
}

def Megac_SliceShardOp : Megac_CollectiveOp<"slice_shard"> {
  let summary = "Keep this rank's chunk of a whole dimension (no communication)";
  let description = [{
    The inverse of `all_gather`: each rank keeps chunk `c` along `dim`, where
    `c` is its coordinate on `axis`.

    ```mlir
    %y = megac.slice_shard %x {axis = "tp", dim = 1 : i64}
        : (tensor<128x512xf32>) -> tensor<128x256xf32>
    ```

    Token ids slice too (i32): labels read whole by every rank where the
    logits they meet are split over the batch or the sequence.

    Rules: `slice_shard_c1` `dim` is a dimension of the input;
    `slice_shard_c2` the other dimensions are unchanged and the sliced one
    does not grow; `slice_shard_c3` the element type is kept.
  }];
  let arguments = (ins Megac_F32OrI32Tensor:$input, StrAttr:$axis, I64Attr:$dim);
  let results = (outs Megac_F32OrI32Tensor:$result);
  let hasVerifier = 1;
}

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACOPS_TD
