//===- MegacOps.cpp - megac op shape rules and sharding rules -------------===//
//
// Every model op infers its result type from its operands; the inference is
// also the verifier, so each labelled rule is checked in exactly one place.
// Dynamic dimensions (`?`, used for batch and sequence before
// megac-specialize-shapes) are compatible with any size.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "OpUtils.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSwitch.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;
using namespace megac;
using namespace megac::detail;

#define GET_OP_CLASSES
#include "megac/Dialect/Megac/IR/MegacOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Type inference (and verification)
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto table = tensorTypeOf(adaptor.getTable());
  auto ids = tensorTypeOf(adaptor.getIds());
  if (table.getRank() != 2 || ids.getRank() != 2)
    return emitOptionalError(loc, "embedding_c1: expected a rank-2 table and "
                                  "rank-2 ids, got table ",
                             shapeString(table), " and ids ", shapeString(ids));
  types.push_back(
      f32Tensor(ctx, {ids.getDimSize(0), ids.getDimSize(1), table.getDimSize(1)}));
  return success();
}

LogicalResult PositionEmbeddingOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto table = tensorTypeOf(adaptor.getTable());
  auto ids = tensorTypeOf(adaptor.getIds());
  if (table.getRank() != 2 || ids.getRank() != 2)
    return emitOptionalError(loc, "position_embedding_c1: expected a rank-2 "
                                  "table and rank-2 ids, got table ",
                             shapeString(table), " and ids ", shapeString(ids));
  int64_t seq = ids.getDimSize(1);
  if (!ShapedType::isDynamic(seq) && !table.isDynamicDim(0) &&
      seq > table.getDimSize(0))
    return emitOptionalError(loc, "position_embedding_c2: sequence length ",
                             seq, " exceeds the ", table.getDimSize(0),
                             " positions of the table");
  types.push_back(f32Tensor(ctx, {seq, table.getDimSize(1)}));
  return success();
}

LogicalResult LinearOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  auto weight = tensorTypeOf(adaptor.getWeight());
  if (weight.getRank() != 2 || input.getRank() < 1)
    return emitOptionalError(loc, "linear_c1: expected a rank-2 weight and an "
                                  "input of rank >= 1, got weight ",
                             shapeString(weight), " and input ",
                             shapeString(input));
  bool transposed = adaptor.getTransposeWeight();
  int64_t k = weight.getDimSize(transposed ? 1 : 0);
  int64_t n = weight.getDimSize(transposed ? 0 : 1);
  if (!sizesAgree(input.getShape().back(), k))
    return emitOptionalError(loc, "linear_c2: input ", shapeString(input),
                             " has last dimension ", input.getShape().back(),
                             " but the weight ", shapeString(weight),
                             " contracts ", k,
                             transposed ? " (transposed)" : "");
  SmallVector<int64_t> shape(input.getShape());
  shape.back() = n;
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult MatMulOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto lhs = tensorTypeOf(adaptor.getLhs());
  auto rhs = tensorTypeOf(adaptor.getRhs());
  int64_t rank = lhs.getRank();
  if (rank < 2 || rhs.getRank() != rank)
    return emitOptionalError(loc, "matmul_c1: operands must have the same "
                                  "rank >= 2, got ",
                             shapeString(lhs), " and ", shapeString(rhs));
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < rank - 2; ++i) {
    if (!sizesAgree(lhs.getDimSize(i), rhs.getDimSize(i)))
      return emitOptionalError(loc, "matmul_c2: batch dimension ", i,
                               " differs: ", shapeString(lhs), " vs ",
                               shapeString(rhs));
    shape.push_back(mergeSizes(lhs.getDimSize(i), rhs.getDimSize(i)));
  }
  if (!sizesAgree(lhs.getDimSize(rank - 1), rhs.getDimSize(rank - 2)))
    return emitOptionalError(loc, "matmul_c3: lhs ", shapeString(lhs),
                             " contracts ", lhs.getDimSize(rank - 1),
                             " but rhs ", shapeString(rhs), " has ",
                             rhs.getDimSize(rank - 2));
  shape.push_back(lhs.getDimSize(rank - 2));
  shape.push_back(rhs.getDimSize(rank - 1));
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

