//===- MegacGradOps.cpp - Backward and optimizer ops ----------------------===//
//
// Shape rules and sharding rules of the ops megac-autodiff and
// megac-apply-optimizer create. Their sharding rules are what make
// Megatron's conjugate collectives and data parallelism's gradient
// reduction fall out of propagation: a weight gradient sums over tokens, so
// tokens split over `dp` make it a partial sum over `dp`.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"

#include <limits>

using namespace mlir;
using namespace megac;
using namespace megac::detail;

//===----------------------------------------------------------------------===//
// Type inference (and verification)
//===----------------------------------------------------------------------===//

/// True when `a` and `b` have the same rank and agreeing sizes.
static bool shapesAgree(RankedTensorType a, RankedTensorType b) {
  if (a.getRank() != b.getRank())
    return false;
  for (int64_t d = 0; d < a.getRank(); ++d)
    if (!sizesAgree(a.getDimSize(d), b.getDimSize(d)))
      return false;
  return true;
}

LogicalResult LinearWeightGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  auto dy = tensorTypeOf(adaptor.getOutputGrad());
  bool ok = x.getRank() >= 1 && x.getRank() == dy.getRank();
  for (int64_t d = 0; ok && d + 1 < x.getRank(); ++d)
    ok = sizesAgree(x.getDimSize(d), dy.getDimSize(d));
  if (!ok)
    return emitOptionalError(loc, "linear_weight_grad_c1: input ",
                             shapeString(x), " and output_grad ",
                             shapeString(dy),
                             " must share their rank and leading dimensions");
  int64_t k = x.getShape().back(), n = dy.getShape().back();
  types.push_back(adaptor.getTransposeWeight() ? f32Tensor(ctx, {n, k})
                                               : f32Tensor(ctx, {k, n}));
  return success();
}

LogicalResult GeluGradOp::inferReturnTypes(MLIRContext *,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  if (!shapesAgree(x, tensorTypeOf(adaptor.getOutputGrad())))
    return emitOptionalError(loc, "gelu_grad_c1: input and output_grad must "
                                  "have one shape");
  types.push_back(x);
  return success();
}

LogicalResult NormalizeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  if (x.getRank() < 1)
    return emitOptionalError(loc, "normalize_c1: the input must have rank >= 1");
  types.push_back(x);
  return success();
}

LogicalResult LayerNormGainGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  if (x.getRank() < 1 || !shapesAgree(x, tensorTypeOf(adaptor.getOutputGrad())))
    return emitOptionalError(loc, "layer_norm_gain_grad_c1: the input must "
                                  "have rank >= 1 and output_grad its shape");
  types.push_back(f32Tensor(ctx, x.getShape().take_back(1)));
  return success();
}

LogicalResult LayerNormGradOp::inferReturnTypes(MLIRContext *,
                                                std::optional<Location> loc,
                                                Adaptor adaptor,
                                                SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  auto gamma = tensorTypeOf(adaptor.getGamma());
  if (x.getRank() < 1 || gamma.getRank() != 1 ||
      !sizesAgree(gamma.getDimSize(0), x.getShape().back()) ||
      !shapesAgree(x, tensorTypeOf(adaptor.getOutputGrad())))
    return emitOptionalError(loc, "layer_norm_grad_c1: gamma must be a vector "
                                  "of the input's last dimension and "
                                  "output_grad must have the input's shape");
  types.push_back(x);
  return success();
}

