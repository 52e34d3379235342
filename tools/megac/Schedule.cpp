//===- Schedule.cpp - megac schedule --------------------------------------===//
//
// megac schedule: a pipeline schedule generated or checked (bubble,
// deadlocks), and how megac compile would split a model into stages.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "megac/Dialect/Megac/Transforms/Passes.h"
#include "megac/InitAll.h"
#include "megac/Pipeline/Partition.h"
#include "megac/Pipeline/Schedule.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
namespace cl = llvm::cl;
using namespace megac::driver;

namespace {

/// Prints how megac compile would split the model at \p path into
/// \p ranks x \p chunksPerRank pipeline stages by cost (model chunk c on
/// rank c % ranks, as the schedules place them), each line after
/// \p prefix.
LogicalResult printPartition(llvm::StringRef path, int64_t ranks,
                             int64_t chunksPerRank, int64_t batch, int64_t seq,
                             llvm::StringRef prefix) {
  const int64_t stages = ranks * chunksPerRank;
  DialectRegistry registry;
  megac::registerAllDialects(registry);
  MLIRContext ctx(registry);
  installOneLineDiagnostics(ctx);
  std::string error;
  llvm::SourceMgr sourceMgr;
  OwningOpRef<ModuleOp> module = loadModel(ctx, path, sourceMgr);
  if (!module)
    return failure();
  PassManager pm(&ctx);
  pm.addPass(megac::createSpecializeShapesPass(
      megac::SpecializeShapesPassOptions{batch, seq, 1}));
  if (failed(pm.run(*module)))
    return failure();
  // As megac compile refuses such sizes (each stage holds its layers'
  // tensors whole), rather than estimate FLOPs past int64.
  if (reportOversizedTensor(*module))
    return failure();
  func::FuncOp func;
  for (auto f : module->getOps<func::FuncOp>())
    if (!f.isExternal())
      func = f;
  if (!func) {
    fail(path + ": no function with a body");
    return failure();
  }
  FailureOr<megac::StagePartition> partition =
      megac::partitionStages(func, ranks, chunksPerRank, error);
  if (failed(partition)) {
    fail(path + ": " + error);
    return failure();
  }
  const int64_t blocks = static_cast<int64_t>(partition->blockCost.size());
  for (int64_t k = 0; k < stages; ++k) {
    int64_t from = partition->firstBlock[k];
    int64_t to = k + 1 < stages ? partition->firstBlock[k + 1] : blocks;
    const std::string where =
        chunksPerRank > 1
            ? llvm::formatv(" (rank {0}, chunk {1})", k % ranks, k / ranks)
                  .str()
            : std::string();
    llvm::outs()
        << prefix
        << llvm::formatv(
               "stage {0}{6}: blocks {1}..{2}{3}{4}, {5:F2} GFLOP per step\n",
               k, from, to - 1, k == 0 ? " + embedding" : "",
               k + 1 == stages ? " + head and loss" : "",
               partition->stageCost[k] / 1e9, where);
  }
  llvm::outs() << prefix
               << llvm::formatv("partition: max/mean stage cost {0:F4}\n",
                                partition->maxOverMean());
  return success();
}

} // namespace

