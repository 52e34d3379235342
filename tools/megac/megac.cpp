//===- megac.cpp - The megac compiler driver ------------------------------===//
//
//   megac compile MODEL.mlir -o MODEL.mgc [--mesh tp=4] [--batch B] [--seq S]
//   megac import --hf-config config.json -o MODEL.mlir   (or --tiny)
//   megac inspect MODEL.mgc [--json] [--rank N] [--trace FILE]
//   megac schedule --stages P --micro-batches M [--schedule 1f1b] [--check F]
//
// Each subcommand constructs only its own command-line options (function-
// local statics), so `megac inspect --mesh` is an error rather than being
// silently ignored, while MLIR's own flags (--mlir-print-ir-after-all,
// --mlir-timing, ...) are available to `compile`.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Frontend/GPT2Importer.h"
#include "megac/InitAll.h"
#include "megac/Pipeline/Partition.h"
#include "megac/Pipeline/Schedule.h"
#include "megac/Target/Plan/PlanEmitter.h"
#ifdef MEGAC_HAVE_NVRTC
#include "NvrtcCompiler.h"
#endif
#include "megac_rt/memory_plan.h"
#include "megac_rt/plan_file.h"
#include "megac_rt/trace.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/xxhash.h"
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

using namespace mlir;
namespace cl = llvm::cl;

namespace {

int fail(const llvm::Twine &message) {
  llvm::errs() << "megac: error: " << message << "\n";
  return 1;
}

/// What messages (and plans, of a schedule) call an input: "-" is
/// standard input.
std::string inputName(StringRef path) {
  return path == "-" ? "<stdin>" : path.str();
}

/// "<name>: more than N MiB (B bytes): not <expected>".
std::string tooLargeInput(StringRef name, uint64_t limit, uint64_t bytes,
                          StringRef expected) {
  return name.str() + ": more than " + std::to_string(limit >> 20) + " MiB (" +
         std::to_string(bytes) + " bytes): not " + expected.str();
}

/// Reads descriptor \p fd (a pipe) to its end, in pieces, so that an
/// endless one stops at \p limit bytes; \p name and \p expected for the
/// message.
std::unique_ptr<llvm::MemoryBuffer> readBounded(int fd, StringRef name,
                                                uint64_t limit,
                                                StringRef expected,
                                                std::string &error) {
  std::string text;
  char piece[1 << 16];
  for (ssize_t n; (n = ::read(fd, piece, sizeof(piece))) != 0;) {
    if (n < 0) {
      if (errno == EINTR)
        continue;
      error = name.str() + ": " + std::strerror(errno);
      return nullptr;
    }
    text.append(piece, size_t(n));
    if (text.size() > limit) {
      error = tooLargeInput(name, limit, text.size(), expected);
      return nullptr;
    }
  }
  return llvm::MemoryBuffer::getMemBufferCopy(text, name);
}

/// Reads the input \p path ("-": standard input) whole, where it can be
/// \p expected ("a HuggingFace config.json"): a regular file or a pipe
/// (standard input, <(...), a mkfifo) of at most \p limit bytes. Anything
/// else is refused before it is read, with the reason in \p error: a
/// directory; a device such as /dev/zero, which would be read until
/// memory ran out; or a file too large to be one.
std::unique_ptr<llvm::MemoryBuffer> readInput(StringRef path, uint64_t limit,
                                              StringRef expected,
                                              std::string &error) {
  const std::string name = inputName(path);
  auto notAFile = [&](StringRef what) {
    error = name + ": not a regular file (" + what.str() + "; " +
            expected.str() + " is expected)";
    return nullptr;
  };
  if (path == "-") {
    // A device other than a terminal (< /dev/zero) is refused as a named
    // one is.
    struct stat in;
    if (::fstat(STDIN_FILENO, &in) == 0 && S_ISCHR(in.st_mode) &&
        !::isatty(STDIN_FILENO))
      return notAFile("a device");
    return readBounded(STDIN_FILENO, name, limit, expected, error);
  }
  llvm::sys::fs::file_status status;
  if (std::error_code ec = llvm::sys::fs::status(path, status)) {
    error = "cannot open input file '" + name + "': " + ec.message();
    return nullptr;
  }
  const auto type = status.type();
  if (type == llvm::sys::fs::file_type::fifo_file) {
    // A pipe by name: read as standard input is, to its end or the limit.
    const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error = "cannot open input file '" + name + "': " + std::strerror(errno);
      return nullptr;
    }
    auto buffer = readBounded(fd, name, limit, expected, error);
    ::close(fd);
    return buffer;
  }
  if (type == llvm::sys::fs::file_type::directory_file)
    return notAFile("a directory");
  if (type != llvm::sys::fs::file_type::regular_file)
    return notAFile("a device");
  if (status.getSize() > limit) {
    error = tooLargeInput(name, limit, status.getSize(), expected);
    return nullptr;
  }
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                            /*RequiresNullTerminator=*/true);
  if (!buffer) {
    error =
        "cannot open input file '" + name + "': " + buffer.getError().message();
    return nullptr;
  }
  return std::move(*buffer);
}

