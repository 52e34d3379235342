//===- Partition.h - Pipeline stage partitioning by cost --------*- C++ -*-===//
//
// Splits a model's transformer blocks into contiguous pipeline stages so
// that the most expensive stage is as cheap as possible (exactly, by
// dynamic programming over the blocks, where GPipe balances a variance
// heuristic). The embedding goes with the first block, the final
// LayerNorm, output layer and loss with the last. Costs are the FLOPs of
// the forward and backward passes on the function's (global) shapes.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_PIPELINE_PARTITION_H
#define MEGAC_PIPELINE_PARTITION_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <string>
#include <vector>

namespace megac {

struct StagePartition {
  /// FLOPs of each segment: segment 0 holds the embedding and block 0, the
  /// last one the last block and the head.
  std::vector<double> blockCost;
  /// First block of each stage, and each stage's cost.
  std::vector<int64_t> firstBlock;
  std::vector<double> stageCost;
  double maxOverMean() const;
};

/// For each op of \p Func's body (terminator excluded), in order, the
/// segment it belongs to: segment k starts at the LayerNorm opening block
/// k, and what comes before block 0 (the embedding) joins it. Empty when
/// the function has no transformer block.
std::vector<int64_t> segmentOfOps(mlir::func::FuncOp Func);

/// The stage holding segment \p Segment.
int64_t stageOfSegment(const StagePartition &P, int64_t Segment);

/// Partitions the blocks of \p Func (shapes static) into \p Ranks x
/// \p ChunksPerRank stages (virtual stages: model chunks per pipeline
/// rank). Fails with a message when the function has fewer blocks than
/// stages.
mlir::FailureOr<StagePartition> partitionStages(mlir::func::FuncOp Func,
                                                int64_t Ranks,
                                                int64_t ChunksPerRank,
                                                std::string &Error);

/// Forward-and-backward FLOPs of one op (3x its forward: the backward
/// pass computes two products per forward product).
double trainingFlops(mlir::Operation *Op);

} // namespace megac

#endif // MEGAC_PIPELINE_PARTITION_H