/// Shared by add and mul: rhs's shape must be a suffix of lhs's.
static LogicalResult inferBroadcast(StringRef label, std::optional<Location> loc,
                                    Value lhsValue, Value rhsValue,
                                    SmallVectorImpl<Type> &types) {
  auto lhs = tensorTypeOf(lhsValue);
  auto rhs = tensorTypeOf(rhsValue);
  if (rhs.getRank() > lhs.getRank())
    return emitOptionalError(loc, label, "_c1: rhs ", shapeString(rhs),
                             " has a higher rank than lhs ", shapeString(lhs));
  int64_t offset = lhs.getRank() - rhs.getRank();
  SmallVector<int64_t> shape(lhs.getShape());
  for (int64_t i = 0; i < rhs.getRank(); ++i) {
    if (!sizesAgree(lhs.getDimSize(offset + i), rhs.getDimSize(i)))
      return emitOptionalError(loc, label, "_c2: rhs ", shapeString(rhs),
                               " is not a suffix of lhs ", shapeString(lhs));
    shape[offset + i] = mergeSizes(shape[offset + i], rhs.getDimSize(i));
  }
  types.push_back(f32Tensor(lhs.getContext(), shape));
  return success();
}

LogicalResult AddOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &types) {
  return inferBroadcast("add", loc, adaptor.getLhs(), adaptor.getRhs(), types);
}

LogicalResult MulOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &types) {
  return inferBroadcast("mul", loc, adaptor.getLhs(), adaptor.getRhs(), types);
}

LogicalResult GeluOp::inferReturnTypes(MLIRContext *, std::optional<Location>,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult RoundBf16Op::inferReturnTypes(MLIRContext *,
                                            std::optional<Location>,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult DropoutOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  double rate = adaptor.getRate().convertToDouble();
  if (!(rate >= 0.0 && rate < 1.0))
    return emitOptionalError(loc, "dropout_c1: rate = ", rate,
                             " must lie in [0, 1)");
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult SoftmaxOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  if (tensorTypeOf(adaptor.getInput()).getRank() < 1)
    return emitOptionalError(loc, "softmax_c1: the input must have rank >= 1");
  types.push_back(adaptor.getInput().getType());
  return success();
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  int64_t hidden = input.getRank() ? input.getShape().back() : 1;
  for (Value param : {adaptor.getGamma(), adaptor.getBeta()}) {
    auto type = tensorTypeOf(param);
    if (input.getRank() < 1 || type.getRank() != 1 ||
        !sizesAgree(type.getDimSize(0), hidden))
      return emitOptionalError(loc, "layer_norm_c1: gamma and beta must be "
                                    "vectors of the input's last dimension (",
                               hidden, "), got ", shapeString(type));
  }
  if (!(adaptor.getEpsilon().convertToDouble() > 0.0) ||
      !std::isfinite(adaptor.getEpsilon().convertToDouble()))
    return emitOptionalError(
        loc, "layer_norm_c2: epsilon must be positive and finite, got ",
        adaptor.getEpsilon().convertToDouble());
  types.push_back(input);
  return success();
}

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto q = tensorTypeOf(adaptor.getQuery());
  auto k = tensorTypeOf(adaptor.getKey());
  auto v = tensorTypeOf(adaptor.getValue());
  if (q.getRank() != 3 || k != q || v != q)
    return emitOptionalError(loc, "attention_c1: query, key and value must be "
                                  "rank-3 [B, S, H] of one shape, got ",
                             shapeString(q), ", ", shapeString(k), ", ",
                             shapeString(v));
  int64_t heads = static_cast<int64_t>(adaptor.getNumHeads());
  int64_t hidden = q.getDimSize(2);
  if (heads <= 0 || (!ShapedType::isDynamic(hidden) && hidden % heads != 0))
    return emitOptionalError(loc, "attention_c2: num_heads = ", heads,
                             " must be positive and divide the hidden size ",
                             hidden);
  double rate = adaptor.getDropout().convertToDouble();
  if (!(rate >= 0.0 && rate < 1.0))
    return emitOptionalError(loc, "attention_c3: dropout = ", rate,
                             " must lie in [0, 1)");
  types.push_back(q);
  return success();
}