/// The largest model file read: 1 GiB (import's deepest model, 10000
/// layers, is far smaller).
constexpr uint64_t kMaxModelBytes = uint64_t(1) << 30;

/// Refuses the ops that passes write for a training step: in a model
/// they met no pass that expects them (an update without a training
/// config, a parameter written in place while still read, sums over
/// micro-batches the step does not take) and ended in an internal error
/// of the emitted plan. A model is the computation; `--train` and
/// `--micro-batches` ask for these. So are IR dumps past the model: ops
/// placed on pipeline stages, per-rank IR.
LogicalResult refuseCompilerOps(ModuleOp module) {
  // (Per-rank IR, an --emit-mlir file or a late dump, is past every pass
  // that reads a model.)
  if (module->hasAttr(megac::MegacDialect::kLocalizedAttrName))
    return module.emitError()
           << "this is per-rank IR (megac-localize-shapes ran: --emit-mlir "
              "or a late --dump-ir file), not a model: compile the model it "
              "came from";
  WalkResult walk = module.walk([](Operation *op) {
    if (op->hasAttr(megac::MegacDialect::kStageAttrName)) {
      op->emitError() << op->getName()
                      << " carries megac.stage, which megac-assign-stages "
                         "sets (megac compile --train on a pp grid), not "
                         "models: an IR dump of a training step is not a "
                         "model; compile the model it came from";
      return WalkResult::interrupt();
    }
    const char *from = nullptr;
    if (isa<megac::AdamWOp, megac::AssignOp>(op))
      from = "megac-apply-optimizer (megac compile --train)";
    else if (isa<megac::AccumulateOp, megac::StackMicroBatchesOp>(op))
      from = "megac-accumulate-micro-batches (megac compile "
             "--micro-batches)";
    if (!from)
      return WalkResult::advance();
    op->emitError() << op->getName() << " is inserted by " << from
                    << ", not written in models: compile the model without "
                       "it (an IR dump of a training step is not a model)";
    return WalkResult::interrupt();
  });
  return failure(walk.wasInterrupted());
}

/// Parses the model file at \p path (reporting errors) into a module whose
/// buffer \p sourceMgr keeps; \p hash, if given, receives its content hash.
OwningOpRef<ModuleOp> loadModel(MLIRContext &ctx, llvm::StringRef path,
                                llvm::SourceMgr &sourceMgr,
                                uint64_t *hash = nullptr) {
  std::string error;
  auto file = readInput(path, kMaxModelBytes,
                        "a model in the megac dialect (.mlir)", error);
  if (!file) {
    fail(error);
    return nullptr;
  }
  // A plan given where a model belongs would otherwise meet the MLIR
  // parser's "unexpected character".
  if (megac_rt::hasPlanIdentifier(file->getBufferStart(),
                                  file->getBufferSize())) {
    fail(path + " is a megac plan, not a model: this command takes a model "
                "in the megac dialect (.mlir); `megac inspect` prints a plan");
    return nullptr;
  }
  // So would a HuggingFace config, the usual start, given one step early.
  if (file->getBuffer().ltrim().starts_with("{")) {
    fail(path +
         " looks like JSON (a HuggingFace config.json?), not a "
         "model: `megac import --hf-config " +
         path + " -o model.mlir` makes the model this command takes");
    return nullptr;
  }
  if (hash)
    *hash = llvm::xxh3_64bits(file->getBuffer());
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &ctx);
  // A model returns what it computes: without a result, every op is dead
  // and the plan would run nothing (batch 0 x seq 0, 0 instructions).
  if (module)
    for (auto func : module->getOps<func::FuncOp>())
      if (!func.isExternal() && func.getNumResults() == 0) {
        func.emitError() << "@" << func.getSymName()
                         << " returns nothing: a model returns what it "
                            "computes (its loss, its logits)";
        return nullptr;
      }
  if (module && failed(refuseCompilerOps(*module)))
    return nullptr;
  return module;
}

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

