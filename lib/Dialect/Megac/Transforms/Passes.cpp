//===- Passes.cpp - Pass registration and the partition pipeline ----------===//

#include "megac/Dialect/Megac/Transforms/Passes.h"
#include "megac/Dialect/Megac/IR/MegacDialect.h"

#include "mlir/Pass/PassRegistry.h"

#include <cstdio>
#include <cstdlib>

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
    // (Selective recomputation is insert-collectives' regather.)
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

std::string numberText(double value) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, value);
    if (std::strtod(buf, nullptr) == value)
      break;
  }
  return buf; // (nan and inf at 1 digit, where they never read back)
}

std::string partitionOptionsProblem(const PartitionOptions &options,
                                    StringRef prefix) {
  auto opt = [&](StringRef name) { return (prefix + name).str(); };
  if (options.train && options.gradients)
    return opt("train") + " and " + opt("gradients") + " exclude each other";
  if (options.microBatches < 1)
    return opt("micro-batches") + " must be positive, got " +
           std::to_string(options.microBatches);
  if (options.microBatches > MegacDialect::kMaxMicroBatches)
    return opt("micro-batches") + " must be at most " +
           std::to_string(MegacDialect::kMaxMicroBatches) +
           " (as many as a plan holds), got " +
           std::to_string(options.microBatches);
  if (options.microBatches > 1 && !options.train && !options.gradients)
    return opt("micro-batches") + " needs " + opt("train") + " or " +
           opt("gradients") + " (it accumulates gradients)";
  if (options.recompute != "none" && options.recompute != "selective" &&
      options.recompute != "full")
    return opt("recompute") + " must be none, selective or full, got '" +
           options.recompute + "'";
  if (options.virtualStages < 1)
    return opt("virtual-stages") + " must be positive, got " +
           std::to_string(options.virtualStages);
  // (megac compile checks its --bucket-mb, in MiB, itself.)
  if (options.bucketBytes < 0)
    return opt("bucket-bytes") +
           " must be >= 0 (0: one all-reduce per "
           "gradient), got " +
           std::to_string(options.bucketBytes);
  SmallVector<GridAxisText> axes;
  if (!parseGridText(options.mesh, axes))
    return ""; // (the mesh's own checks say what is wrong with it)
  for (const GridAxisText &axis : axes)
    if (!options.train && axis.name == "pp" && axis.size > 1)
      return "a pp axis (pipeline parallelism) needs " + opt("train") +
             ": the pipeline runs training steps";
  // ZeRO's axis named other than its default must be one of the grid's,
  // found now rather than after autodiff (as megac-apply-optimizer does
  // where the grid is the model's own).
  const std::string &zeroAxis = options.optimizer.zeroAxis;
  if (options.train && options.optimizer.zeroStage >= 1 &&
      !options.mesh.empty() &&
      zeroAxis != ApplyOptimizerPassOptions().zeroAxis &&
      llvm::none_of(axes, [&](const GridAxisText &axis) {
        return axis.name == zeroAxis;
      }))
    return opt("zero-axis") + " '" + zeroAxis +
           "' is not an axis of the grid (" + options.mesh + ")";
  return "";
}

