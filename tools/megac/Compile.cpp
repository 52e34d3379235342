//===- Compile.cpp - megac compile ----------------------------------------===//
//
// megac compile: a model partitioned over a device grid, written as a
// plan (.mgc) the runtime launches.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/InitAll.h"
#include "megac/Pipeline/Partition.h"
#include "megac/Pipeline/Schedule.h"
#include "megac/Target/Plan/PlanEmitter.h"
#ifdef MEGAC_HAVE_NVRTC
#include "NvrtcCompiler.h"
#endif
#include "megac_rt/memory_plan.h"
#include "megac_rt/plan_file.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

using namespace mlir;
namespace cl = llvm::cl;
using namespace megac::driver;

namespace {

/// "80G", "512M", "1.5GiB", "1073741824": bytes (K, M, G, T are powers of
/// 1024, with or without "iB"/"B").
std::optional<uint64_t> parseByteSize(llvm::StringRef text) {
  text = text.trim();
  size_t digits = 0;
  while (digits < text.size() &&
         (llvm::isDigit(text[digits]) || text[digits] == '.'))
    ++digits;
  double value;
  if (digits == 0 || text.take_front(digits).getAsDouble(value))
    return std::nullopt;
  llvm::StringRef unit = text.drop_front(digits).trim();
  unit.consume_back("iB");
  unit.consume_back("B");
  double scale = 1;
  if (unit.equals_insensitive("k"))
    scale = 1024.0;
  else if (unit.equals_insensitive("m"))
    scale = 1024.0 * 1024;
  else if (unit.equals_insensitive("g"))
    scale = 1024.0 * 1024 * 1024;
  else if (unit.equals_insensitive("t"))
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty())
    return std::nullopt;
  // 2^64 bytes and more do not fit (the cast would wrap to nonsense).
  if (!(value * scale < 18446744073709551616.0))
    return std::nullopt;
  return static_cast<uint64_t>(value * scale);
}

/// Plans every rank's memory; prints the plans with \p report and fails,
/// naming the rank, the breakdown and what would help, when one exceeds
/// \p budget. \p backward: the plan has a backward pass (--train or
/// --gradients), so --micro-batches would apply.
mlir::LogicalResult checkMemory(const megac::plan::Program &program,
                                std::optional<uint64_t> budget, bool report,
                                bool backward) {
  using megac_rt::formatBytes;
  uint32_t worstRank = 0;
  megac_rt::MemoryPlan worst;
  // Ranks that differ only in their coordinates (every rank of a tp x dp
  // grid) have the same plan: compute it once per distinct program.
  std::map<std::vector<int64_t>, megac_rt::MemoryPlan> planned;
  // A CUDA plan runs where the backend keeps bf16 copies of its rounded
  // operands, and some rounded tensors in bf16 alone; the report counts
  // them as the backend allocates them by default.
  const megac_rt::Bf16Storage storage =
      program.target() && program.target()->str() == "cuda"
          ? megac_rt::Bf16Storage::Bf16Only
          : megac_rt::Bf16Storage::Fp32;
  for (uint32_t r = 0; r < program.ranks()->size(); ++r) {
    const auto &rp = *program.ranks()->Get(r);
    std::vector<int64_t> key = {rp.forward_end(), rp.accumulate_end()};
    for (const auto *buffer : *rp.buffers()) {
      key.push_back(-1 - static_cast<int64_t>(buffer->dtype()));
      key.insert(key.end(), buffer->shape()->begin(), buffer->shape()->end());
    }
    for (const auto *instr : *rp.instrs()) {
      key.push_back(-100 - static_cast<int64_t>(instr->op()) -
                    (instr->generation_only() ? 1000 : 0));
      key.insert(key.end(), instr->inputs()->begin(), instr->inputs()->end());
      key.push_back(-2);
      key.insert(key.end(), instr->outputs()->begin(), instr->outputs()->end());
    }
    if (rp.params())
      for (const auto *param : *rp.params())
        key.push_back(-3 - static_cast<int64_t>(param->buffer()));
    if (rp.inputs())
      for (const auto *in : *rp.inputs())
        key.push_back(-4 - static_cast<int64_t>(in->buffer()));
    if (rp.outputs())
      for (const auto *out : *rp.outputs())
        key.push_back(-5 - static_cast<int64_t>(out->buffer()));
    // Pipeline ranks: the segments and the schedule (micro-batches in
    // flight) matter too.
    if (rp.segments())
      for (const auto *segment : *rp.segments())
        key.insert(key.end(), {-6, segment->begin(), segment->end()});
    if (rp.schedule())
      for (const auto *task : *rp.schedule())
        key.insert(key.end(), {-7, task->segment(), task->micro_batch()});
    auto found = planned.find(key);
    if (found == planned.end())
      found = planned
                  .emplace(std::move(key),
                           megac_rt::planMemory(program, rp, storage))
                  .first;
    const megac_rt::MemoryPlan &plan = found->second;
    if (report)
      llvm::errs() << llvm::formatv(
          "megac: memory of rank {0}: {1} = parameters {2} + optimizer state "
          "{3} + arena {4} (at its peak, instruction {5}: gradients {6}, "
          "activations {7}, workspace {8}; {11} without reuse); activations "
          "kept for the backward pass {9} ({10} B){12}{13}{14}\n",
          r, formatBytes(plan.totalBytes()), formatBytes(plan.parameterBytes),
          formatBytes(plan.optimizerBytes), formatBytes(plan.arenaBytes),
          plan.peakInstruction, formatBytes(plan.peakGradientBytes),
          formatBytes(plan.peakActivationBytes),
          formatBytes(plan.peakWorkspaceBytes),
          formatBytes(plan.savedActivationBytes), plan.savedActivationBytes,
          formatBytes(plan.unsharedBytes),
          plan.slotBytes
              ? llvm::formatv("; pipeline: {0} micro-batch(es) in flight x "
                              "{1} each",
                              plan.slots, formatBytes(plan.slotBytes))
                    .str()
              : std::string(),
          plan.copyBytes
              ? llvm::formatv("; bf16 operand copies {0} without reuse",
                              formatBytes(plan.copyBytes))
                    .str()
              : std::string(),
          plan.bf16OnlyBytes
              ? llvm::formatv("; {0} buffers kept in bf16 alone ({1}, "
                              "not {2} in fp32)",
                              llvm::count(plan.bf16Only, true),
                              formatBytes(plan.bf16OnlyBytes),
                              formatBytes(2 * plan.bf16OnlyBytes))
                    .str()
              : std::string());
    if (r == 0 || plan.totalBytes() > worst.totalBytes()) {
      worst = plan;
      worstRank = r;
    }
  }
  if (!budget || worst.totalBytes() <= *budget)
    return mlir::success();
  // Suggest what shrinks the largest part.
  std::string hint;
  bool hasDp = false;
  for (const auto *axis : *program.axes())
    hasDp |= axis->name()->str() == "dp" && axis->size() > 1;
  const uint64_t activations =
      worst.peakActivationBytes + worst.peakWorkspaceBytes;
  const uint64_t largest =
      std::max({worst.optimizerBytes, worst.peakGradientBytes, activations});
  if (largest == worst.optimizerBytes && hasDp)
    hint = "--zero 1 shards the optimizer state over dp";
  else if (largest == worst.optimizerBytes)
    hint = "a larger tp axis splits parameters and optimizer state";
  else if (largest == worst.peakGradientBytes)
    hint = "gradients dominate: a larger tp axis splits them (sharding them "
           "over dp, ZeRO-2, is not implemented)";
  else if (backward)
    hint = "--micro-batches N divides the activations by about N; a larger "
           "tp axis or --precision bf16 also shrink them";
  else // forward plans take no micro-batches
    hint = "a smaller --batch, a larger tp axis or --precision bf16 shrink "
           "the activations";
  fail(llvm::formatv(
           "rank {0} needs {1} (parameters {2}, optimizer state "
           "{3}, arena {4} with activations {5} at its peak) but "
           "--device-memory is {6}; {7}",
           worstRank, formatBytes(worst.totalBytes()),
           formatBytes(worst.parameterBytes), formatBytes(worst.optimizerBytes),
           formatBytes(worst.arenaBytes),
           formatBytes(worst.peakActivationBytes), formatBytes(*budget), hint)
           .str());
  return mlir::failure();
}