/// Reports, at its op in the model, the first tensor of the compiled
/// (per-rank) \p module with more elements than a plan's buffer may hold;
/// false when there is none. The runtime would refuse such a plan, and the
/// user's sizes are the cause.
bool reportOversizedTensor(ModuleOp module) {
  bool found = false;
  auto check = [&](Value value, Operation *owner) {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (found || !type || !type.hasStaticShape())
      return;
    int64_t elements = 1;
    bool overflow = false;
    for (int64_t size : type.getShape())
      overflow |= llvm::MulOverflow(elements, size, elements);
    if (!overflow && elements <= megac_rt::kMaxBufferElements)
      return;
    std::string shape;
    llvm::raw_string_ostream os(shape);
    llvm::interleave(type.getShape(), os, ", ");
    owner->emitError() << "a rank's tensor of shape [" << shape << "] ("
                       << owner->getName().getStringRef()
                       << ") has more elements than a plan's buffer may hold "
                          "(2^40): a smaller --batch or --seq, or a larger "
                          "grid, is needed";
    found = true;
  };
  module.walk([&](Operation *op) {
    for (Region &region : op->getRegions())
      for (Block &block : region)
        for (BlockArgument arg : block.getArguments())
          check(arg, op);
    for (Value result : op->getResults())
      check(result, op);
  });
  return found;
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
  const uint64_t largest = std::max(
      {worst.optimizerBytes, worst.peakGradientBytes, activations});
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
  fail(llvm::formatv("rank {0} needs {1} (parameters {2}, optimizer state "
                     "{3}, arena {4} with activations {5} at its peak) but "
                     "--device-memory is {6}; {7}",
                     worstRank, formatBytes(worst.totalBytes()),
                     formatBytes(worst.parameterBytes),
                     formatBytes(worst.optimizerBytes),
                     formatBytes(worst.arenaBytes),
                     formatBytes(worst.peakActivationBytes),
                     formatBytes(*budget), hint)
           .str());
  return mlir::failure();
}

/// Prints each diagnostic as one line: `file:line:col: error: message`.
/// \p message without the verifiers' rule labels ("position_embedding_c2: "),
/// which name docs/dialect.md's rules for megac-opt's users and the tests
/// but only puzzle someone compiling a model.
std::string withoutRuleLabels(llvm::StringRef message) {
  static const llvm::Regex label("(^|[ '])[a-z][a-z0-9_]*_c[0-9]+: ");
  std::string text = message.str();
  SmallVector<StringRef> match;
  while (label.match(text, &match)) {
    size_t at = match[0].data() - text.data() + match[1].size();
    text.erase(at, match[0].size() - match[1].size());
  }
  return text;
}

