//===- GemmEpilogue.h - A product and the epilogue it takes -----*- C++ -*-===//
//
// cuBLASLt can add a bias or a residual, and apply a GeLU or GeLU's
// gradient, as it writes a product: no pass over memory for them; a
// LayerNorm gradient's row kernel can add the residual stream's gradient
// likewise, a LayerNorm gain gradient's pass over dy can sum the bias
// gradient too, as can a weight gradient's product (cuBLASLt's BGRAD
// epilogues), and one pass of the attention kernels gives dq, dk and dv.
// The embedding's gradient can add another gradient of its table as it
// writes, and a product another tensor of its shape (cuBLAS's C).
// megac-fuse-elementwise marks such groups ("g", "d", "c", "n", "b", "w",
// "a", "t") and the plan emitter turns each into one linear_bias,
// linear_gelu_grad, linear, layer_norm_grad, layer_norm_gain_grad,
// linear_weight_grad, attention_grad or embedding_grad instruction;
// both find the group's parts with the matchers below, so what one marks
// the other emits.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_GEMMEPILOGUE_H
#define MEGAC_DIALECT_MEGAC_IR_GEMMEPILOGUE_H

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include <optional>

namespace megac {

/// The single reader of \p value, if it has exactly one.
mlir::Operation *soleUser(mlir::Value value);

/// Whether \p add adds a bias (a vector of the last dimension) to every
/// row of \p product, its first operand.
bool addsBias(AddOp add, mlir::Value product);

/// The operand \p add adds to \p sum, when that is a tensor of the sum's
/// own type (a residual, not a bias); null otherwise.
mlir::Value residualOf(AddOp add, mlir::Value sum);

/// linear -> add bias [-> round_bf16] [-> gelu [-> round_bf16]], or
/// linear -> add bias -> add residual [-> round_bf16]: a bf16 plan rounds
/// the sum (or the residual sum) and the GeLU (megac-round-after-epilogue
/// took the product's rounding away: the bias is added to the fp32
/// product, the GeLU or the residual add reads the fp32 sum), an fp32 plan
/// neither. What cuBLASLt computes as the product's epilogue (the residual
/// its C, added with beta = 1), and writes rounded.
struct GemmEpilogue {
  LinearOp linear;
  AddOp add;
  RoundBf16Op sumRound; // the rounded sum (null: not rounded, or not read)
  AddOp residual;       // null: no residual add (always, with a GeLU)
  RoundBf16Op residualRound;
  GeluOp gelu;          // null: no GeLU
  RoundBf16Op geluRound;

  bool rounded() const;
  /// The GeLU's input the group writes: the (rounded) sum.
  mlir::Value preActivation() const;
  /// What the group writes last: the GeLU's result, else the residual
  /// sum, else the sum.
  mlir::Value result() const;
  /// The tensor the residual add adds (null: none).
  mlir::Value residualInput() const;
  /// Whether the pre-activation is read outside the group too (the
  /// backward pass keeps it for GeLU's gradient): a second output.
  bool keepsPreActivation() const;
  /// The group's ops in program order; the last is where it is emitted.
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group starting at \p linear, taking only ops \p admissible accepts
/// (besides the linear); none where \p linear does not start one. Every
/// value inside the group is read only inside it, except a kept
/// pre-activation, whose other readers all follow the group.
std::optional<GemmEpilogue>
matchGemmEpilogue(LinearOp linear,
                  llvm::function_ref<bool(mlir::Operation *)> admissible);

/// linear -> gelu_grad(x, product) [-> round_bf16]: the product is the
/// output gradient of a GeLU whose input x the forward kept (the backward
/// pass through fc1's GeLU; in a bf16 plan megac-round-after-epilogue took
/// the product's rounding away). cuBLASLt's DGELU epilogue, x its
/// auxiliary input.
struct GemmGeluGrad {
  LinearOp linear;
  GeluGradOp grad;
  RoundBf16Op round; // null in an fp32 plan

  /// What the group writes: the (rounded) gradient.
  mlir::Value result() const;
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group starting at \p linear, taking only ops \p admissible accepts;
/// none where \p linear does not start one.
std::optional<GemmGeluGrad>
matchGemmGeluGrad(LinearOp linear,
                  llvm::function_ref<bool(mlir::Operation *)> admissible);

/// Whether the product whose result (or rounding) is \p product, one of
/// \p add's two addends, takes the other addend, a tensor of its type, as
/// its C (cuBLAS adds it with beta = 1 as it writes the product: a "c"
/// group). Not where the other could take this add into a group of its
/// own instead: a product with its bias (the "g" group's residual add),
/// a LayerNorm's input gradient ("n"), the embedding's gradient ("t"),
/// each directly or through a rounding that only \p add reads; where the
/// other is such a product without bias, the later of the two takes the
/// earlier as its C (the earlier is written first). One answer for both
/// megac-round-after-epilogue and megac-fuse-elementwise.
bool takesAddendAsC(AddOp add, mlir::Value product);
/// linear -> add of another tensor of the product's type [-> round_bf16],
/// where the product takes it as its C (takesAddendAsC): a sum of
/// products, like the gradient reaching q, k and v's shared input, or a
/// product and another gradient. A bf16 plan rounds the sum
/// (megac-round-after-epilogue took the product's rounding away: the
/// other is added to the fp32 product, the sum rounded once). One product
/// that reads the other as C and writes the sum ("c" groups): no pass
/// over memory for the add.
struct GemmAccumulate {
  LinearOp linear;
  AddOp add;
  RoundBf16Op round; // null in an fp32 plan
  /// The tensor added to the product (cuBLAS's C).
  mlir::Value into() const;
  /// What the group writes: the (rounded) sum.
  mlir::Value result() const;
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};
/// The group starting at \p linear, taking only ops \p admissible accepts;
/// none where \p linear does not start one.
std::optional<GemmAccumulate>
matchGemmAccumulate(LinearOp linear,
                    llvm::function_ref<bool(mlir::Operation *)> admissible);

/// layer_norm_grad -> add residual [-> round_bf16]: the gradient reaching
/// a LayerNorm's input through the norm, plus the residual stream's
/// gradient (a bf16 plan rounds the sum; megac-round-after-epilogue took
/// the norm gradient's own rounding away). The norm gradient's row kernel
/// adds the residual as it writes ("n" groups): no pass over memory for
/// the add.
struct NormGradResidual {
  LayerNormGradOp grad;
  AddOp add;
  RoundBf16Op round; // null in an fp32 plan

