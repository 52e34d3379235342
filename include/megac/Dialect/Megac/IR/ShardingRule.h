//===- ShardingRule.h - Factor-based op sharding rules ----------*- C++ -*-===//
//
// A sharding rule says how an op may be split across a device grid without
// changing its meaning. Each factor is one loop dimension of the op (a batch
// dimension, the contracted K of a product, the heads of attention) and
// names the operand and result dimensions it indexes. Propagation assigns at
// most one grid axis to each factor; a reduction factor split over an axis
// makes the result a partial sum over it.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_SHARDINGRULE_H
#define MEGAC_DIALECT_MEGAC_IR_SHARDINGRULE_H

#include "llvm/ADT/SmallVector.h"
#include <cstdint>
#include <string>

namespace megac {

enum class FactorKind {
  /// Indexes the result; splitting it splits the result the same way.
  Parallel,
  /// Summed over (contracted); splitting it makes the result partial.
  Reduction,
  /// Must stay whole on every rank (a normalized or softmax dimension).
  Whole,
};

/// How partial-sum operands may pass through the op.
enum class PartialPolicy {
  /// Every partial operand must be all-reduced first.
  None,
  /// The op is linear in all operands jointly (a sum): partial passes when
  /// every operand is partial over the same axes.
  AllOperands,
  /// The op is linear in each operand separately (a product): partial passes
  /// when exactly one operand is partial.
  AnyOneOperand,
};

struct ShardingFactor {
  FactorKind kind = FactorKind::Parallel;
  /// Dimension of each operand this factor indexes, -1 where it does not.
  llvm::SmallVector<int64_t, 4> operandDims;
  /// Dimension of the result, -1 for reduction factors.
  int64_t resultDim = -1;
  /// When > 0, the factor may be split only in whole blocks of this many
  /// (e.g. attention heads): the axis size must divide `blocks`.
  int64_t blocks = 0;
  /// Word used in diagnostics ("heads", "vocabulary").
  std::string name;
  /// When >= 0, only this operand may choose the factor's axis; the others
  /// follow it (an in-place update must keep its target's layout).
  int64_t sourceOperand = -1;
};

struct ShardingRule {
  llvm::SmallVector<ShardingFactor, 4> factors;
  PartialPolicy partial = PartialPolicy::None;
};

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_SHARDINGRULE_H
