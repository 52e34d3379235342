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

#include "Driver.h"

#include "megac/InitAll.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"

using namespace megac::driver;
namespace cl = llvm::cl;

namespace {

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
