//===- OpUtils.h - Shape and sharding-rule helpers for op definitions ----===//
//
// Shared by the files that define megac ops (forward, backward, optimizer):
// shape comparisons that tolerate dynamic sizes, shape printing for
// messages, and constructors for sharding-rule factors.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_LIB_DIALECT_MEGAC_IR_OPUTILS_H
#define MEGAC_LIB_DIALECT_MEGAC_IR_OPUTILS_H

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "mlir/IR/BuiltinTypes.h"

namespace megac::detail {
using namespace mlir;

//===----------------------------------------------------------------------===//
// Shape helpers
//===----------------------------------------------------------------------===//

inline RankedTensorType tensorTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// True when two sizes may be equal (either is dynamic, or they match).
inline bool sizesAgree(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) || a == b;
}

/// Of two agreeing sizes, the static one if any.
inline int64_t mergeSizes(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) ? b : a;
}

inline std::string shapeString(RankedTensorType type) {
  std::string s = "[";
  llvm::raw_string_ostream os(s);
  llvm::interleave(
      type.getShape(), os,
      [&](int64_t d) {
        if (ShapedType::isDynamic(d))
          os << "?";
        else
          os << d;
      },
      "x");
  os << "]";
  return s;
}

inline Type f32Tensor(MLIRContext *ctx, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float32Type::get(ctx));
}

inline ShardingFactor factor(FactorKind kind, ArrayRef<int64_t> operandDims,
                             int64_t resultDim, StringRef name = "") {
  ShardingFactor f;
  f.kind = kind;
  f.operandDims.assign(operandDims.begin(), operandDims.end());
  f.resultDim = resultDim;
  f.name = name.str();
  return f;
}

/// One parallel factor per dimension of every (same-shaped) operand.
inline ShardingRule elementwiseRule(int64_t rank, unsigned numOperands,
                                    PartialPolicy partial) {
  ShardingRule rule;
  rule.partial = partial;
  for (int64_t d = 0; d < rank; ++d)
    rule.factors.push_back(factor(FactorKind::Parallel,
                                  SmallVector<int64_t>(numOperands, d), d));
  return rule;
}

} // namespace megac::detail

#endif // MEGAC_LIB_DIALECT_MEGAC_IR_OPUTILS_H