LogicalResult AttentionGradOp::inferReturnTypes(MLIRContext *,
                                                std::optional<Location> loc,
                                                Adaptor adaptor,
                                                SmallVectorImpl<Type> &types) {
  auto q = tensorTypeOf(adaptor.getQuery());
  for (Value v : {adaptor.getKey(), adaptor.getValue(), adaptor.getOutputGrad()})
    if (q.getRank() != 3 || tensorTypeOf(v) != q)
      return emitOptionalError(loc, "attention_grad_c1: query, key, value and "
                                    "output_grad must be rank-3 of one shape");
  int64_t heads = static_cast<int64_t>(adaptor.getNumHeads());
  if (heads <= 0 || (!q.isDynamicDim(2) && q.getDimSize(2) % heads != 0))
    return emitOptionalError(loc, "attention_grad_c2: num_heads = ", heads,
                             " must be positive and divide ", q.getDimSize(2));
  if (adaptor.getOperand() > 2)
    return emitOptionalError(loc, "attention_grad_c3: operand must be 0 "
                                  "(query), 1 (key) or 2 (value)");
  double rate = adaptor.getDropout().convertToDouble();
  if (!(rate >= 0.0 && rate < 1.0))
    return emitOptionalError(loc, "attention_grad_c4: dropout = ", rate,
                             " must lie in [0, 1)");
  types.push_back(q);
  return success();
}

LogicalResult SoftmaxGradOp::inferReturnTypes(MLIRContext *,
                                              std::optional<Location> loc,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &types) {
  auto y = tensorTypeOf(adaptor.getOutput());
  if (y.getRank() < 1 || !shapesAgree(y, tensorTypeOf(adaptor.getOutputGrad())))
    return emitOptionalError(loc, "softmax_grad_c1: output and output_grad "
                                  "must have one shape of rank >= 1");
  types.push_back(y);
  return success();
}

LogicalResult EmbeddingGradOp::inferReturnTypes(MLIRContext *,
                                                std::optional<Location> loc,
                                                Adaptor adaptor,
                                                SmallVectorImpl<Type> &types) {
  auto table = tensorTypeOf(adaptor.getTable());
  auto ids = tensorTypeOf(adaptor.getIds());
  auto dy = tensorTypeOf(adaptor.getOutputGrad());
  if (table.getRank() != 2 || ids.getRank() != 2 || dy.getRank() != 3 ||
      !sizesAgree(ids.getDimSize(0), dy.getDimSize(0)) ||
      !sizesAgree(ids.getDimSize(1), dy.getDimSize(1)) ||
      !sizesAgree(table.getDimSize(1), dy.getDimSize(2)))
    return emitOptionalError(loc, "embedding_grad_c1: expected table [V, H], "
                                  "ids [B, S] and output_grad [B, S, H], got ",
                             shapeString(table), ", ", shapeString(ids), ", ",
                             shapeString(dy));
  types.push_back(table);
  return success();
}

LogicalResult PositionEmbeddingGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto table = tensorTypeOf(adaptor.getTable());
  auto dy = tensorTypeOf(adaptor.getOutputGrad());
  if (table.getRank() != 2 || dy.getRank() != 2 ||
      !sizesAgree(table.getDimSize(1), dy.getDimSize(1)) ||
      (!table.isDynamicDim(0) && !dy.isDynamicDim(0) &&
       dy.getDimSize(0) > table.getDimSize(0)))
    return emitOptionalError(loc, "position_embedding_grad_c1: expected table "
                                  "[P, H] and output_grad [S, H] with S <= P, "
                                  "got ",
                             shapeString(table), " and ", shapeString(dy));
  types.push_back(table);
  return success();
}

LogicalResult CrossEntropyGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto logits = tensorTypeOf(adaptor.getLogits());
  auto labels = tensorTypeOf(adaptor.getLabels());
  if (logits.getRank() != 3 || labels.getRank() != 2 ||
      !sizesAgree(logits.getDimSize(0), labels.getDimSize(0)) ||
      !sizesAgree(logits.getDimSize(1), labels.getDimSize(1)) ||
      tensorTypeOf(adaptor.getLossGrad()).getRank() != 0)
    return emitOptionalError(loc, "cross_entropy_grad_c1: expected logits "
                                  "[B, S, V], labels [B, S] and a scalar "
                                  "loss_grad");
  if (Value statsValue = adaptor.getStats()) {
    auto stats = tensorTypeOf(statsValue);
    bool ok = stats.getRank() == 3 &&
              sizesAgree(stats.getDimSize(0), logits.getDimSize(0)) &&
              sizesAgree(stats.getDimSize(1), logits.getDimSize(1));
    // No rule ties n to the logits' width: before partitioning the logits
    // are the whole vocabulary (n of whose blocks the stats describe), after
    // it one block of it, and cross_entropy_stats checked the split.
    if (ok && !stats.isDynamicDim(2))
      ok = stats.getDimSize(2) > 0 && stats.getDimSize(2) % 3 == 0;
    if (!ok)
      return emitOptionalError(
          loc, "cross_entropy_grad_c2: stats ", shapeString(stats),
          " must be [B, S, 3n] for logits ", shapeString(logits));
  }
  if (std::optional<uint64_t> classes = adaptor.getClasses();
      classes && int64_t(*classes) <= 0)
    return emitOptionalError(loc, "cross_entropy_grad_c2: classes must be "
                                  "positive");
  types.push_back(logits);
  return success();
}