LogicalResult ReshapeOp::inferReturnTypes(MLIRContext *ctx,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  ArrayRef<int64_t> shape = adaptor.getShape();
  int64_t count = 1;
  for (int64_t d : shape)
    count = d < 0 ? -1 : count * d;
  if (!input.hasStaticShape() || count != input.getNumElements())
    return emitOptionalError(loc, "reshape_c1: cannot reshape ",
                             shapeString(input), " into ",
                             shapeString(cast<RankedTensorType>(
                                 f32Tensor(ctx, shape))),
                             " (the input must be static and the element "
                             "counts equal)");
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto input = tensorTypeOf(adaptor.getInput());
  ArrayRef<int64_t> perm = adaptor.getPermutation();
  SmallVector<bool> seen(input.getRank(), false);
  bool valid = static_cast<int64_t>(perm.size()) == input.getRank();
  for (int64_t p : perm) {
    if (!valid || p < 0 || p >= input.getRank() || seen[p]) {
      valid = false;
      break;
    }
    seen[p] = true;
  }
  if (!valid)
    return emitOptionalError(loc, "transpose_c1: the permutation is not a "
                                  "permutation of the input's ",
                             input.getRank(), " dimensions");
  SmallVector<int64_t> shape;
  for (int64_t p : perm)
    shape.push_back(input.getDimSize(p));
  types.push_back(f32Tensor(ctx, shape));
  return success();
}

/// Logits [B, S, V] and labels [B, S] (cross_entropy and cross_entropy_stats).
static LogicalResult checkLogitsAndLabels(std::optional<Location> loc,
                                          StringRef label, Value logitsValue,
                                          Value labelsValue) {
  auto logits = tensorTypeOf(logitsValue);
  auto labels = tensorTypeOf(labelsValue);
  if (logits.getRank() != 3 || labels.getRank() != 2 ||
      !sizesAgree(logits.getDimSize(0), labels.getDimSize(0)) ||
      !sizesAgree(logits.getDimSize(1), labels.getDimSize(1)))
    return emitOptionalError(loc, label, ": logits ", shapeString(logits),
                             " and labels ", shapeString(labels),
                             " must be [B, S, V] and [B, S]");
  return success();
}

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *ctx,
                                               std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &types) {
  if (failed(checkLogitsAndLabels(loc, "cross_entropy_c1", adaptor.getLogits(),
                                  adaptor.getLabels())))
    return failure();
  if (std::optional<uint64_t> classes = adaptor.getClasses()) {
    int64_t vocab = tensorTypeOf(adaptor.getLogits()).getDimSize(2);
    if (int64_t(*classes) <= 0 ||
        (!ShapedType::isDynamic(vocab) && int64_t(*classes) > vocab))
      return emitOptionalError(loc, "cross_entropy_c2: classes = ",
                               int64_t(*classes),
                               " must be positive and at most the "
                               "vocabulary (",
                               vocab, ")");
  }
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult CrossEntropyStatsOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  if (failed(checkLogitsAndLabels(loc, "cross_entropy_stats_c1",
                                  adaptor.getLogits(), adaptor.getLabels())))
    return failure();
  auto logits = tensorTypeOf(adaptor.getLogits());
  int64_t shards = static_cast<int64_t>(adaptor.getShards());
  int64_t vocab = logits.getDimSize(2);
  if (shards <= 0 || (!ShapedType::isDynamic(vocab) && vocab % shards != 0))
    return emitOptionalError(loc, "cross_entropy_stats_c2: shards = ", shards,
                             " must be positive and divide the vocabulary (",
                             vocab, ")");
  if (std::optional<uint64_t> classes = adaptor.getClasses();
      classes && int64_t(*classes) <= 0)
    return emitOptionalError(loc, "cross_entropy_stats_c2: classes must be "
                                  "positive");
  types.push_back(f32Tensor(
      ctx, {logits.getDimSize(0), logits.getDimSize(1), 3 * shards}));
  return success();
}

LogicalResult CrossEntropyFromStatsOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto stats = tensorTypeOf(adaptor.getStats());
  if (stats.getRank() != 3 || (!stats.isDynamicDim(2) &&
                               (stats.getDimSize(2) == 0 ||
                                stats.getDimSize(2) % 3 != 0)))
    return emitOptionalError(loc, "cross_entropy_from_stats_c1: stats ",
                             shapeString(stats), " must be [B, S, 3n]");
  types.push_back(f32Tensor(ctx, {}));
  return success();
}

//===----------------------------------------------------------------------===//
// Collective verifiers
//===----------------------------------------------------------------------===//

LogicalResult AllReduceOp::verify() {
  if (getInput().getType() != getResult().getType())
    return emitOpError("all_reduce_c1: result type must equal the input type");
  return success();
}

LogicalResult AllReduceBucketOp::verify() {
  if (getInputs().empty() || getInputs().getTypes() != getResults().getTypes())
    return emitOpError("all_reduce_bucket_c1: expected at least one input and "
                       "result types equal to the input types");
  return success();
}

/// Pipeline phases in the order a micro-batch runs them; -1 for others.
int megac::phaseRank(StringRef phase) {
  return llvm::StringSwitch<int>(phase)
      .Case("forward", 0)
      .Case("backward", 1)
      .Case("step", 2)
      .Default(-1);
}

ArrayRef<int64_t> megac::getStages(Operation *op) {
  if (auto stages =
          op->getAttrOfType<DenseI64ArrayAttr>(MegacDialect::kStageAttrName))
    return stages.asArrayRef();
  return {};
}

StringRef megac::getPhase(Operation *op) {
  if (auto phase = op->getAttrOfType<StringAttr>(MegacDialect::kPhaseAttrName))
    return phase.getValue();
  return "";
}

void megac::setPlacement(Operation *op, ArrayRef<int64_t> stages,
                         StringRef phase) {
  Builder b(op->getContext());
  op->setAttr(MegacDialect::kStageAttrName, b.getDenseI64ArrayAttr(stages));
  op->setAttr(MegacDialect::kPhaseAttrName, b.getStringAttr(phase));
}

LogicalResult TransferOp::verify() {
  if (getSrcStage() < 0 || getDstStage() < 0 || getSrcStage() == getDstStage())
    return emitOpError("transfer_c1: expected two different non-negative "
                       "stages, got ")
           << getSrcStage() << " and " << getDstStage();
  int src = phaseRank(getSrcPhase()), dst = phaseRank(getDstPhase());
  if (src < 0 || dst < 0)
    return emitOpError("transfer_c2: phases must be forward, backward or "
                       "step, got '")
           << getSrcPhase() << "' and '" << getDstPhase() << "'";
  if (dst < src)
    return emitOpError("transfer_c2: a value made in the ")
           << getSrcPhase() << " phase cannot be received in the "
           << getDstPhase() << " phase, which runs before it";
  return success();
}

/// all_gather and slice_shard: only `dim` may change, growing or shrinking.
static LogicalResult verifyResizeAlongDim(Operation *op, StringRef label,
                                          int64_t dim, bool grows) {
  auto input = cast<RankedTensorType>(op->getOperand(0).getType());
  auto result = cast<RankedTensorType>(op->getResult(0).getType());
  if (dim < 0 || dim >= input.getRank())
    return op->emitOpError() << label << "_c1: dim " << dim
                             << " is not a dimension of the input";
  bool ok = input.getRank() == result.getRank();
  for (int64_t i = 0; ok && i < input.getRank(); ++i) {
    int64_t in = input.getDimSize(i), out = result.getDimSize(i);
    if (i != dim)
      ok = sizesAgree(in, out);
    else if (!ShapedType::isDynamic(in) && !ShapedType::isDynamic(out))
      // (A size of 0 splits into nothing: refused, not divided by.)
      ok =
          in > 0 && out > 0 &&
          (grows ? (out >= in && out % in == 0) : (in >= out && in % out == 0));
  }
  if (!ok)
    return op->emitOpError()
           << label << "_c2: " << shapeString(input) << " -> "
           << shapeString(result) << " changes more than dimension " << dim
           << " or resizes it the wrong way";
  return success();
}