void installOneLineDiagnostics(MLIRContext &ctx) {
  // A pass failure would otherwise attach the whole failing op as a note.
  ctx.printOpOnDiagnostic(false);
  ctx.printStackTraceOnDiagnostic(false);
  ctx.getDiagEngine().registerHandler([](Diagnostic &diag) {
    auto print = [](Location loc, DiagnosticSeverity severity,
                    const llvm::Twine &message) {
      std::string where;
      if (auto fileLoc = dyn_cast<FileLineColLoc>(loc))
        where = llvm::formatv("{0}:{1}:{2}: ", fileLoc.getFilename().getValue(),
                              fileLoc.getLine(), fileLoc.getColumn());
      else if (auto nameLoc = dyn_cast<NameLoc>(loc))
        where = nameLoc.getName().getValue().str() + ": ";
      const char *kind = severity == DiagnosticSeverity::Error     ? "error"
                         : severity == DiagnosticSeverity::Warning ? "warning"
                         : severity == DiagnosticSeverity::Note    ? "note"
                                                                   : "remark";
      llvm::errs() << where << kind << ": " << message << "\n";
    };
    // Notes are dropped: every error is one line, and the messages megac
    // writes carry what they need.
    print(diag.getLocation(), diag.getSeverity(),
          withoutRuleLabels(diag.str()));
    return success();
  });
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
    llvm::sys::path::append(path, llvm::formatv("{0:2}-{1}.mlir", index++, stage)
                                      .str());
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

/// The producer named in every plan and by --version.
constexpr const char *kProducer = megac_rt::kMegacRelease;

/// Keeps --help to the subcommand's own options and MLIR's (--mlir-*):
/// the LLVM libraries megac links register hundreds of code-generation
/// flags (--x86-..., --amdgpu-...) that mean nothing here. Hidden options
/// still parse, and --help-hidden lists them.
///
/// MLIR's own options go to a category of their own, which --help lists
/// after the subcommand's (categories print in the order of their names),
/// so that a user reads megac's options first.
void hideForeignOptions() {
  static cl::OptionCategory mlirCategory(
      "megac: MLIR's options (IR printing, pass timing and statistics, "
      "crash reproducers)");
  for (auto &entry : cl::getRegisteredOptions()) {
    cl::Option *option = entry.second;
    StringRef name = option->ArgStr;
    bool ours = false;
    for (cl::OptionCategory *cat : option->Categories)
      ours |= cat->getName().starts_with("megac ");
    if (name.starts_with("mlir-"))
      option->addCategory(mlirCategory);
    else if (!ours && name != "help" && name != "version")
      // Really hidden: LLVM's own options (--mgpopt) are no help, not even
      // as the "Did you mean" of a mistyped megac option.
      option->setHiddenFlag(cl::ReallyHidden);
  }
}

/// Whether some single-value option was given more than once. LLVM's
/// parser would keep the last value silently, and `--mesh tp=2 --mesh dp=2`
/// reads as if the two combined; megac-run refuses repeats too.
bool reportRepeatedOptions() {
  bool repeated = false;
  for (auto &entry : cl::getRegisteredOptions()) {
    cl::Option *option = entry.second;
    // Lists take every occurrence by design, and a repeated flag changes
    // nothing; an option is registered under each of its names but
    // reported once.
    if (option->getNumOccurrences() > 1 &&
        option->getNumOccurrencesFlag() == cl::Optional &&
        option->getValueExpectedFlag() == cl::ValueRequired &&
        entry.first == option->ArgStr) {
      // (Spelt as given: -o is one letter, the rest long options.)
      fail((option->ArgStr.size() == 1 ? "-" : "--") + option->ArgStr +
           " given " + llvm::Twine(option->getNumOccurrences()) +
           " times; give it once");
      repeated = true;
    }
  }
  return repeated;
}

/// Standard error, sent to a temporary file from construction until
/// release(), which returns what was written and restores it. (Where no
/// temporary can be made, nothing is captured.)
class CapturedStderr {
public:
  CapturedStderr() {
    llvm::errs().flush();
    std::fflush(stderr);
    if ((file = std::tmpfile()) && (saved = ::dup(STDERR_FILENO)) >= 0)
      ::dup2(::fileno(file), STDERR_FILENO);
  }
  CapturedStderr(const CapturedStderr &) = delete;
  CapturedStderr &operator=(const CapturedStderr &) = delete;
  ~CapturedStderr() { release(); }
  std::string release() {
    std::string text;
    llvm::errs().flush();
    std::fflush(stderr);
    if (saved >= 0) {
      ::dup2(saved, STDERR_FILENO);
      ::close(saved);
      saved = -1;
      std::rewind(file);
      char buffer[4096];
      for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;)
        text.append(buffer, n);
    }
    if (file)
      std::fclose(file);
    file = nullptr;
    return text;
  }

private:
  std::FILE *file = nullptr;
  int saved = -1;
};

/// Prints LLVM's option-parser \p errors as megac's own diagnostics: each
/// "<program>: <problem>" line as "megac: error: <problem>" (as every other
/// refusal reads, and as tools that scan for "error:" expect), a bad
/// value's "for the --seed option: '-1' value invalid for ulong argument!"
/// as "--seed: expected a whole number from 0 to 18446744073709551615, got
/// '-1'", and the
/// hints (a "Did you mean", the line after a positional-argument error) as
/// notes.
void reportOptionErrors(StringRef errors, StringRef programName) {
  static const llvm::Regex badValue(
      "^for the (-?-[A-Za-z0-9-]+) option: '(.*)' value invalid for "
      "([a-z ]+) argument!$");
  llvm::SmallVector<StringRef> lines;
  errors.split(lines, '\n', -1, /*KeepEmpty=*/false);
  // (LLVM names the program by its file name, "megac compile", also when
  // megac was run by a path.)
  const std::string prefix =
      (llvm::sys::path::filename(programName) + ": ").str();
  for (StringRef line : lines) {
    const bool own = line.consume_front(prefix);
    line = line.trim();
    std::string text = line.str();
    llvm::SmallVector<StringRef> match;
    if (own && badValue.match(line, &match)) {
      // (LLVM's parsers name the C type: integer, uint, long, ulong,
      // llong, ullong.)
      StringRef kind = match[3];
      const char *expected =
          kind == "floating point" ? "a number"
          : kind == "integer" ? "a whole number from -2147483648 to 2147483647"
          : kind == "uint"    ? "a whole number from 0 to 4294967295"
          : kind == "ulong" || kind == "ullong"
              ? "a whole number from 0 to 18446744073709551615"
              : "a whole number from -9223372036854775808 to "
                "9223372036854775807";
      text = (match[1] + ": expected " + expected + ", got '" + match[2] + "'")
                 .str();
    }
    const bool hint = !own || line.starts_with("Did you mean");
    llvm::errs() << (hint ? "megac: note: " : "megac: error: ") << text << "\n";
  }
}

