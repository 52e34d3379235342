//===- Driver.cpp - What megac's subcommands share ------------------------===//
//
// What megac's subcommands share (Driver.h).
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Pipeline/Schedule.h"
#include "megac_rt/plan_file.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/xxhash.h"
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mlir;
namespace cl = llvm::cl;
using namespace megac::driver;

namespace {

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

} // namespace

namespace megac::driver {

int fail(const llvm::Twine &message) {
  llvm::errs() << "megac: error: " << message << "\n";
  return 1;
}

std::string inputName(StringRef path) {
  return path == "-" ? "<stdin>" : path.str();
}

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

OwningOpRef<ModuleOp> loadModel(MLIRContext &ctx, llvm::StringRef path,
                                llvm::SourceMgr &sourceMgr, uint64_t *hash) {
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

bool parseSubcommand(int argc, char **argv, StringRef overview) {
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

void printVersion(llvm::raw_ostream &os) {
  os << kProducer << " (built with MLIR and LLVM " << LLVM_VERSION_STRING
     << ")\n";
}

} // namespace megac::driver