/// Whether \p name is one a --dump-ir file takes ("00-input.mlir",
/// "NN-megac-*.mlir": every pass of the pipeline is megac's).
bool isDumpFileName(llvm::StringRef name) {
  return name == "00-input.mlir" ||
         (name.size() > 3 && llvm::isDigit(name[0]) && llvm::isDigit(name[1]) &&
          name.drop_front(2).starts_with("-megac-") && name.ends_with(".mlir"));
}

/// Writes the IR after every pass to DIR/NN-<pass>.mlir.
class DumpIRInstrumentation : public PassInstrumentation {
public:
  explicit DumpIRInstrumentation(std::string dir) : dir(std::move(dir)) {
    removeEarlierDumps();
  }

  /// A directory used before keeps that run's numbered files: a forward
  /// dump after a training one would leave two files of each number. Only
  /// the names dumps take are removed (isDumpFileName); megac compile has
  /// refused a model, plan or IR file of such a name there (dumpFileAt).
  void removeEarlierDumps() {
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
         it.increment(ec))
      if (isDumpFileName(llvm::sys::path::filename(it->path())))
        llvm::sys::fs::remove(it->path());
  }

  void write(llvm::StringRef stage, Operation *op) {
    llvm::SmallString<256> path(dir);
    llvm::sys::path::append(
        path, llvm::formatv("{0:2}-{1}.mlir", index++, stage).str());
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    if (ec) {
      llvm::errs() << "megac: warning: cannot write " << path << ": "
                   << ec.message() << "\n";
      return;
    }
    op->print(os);
  }

  void runAfterPass(Pass *pass, Operation *op) override {
    write(pass->getArgument(), op);
  }

private:
  std::string dir;
  unsigned index = 0;
};

/// The axes of a --mesh value such as "dp=2,pp=4" (none if it is empty or
/// misspelt: checkMeshOption reports that).
SmallVector<megac::GridAxisText> meshAxes(StringRef mesh) {
  SmallVector<megac::GridAxisText> axes;
  if (!megac::parseGridText(mesh, axes))
    axes.clear();
  return axes;
}

/// The size of axis \p name in a --mesh value; 1 if absent.
int64_t meshAxisSize(StringRef mesh, StringRef name) {
  for (const megac::GridAxisText &axis : meshAxes(mesh))
    if (axis.name == name)
      return axis.size;
  return 1;
}

/// Checks a --mesh value before any model is read, by #megac.mesh's own
/// rules, so that a mistake in it is reported as the option's rather than
/// placed in the model. Returns "" when it is fine.
std::string checkMeshOption(MLIRContext &ctx, StringRef mesh) {
  if (mesh.empty())
    return "";
  const std::string what = "--mesh " + mesh.str() + ": ";
  SmallVector<megac::GridAxisText> parsed;
  if (!megac::parseGridText(mesh, parsed)) {
    // A size of digits alone that parses to no int64 is too large, not
    // misspelt.
    for (StringRef item : llvm::split(mesh, ',')) {
      auto [name, size] = item.split('=');
      size = size.trim();
      int64_t value;
      if (!size.empty() && llvm::all_of(size, llvm::isDigit) &&
          size.getAsInteger(10, value))
        return what + "grid axis '" + name.trim().str() + "' size " +
               size.str() + " is too large (a grid has at most 2^24 ranks)";
    }
    return what + "expected name=size pairs such as 'tp=4' or 'dp=2,tp=4'";
  }
  SmallVector<StringAttr> names;
  SmallVector<int64_t> sizes;
  for (const megac::GridAxisText &axis : parsed) {
    names.push_back(StringAttr::get(&ctx, axis.name));
    sizes.push_back(axis.size);
  }
  std::string problem;
  ScopedDiagnosticHandler capture(&ctx, [&](Diagnostic &diag) {
    problem = withoutRuleLabels(diag.str());
    return success();
  });
  if (failed(megac::MeshAttr::verify(
          [&] { return mlir::emitError(UnknownLoc::get(&ctx)); }, names,
          sizes)))
    return what + problem;
  return "";
}