LogicalResult AllGatherOp::verify() {
  return verifyResizeAlongDim(*this, "all_gather", getDim(), /*grows=*/true);
}

LogicalResult ReduceScatterOp::verify() {
  return verifyResizeAlongDim(*this, "reduce_scatter", getDim(),
                              /*grows=*/false);
}

LogicalResult SliceShardOp::verify() {
  if (getInput().getType().getElementType() !=
      getResult().getType().getElementType())
    return emitOpError("slice_shard_c3: the result's element type must be "
                       "the input's");
  return verifyResizeAlongDim(*this, "slice_shard", getDim(), /*grows=*/false);
}

//===----------------------------------------------------------------------===//
// Sharding rules
//===----------------------------------------------------------------------===//

/// lhs [..., X], rhs a suffix of lhs: rhs dim j is lhs dim j + offset.
static ShardingRule broadcastRule(Value lhs, Value rhs, PartialPolicy partial) {
  int64_t rank = tensorTypeOf(lhs).getRank();
  int64_t offset = rank - tensorTypeOf(rhs).getRank();
  ShardingRule rule;
  rule.partial = partial;
  for (int64_t d = 0; d < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel,
                                  {d, d >= offset ? d - offset : -1}, d));
  return rule;
}

ShardingRule EmbeddingOp::getShardingRule() {
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Parallel, {-1, 0}, 0, "batch"),
      factor(FactorKind::Parallel, {-1, 1}, 1, "sequence"),
      factor(FactorKind::Parallel, {1, -1}, 2, "hidden"),
      // Each rank holds some vocabulary rows and contributes zeros for the
      // others: summing over the axis reassembles the lookup.
      factor(FactorKind::Reduction, {0, -1}, -1, "vocabulary"),
  };
  return rule;
}

ShardingRule PositionEmbeddingOp::getShardingRule() {
  ShardingRule rule;
  rule.factors = {
      // The batch only feeds the sequence length: splitting it is free.
      factor(FactorKind::Parallel, {-1, 0}, -1, "batch"),
      factor(FactorKind::Whole, {0, 1}, 0, "position"),
      factor(FactorKind::Parallel, {1, -1}, 1, "hidden"),
  };
  return rule;
}

ShardingRule LinearOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  bool transposed = getTransposeWeight();
  ShardingRule rule;
  rule.partial = PartialPolicy::AnyOneOperand;
  for (int64_t d = 0; d + 1 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel, {d, -1}, d));
  rule.factors.push_back(factor(FactorKind::Reduction,
                                {rank - 1, transposed ? 1 : 0}, -1,
                                "contracting"));
  rule.factors.push_back(factor(FactorKind::Parallel,
                                {-1, transposed ? 0 : 1}, rank - 1, "output"));
  return rule;
}

ShardingRule MatMulOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getLhs()).getRank();
  ShardingRule rule;
  rule.partial = PartialPolicy::AnyOneOperand;
  for (int64_t d = 0; d + 2 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel, {d, d}, d, "batch"));
  rule.factors.push_back(factor(FactorKind::Parallel, {rank - 2, -1}, rank - 2));
  rule.factors.push_back(factor(FactorKind::Parallel, {-1, rank - 1}, rank - 1));
  rule.factors.push_back(factor(FactorKind::Reduction, {rank - 1, rank - 2}, -1,
                                "contracting"));
  return rule;
}

ShardingRule AddOp::getShardingRule() {
  return broadcastRule(getLhs(), getRhs(), PartialPolicy::AllOperands);
}

ShardingRule MulOp::getShardingRule() {
  return broadcastRule(getLhs(), getRhs(), PartialPolicy::AnyOneOperand);
}

ShardingRule GeluOp::getShardingRule() {
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 1,
                         PartialPolicy::None);
}

ShardingRule RoundBf16Op::getShardingRule() {
  // Each rank rounds what it holds, partial sums included (a bf16 program
  // keeps its partial products in bf16 too), so nothing needs reducing.
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 1,
                         PartialPolicy::AllOperands);
}