LogicalResult SumLeadingOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location> loc,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  auto x = tensorTypeOf(adaptor.getInput());
  int64_t keep = static_cast<int64_t>(adaptor.getKeep());
  if (keep < 0 || keep > x.getRank())
    return emitOptionalError(loc, "sum_leading_c1: keep = ", keep,
                             " must lie in [0, ", x.getRank(), "]");
  types.push_back(f32Tensor(ctx, x.getShape().take_back(keep)));
  return success();
}

LogicalResult SumSquaresOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location>,
                                             Adaptor, SmallVectorImpl<Type> &types) {
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult ClipCoefficientOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  if (tensorTypeOf(adaptor.getTotal()).getRank() != 0)
    return emitOptionalError(loc, "clip_coefficient_c1: total must be a scalar");
  if (!(adaptor.getMaxNorm().convertToDouble() > 0.0))
    return emitOptionalError(loc, "clip_coefficient_c2: max_norm must be "
                                  "positive");
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult FillOp::inferReturnTypes(MLIRContext *ctx,
                                       std::optional<Location> loc,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &types) {
  if (llvm::any_of(adaptor.getShape(), [](int64_t d) { return d < 0; }))
    return emitOptionalError(loc, "fill_c1: sizes must not be negative");
  types.push_back(f32Tensor(ctx, adaptor.getShape()));
  return success();
}

LogicalResult AdamWOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  auto param = tensorTypeOf(adaptor.getParam());
  if (!shapesAgree(param, tensorTypeOf(adaptor.getGrad())))
    return emitOptionalError(loc, "adamw_c1: grad must have the parameter's "
                                  "shape ",
                             shapeString(param));
  if (tensorTypeOf(adaptor.getCoefficient()).getRank() != 0)
    return emitOptionalError(loc, "adamw_c2: the coefficient must be a scalar");
  double b1 = adaptor.getBeta1().convertToDouble();
  double b2 = adaptor.getBeta2().convertToDouble();
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1) ||
      !(adaptor.getEpsilon().convertToDouble() >= 0) ||
      !(adaptor.getWeightDecay().convertToDouble() >= 0))
    return emitOptionalError(loc, "adamw_c3: betas must lie in [0, 1), "
                                  "epsilon and weight_decay must not be "
                                  "negative");
  types.push_back(param);
  return success();
}

LogicalResult ShardingConstraintOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  ShardingAttr sharding = adaptor.getSharding();
  if (static_cast<int64_t>(sharding.getDims().size()) != input.getRank() ||
      !sharding.getPartial().empty())
    return emitOptionalError(loc, "sharding_constraint_c1: the sharding needs "
                                  "one entry per dimension of ",
                             shapeString(input), " and no partial axis");
  types.push_back(input);
  return success();
}

LogicalResult AssignOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto param = tensorTypeOf(adaptor.getParam());
  if (!shapesAgree(param, tensorTypeOf(adaptor.getValue())))
    return emitOptionalError(loc, "assign_c1: the value must have the "
                                  "parameter's shape ",
                             shapeString(param));
  types.push_back(param);
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding rules
//===----------------------------------------------------------------------===//

ShardingRule ShardingConstraintOp::getShardingRule() {
  // Never consulted: megac-propagate-sharding takes the op's attribute.
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 1,
                         PartialPolicy::None);
}