/// Warns about each axis of \p mesh (but pp, which splits layers) that no
/// sharding in the model names: its ranks would all do the same work, which
/// is most often a misspelt axis (--mesh TP=2).
void warnUnusedAxes(ModuleOp module, StringRef mesh) {
  llvm::StringSet<> named;
  module->walk([&](Operation *op) {
    op->getAttrDictionary().walk([&](megac::ShardingAttr sharding) {
      for (StringAttr axis : sharding.getDims())
        if (!axis.getValue().empty()) // "" marks a whole dimension
          named.insert(axis.getValue());
      for (StringAttr axis : sharding.getPartial())
        named.insert(axis.getValue());
    });
  });
  for (const megac::GridAxisText &axis : meshAxes(mesh)) {
    if (axis.name == "pp" || axis.size <= 1 || named.contains(axis.name))
      continue;
    SmallVector<StringRef> known(named.keys());
    llvm::sort(known);
    llvm::errs() << "megac: warning: no sharding in the model names grid "
                    "axis '"
                 << axis.name << "', so its " << axis.size
                 << " ranks will repeat the same work (the model's axes: "
                 << (known.empty() ? std::string("none")
                                   : llvm::join(known, ", "))
                 << ")\n";
  }
}

/// A `--target cuda` model whose embedding table's rows (the vocabulary,
/// tied to the output layer) are not a multiple of 64: the output layer's
/// products then have an odd width, which keeps cuBLAS from its fastest
/// kernels (their rows must be 16-byte aligned), and the loss's kernels
/// read each row's first and last few logits one at a time (their rows
/// start unaligned). nanoGPT pads GPT-2's
/// 50257 to 50304 for this; `megac import --pad-vocab-to` does the same
/// without changing the loss.
void noteGpuVocabulary(ModuleOp module, bool quiet) {
  if (quiet)
    return;
  module->walk([&](megac::EmbeddingOp op) {
    auto table = dyn_cast<RankedTensorType>(op.getTable().getType());
    if (!table || table.getRank() != 2 || table.isDynamicDim(0))
      return WalkResult::advance();
    const int64_t rows = table.getDimSize(0);
    if (rows % 64 != 0)
      llvm::errs() << "megac: note: the embedding table has " << rows
                   << " rows, not a multiple of 64: on a GPU the output "
                      "layer's products and the loss run faster on a padded "
                      "vocabulary (`megac import --pad-vocab-to 64` makes it "
                   << (rows + 63) / 64 * 64 << "; the loss is the same)\n";
    return WalkResult::interrupt(); // the first table: the vocabulary's
  });
}

/// The file of --dump-ir directory \p dir that is \p path under a dump's
/// name (or a link by such a name to it); "" if none. The dump would
/// overwrite it, or remove it as an earlier run's dump.
std::string dumpFileAt(llvm::StringRef dir, llvm::StringRef path) {
  if (path.empty() || path == "-")
    return "";
  llvm::StringRef parent = llvm::sys::path::parent_path(path);
  if (isDumpFileName(llvm::sys::path::filename(path)) &&
      sameFileOrPath(parent.empty() ? "." : parent, dir))
    return path.str();
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec))
    if (isDumpFileName(llvm::sys::path::filename(it->path())) &&
        sameFileOrPath(it->path(), path))
      return it->path();
  return "";
}

} // namespace

