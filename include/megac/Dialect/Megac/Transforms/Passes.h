//===- Passes.h - megac passes and pipelines --------------------*- C++ -*-===//
//
// Pass constructors, registration, and the partition pipeline shared by
// `megac compile` and `megac-opt`.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_H
#define MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_H

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"
#include <string>

namespace megac {

/// The kinds of group megac-fuse-elementwise forms, by letter: its
/// `groups` option's default, and a GPU target's choice.
inline constexpr llvm::StringLiteral kAllFusionGroups = "abcdegnrtw";

#define GEN_PASS_DECL
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"

/// What is wrong with AdamW's, its schedule's and clipping's options, or
/// "". Options are named as \p prefix + the pass option's name (`--` for
/// megac compile's flags), the ZeRO stage as \p zeroName.
std::string optimizerOptionsProblem(const ApplyOptimizerPassOptions &options,
                                    llvm::StringRef prefix = "",
                                    llvm::StringRef zeroName = "zero-stage");

/// Options of the partition pipeline.
struct PartitionOptions {
  /// Grid, e.g. "tp=4"; empty keeps the module's own (or none).
  std::string mesh;
  int64_t batch = 0;
  int64_t seq = 0;
  /// Build a training step (autodiff + AdamW) instead of the forward pass.
  bool train = false;
  /// Append the backward pass only: parameter gradients become outputs
  /// named grad:<parameter> (for checking them; no update).
  bool gradients = false;
  ApplyOptimizerPassOptions optimizer;
  /// Gradient all-reduces are fused into buckets of at most this many bytes
  /// (0: one all-reduce per gradient).
  int64_t bucketBytes = 25 << 20;
  /// Gradient accumulation: the step runs forward and backward once per
  /// micro-batch of batch / microBatches rows.
  int64_t microBatches = 1;
  /// bf16 compute with f32 master weights (megac-mixed-precision).
  bool bf16 = false;
  /// Split the residual stream on the sequence over tp
  /// (megac-sequence-parallel).
  bool sequenceParallel = false;
  /// Activation recomputation: none, selective or full (megac-recompute).
  std::string recompute = "none";
  /// Pipeline parallelism (a pp axis in the grid): model chunks per
  /// pipeline rank (interleaved schedules).
  int64_t virtualStages = 1;
  /// The kinds of kernel group to mark (megac-fuse-elementwise's
  /// `groups`): all of them for a GPU target, "a" for the CPU; empty:
  /// none.
  std::string fusionGroups;
};

/// set-mesh, specialize-shapes, [autodiff, apply-optimizer,]
/// propagate-sharding, split-cross-entropy, propagate-sharding,
/// insert-collectives, localize-shapes[, bucket-all-reduces]: from a model
/// to per-rank IR.
void buildPartitionPipeline(mlir::OpPassManager &pm,
                            const PartitionOptions &options);

/// Why \p options make no pipeline ("" if they do): training and
/// gradients together, micro-batches without either, an unknown
/// recompute mode, a pp axis without training... Each option is named
/// with \p prefix ("--" for megac compile's flags, "" for the pipeline's
/// options).
std::string partitionOptionsProblem(const PartitionOptions &options,
                                    llvm::StringRef prefix);

/// \p value as a user writes it: the shortest decimal that reads back as
/// it (1.5, 1e-08, 1048577, -1), for messages that quote an option.
std::string numberText(double value);

/// One axis of a grid as the command line spells it (`tp=4`).
struct GridAxisText {
  std::string name;
  int64_t size = 0;
};

/// Reads a grid's command-line spelling (`dp=2,tp=4`: names of letters,
/// digits and '_', integer sizes) into \p axes; false on a spelling error.
/// The sizes and the names' uniqueness are #megac.mesh's rules
/// (MeshAttr::verify), not checked here. megac-set-mesh and megac compile
/// read --mesh with it.
bool parseGridText(llvm::StringRef text,
                   llvm::SmallVectorImpl<GridAxisText> &axes);

/// Registers every megac pass and the `megac-partition-pipeline`.
void registerMegacPassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_H