ShardingRule AssignOp::getShardingRule() {
  // The parameter keeps its layout; the value must arrive in it.
  ShardingRule rule;
  for (int64_t d = 0; d < tensorTypeOf(getParam()).getRank(); ++d) {
    rule.factors.push_back(factor(FactorKind::Parallel, {d, d}, d));
    rule.factors.back().sourceOperand = 0;
  }
  return rule;
}

ShardingRule LinearWeightGradOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  bool transposed = getTransposeWeight();
  ShardingRule rule;
  rule.partial = PartialPolicy::AnyOneOperand;
  // Tokens are summed over: split tokens give a partial weight gradient.
  for (int64_t d = 0; d + 1 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Reduction, {d, d}, -1, "tokens"));
  rule.factors.push_back(
      factor(FactorKind::Parallel, {rank - 1, -1}, transposed ? 1 : 0, "in"));
  rule.factors.push_back(
      factor(FactorKind::Parallel, {-1, rank - 1}, transposed ? 0 : 1, "out"));
  return rule;
}

ShardingRule GeluGradOp::getShardingRule() {
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 2,
                         PartialPolicy::None);
}

ShardingRule NormalizeOp::getShardingRule() {
  ShardingRule rule =
      elementwiseRule(tensorTypeOf(getInput()).getRank(), 1, PartialPolicy::None);
  rule.factors.back().kind = FactorKind::Whole;
  return rule;
}

ShardingRule LayerNormGainGradOp::getShardingRule() {
  // Rows are summed over: split rows give a partial gradient. Each row is
  // normalized whole. Linear in output_grad but not in input, which no
  // partial policy says, so partial operands are reduced first (the
  // default); a LayerNorm's output gradient is reduced before its input
  // gradient reads it anyway.
  int64_t rank = tensorTypeOf(getInput()).getRank();
  ShardingRule rule;
  for (int64_t d = 0; d + 1 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Reduction, {d, d}, -1, "rows"));
  rule.factors.push_back(
      factor(FactorKind::Whole, {rank - 1, rank - 1}, 0, "normalized"));
  return rule;
}

ShardingRule LayerNormGradOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  ShardingRule rule;
  for (int64_t d = 0; d + 1 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel, {d, -1, d}, d));
  rule.factors.push_back(factor(FactorKind::Whole, {rank - 1, 0, rank - 1},
                                rank - 1, "normalized"));
  return rule;
}

ShardingRule AttentionGradOp::getShardingRule() {
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Parallel, {0, 0, 0, 0}, 0, "batch"),
      factor(FactorKind::Whole, {1, 1, 1, 1}, 1, "sequence"),
      factor(FactorKind::Parallel, {2, 2, 2, 2}, 2, "heads"),
  };
  rule.factors.back().blocks = static_cast<int64_t>(getNumHeads());
  return rule;
}

ShardingRule SoftmaxGradOp::getShardingRule() {
  ShardingRule rule =
      elementwiseRule(tensorTypeOf(getOutput()).getRank(), 2, PartialPolicy::None);
  rule.factors.back().kind = FactorKind::Whole;
  return rule;
}

ShardingRule EmbeddingGradOp::getShardingRule() {
  ShardingRule rule;
  rule.partial = PartialPolicy::AnyOneOperand;
  rule.factors = {
      factor(FactorKind::Reduction, {-1, 0, 0}, -1, "batch"),
      factor(FactorKind::Reduction, {-1, 1, 1}, -1, "sequence"),
      factor(FactorKind::Parallel, {1, -1, 2}, 1, "hidden"),
      // Each rank accumulates only its own vocabulary rows.
      factor(FactorKind::Parallel, {0, -1, -1}, 0, "vocabulary"),
  };
  return rule;
}

ShardingRule PositionEmbeddingGradOp::getShardingRule() {
  ShardingRule rule;
  rule.partial = PartialPolicy::AnyOneOperand;
  rule.factors = {
      factor(FactorKind::Whole, {0, 0}, 0, "position"),
      factor(FactorKind::Parallel, {1, 1}, 1, "hidden"),
  };
  return rule;
}

