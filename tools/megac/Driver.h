//===- Driver.h - What megac's subcommands share ----------------*- C++ -*-===//
//
// megac's subcommands, one file each (Compile.cpp, Import.cpp,
// Inspect.cpp, Schedule.cpp; main in megac.cpp), and what they share:
// errors in one line, inputs read within bounds, the model loaded and
// checked, options parsed per subcommand, outputs kept only whole.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_TOOLS_MEGAC_DRIVER_H
#define MEGAC_TOOLS_MEGAC_DRIVER_H

#include "megac/Pipeline/Schedule.h"
#include "megac_rt/plan_file.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"
#include <cstdint>
#include <memory>
#include <string>

namespace megac::driver {

using llvm::StringRef;
using mlir::LogicalResult;
using mlir::MLIRContext;
using mlir::ModuleOp;
using mlir::OwningOpRef;

/// The subcommands: `megac <command> ...` with argv[1] the command.
int runCompile(int argc, char **argv);
int runImport(int argc, char **argv);
int runInspect(int argc, char **argv);
int runSchedule(int argc, char **argv);

/// Prints "megac: error: <message>"; returns 1, a subcommand's failure.
int fail(const llvm::Twine &message);

/// The producer named in every plan and by --version.
inline constexpr const char *kProducer = megac_rt::kMegacRelease;

/// What messages (and plans, of a schedule) call an input: "-" is
/// standard input.
std::string inputName(StringRef path);

/// Reads the input \p path ("-": standard input) whole, where it can be
/// \p expected ("a HuggingFace config.json"): a regular file or a pipe
/// (standard input, <(...), a mkfifo) of at most \p limit bytes. Anything
/// else is refused before it is read, with the reason in \p error: a
/// directory; a device such as /dev/zero, which would be read until
/// memory ran out; or a file too large to be one.
std::unique_ptr<llvm::MemoryBuffer> readInput(StringRef path, uint64_t limit,
                                              StringRef expected,
                                              std::string &error);

/// Parses the model file at \p path (reporting errors) into a module whose
/// buffer \p sourceMgr keeps; \p hash, if given, receives its content hash.
OwningOpRef<ModuleOp> loadModel(MLIRContext &ctx, llvm::StringRef path,
                                llvm::SourceMgr &sourceMgr,
                                uint64_t *hash = nullptr);

/// Reports, at its op in the model, the first tensor of the compiled
/// (per-rank) \p module with more elements than a plan's buffer may hold;
/// false when there is none. The runtime would refuse such a plan, and the
/// user's sizes are the cause.
bool reportOversizedTensor(ModuleOp module);

/// \p message without the verifiers' rule labels ("position_embedding_c2: "),
/// which name docs/dialect.md's rules for megac-opt's users and the tests
/// but only puzzle someone compiling a model.
std::string withoutRuleLabels(StringRef message);

/// Prints each diagnostic as one line, `file:line:col: error: message`,
/// without the verifiers' rule labels and without notes.
void installOneLineDiagnostics(MLIRContext &ctx);

/// Parses the options of subcommand argv[1], with argv[0] shown as
/// "megac compile" so --help reads naturally. False (reported) when the
/// command line must be refused.
[[nodiscard]] bool parseSubcommand(int argc, char **argv, StringRef overview);

/// A pipeline schedule: read from \p file if given, else generated
/// (\p kind: gpipe, 1f1b or interleaved). Fails with a message.
bool makeSchedule(StringRef kind, int64_t stages, int64_t microBatches,
                  int64_t virtualStages, StringRef file,
                  megac::PipelineSchedule &schedule, std::string &error);

/// Keeps \p out (written to \p path) if every byte reached it; else says
/// why, in one line, and leaves no file (a full disk is no LLVM ERROR).
bool keepOutput(llvm::ToolOutputFile &out, llvm::StringRef path);

/// Whether paths \p a and \p b name one file: the same file where both
/// exist (links, hard links, "./x"), else the same absolute path. "-" is
/// no file (standard input or output: `compile - -o -` is a filter).
bool sameFileOrPath(llvm::StringRef a, llvm::StringRef b);

/// `megac --version`, `megac <command> --version`.
void printVersion(llvm::raw_ostream &os);

} // namespace megac::driver

#endif // MEGAC_TOOLS_MEGAC_DRIVER_H
