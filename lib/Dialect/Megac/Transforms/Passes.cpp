//===- Passes.cpp - Pass registration and the partition pipeline ----------===//

#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace megac {

void buildPartitionPipeline(OpPassManager &pm, const PartitionOptions &options) {
  if (!options.mesh.empty())
    pm.addPass(createSetMeshPass(SetMeshPassOptions{options.mesh}));
  pm.addPass(createSpecializeShapesPass(SpecializeShapesPassOptions{
      options.batch, options.seq, options.microBatches}));
  // Dropout is a training-time transformation; inference plans drop it.
  if (!options.train && !options.gradients)
    pm.addPass(createDisableDropoutPass());
  if (options.sequenceParallel)
    pm.addPass(createSequenceParallelPass());
  if (options.train || options.gradients) {
    // Stages are placed before differentiation, so that each gradient op
    // lands on the stage of the op it differentiates (no-op without pp).
    pm.addPass(createAssignStagesPass(
        AssignStagesPassOptions{options.virtualStages}));
    pm.addPass(createAutodiffPass());
    if (options.recompute == "full")
      pm.addPass(createRecomputePass(RecomputePassOptions{options.recompute}));
  }
  // One micro-batch needs no accumulation, unless on a pipeline (the
  // pass decides).
  // A training step's logits are for generation alone, which reads
  // micro-batch 0's: stacking them would cost m times their memory.
  if (options.train || options.gradients)
    pm.addPass(createAccumulateMicroBatchesPass(
        AccumulateMicroBatchesPassOptions{options.microBatches,
                                          /*stackRows=*/!options.train}));
  if (options.bf16)
    pm.addPass(createMixedPrecisionPass());
  if (options.train)
    pm.addPass(createApplyOptimizerPass(options.optimizer));
  pm.addPass(createPropagateShardingPass());
  // The loss over vocabulary-split logits becomes per-block statistics;
  // propagating again shards the ops that introduces.
  pm.addPass(createSplitCrossEntropyPass());
  pm.addPass(createPropagateShardingPass());
  // Selective recomputation with sequence parallelism: the backward pass
  // gathers the split LayerNorm outputs again (Korthikanti et al.'s TP+SP).
  pm.addPass(createInsertCollectivesPass(InsertCollectivesPassOptions{
      options.sequenceParallel && options.recompute == "selective"}));
  // After the collectives: a product reduced across ranks keeps its
  // rounding (each rank rounds its partial sum).
  if (options.bf16)
    pm.addPass(createRoundAfterEpiloguePass());
  pm.addPass(createLocalizeShapesPass());
  pm.addPass(createPipelineStagesPass());
  if (options.bucketBytes > 0)
    pm.addPass(createBucketAllReducesPass(
        BucketAllReducesPassOptions{options.bucketBytes}));
  // A GPU target runs elementwise chains and GEMM epilogues as one kernel;
  // the CPU takes an attention's gradient steps in one pass.
  if (!options.fusionGroups.empty())
    pm.addPass(createFuseElementwisePass(
        FuseElementwisePassOptions{options.fusionGroups}));
}

namespace {
struct PartitionPipelineOptions
    : public PassPipelineOptions<PartitionPipelineOptions> {
  Option<std::string> mesh{*this, "mesh",
                           llvm::cl::desc("Grid, e.g. tp=4 or dp=2,tp=4")};
  Option<int64_t> batch{*this, "batch", llvm::cl::desc("Batch size"),
                        llvm::cl::init(0)};
  Option<int64_t> seq{*this, "seq", llvm::cl::desc("Sequence length"),
                      llvm::cl::init(0)};
  Option<bool> train{*this, "train",
                     llvm::cl::desc("Build a training step (default AdamW)"),
                     llvm::cl::init(false)};
};
} // namespace

void registerMegacPassesAndPipelines() {
  registerMegacPasses();
  PassPipelineRegistration<PartitionPipelineOptions>(
      "megac-partition-pipeline",
      "From a model on global shapes to per-rank IR with collectives",
      [](OpPassManager &pm, const PartitionPipelineOptions &opts) {
        PartitionOptions options;
        options.mesh = opts.mesh;
        options.batch = opts.batch;
        options.seq = opts.seq;
        options.train = opts.train;
        buildPartitionPipeline(pm, options);
      });
}

} // namespace megac