namespace megac::driver {

int runSchedule(int argc, char **argv) {
  static cl::OptionCategory category("megac schedule options");
  static cl::opt<int64_t> stages("stages",
                                 cl::desc("Pipeline stages (ranks; default 4)"),
                                 cl::init(4), cl::cat(category));
  static cl::opt<int64_t> microBatches(
      "micro-batches", cl::desc("Micro-batches per step (default 8)"),
      cl::init(8), cl::cat(category));
  static cl::opt<std::string> kind(
      "schedule", cl::desc("gpipe, 1f1b (the default) or interleaved"),
      cl::init("1f1b"), cl::cat(category));
  static cl::opt<int64_t> virtualStages(
      "virtual-stages",
      cl::desc("Model chunks per rank (interleaved only; default 2)"),
      cl::init(2), cl::cat(category));
  static cl::opt<std::string> check(
      "check",
      cl::desc("Check this schedule instead of generating one: one line per "
               "rank, tasks F<micro-batch>[.<chunk>] and B... in order; - "
               "reads standard input"),
      cl::value_desc("file"), cl::cat(category));
  static cl::opt<bool> print("print", cl::desc("Print every rank's tasks"),
                             cl::cat(category));
  static cl::opt<std::string> model(
      "model",
      cl::desc("Also split this model's transformer blocks into the stages "
               "(FLOPs of forward and backward, the embedding with the "
               "first stage, the head and loss with the last) and print the "
               "partition"),
      cl::value_desc("model.mlir"), cl::cat(category));
  static cl::opt<int64_t> batch(
      "batch",
      cl::desc("Batch size for --model (default: the model's, else 4)"),
      cl::init(0), cl::cat(category));
  static cl::opt<int64_t> seq(
      "seq",
      cl::desc("Sequence length for --model (default: the model's, or 64, "
               "or the position table's length if shorter)"),
      cl::init(0), cl::cat(category));
  if (!parseSubcommand(
          argc, argv,
          "megac schedule: generate a pipeline schedule (GPipe, 1F1B, "
          "interleaved 1F1B) or check one written by hand. The schedule is "
          "simulated (a backward pass takes twice a forward pass): every "
          "activation and gradient sent must be received in an order that lets "
          "every rank finish; the bubble (idle time) is reported.\n"))
    return 1;
  megac::PipelineSchedule schedule;
  std::string error;
  // A checked file says its own shape: options that would shape a
  // generated schedule are refused beside it, not silently dropped.
  if (!check.empty())
    for (cl::Option *option : std::initializer_list<cl::Option *>{
             &stages, &microBatches, &kind, &virtualStages})
      if (option->getNumOccurrences())
        return fail("--" + option->ArgStr.str() +
                    " shapes a generated schedule; --check " + check +
                    " takes its ranks, micro-batches and chunks from the "
                    "file");
  if (check == "-" && model == "-")
    return fail("--check - and --model - cannot both be read from standard "
                "input");
  if (model.empty())
    for (cl::opt<int64_t> *option : {&batch, &seq})
      if (option->getNumOccurrences())
        llvm::errs() << "megac: warning: --" << option->ArgStr
                     << " has no effect without --model (it shapes the "
                        "model's partition)\n";
  // As megac compile: chunks only where the schedule interleaves them.
  if (check.empty() && virtualStages.getNumOccurrences() && virtualStages > 1 &&
      kind != "interleaved")
    return fail("--virtual-stages " + std::to_string(virtualStages) +
                " needs --schedule interleaved");
  // As megac compile: sizes given must be positive.
  for (cl::opt<int64_t> *size : {&batch, &seq})
    if (size->getNumOccurrences() && *size <= 0)
      return fail("--" + size->ArgStr.str() + " must be positive, got " +
                  std::to_string(size->getValue()));
  if (!makeSchedule(kind, stages, microBatches, virtualStages, check, schedule,
                    error))
    return fail(error);
  megac::PipelineTiming timing;
  if (!megac::simulatePipeline(schedule, 1.0, 2.0, timing, error))
    return fail((check.empty() ? std::string("internal error: ")
                               : inputName(check) + ": ") +
                error);
  if (print)
    for (auto [r, tasks] : llvm::enumerate(schedule.ranks)) {
      llvm::outs() << "rank " << r << ":";
      for (const megac::PipelineTask &t : tasks)
        llvm::outs() << " " << megac::formatTask(t);
      llvm::outs() << "\n";
    }
  // With --print the other lines are comments, so that the output reads
  // back with --check or megac compile --pipeline-schedule.
  llvm::StringRef prefix = print ? "# " : "";
  // The partition of a step megac compile would make: a batch its
  // micro-batches split evenly, as compile requires.
  if (!model.empty() && batch > 0 && batch % schedule.microBatches != 0)
    return fail("--batch " + std::to_string(batch.getValue()) +
                " is not divisible by the " +
                std::to_string(schedule.microBatches) +
                " micro-batches (megac compile would refuse it)");
  if (!model.empty() &&
      failed(printPartition(model, schedule.stages, schedule.virtualStages,
                            batch, seq, prefix)))
    return 1;
  llvm::outs() << prefix
               << llvm::formatv("{0} stages, {1} micro-batches, {2} chunk(s) "
                                "per rank: step {3:F2} "
                                "forward-times, bubble {4:F4} of the step "
                                "({5:F4} of the compute)\n",
                                schedule.stages, schedule.microBatches,
                                schedule.virtualStages, timing.makespan,
                                timing.bubbleOfTotal, timing.bubbleOfIdeal);
  return 0;
}

} // namespace megac::driver