  /// What the group writes: the (rounded) sum.
  mlir::Value result() const;
  /// The tensor added to the norm's gradient.
  mlir::Value residualInput() const;
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group starting at \p grad, taking only ops \p admissible accepts;
/// none where \p grad does not start one.
std::optional<NormGradResidual>
matchNormGradResidual(LayerNormGradOp grad,
                      llvm::function_ref<bool(mlir::Operation *)> admissible);

/// layer_norm_gain_grad(x, dy) and sum_leading(dy) (the LayerNorm's gain
/// and bias gradients): both sum over dy's rows, so one pass over dy makes
/// both ("b" groups). Neither is a micro-batch sum's (a gradient written
/// straight into it): those stay one instruction each.
struct NormParamGrads {
  LayerNormGainGradOp gain;
  SumLeadingOp bias;

  /// The group's ops in program order; the last is where it is emitted.
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group of \p gain and a bias gradient of its dy that \p admissible
/// accepts; none where there is no such bias gradient, or where a reader
/// of the first of the two comes before the second.
std::optional<NormParamGrads>
matchNormParamGrads(LayerNormGainGradOp gain,
                    llvm::function_ref<bool(mlir::Operation *)> admissible);

/// linear_weight_grad(x, dy) and sum_leading(dy) (a product's weight and
/// bias gradients): cuBLASLt's BGRADA/BGRADB epilogue sums dy's rows as
/// the weight gradient's product reads them, so the bias gradient takes
/// no pass over dy of its own ("w" groups). Neither is a micro-batch
/// sum's.
struct WeightBiasGrads {
  LinearWeightGradOp weight;
  SumLeadingOp bias;

  /// The group's ops in program order; the last is where it is emitted.
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group of \p weight and a bias gradient of its dy that \p
/// admissible accepts; none where there is no such bias gradient, or
/// where a reader of the first of the two comes before the second.
std::optional<WeightBiasGrads>
matchWeightBiasGrads(LinearWeightGradOp weight,
                     llvm::function_ref<bool(mlir::Operation *)> admissible);

/// embedding_grad -> add of another gradient of the table (a tied
/// embedding's output layer's): the embedding's gradient kernel adds the
/// other as it writes each row ("t" groups), in place where nothing else
/// reads the other (its buffer becomes the sum's), so rows no token
/// touched are not even read. The CPU backend adds the two as the add
/// did.
struct EmbeddingGradInto {
  EmbeddingGradOp grad;
  AddOp add;

  /// The gradient added to the embedding's.
  mlir::Value into() const;
  /// Whether the sum may take into()'s buffer: the add is its one reader,
  /// and an op of the same block writes it.
  bool inPlace() const;
  llvm::SmallVector<mlir::Operation *, 5> ops() const;
};

/// The group starting at \p grad, taking only ops \p admissible accepts;
/// none where \p grad does not start one.
std::optional<EmbeddingGradInto>
matchEmbeddingGradInto(EmbeddingGradOp grad,
                       llvm::function_ref<bool(mlir::Operation *)> admissible);

/// The gradient steps of one attention's inputs (attention_grad with
/// operand 0, 1 and 2 of the same q, k, v, dy and attributes), each with
/// its rounding in a bf16 plan: the register-resident kernels compute dk
/// and dv in one pass, and dq in the same pass where the query's step is
/// in the group ("a" groups: one attention_grad instruction with two
/// outputs, dk and dv, or three, dq, dk and dv).
struct AttentionInputGrads {
  AttentionGradOp query, key, value;            // query may be null
  RoundBf16Op queryRound, keyRound, valueRound; // all null, or all set

  /// The (rounded) results the group writes, in its instruction's order:
  /// dq (where the group has the query's step), dk, dv.
  llvm::SmallVector<mlir::Value, 3> results() const;
  /// The group's ops in program order; the last is where it is emitted.
  llvm::SmallVector<mlir::Operation *, 6> ops() const;
};

/// The group of \p key (the key's gradient step), its attention's value
/// step and, where one fits, its query step, taking only ops \p admissible
/// accepts; none where there is no such value step, the two are rounded
/// differently, or a reader of the group's first result comes before its
/// last op. A query step joins where it is rounded as the other two and
/// its result, too, is read only after the group's last op.
std::optional<AttentionInputGrads> matchAttentionInputGrads(
    AttentionGradOp key,
    llvm::function_ref<bool(mlir::Operation *)> admissible);

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_GEMMEPILOGUE_H