namespace megac::driver {

int runCompile(int argc, char **argv) {
  static cl::OptionCategory category("megac compile options");
  static cl::opt<std::string> input(cl::Positional, cl::Required,
                                    cl::desc("<model.mlir>"),
                                    cl::cat(category));
  // Required, but checked here: LLVM's "must be specified at least once!"
  // is not megac's one-line error.
  static cl::opt<std::string> output(
      "o", cl::desc("Plan file to write (.mgc; required; - for stdout)"),
      cl::value_desc("file"), cl::cat(category));
  static cl::opt<std::string> mesh(
      "mesh",
      cl::desc("Device grid as name=size pairs, outermost first: tp=4, "
               "dp=2,tp=4, dp=2,pp=2,tp=2 (dp: data, pp: pipeline stages, "
               "tp: tensor parallelism; default: the module's own, or a "
               "single rank)"),
      cl::cat(category));
  static cl::opt<int64_t> batch(
      "batch", cl::desc("Batch size (default: the model's, or 4)"), cl::init(0),
      cl::cat(category));
  static cl::opt<int64_t> seq(
      "seq",
      cl::desc("Sequence length (default: the model's, or 64, or "
               "the position table's length if shorter)"),
      cl::init(0), cl::cat(category));
  static cl::opt<uint64_t> seed(
      "seed",
      cl::desc("Seed for parameter init and the default input batch "
               "(default 1234)"),
      cl::init(1234), cl::cat(category));
  static cl::opt<std::string> dumpIR(
      "dump-ir",
      cl::desc("Write the IR after every pass to numbered files "
               "in this directory"),
      cl::value_desc("dir"), cl::cat(category));
  static cl::opt<std::string> emitMLIR(
      "emit-mlir", cl::desc("Also write the final per-rank IR to this file"),
      cl::value_desc("file"), cl::cat(category));
  static cl::opt<bool> quiet("quiet",
                             cl::desc("Print nothing on success (also -q)"),
                             cl::cat(category));
  static cl::alias quietShort("q", cl::desc("Alias for --quiet"),
                              cl::aliasopt(quiet), cl::cat(category));
  static cl::opt<std::string> target(
      "target",
      cl::desc("cpu (an attention's three gradient steps one instruction), "
               "or cuda: elementwise chains and GEMM epilogues fused "
               "(megac-fuse-elementwise), the chains as generated CUDA "
               "kernels compiled with NVRTC for sm_80 and sm_90 (with PTX "
               "for compute_90, which the driver compiles for later GPUs) "
               "and embedded in the plan (the CPU backend runs them too); "
               "compiled "
               "kernels are cached in $MEGAC_KERNEL_CACHE (default "
               "$XDG_CACHE_HOME/megac/kernels, else ~/.cache/megac/kernels; "
               "off or empty: no cache)"),
      cl::init("cpu"), cl::cat(category));
  static cl::list<std::string> cudaArch(
      "cuda-arch", cl::CommaSeparated,
      cl::desc("With --target cuda: the architectures the generated kernels "
               "are compiled for, sm_XY for a cubin (it runs on that major "
               "version from its minor on) and compute_XY for PTX (the "
               "driver compiles it for any later GPU); default "
               "sm_80,sm_90,compute_90. sm_100 or sm_120 adds native "
               "cubins for Blackwell GPUs"),
      cl::value_desc("arch,..."), cl::cat(category));
  static cl::OptionCategory trainCategory(
      "megac compile training options (with --train)");
  static cl::opt<bool> train(
      "train",
      cl::desc("Compile a training step: forward, backward (autodiff) and "
               "AdamW updates with global-norm clipping"),
      cl::cat(trainCategory));
  static cl::opt<bool> gradients(
      "gradients",
      cl::desc("Compile forward and backward only: the plan outputs every "
               "parameter's gradient as grad:<name> (to inspect or check "
               "them)"),
      cl::cat(trainCategory));
  static cl::opt<double> lr("lr", cl::desc("Peak learning rate (default 6e-4)"),
                            cl::init(6e-4), cl::cat(trainCategory));
  static cl::opt<double> minLr(
      "min-lr",
      cl::desc("Learning rate at the end of the cosine decay (default "
               "6e-5)"),
      cl::init(6e-5), cl::cat(trainCategory));
  static cl::opt<int64_t> warmup("warmup-steps",
                                 cl::desc("Linear warm-up steps (default 10)"),
                                 cl::init(10), cl::cat(trainCategory));
  static cl::opt<int64_t> totalSteps(
      "total-steps",
      cl::desc("Step at which the cosine decay ends (default 1000)"),
      cl::init(1000), cl::cat(trainCategory));
  static cl::opt<double> weightDecay(
      "weight-decay",
      cl::desc("AdamW weight decay, matrices only (default 0.1)"),
      cl::init(0.1), cl::cat(trainCategory));
  static cl::opt<double> maxGradNorm(
      "max-grad-norm",
      cl::desc("Global gradient-norm clipping (0: off; default 1)"),
      cl::init(1.0), cl::cat(trainCategory));
  static cl::opt<int64_t> zero(
      "zero",
      cl::desc("ZeRO stage: 1 shards the AdamW state over the dp axis "
               "(gradients reduce-scattered, updated slices all-gathered)"),
      cl::init(0), cl::cat(trainCategory));
  static cl::opt<int64_t> microBatches(
      "micro-batches",
      cl::desc("Gradient accumulation: run forward and backward on this many "
               "micro-batches of batch / N rows per step, summing the "
               "gradients, then update once (--train, --gradients); at most "
               "1048576"),
      cl::init(1), cl::cat(trainCategory));
  static cl::opt<std::string> precision(
      "precision",
      cl::desc("fp32, or bf16: activations, gradients of activations and the "
               "weights' compute copies in bf16 (emulated by rounding on "
               "CPU ranks), f32 master weights, loss and optimizer"),
      cl::init("fp32"), cl::cat(category));
  static cl::opt<bool> sequenceParallel(
      "sequence-parallel",
      cl::desc("Megatron sequence parallelism: LayerNorm, dropout and the "
               "residual stream split on the sequence over tp (all-gathers "
               "and reduce-scatters in place of the all-reduces)"),
      cl::cat(category));
  static cl::opt<std::string> recompute(
      "recompute",
      cl::desc("Activation recomputation: none; selective (the fused "
               "attention's scores and softmax, which megac always "
               "recomputes, and with --sequence-parallel the LayerNorm "
               "outputs gathered again in the backward pass); full (keep "
               "only each transformer block's input, recompute the block's "
               "forward in its backward). Default none"),
      cl::init("none"), cl::cat(trainCategory));
  static cl::opt<bool> memoryReport(
      "memory-report",
      cl::desc("Print each rank's memory plan: parameters, optimizer state, "
               "and the liveness-planned arena's gradients, activations and "
               "workspace at its peak"),
      cl::cat(category));
  static cl::opt<std::string> deviceMemory(
      "device-memory",
      cl::desc("Fail unless every rank's planned peak fits in this many "
               "bytes (suffixes K, M, G, T: powers of 1024; e.g. 80G)"),
      cl::value_desc("size"), cl::cat(category));
  static cl::opt<double> bucketMB(
      "bucket-mb",
      cl::desc("Fuse gradient all-reduces into buckets of this many MiB "
               "(one collective per bucket, as PyTorch DDP; 0: one per "
               "gradient; default 25)"),
      cl::init(25.0), cl::cat(trainCategory));
  static cl::OptionCategory pipelineCategory(
      "megac compile pipeline options (a pp axis in --mesh, with --train)");
  static cl::opt<std::string> pipelineSchedule(
      "schedule",
      cl::desc("Pipeline schedule: gpipe, 1f1b (the default) or interleaved "
               "(1F1B with --virtual-stages chunks per rank)"),
      cl::init("1f1b"), cl::cat(pipelineCategory));
  static cl::opt<int64_t> virtualStages(
      "virtual-stages",
      cl::desc("Model chunks per pipeline rank (interleaved; 2 by default "
               "there, 1 otherwise)"),
      cl::init(0), cl::cat(pipelineCategory));
  static cl::opt<std::string> scheduleFile(
      "pipeline-schedule",
      cl::desc("Follow this schedule instead: one line per pipeline rank, "
               "tasks F<micro-batch>[.<chunk>] and B... in order (as megac "
               "schedule --print writes them); checked for deadlocks"),
      cl::value_desc("file"), cl::cat(pipelineCategory));
  static cl::opt<double> beta1("beta1", cl::desc("AdamW beta1 (default 0.9)"),
                               cl::init(0.9), cl::cat(trainCategory));
  static cl::opt<double> beta2("beta2", cl::desc("AdamW beta2 (default 0.95)"),
                               cl::init(0.95), cl::cat(trainCategory));
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerAsmPrinterCLOptions();
  registerDefaultTimingManagerCLOptions();
  if (!parseSubcommand(
          argc, argv,
          "megac compile: partition a megac model over a device grid and write "
          "an execution plan.\n\n"
          "  megac compile model.mlir --mesh tp=4 -o model.mgc\n"
          "  mpirun -np 4 megac-run model.mgc\n"
          "  megac compile model.mlir --train --mesh dp=2,tp=2 -o train.mgc\n"
          "  mpirun -np 4 megac-run train.mgc --steps 100 --data tokens.bin\n"))
    return 1;

  auto start = std::chrono::steady_clock::now();
  if (output.empty())
    return fail("no plan file: name one with -o (e.g. -o model.mgc, or -o - "
                "for standard output)");
  // A plan written over its own model (a slip of `-o model.mlir`) would
  // lose the model, and two outputs of one name would lose one of them.
  if (sameFileOrPath(input, output))
    return fail("-o " + output +
                " is the model being compiled; the plan "
                "would overwrite it");
  if (!emitMLIR.empty() && sameFileOrPath(input, emitMLIR))
    return fail("--emit-mlir " + emitMLIR +
                " is the model being compiled; the IR would overwrite it");
  if (output == "-" && emitMLIR == "-")
    return fail("-o - and --emit-mlir - would both write to standard output; "
                "send one of them to a file");
  // (/dev/null for both discards both: a device is written in place, and
  // one file cannot hold two outputs only where it is a regular file.)
  auto isDevice = [](llvm::StringRef path) {
    llvm::sys::fs::file_status status;
    return !llvm::sys::fs::status(path, status) &&
           status.type() == llvm::sys::fs::file_type::character_file;
  };
  if (!emitMLIR.empty() && sameFileOrPath(output, emitMLIR) &&
      !isDevice(output))
    return fail("--emit-mlir " + emitMLIR +
                " is the plan's file (-o); name another file");
  // 0 is the options' "not given"; given, a size must be positive.
  for (cl::opt<int64_t> *size : {&batch, &seq})
    if (size->getNumOccurrences() && *size <= 0)
      return fail("--" + size->ArgStr.str() + " must be positive, got " +
                  std::to_string(size->getValue()));
  // The options alone, before the model is read: an error here leaves an
  // older plan at -o in place (see removeStalePlan below).
  // What the pipeline is built from; the rest is filled in once the
  // model is read.
  megac::PartitionOptions options;
  options.mesh = mesh;
  options.batch = batch;
  options.seq = seq;
  options.train = train;
  options.gradients = gradients;
  options.microBatches = microBatches;
  options.recompute = recompute;
  {
    // The combinations megac-opt's --megac-partition-pipeline refuses too
    // (--virtual-stages: 0 is "not given", the schedule's own count).
    megac::PartitionOptions asked = options;
    asked.virtualStages =
        virtualStages.getNumOccurrences() ? virtualStages.getValue() : 1;
    if (std::string problem = megac::partitionOptionsProblem(asked, "--");
        !problem.empty())
      return fail(problem);
  }
  if (!dumpIR.empty() && llvm::sys::fs::exists(dumpIR) &&
      !llvm::sys::fs::is_directory(dumpIR))
    return fail("--dump-ir " + dumpIR + " is a file; it takes a directory");
  // A dump writes its numbered files over whatever has their names.
  if (!dumpIR.empty())
    for (auto [path, what] : {std::pair<const std::string &, const char *>{
                                  input, "the model being compiled"},
                              {output, "the plan's file (-o)"},
                              {emitMLIR, "the IR's file (--emit-mlir)"}})
      if (std::string clash = dumpFileAt(dumpIR, path); !clash.empty())
        return fail("--dump-ir " + dumpIR + ": its file " + clash + " is " +
                    what +
                    "; the dump writes files of such names there "
                    "(00-input.mlir, NN-megac-<pass>.mlir) and removes "
                    "an earlier dump's: name another directory");
  // The optimizer's options go straight into the pipeline's (they are
  // checked here, with --train or without).
  megac::ApplyOptimizerPassOptions &optimizer = options.optimizer;
  optimizer.lr = lr;
  optimizer.minLr = minLr;
  optimizer.warmupSteps = warmup;
  optimizer.totalSteps = totalSteps;
  optimizer.weightDecay = weightDecay;
  optimizer.maxGradNorm = maxGradNorm;
  optimizer.beta1 = beta1;
  optimizer.beta2 = beta2;
  optimizer.zeroStage = zero;
  // Refused with --train or without: a value that cannot be right is a
  // slip wherever it appears.
  if (std::string problem =
          megac::optimizerOptionsProblem(optimizer, "--", "zero");
      !problem.empty())
    return fail(problem);
  if (!(bucketMB >= 0.0 && bucketMB <= 1024.0 * 1024.0))
    return fail("--bucket-mb must lie in [0, 1048576] MiB, got " +
                megac::numberText(bucketMB));
  if (precision != "fp32" && precision != "bf16")
    return fail("--precision must be fp32 or bf16, got '" +
                precision.getValue() + "'");
  if (target != "cpu" && target != "cuda")
    return fail("--target must be cpu or cuda, got '" + target.getValue() +
                "'");
  if (cudaArch.getNumOccurrences() && target != "cuda")
    return fail("--cuda-arch names the architectures of a --target cuda "
                "plan's kernels; add --target cuda");
#ifdef MEGAC_HAVE_NVRTC
  const std::vector<std::string> archs =
      cudaArch.getNumOccurrences()
          ? std::vector<std::string>(cudaArch.begin(), cudaArch.end())
          : megac::defaultCudaArchitectures();
  if (std::string bad = megac::checkCudaArchitectures(archs); !bad.empty())
    return fail(bad);
#else
  if (cudaArch.getNumOccurrences())
    return fail("--cuda-arch: this megac was built without NVRTC (the CUDA "
                "toolkit), so it compiles no kernels");
#endif
  if (pipelineSchedule != "gpipe" && pipelineSchedule != "1f1b" &&
      pipelineSchedule != "interleaved")
    return fail("--schedule must be gpipe, 1f1b or interleaved, got '" +
                pipelineSchedule.getValue() + "'");
  const std::string scheduleName = inputName(scheduleFile);
  // A schedule file is read now; whether it fits the grid is checked once
  // the grid is known.
  if (scheduleFile == "-" && input == "-")
    return fail("the model and --pipeline-schedule cannot both be read from "
                "standard input");
  megac::PipelineSchedule fileSchedule;
  if (std::string error;
      !scheduleFile.empty() &&
      !makeSchedule("", 0, 0, 0, scheduleFile, fileSchedule, error))
    return fail(error);
  // (A pp axis in --mesh needs --train, checked above; one from the
  // model's own grid is checked once the model is read.)
  // Model chunks per pipeline rank (a schedule file says its own).
  int64_t chunksPerRank = virtualStages ? virtualStages.getValue()
                          : pipelineSchedule == "interleaved" ? 2
                                                              : 1;
  // Why no schedule can be generated for \p ranks pipeline ranks ("" if
  // one can): --mesh's pp axis is checked now, the model's own grid's
  // once the model is read.
  auto generatedScheduleProblem = [&](int64_t ranks) -> std::string {
    if (chunksPerRank > 1 && pipelineSchedule != "interleaved")
      return "--virtual-stages " + std::to_string(chunksPerRank) +
             " needs --schedule interleaved";
    megac::PipelineSchedule generated;
    std::string error;
    makeSchedule(pipelineSchedule, ranks, microBatches, chunksPerRank, "",
                 generated, error);
    return error;
  };
  if (const int64_t meshPP = meshAxisSize(mesh, "pp");
      meshPP > 1 && scheduleFile.empty())
    if (std::string problem = generatedScheduleProblem(meshPP);
        !problem.empty())
      return fail(problem);
  std::optional<uint64_t> memoryBudget;
  if (!deviceMemory.empty() && !(memoryBudget = parseByteSize(deviceMemory)))
    return fail("--device-memory: cannot read '" + deviceMemory +
                "' as a size below 16777216T (e.g. 80G, 512M, "
                "1073741824)");
  if (!dumpIR.empty())
    if (std::error_code ec = llvm::sys::fs::create_directories(dumpIR))
      return fail("cannot create " + dumpIR + ": " + ec.message());
  DialectRegistry registry;
  megac::registerAllDialects(registry);
  MLIRContext ctx(registry);
  if (std::string problem = checkMeshOption(ctx, mesh); !problem.empty())
    return fail(problem);
  installOneLineDiagnostics(ctx);

  // --mlir-timing: the passes' times, nested among the driver's own stages
  // (reported when the manager goes out of scope; nothing without the flag).
  DefaultTimingManager timingManager;
  applyDefaultTimingManagerCLOptions(timingManager);
  TimingScope timing = timingManager.getRootScope();

  std::string error;
  llvm::SourceMgr sourceMgr;
  uint64_t modelHash = 0;
  TimingScope parseTiming = timing.nest("Parse the model");
  // From here a failure is the model's (or the grid's): as gcc and clang
  // remove their -o file then, no older plan stays behind for a script to
  // run in this one's place. (Option errors above leave it.)
  bool compiled = false;
  llvm::scope_exit removeStalePlan([&] {
    llvm::sys::fs::file_status status;
    if (compiled || output == "-" || llvm::sys::fs::status(output, status) ||
        !llvm::sys::fs::is_regular_file(status))
      return;
    if (!llvm::sys::fs::remove(output))
      llvm::errs() << "megac: note: removed " << output
                   << ", an earlier compile's plan\n";
  });
  OwningOpRef<ModuleOp> module = loadModel(ctx, input, sourceMgr, &modelHash);
  if (!module)
    return 1;
  parseTiming.stop();

  warnUnusedAxes(*module, mesh);
  // The grid the passes partition over: --mesh, else the module's own
  // megac.mesh. The options' checks below ask it, not --mesh alone.
  const std::string grid =
      mesh.empty() ? megac::gridText(megac::getMesh(*module)) : mesh.getValue();

  PassManager pm(&ctx);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  pm.enableVerifier(true);
  if (!dumpIR.empty()) {
    auto instrumentation = std::make_unique<DumpIRInstrumentation>(dumpIR);
    instrumentation->write("input", module->getOperation());
    pm.addInstrumentation(std::move(instrumentation));
  }
  // Options that a plan without their part would silently ignore.
  if (!train)
    for (cl::Option *option : std::initializer_list<cl::Option *>{
             &lr, &minLr, &warmup, &totalSteps, &weightDecay, &maxGradNorm,
             &zero, &beta1, &beta2})
      if (option->getNumOccurrences())
        llvm::errs() << "megac: warning: --" << option->ArgStr
                     << " has no effect without --train\n";
  if (!train && !gradients && recompute.getNumOccurrences())
    llvm::errs() << "megac: warning: --recompute has no effect without "
                    "--train or --gradients (there is no backward pass)\n";
  if (!train && !gradients && bucketMB.getNumOccurrences())
    llvm::errs() << "megac: warning: --bucket-mb has no effect without "
                    "--train or --gradients (there are no gradients)\n";
  // (Only about values that are valid: an invalid one is an error below,
  // and a warning first would only confuse.)
  if (train && zero == 1 && meshAxisSize(grid, "dp") <= 1)
    llvm::errs() << "megac: warning: --zero " << zero
                 << " has no effect without a dp axis in the grid (nothing to "
                    "shard the optimizer state over)\n";
  // (Gradients are summed over dp, and some over tp: with neither axis
  // there is no all-reduce to bucket.)
  if ((train || gradients) && bucketMB.getNumOccurrences() &&
      meshAxisSize(grid, "dp") <= 1 && meshAxisSize(grid, "tp") <= 1)
    llvm::errs() << "megac: warning: --bucket-mb has no effect without a dp "
                    "or tp axis in the grid (no gradient is all-reduced)\n";
  if (sequenceParallel && meshAxisSize(grid, "tp") <= 1)
    llvm::errs() << "megac: warning: --sequence-parallel has no effect "
                    "without a tp axis in the grid\n";
  if (meshAxisSize(grid, "pp") > 1 && scheduleFile.getNumOccurrences() &&
      (pipelineSchedule.getNumOccurrences() ||
       virtualStages.getNumOccurrences()))
    llvm::errs() << "megac: warning: --pipeline-schedule " << scheduleName
                 << " decides the schedule and its chunks; --schedule and "
                    "--virtual-stages are ignored\n";
  if (meshAxisSize(grid, "pp") <= 1)
    for (cl::Option *option : std::initializer_list<cl::Option *>{
             &pipelineSchedule, &virtualStages, &scheduleFile})
      if (option->getNumOccurrences())
        llvm::errs() << "megac: warning: --" << option->ArgStr
                     << " has no effect without a pp axis in the grid\n";
  if (train && totalSteps > 0 && warmup > totalSteps)
    llvm::errs() << "megac: warning: --warmup-steps " << warmup
                 << " exceeds --total-steps " << totalSteps
                 << ": the learning rate climbs to its peak and then drops "
                    "to --min-lr at once, with no cosine decay\n";
  options.bucketBytes = static_cast<int64_t>(bucketMB * 1024.0 * 1024.0);
  options.bf16 = precision == "bf16";
  options.sequenceParallel = sequenceParallel;
  options.fusionGroups = target == "cuda" ? megac::kAllFusionGroups.str() : "a";
  if (target == "cuda")
    noteGpuVocabulary(*module, quiet);
  // Pipeline parallelism: a pp axis splits the layers into stages.
  const int64_t pp = meshAxisSize(grid, "pp");
  megac::PipelineSchedule schedule;
  // The schedule's ranks and micro-batches are the grid's, every task runs
  // once, in an order in which every rank finishes. A file's is checked
  // before the passes, which take its chunk count from it (a stray ".1"
  // would otherwise read as a model too short for twice the stages).
  auto checkSchedule = [&]() -> bool {
    if (schedule.stages != pp || schedule.microBatches != microBatches) {
      // (A generated schedule has the grid's counts by construction.)
      fail((scheduleFile.empty() ? std::string("internal error: ")
                                 : scheduleName + ": ") +
           "the schedule has " + std::to_string(schedule.stages) +
           " ranks and " + std::to_string(schedule.microBatches) +
           " micro-batches, but the grid has pp=" + std::to_string(pp) +
           " and --micro-batches is " +
           std::to_string(microBatches.getValue()));
      return false;
    }
    megac::PipelineTiming timing;
    std::string error;
    if (!megac::simulatePipeline(schedule, 1.0, 2.0, timing, error)) {
      fail((scheduleFile.empty() ? std::string("internal error: ")
                                 : scheduleName + ": ") +
           error);
      return false;
    }
    return true;
  };
  if (pp > 1) {
    if (!train)
      return fail("a pp axis (pipeline parallelism) needs --train: the "
                  "pipeline runs training steps");
    if (!scheduleFile.empty()) {
      // The file says how many chunks each rank runs.
      schedule = fileSchedule;
      if (!checkSchedule())
        return 1;
      chunksPerRank = schedule.virtualStages;
    } else if (std::string problem = generatedScheduleProblem(pp);
               !problem.empty()) {
      return fail(problem);
    }
    options.virtualStages = chunksPerRank;
  }
  megac::buildPartitionPipeline(pm, options);
  {
    TimingScope passTiming = timing.nest("Passes");
    pm.enableTiming(passTiming);
    if (failed(pm.run(*module)))
      return 1;
  }
  if (reportOversizedTensor(*module))
    return 1;
  megac::PlanEmitOptions emitOptions{seed, modelHash, kProducer};
  emitOptions.target = target;
#ifdef MEGAC_HAVE_NVRTC
  megac::KernelCacheStats kernelStats;
  if (!quiet)
    kernelStats.beforeFirstCompile = [&archs] {
      llvm::errs() << "megac: compiling generated CUDA kernels with NVRTC "
                   << megac::cudaArchitecturesText(archs)
                   << (megac::kernelCacheDir().empty()
                           ? " (seconds)...\n"
                           : " (seconds; the kernel cache keeps them for "
                             "later compiles)...\n");
    };
  emitOptions.compileKernel = [&](const std::string &name,
                                  const std::string &source,
                                  megac::PlanEmitOptions::Binaries &binaries) {
    return megac::compileWithNvrtc(name, source, archs, binaries, &kernelStats);
  };
#endif
  if ((*module)->hasAttr(megac::MegacDialect::kPipelineStagesAttrName)) {
    std::string error;
    if (scheduleFile.empty()) {
      if (!makeSchedule(pipelineSchedule, pp, microBatches, chunksPerRank, "",
                        schedule, error))
        return fail(error);
      emitOptions.scheduleName = pipelineSchedule;
      if (!checkSchedule())
        return 1;
    } else {
      emitOptions.scheduleName = "file " + scheduleName; // checked above
    }
    emitOptions.schedule = schedule;
  } else if (pp > 1) {
    return fail("internal error: the pp axis was not split into stages");
  }

  if (!emitMLIR.empty()) {
    auto out = openOutputFile(emitMLIR, &error);
    if (!out)
      return fail(error);
    module->print(out->os());
    if (!keepOutput(*out, emitMLIR))
      return 1;
  }
  TimingScope emitTiming =
      timing.nest(target == "cuda" ? "Emit the plan (and compile its kernels)"
                                   : "Emit the plan");
  FailureOr<std::vector<uint8_t>> plan = megac::emitPlan(*module, emitOptions);
  if (failed(plan))
    return 1;
  emitTiming.stop();
  TimingScope checkTiming = timing.nest("Check the plan");
  // The schedule, as the plan's instruction streams realize it: every
  // transfer received, in an order that lets every rank finish.
  {
    const auto *root = megac::plan::GetPlan(plan->data());
    std::string deadlock =
        megac_rt::checkPipelineTransfers(*root->body_nested_root());
    if (!deadlock.empty())
      return fail((scheduleFile.empty() ? std::string("internal error: ")
                                        : scheduleName + ": ") +
                  deadlock);
  }
  // Check the plan as the runtime will before writing it: a plan that the
  // runtime would refuse is a compiler bug, never a file on disk.
  megac_rt::LoadedPlan loaded;
  std::string message = megac_rt::verifyPlanBytes(*plan, loaded);
  if (!message.empty())
    return fail("internal error: the emitted plan does not verify: " + message);
  checkTiming.stop();
  if (memoryReport || memoryBudget) {
    if (failed(checkMemory(*loaded.program, memoryBudget, memoryReport,
                           train || gradients)))
      return 1;
  }
  TimingScope writeTiming = timing.nest("Write the plan");
  auto out = openOutputFile(output, &error);
  if (!out)
    return fail(error);
  out->os().write(reinterpret_cast<const char *>(plan->data()), plan->size());
  if (!keepOutput(*out, output))
    return 1;
  writeTiming.stop();

  if (!quiet) {
    // Summarize from the plan itself, as the runtime sees it.
    const auto *program = loaded.program;
    const auto *rank0 = program->ranks()->Get(0);
    unsigned collectives = 0;
    for (const auto *instr : *rank0->instrs())
      collectives += instr->axis() >= 0;
    std::string grid;
    for (const auto *axis : *program->axes())
      grid += (grid.empty() ? "" : ",") + axis->name()->str() + "=" +
              std::to_string(axis->size());
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - start)
                    .count();
    // The plan's batch is one rank's micro-batch; the user gave the
    // global batch.
    const int64_t micro = std::max<int64_t>(1, program->micro_batches());
    const int64_t perRank = int64_t(program->batch()) * micro;
    const int64_t global =
        program->global_batch() > 0 ? program->global_batch() : perRank;
    std::string batchText = std::to_string(global);
    llvm::SmallVector<std::string> split;
    if (perRank != global)
      split.push_back(std::to_string(perRank) + " a data-parallel rank");
    if (micro > 1)
      split.push_back(std::to_string(micro) + " micro-batches of " +
                      std::to_string(program->batch()));
    if (!split.empty())
      batchText += " (" + llvm::join(split, ", ") + ")";
    size_t fewest = rank0->instrs()->size(), most = fewest;
    for (const auto *rank : *program->ranks()) {
      fewest = std::min<size_t>(fewest, rank->instrs()->size());
      most = std::max<size_t>(most, rank->instrs()->size());
    }
    std::string instrText =
        fewest == most ? std::to_string(most)
                       : std::to_string(fewest) + " to " + std::to_string(most);
    llvm::errs() << llvm::formatv(
        "megac: compiled {0} for grid {1} ({2} rank{10}), batch {3} x seq {4}: "
        "{5} instructions per rank ({6} collectives), plan {7} KiB "
        "-> {8} [{9:F1} ms]\n",
        input, grid.empty() ? "single" : grid, program->world_size(), batchText,
        program->seq(), instrText, collectives, (plan->size() + 1023) / 1024,
        output, ms, program->world_size() == 1 ? "" : "s");
#ifdef MEGAC_HAVE_NVRTC
    if (const unsigned cubins = kernelStats.hits + kernelStats.compiled) {
      const std::string cache = megac::kernelCacheDir();
      llvm::errs() << llvm::formatv(
          "megac: {0} kernel binaries: {1} compiled with NVRTC, {2} from the "
          "kernel cache{3}\n",
          cubins, kernelStats.compiled.load(), kernelStats.hits.load(),
          cache.empty()
              ? std::string(" (none: MEGAC_KERNEL_CACHE=off, or no HOME)")
          : kernelStats.notStored
              ? " (" + cache + ", which could not store " +
                    std::to_string(kernelStats.notStored.load()) +
                    " of them: not a writable directory?)"
              : " (" + cache + ")");
    }
#endif
  }
  compiled = true;
  return 0;
}

} // namespace megac::driver