namespace {
// The passes' own defaults, not copies of them.
const PartitionOptions kPartitionDefaults;
const ApplyOptimizerPassOptions kOptimizerDefaults;

/// megac compile's options that shape the IR, under the names of the
/// passes they set (the defaults are megac compile's on its CPU target),
/// so that `megac-opt --megac-partition-pipeline` gives what `megac
/// compile --dump-ir` shows for the same choices.
struct PartitionPipelineOptions
    : public PassPipelineOptions<PartitionPipelineOptions> {
  Option<std::string> mesh{*this, "mesh",
                           llvm::cl::desc("Grid, e.g. tp=4 or dp=2,tp=4")};
  Option<int64_t> batch{*this, "batch", llvm::cl::desc("Batch size"),
                        llvm::cl::init(0)};
  Option<int64_t> seq{*this, "seq", llvm::cl::desc("Sequence length"),
                      llvm::cl::init(0)};
  Option<int64_t> microBatches{
      *this, "micro-batches",
      llvm::cl::desc("Micro-batches per step (gradient accumulation)"),
      llvm::cl::init(kPartitionDefaults.microBatches)};
  Option<bool> train{*this, "train",
                     llvm::cl::desc("Build a training step (default AdamW)"),
                     llvm::cl::init(false)};
  Option<bool> gradients{
      *this, "gradients",
      llvm::cl::desc("Append the backward pass only: parameter gradients "
                     "become outputs grad:<parameter>"),
      llvm::cl::init(false)};
  Option<bool> bf16{*this, "bf16",
                    llvm::cl::desc("bf16 compute with fp32 master weights "
                                   "(megac compile --precision bf16)"),
                    llvm::cl::init(false)};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("Split the residual stream on the sequence over tp"),
      llvm::cl::init(false)};
  Option<std::string> recompute{
      *this, "recompute",
      llvm::cl::desc("Activation recomputation: none, selective or full"),
      llvm::cl::init(kPartitionDefaults.recompute)};
  Option<int64_t> virtualStages{
      *this, "virtual-stages",
      llvm::cl::desc("Model chunks per pipeline rank (interleaved)"),
      llvm::cl::init(kPartitionDefaults.virtualStages)};
  Option<int64_t> bucketBytes{
      *this, "bucket-bytes",
      llvm::cl::desc("Gradient all-reduce buckets of at most this many "
                     "bytes (0: one all-reduce per gradient)"),
      llvm::cl::init(kPartitionDefaults.bucketBytes)};
  Option<std::string> fusionGroups{
      *this, "fusion-groups",
      llvm::cl::desc("Kernel groups to mark (megac-fuse-elementwise's "
                     "groups): a, the CPU target's; abcdegnrtw, a GPU "
                     "target's; empty for none"),
      llvm::cl::init("a")};
  // The optimizer's (megac-apply-optimizer's), with --train.
  Option<double> lr{*this, "lr", llvm::cl::desc("Peak learning rate"),
                    llvm::cl::init(kOptimizerDefaults.lr)};
  Option<double> minLr{*this, "min-lr",
                       llvm::cl::desc("Learning rate at the end of the "
                                      "cosine decay"),
                       llvm::cl::init(kOptimizerDefaults.minLr)};
  Option<int64_t> warmupSteps{*this, "warmup-steps",
                              llvm::cl::desc("Linear warm-up steps"),
                              llvm::cl::init(kOptimizerDefaults.warmupSteps)};
  Option<int64_t> totalSteps{
      *this, "total-steps",
      llvm::cl::desc("Step at which the cosine decay reaches min-lr"),
      llvm::cl::init(kOptimizerDefaults.totalSteps)};
  Option<double> beta1{*this, "beta1", llvm::cl::desc("AdamW beta1"),
                       llvm::cl::init(kOptimizerDefaults.beta1)};
  Option<double> beta2{*this, "beta2", llvm::cl::desc("AdamW beta2"),
                       llvm::cl::init(kOptimizerDefaults.beta2)};
  Option<double> epsilon{*this, "epsilon", llvm::cl::desc("AdamW epsilon"),
                         llvm::cl::init(kOptimizerDefaults.epsilon)};
  Option<double> weightDecay{*this, "weight-decay",
                             llvm::cl::desc("Decoupled weight decay for "
                                            "matrices"),
                             llvm::cl::init(kOptimizerDefaults.weightDecay)};
  Option<double> maxGradNorm{
      *this, "max-grad-norm",
      llvm::cl::desc("Global gradient-norm clipping threshold (0: off)"),
      llvm::cl::init(kOptimizerDefaults.maxGradNorm)};
  Option<int64_t> zeroStage{
      *this, "zero-stage",
      llvm::cl::desc("1: shard the optimizer state over zero-axis (ZeRO-1)"),
      llvm::cl::init(kOptimizerDefaults.zeroStage)};
  Option<std::string> zeroAxis{*this, "zero-axis",
                               llvm::cl::desc("The axis ZeRO shards over"),
                               llvm::cl::init(kOptimizerDefaults.zeroAxis)};
};
} // namespace

/// The pipeline's options as buildPartitionPipeline takes them.
static PartitionOptions
toPartitionOptions(const PartitionPipelineOptions &opts) {
  PartitionOptions options;
  options.mesh = opts.mesh;
  options.batch = opts.batch;
  options.seq = opts.seq;
  options.microBatches = opts.microBatches;
  options.train = opts.train;
  options.gradients = opts.gradients;
  options.bf16 = opts.bf16;
  options.sequenceParallel = opts.sequenceParallel;
  options.recompute = opts.recompute;
  options.virtualStages = opts.virtualStages;
  options.bucketBytes = opts.bucketBytes;
  options.fusionGroups = opts.fusionGroups;
  options.optimizer.lr = opts.lr;
  options.optimizer.minLr = opts.minLr;
  options.optimizer.warmupSteps = opts.warmupSteps;
  options.optimizer.totalSteps = opts.totalSteps;
  options.optimizer.beta1 = opts.beta1;
  options.optimizer.beta2 = opts.beta2;
  options.optimizer.epsilon = opts.epsilon;
  options.optimizer.weightDecay = opts.weightDecay;
  options.optimizer.maxGradNorm = opts.maxGradNorm;
  options.optimizer.zeroStage = opts.zeroStage;
  options.optimizer.zeroAxis = opts.zeroAxis;
  return options;
}

void registerMegacPassesAndPipelines() {
  registerMegacPasses();
  // (Registered by hand rather than with PassPipelineRegistration, whose
  // builder cannot refuse options: megac compile's combinations that
  // make no sense are refused here too.)
  registerPassPipeline(
      "megac-partition-pipeline",
      "From a model on global shapes to per-rank IR with collectives (the "
      "passes megac compile runs)",
      [](OpPassManager &pm, StringRef text,
         function_ref<LogicalResult(const Twine &)> errorHandler) {
        PartitionPipelineOptions opts;
        if (failed(opts.parseFromString(text)))
          return failure();
        const PartitionOptions options = toPartitionOptions(opts);
        // (The optimizer's too, as megac compile checks them with
        // --train or without: a value that cannot be right is a slip.)
        std::string problem = partitionOptionsProblem(options, "");
        if (problem.empty())
          problem = optimizerOptionsProblem(options.optimizer);
        if (!problem.empty())
          return errorHandler("megac-partition-pipeline: " + problem);
        buildPartitionPipeline(pm, options);
        return success();
      },
      [](function_ref<void(const mlir::detail::PassOptions &)> optHandler) {
        optHandler(PartitionPipelineOptions());
      });
}

} // namespace megac