/// Parses the options of subcommand argv[1], with argv[0] shown as
/// "megac compile" so --help reads naturally. False (reported) when the
/// command line must be refused.
[[nodiscard]] bool parseSubcommand(int argc, char **argv, StringRef overview) {
  hideForeignOptions();
  std::string programName = std::string(argv[0]) + " " + argv[1];
  llvm::SmallVector<char *> args = {programName.data()};
  for (int i = 2; i < argc; ++i)
    args.push_back(argv[i]);
  // "--lr=" would read as 0 (LLVM's parser takes the empty value), and
  // silently turn off what the option sets.
  for (char *arg : llvm::ArrayRef(args).drop_front()) {
    StringRef text(arg);
    if (text == "--")
      break;
    if (!text.starts_with("-") || !text.ends_with("="))
      continue;
    StringRef name = text.ltrim('-').drop_back();
    auto &options = cl::getRegisteredOptions();
    auto found = options.find(name);
    if (found != options.end() &&
        found->second->getValueExpectedFlag() != cl::ValueDisallowed) {
      fail(text + " gives no value: write " + text +
           "VALUE or leave the "
           "option out");
      return false;
    }
  }
  std::string errors;
  bool parsed;
  {
    llvm::raw_string_ostream errorStream(errors);
    // (LLVM reports a bad option value, "--seed -1", on llvm::errs()
    // whatever stream it is given: that is captured as well.)
    CapturedStderr valueErrors;
    parsed = cl::ParseCommandLineOptions(args.size(), args.data(), overview,
                                         &errorStream);
    errors += valueErrors.release();
  }
  if (!parsed) {
    reportOptionErrors(errors, programName);
    return false;
  }
  return !reportRepeatedOptions();
}

/// A pipeline schedule: read from \p file if given, else generated
/// (\p kind: gpipe, 1f1b or interleaved). Fails with a message.
bool makeSchedule(StringRef kind, int64_t stages, int64_t microBatches,
                  int64_t virtualStages, StringRef file,
                  megac::PipelineSchedule &schedule, std::string &error) {
  if (!file.empty()) {
    // "-": standard input, as `megac schedule --print | megac schedule
    // --check -` pipes it.
    const std::string name = inputName(file);
    // (The largest schedule megac makes, ten million tasks, is about
    // 80 MB of text.)
    auto buffer =
        readInput(file, uint64_t(256) << 20,
                  "a pipeline schedule, a line of tasks per rank", error);
    if (!buffer)
      return false;
    if (!megac::parsePipelineSchedule(buffer->getBuffer(), schedule, error)) {
      error = name + ": " + error;
      return false;
    }
    return true;
  }
  megac::PipelineKind k;
  if (kind == "gpipe")
    k = megac::PipelineKind::GPipe;
  else if (kind == "1f1b")
    k = megac::PipelineKind::OneFOneB;
  else if (kind == "interleaved")
    k = megac::PipelineKind::Interleaved;
  else {
    error = "--schedule must be gpipe, 1f1b or interleaved, got '" +
            kind.str() + "'";
    return false;
  }
  schedule = megac::buildPipelineSchedule(k, stages, microBatches,
                                          virtualStages, error);
  return error.empty();
}

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

/// Keeps \p out (written to \p path) if every byte reached it; else says
/// why, in one line, and leaves no file (a full disk is no LLVM ERROR).
bool keepOutput(llvm::ToolOutputFile &out, llvm::StringRef path) {
  out.os().flush();
  if (std::error_code ec = out.os().error()) {
    out.os().clear_error();
    fail("cannot write " +
         (path == "-" ? std::string("standard output") : path.str()) + ": " +
         ec.message());
    return false;
  }
  out.keep();
  return true;
}

