//===- MegacVJPs.cpp - Vector-Jacobian products of megac ops --------------===//
//
// Each differentiable op builds the gradients of its operands from the
// gradient of its result, out of megac ops only, so that the backward pass
// goes through the same sharding propagation and collective insertion as
// the forward pass. That is where Megatron's conjugate pairs come from: the
// input gradient of a column-parallel product contracts the split output
// dimension and so is a partial sum (all-reduce backward, identity
// forward), and the reverse holds for row-parallel products.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"

using namespace mlir;
using namespace megac;
using namespace megac::detail;

/// The gradient of a broadcast operand of rank `rank`: sum the leading
/// dimensions of the (full-shape) gradient away.
static Value reduceToRank(OpBuilder &b, Location loc, Value grad, int64_t rank) {
  if (tensorTypeOf(grad).getRank() == rank)
    return grad;
  return SumLeadingOp::create(b, loc, grad, rank);
}

/// Swaps the last two dimensions.
static Value transposeLastTwo(OpBuilder &b, Location loc, Value x) {
  int64_t rank = tensorTypeOf(x).getRank();
  SmallVector<int64_t> perm = llvm::to_vector(llvm::seq<int64_t>(0, rank));
  std::swap(perm[rank - 1], perm[rank - 2]);
  return TransposeOp::create(b, loc, x, perm);
}

LogicalResult EmbeddingOp::buildVJP(OpBuilder &b, Value dy,
                                    SmallVectorImpl<Value> &grads) {
  grads.assign({EmbeddingGradOp::create(b, getLoc(), getTable(), getIds(), dy),
           Value()});
  return success();
}

LogicalResult PositionEmbeddingOp::buildVJP(OpBuilder &b, Value dy,
                                            SmallVectorImpl<Value> &grads) {
  grads.assign({PositionEmbeddingGradOp::create(b, getLoc(), getTable(), dy),
           Value()});
  return success();
}

LogicalResult LinearOp::buildVJP(OpBuilder &b, Value dy,
                                 SmallVectorImpl<Value> &grads) {
  bool transposed = getTransposeWeight();
  // y = x W  => dx = dy W^T ; y = x W^T => dx = dy W.
  Value dx = LinearOp::create(b, getLoc(), dy, getWeight(), !transposed);
  Value dw = LinearWeightGradOp::create(b, getLoc(), getInput(), dy, transposed);
  grads.assign({dx, dw});
  return success();
}

LogicalResult MatMulOp::buildVJP(OpBuilder &b, Value dy,
                                 SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  Value da = MatMulOp::create(b, loc, dy, transposeLastTwo(b, loc, getRhs()));
  Value db = MatMulOp::create(b, loc, transposeLastTwo(b, loc, getLhs()), dy);
  grads.assign({da, db});
  return success();
}

LogicalResult AddOp::buildVJP(OpBuilder &b, Value dy,
                              SmallVectorImpl<Value> &grads) {
  grads.assign({dy, reduceToRank(b, getLoc(), dy, tensorTypeOf(getRhs()).getRank())});
  return success();
}

LogicalResult MulOp::buildVJP(OpBuilder &b, Value dy,
                              SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  Value dlhs = MulOp::create(b, loc, dy, getRhs());
  Value drhs = reduceToRank(b, loc, MulOp::create(b, loc, dy, getLhs()),
                            tensorTypeOf(getRhs()).getRank());
  grads.assign({dlhs, drhs});
  return success();
}

LogicalResult GeluOp::buildVJP(OpBuilder &b, Value dy,
                               SmallVectorImpl<Value> &grads) {
  grads.assign({GeluGradOp::create(b, getLoc(), getInput(), dy)});
  return success();
}

LogicalResult SoftmaxOp::buildVJP(OpBuilder &b, Value dy,
                                  SmallVectorImpl<Value> &grads) {
  grads.assign({SoftmaxGradOp::create(b, getLoc(), getResult(), dy)});
  return success();
}

LogicalResult LayerNormOp::buildVJP(OpBuilder &b, Value dy,
                                    SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  FloatAttr eps = getEpsilonAttr();
  Value dx = LayerNormGradOp::create(b, loc, getInput(), getGamma(), dy, eps);
  // One pass over x and dy: neither x-hat nor dy * x-hat is stored.
  Value dgamma = LayerNormGainGradOp::create(b, loc, getInput(), dy, eps);
  Value dbeta = reduceToRank(b, loc, dy, 1);
  grads.assign({dx, dgamma, dbeta});
  return success();
}

LogicalResult AttentionOp::buildVJP(OpBuilder &b, Value dy,
                                    SmallVectorImpl<Value> &grads) {
  grads.clear();
  for (int64_t operand = 0; operand < 3; ++operand)
    grads.push_back(AttentionGradOp::create(
        b, getLoc(), getQuery(), getKey(), getValue(), dy, getNumHeadsAttr(),
        getCausalAttr(), b.getI64IntegerAttr(operand), getDropoutAttr(),
        getStreamAttr()));
  return success();
}

LogicalResult ReshapeOp::buildVJP(OpBuilder &b, Value dy,
                                  SmallVectorImpl<Value> &grads) {
  grads.assign({ReshapeOp::create(b, getLoc(), dy,
                             tensorTypeOf(getInput()).getShape())});
  return success();
}

LogicalResult TransposeOp::buildVJP(OpBuilder &b, Value dy,
                                    SmallVectorImpl<Value> &grads) {
  ArrayRef<int64_t> perm = getPermutation();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = static_cast<int64_t>(i);
  grads.assign({TransposeOp::create(b, getLoc(), dy, inverse)});
  return success();
}

LogicalResult CrossEntropyOp::buildVJP(OpBuilder &b, Value dy,
                                       SmallVectorImpl<Value> &grads) {
  grads.assign({CrossEntropyGradOp::create(b, getLoc(), getLogits(),
                                           getLabels(), dy, /*stats=*/Value(),
                                           getClassesAttr()),
                Value()});
  return success();
}

LogicalResult ShardingConstraintOp::buildVJP(OpBuilder &b, Value dy,
                                             SmallVectorImpl<Value> &grads) {
  // An identity: the gradient passes unchanged, held to the same layout
  // (a sequence-split residual stream has a sequence-split gradient).
  grads.assign({ShardingConstraintOp::create(b, getLoc(), dy, getShardingAttr())});
  return success();
}

LogicalResult DropoutOp::buildVJP(OpBuilder &b, Value dy,
                                  SmallVectorImpl<Value> &grads) {
  // The mask depends on the stream, step and global position only: the same
  // dropout of the output gradient applies the forward pass's mask.
  grads.assign({DropoutOp::create(b, getLoc(), dy, getRateAttr(),
                                  getStreamAttr())});
  return success();
}