LogicalResult AccumulateOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location>,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

ShardingRule AccumulateOp::getShardingRule() {
  // A sum over micro-batches is linear: partial sums pass through, so a
  // data-parallel gradient is all-reduced once per step, not per micro-batch.
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 1,
                         PartialPolicy::AllOperands);
}

LogicalResult StackMicroBatchesOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  const int64_t count = adaptor.getCount();
  if (input.getRank() < 1 || count < 1)
    return emitOptionalError(loc, "stack_micro_batches_c1: the input must "
                                  "have rank >= 1 and count must be "
                                  "positive");
  SmallVector<int64_t> shape(input.getShape());
  if (!ShapedType::isDynamic(shape[0])) {
    if (shape[0] > 0 && count > std::numeric_limits<int64_t>::max() / shape[0])
      return emitOptionalError(loc, "stack_micro_batches_c1: ", shape[0],
                               " rows times count ", count,
                               " overflows a dimension");
    shape[0] *= count;
  }
  types.push_back(RankedTensorType::get(shape, input.getElementType()));
  return success();
}

ShardingRule StackMicroBatchesOp::getShardingRule() {
  // Whole on every rank: the global batch's rows of one micro-batch, which
  // stack in order (a data-parallel split of the rows would interleave the
  // ranks' rows with the micro-batches'). The gathers this asks for are
  // one micro-batch's, as the returned value needs anyway.
  const int64_t rank = tensorTypeOf(getInput()).getRank();
  ShardingRule rule;
  for (int64_t d = 0; d < rank; ++d)
    rule.factors.push_back(
        factor(FactorKind::Whole, {d}, d, d == 0 ? "micro-batch rows" : ""));
  return rule;
}

ShardingRule CrossEntropyGradOp::getShardingRule() {
  // Without stats the softmax needs whole rows; with them (all blocks,
  // whole) each rank computes the gradient of its own vocabulary block.
  ShardingRule rule;
  if (!getStats()) {
    rule.factors = {
        factor(FactorKind::Parallel, {0, 0, -1}, 0, "batch"),
        factor(FactorKind::Parallel, {1, 1, -1}, 1, "sequence"),
        factor(FactorKind::Whole, {2, -1, -1}, 2, "vocabulary"),
    };
    return rule;
  }
  rule.factors = {
      factor(FactorKind::Parallel, {0, 0, -1, 0}, 0, "batch"),
      factor(FactorKind::Parallel, {1, 1, -1, 1}, 1, "sequence"),
      factor(FactorKind::Parallel, {2, -1, -1, -1}, 2, "vocabulary"),
      factor(FactorKind::Whole, {-1, -1, -1, 2}, -1, "vocabulary blocks"),
  };
  return rule;
}

ShardingRule SumLeadingOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  int64_t keep = static_cast<int64_t>(getKeep());
  ShardingRule rule;
  rule.partial = PartialPolicy::AllOperands;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < rank - keep)
      rule.factors.push_back(factor(FactorKind::Reduction, {d}, -1));
    else
      rule.factors.push_back(
          factor(FactorKind::Parallel, {d}, d - (rank - keep)));
  }
  return rule;
}

ShardingRule SumSquaresOp::getShardingRule() {
  ShardingRule rule;
  for (int64_t d = 0; d < tensorTypeOf(getInput()).getRank(); ++d)
    rule.factors.push_back(factor(FactorKind::Reduction, {d}, -1));
  return rule;
}

ShardingRule ClipCoefficientOp::getShardingRule() { return {}; }

ShardingRule FillOp::getShardingRule() { return {}; }

ShardingRule AdamWOp::getShardingRule() {
  // The update follows the parameter's layout; the gradient must match it
  // whole over every other axis (reduced over data parallelism).
  ShardingRule rule;
  for (int64_t d = 0; d < tensorTypeOf(getParam()).getRank(); ++d) {
    rule.factors.push_back(factor(FactorKind::Parallel, {d, d, -1}, d));
    rule.factors.back().sourceOperand = 0;
  }
  return rule;
}