/// Whether paths \p a and \p b name one file: the same file where both
/// exist (links, hard links, "./x"), else the same absolute path. "-" is
/// no file (standard input or output: `compile - -o -` is a filter).
bool sameFileOrPath(llvm::StringRef a, llvm::StringRef b) {
  if (a == "-" || b == "-")
    return false;
  bool same = false;
  if (!llvm::sys::fs::equivalent(a, b, same))
    return same;
  llvm::SmallString<256> absA(a), absB(b);
  (void)llvm::sys::fs::make_absolute(absA);
  (void)llvm::sys::fs::make_absolute(absB);
  llvm::sys::path::remove_dots(absA, /*remove_dot_dot=*/true);
  llvm::sys::path::remove_dots(absB, /*remove_dot_dot=*/true);
  return absA == absB;
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

//===----------------------------------------------------------------------===//
// megac compile
//===----------------------------------------------------------------------===//

int runCompile(int argc, char **argv) {
  static cl::OptionCategory category("megac compile options");
  static cl::opt<std::string> input(cl::Positional, cl::Required,
                                    cl::desc("<model.mlir>"), cl::cat(category));
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
      "batch", cl::desc("Batch size (default: the model's, or 4)"),
      cl::init(0), cl::cat(category));
  static cl::opt<int64_t> seq(
      "seq", cl::desc("Sequence length (default: the model's, or 64, or "
                      "the position table's length if shorter)"),
      cl::init(0), cl::cat(category));
  static cl::opt<uint64_t> seed(
      "seed",
      cl::desc("Seed for parameter init and the default input batch "
               "(default 1234)"),
      cl::init(1234), cl::cat(category));
  static cl::opt<std::string> dumpIR(
      "dump-ir", cl::desc("Write the IR after every pass to numbered files "
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
      "min-lr", cl::desc("Learning rate at the end of the cosine decay (default "
                             "6e-5)"),
      cl::init(6e-5), cl::cat(trainCategory));
  static cl::opt<int64_t> warmup("warmup-steps",
                                 cl::desc("Linear warm-up steps (default 10)"),
                                 cl::init(10), cl::cat(trainCategory));
  static cl::opt<int64_t> totalSteps(
      "total-steps", cl::desc("Step at which the cosine decay ends (default 1000)"),
      cl::init(1000), cl::cat(trainCategory));
  static cl::opt<double> weightDecay(
      "weight-decay", cl::desc("AdamW weight decay, matrices only (default 0.1)"),
      cl::init(0.1), cl::cat(trainCategory));
  static cl::opt<double> maxGradNorm(
      "max-grad-norm", cl::desc("Global gradient-norm clipping (0: off; default 1)"),
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
  static cl::opt<double> beta1("beta1", cl::desc("AdamW beta1 (default 0.9)"), cl::init(0.9),
                               cl::cat(trainCategory));
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
  std::string grid = mesh;
  if (grid.empty())
    if (megac::MeshAttr own = megac::getMesh(*module))
      for (auto [axis, size] : llvm::zip(own.getAxes(), own.getSizes()))
        grid +=
            (grid.empty() ? "" : ",") + axis.str() + "=" + std::to_string(size);

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
    for (cl::Option *option :
         std::initializer_list<cl::Option *>{&lr, &minLr, &warmup, &totalSteps,
                                             &weightDecay, &maxGradNorm, &zero,
                                             &beta1, &beta2})
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
        input, grid.empty() ? "single" : grid, program->world_size(),
        batchText, program->seq(), instrText, collectives,
        (plan->size() + 1023) / 1024, output, ms,
        program->world_size() == 1 ? "" : "s");
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

//===----------------------------------------------------------------------===//
// megac import
//===----------------------------------------------------------------------===//

int runImport(int argc, char **argv) {
  static cl::OptionCategory category("megac import options");
  static cl::opt<std::string> config(
      "hf-config", cl::desc("HuggingFace GPT-2 config.json to import"),
      cl::value_desc("file"), cl::cat(category));
  static cl::opt<bool> tiny(
      "tiny", cl::desc("Import the built-in tiny GPT-2 (4 layers, hidden 128, "
                       "4 heads, vocabulary 512, 128 positions)"),
      cl::cat(category));
  static cl::opt<bool> noTP(
      "no-tensor-parallel",
      cl::desc("Leave weights unannotated (everything replicated)"),
      cl::cat(category));
  static cl::opt<double> dropout(
      "dropout",
      cl::desc("Dropout rate after the embeddings, on the residual "
               "branches and on the attention probabilities (overrides "
               "embd_pdrop, resid_pdrop and attn_pdrop; training only)"),
      cl::init(-1.0), cl::cat(category));
  static cl::opt<int64_t> padVocab(
      "pad-vocab-to",
      cl::desc("Pad the vocabulary to a multiple of N (as Megatron's "
               "--make-vocab-size-divisible-by), so that tensor parallelism "
               "can split it: e.g. 128 turns GPT-2's 50257 into 50304. The "
               "padding rows are zero when HF weights are loaded, and the "
               "loss counts only the real vocabulary (default 1: none)"),
      cl::init(1), cl::value_desc("N"), cl::cat(category));
  static cl::opt<std::string> output("o", cl::desc("Output file (default: -)"),
                                     cl::value_desc("file"), cl::init("-"),
                                     cl::cat(category));
  if (!parseSubcommand(
          argc, argv,
          "megac import: generate a megac model from a HuggingFace config.\n\n"
          "  megac import --hf-config config.json -o model.mlir\n"))
    return 1;
  if (config.empty() == !tiny)
    return fail("give exactly one of --hf-config FILE or --tiny");
  if (!config.empty() && sameFileOrPath(config, output))
    return fail("-o " + output +
                " is the config being imported; the model would overwrite "
                "it");

  megac::GPT2Config parsed = megac::getTinyGPT2Config();
  if (!config.empty()) {
    // A config is a few KiB: anything else (a device such as /dev/zero,
    // which would be read forever, or a checkpoint named by mistake) is
    // refused before it is read.
    std::string error;
    auto buffer =
        readInput(config, uint64_t(16) << 20,
                  "a HuggingFace config.json, a few KiB of JSON", error);
    if (!buffer)
      return fail(error);
    auto result = megac::parseGPT2Config(buffer->getBuffer());
    if (!result)
      return fail(config + ": " + llvm::toString(result.takeError()));
    parsed = *result;
  }
  parsed.tensorParallel = !noTP;
  if (padVocab < 1)
    return fail("--pad-vocab-to must be positive, got " +
                std::to_string(padVocab.getValue()));
  parsed.padVocabTo = padVocab;
  // The padded tables must fit a plan's buffer as the config's do
  // (parseGPT2Config's 2^40 elements); a multiple past that would also
  // overflow the rounding.
  constexpr int64_t kMaxElements = int64_t(1) << 40;
  int64_t tableElements = 0;
  if (padVocab > kMaxElements ||
      llvm::MulOverflow(megac::paddedVocab(parsed), parsed.hidden,
                        tableElements) ||
      tableElements > kMaxElements)
    return fail("--pad-vocab-to " + std::to_string(padVocab.getValue()) +
                " makes the embedding table exceed 2^40 elements (vocabulary " +
                std::to_string(parsed.vocabSize) + " padded, x n_embd " +
                std::to_string(parsed.hidden) + ")");
  if (dropout.getNumOccurrences()) {
    if (!(dropout >= 0.0 && dropout < 1.0))
      return fail("--dropout must lie in [0, 1)");
    parsed.embeddingDropout = parsed.residualDropout =
        parsed.attentionDropout = dropout;
  }
  DialectRegistry registry;
  megac::registerAllDialects(registry);
  MLIRContext ctx(registry);
  OwningOpRef<ModuleOp> module = megac::buildGPT2Module(&ctx, parsed);
  if (failed(verify(*module)))
    return fail("internal error: the generated model does not verify");
  std::string error;
  auto out = openOutputFile(output, &error);
  if (!out)
    return fail(error);
  // (The name is the config's text: a line break in it would end the
  // comment and leave the rest of the name to be parsed as IR.)
  std::string commentName = parsed.name;
  for (char &c : commentName)
    if (megac::isControlChar(c))
      c = ' ';
  out->os() << "// " << commentName << ": " << parsed.numLayers
            << " layers, hidden " << parsed.hidden << ", " << parsed.numHeads
            << " heads, MLP width " << megac::mlpWidth(parsed)
            << ", vocabulary " << parsed.vocabSize
            << (megac::paddedVocab(parsed) != parsed.vocabSize
                    ? " (padded to " +
                          std::to_string(megac::paddedVocab(parsed)) + ")"
                    : std::string())
            << ", " << parsed.maxPositions
            << " positions. Generated by megac import.\n";
  module->print(out->os());
  return keepOutput(*out, output) ? 0 : 1;
}

//===----------------------------------------------------------------------===//
// megac inspect
//===----------------------------------------------------------------------===//

int runInspect(int argc, char **argv) {
  static cl::OptionCategory category("megac inspect options");
  static cl::opt<std::string> input(cl::Positional, cl::Required,
                                    cl::desc("<model.mgc>"), cl::cat(category));
  static cl::opt<bool> json("json", cl::desc("Print JSON instead of text"),
                            cl::cat(category));
  static cl::opt<int> rank("rank", cl::desc("Print only this rank"),
                           cl::init(-1), cl::cat(category));
  static cl::opt<std::string> trace(
      "trace",
      cl::desc("Write the schedule every rank is expected to follow (a cost "
               "model: 20 GFLOP/s, 5 GB/s memory, 2 GB/s links per rank; "
               "collectives wait for their whole group) as Chrome "
               "trace-event JSON, for Perfetto, instead of printing"),
      cl::value_desc("file.json"), cl::cat(category));
  if (!parseSubcommand(argc, argv,
                       "megac inspect: print a plan (verified first) as text "
                       "or JSON, or write "
                       "its expected schedule as a trace.\n"))
    return 1;
  if (!trace.empty() && (json || rank.getNumOccurrences()))
    return fail("--trace writes every rank's schedule as trace JSON; "
                "--json and --rank choose what is printed instead");
  if (!trace.empty() && sameFileOrPath(input, trace))
    return fail("--trace " + trace +
                " is the plan being inspected; the trace would overwrite it");
  megac_rt::LoadedPlan plan;
  std::string message = megac_rt::loadPlanFile(input, plan);
  if (!message.empty())
    return fail(message);
  if (!trace.empty()) {
    std::vector<std::vector<megac_rt::TraceSpan>> spans;
    std::string problem =
        megac_rt::estimateSchedule(*plan.program, megac_rt::CostModel(), spans);
    if (!problem.empty())
      return fail(input + ": " + problem);
    std::vector<std::string> perRank;
    double end = 0;
    for (uint32_t r = 0; r < spans.size(); ++r) {
      perRank.push_back(megac_rt::traceEventsJson(*plan.program, r, spans[r]));
      if (!spans[r].empty())
        end = std::max(end, spans[r].back().startUs + spans[r].back().durUs);
    }
    std::string error;
    auto out = mlir::openOutputFile(trace, &error);
    if (!out)
      return fail(error);
    out->os() << megac_rt::traceFileJson(perRank);
    if (!keepOutput(*out, trace))
      return 1;
    llvm::errs() << llvm::formatv("megac: wrote the expected schedule of {0} "
                                  "ranks to {1}: one step takes {2:F3} ms\n",
                                  spans.size(), trace, end / 1e3);
    return 0;
  }
  if (rank.getNumOccurrences() &&
      (rank < 0 || static_cast<uint32_t>(rank) >= plan.program->world_size()))
    return fail(llvm::formatv("--rank must be a rank of the plan (0 to {0}), "
                              "got {1}",
                              plan.program->world_size() - 1, rank));
  llvm::outs() << (json ? megac_rt::dumpPlanJson(plan, rank)
                        : megac_rt::dumpPlanText(plan, rank));
  return 0;
}

//===----------------------------------------------------------------------===//
// megac schedule
//===----------------------------------------------------------------------===//

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
  llvm::outs() << prefix << llvm::formatv(
      "{0} stages, {1} micro-batches, {2} chunk(s) per rank: step {3:F2} "
      "forward-times, bubble {4:F4} of the step ({5:F4} of the compute)\n",
      schedule.stages, schedule.microBatches, schedule.virtualStages,
      timing.makespan, timing.bubbleOfTotal, timing.bubbleOfIdeal);
  return 0;
}

/// `megac --version`, `megac <command> --version`.
void printVersion(llvm::raw_ostream &os) {
  os << kProducer << " (built with MLIR and LLVM " << LLVM_VERSION_STRING
     << ")\n";
}

void printUsage() {
  llvm::outs()
      << "megac: an ahead-of-time compiler for parallel Transformer graphs\n\n"
         "USAGE: megac <command> [options]\n\n"
         "COMMANDS:\n"
         "  import   generate a model (megac dialect) from a HuggingFace "
         "config.json\n"
         "  compile  partition a model over a device grid and write a plan "
         "(.mgc)\n"
         "  inspect  print a plan as text or JSON\n"
         "  schedule generate or check a pipeline schedule (bubble, "
         "deadlocks)\n\n"
         "Run 'megac <command> --help' for a command's options. Plans run "
         "with\n'mpirun -np N megac-run model.mgc'.\n";
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  megac::registerAllPasses();
  cl::SetVersionPrinter(printVersion);
  if (argc >= 2 && llvm::StringRef(argv[1]) == "--version") {
    printVersion(llvm::outs());
    return 0;
  }
  if (argc < 2 || llvm::StringRef(argv[1]) == "--help" ||
      llvm::StringRef(argv[1]) == "-h" || llvm::StringRef(argv[1]) == "help") {
    printUsage();
    return argc < 2 ? 1 : 0;
  }
  llvm::StringRef command = argv[1];
  int (*run)(int, char **) = command == "compile"    ? runCompile
                             : command == "import"   ? runImport
                             : command == "inspect"  ? runInspect
                             : command == "schedule" ? runSchedule
                                                     : nullptr;
  if (run) {
    int rc = run(argc, argv);
    // A report that did not reach standard output (a full disk, a closed
    // pipe) fails the command, in one line rather than LLVM's fatal error.
    llvm::outs().flush();
    if (std::error_code ec = llvm::outs().error()) {
      llvm::outs().clear_error();
      return fail("cannot write standard output: " + ec.message());
    }
    return rc;
  }
  return fail("unknown command '" + command +
              "' (expected import, compile, inspect or schedule; see megac "
              "--help)");
}