ShardingRule DropoutOp::getShardingRule() {
  // Scaling by a mask that every layout draws alike is linear: partial sums
  // may pass through.
  return elementwiseRule(tensorTypeOf(getInput()).getRank(), 1,
                         PartialPolicy::AllOperands);
}

ShardingRule SoftmaxOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  ShardingRule rule = elementwiseRule(rank, 1, PartialPolicy::None);
  rule.factors.back().kind = FactorKind::Whole;
  rule.factors.back().name = "softmax";
  return rule;
}

ShardingRule LayerNormOp::getShardingRule() {
  int64_t rank = tensorTypeOf(getInput()).getRank();
  ShardingRule rule;
  for (int64_t d = 0; d + 1 < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel, {d, -1, -1}, d));
  rule.factors.push_back(
      factor(FactorKind::Whole, {rank - 1, 0, 0}, rank - 1, "normalized"));
  return rule;
}

ShardingRule AttentionOp::getShardingRule() {
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Parallel, {0, 0, 0}, 0, "batch"),
      factor(FactorKind::Whole, {1, 1, 1}, 1, "sequence"),
      factor(FactorKind::Parallel, {2, 2, 2}, 2, "heads"),
  };
  rule.factors.back().blocks = static_cast<int64_t>(getNumHeads());
  return rule;
}

ShardingRule CrossEntropyStatsOp::getShardingRule() {
  // Each vocabulary block yields its own three statistics: splitting the
  // vocabulary into whole blocks splits the result the same way.
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Parallel, {0, 0}, 0, "batch"),
      factor(FactorKind::Parallel, {1, 1}, 1, "sequence"),
      factor(FactorKind::Parallel, {2, -1}, 2, "vocabulary blocks"),
  };
  rule.factors.back().blocks = static_cast<int64_t>(getShards());
  return rule;
}

ShardingRule CrossEntropyFromStatsOp::getShardingRule() {
  // A sum over tokens, like cross_entropy; the blocks of a token combine.
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Reduction, {0}, -1, "batch"),
      factor(FactorKind::Reduction, {1}, -1, "sequence"),
      factor(FactorKind::Whole, {2}, -1, "vocabulary blocks"),
  };
  return rule;
}

ShardingRule ReshapeOp::getShardingRule() {
  // Leading dimensions the reshape leaves alone may stay split; the rest must
  // be whole (splits do not survive merging or splitting dimensions).
  auto input = tensorTypeOf(getInput());
  auto result = tensorTypeOf(getResult());
  ShardingRule rule;
  rule.partial = PartialPolicy::AllOperands;
  int64_t d = 0;
  for (; d < std::min(input.getRank(), result.getRank()) &&
         input.getDimSize(d) == result.getDimSize(d);
       ++d)
    rule.factors.push_back(factor(FactorKind::Parallel, {d}, d));
  for (int64_t i = d; i < input.getRank(); ++i)
    rule.factors.push_back(factor(FactorKind::Whole, {i}, -1, "reshaped"));
  return rule;
}

ShardingRule TransposeOp::getShardingRule() {
  ShardingRule rule;
  rule.partial = PartialPolicy::AllOperands;
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    rule.factors.push_back(
        factor(FactorKind::Parallel, {p}, static_cast<int64_t>(i)));
  return rule;
}

ShardingRule CrossEntropyOp::getShardingRule() {
  // The loss is a sum over tokens divided by the global token count (the
  // plan carries the count), so tokens split over an axis give a partial
  // sum over it. The vocabulary must be whole here; when propagation finds
  // the logits split over it, megac-split-cross-entropy rewrites the loss
  // into per-block statistics (cross_entropy_stats), which may be split.
  ShardingRule rule;
  rule.factors = {
      factor(FactorKind::Reduction, {0, 0}, -1, "batch"),
      factor(FactorKind::Reduction, {1, 1}, -1, "sequence"),
      factor(FactorKind::Whole, {2, -1}, -1, "vocabulary"),
  };
  return rule;
}
