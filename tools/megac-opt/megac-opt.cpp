//===- megac-opt.cpp - Run megac passes on MLIR files ---------------------===//
//
// The mlir-opt of megac: every megac pass and pipeline, one at a time, for
// lit tests and for looking at what a pass does.
//
//===----------------------------------------------------------------------===//

#include "megac/InitAll.h"
#include "megac_rt/plan_file.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

namespace {

/// A compiled plan given where MLIR belongs would meet the parser's
/// "unexpected character" and have its binary bytes echoed to the terminal;
/// name it instead. Unreadable files are left to MlirOptMain's own message.
bool isPlanFile(llvm::StringRef path) {
  // Only regular files: reading stdin, a pipe or /dev/stdin here would
  // consume what MlirOptMain is to read.
  if (!llvm::sys::fs::is_regular_file(path))
    return false;
  std::string error;
  auto file = mlir::openInputFile(path, &error);
  return file && megac_rt::hasPlanIdentifier(file->getBufferStart(),
                                             file->getBufferSize());
}

} // namespace

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  megac::registerAllDialects(registry);
  megac::registerAllPasses();
  auto [inputFilename, outputFilename] = mlir::registerAndParseCLIOptions(
      argc, argv, "megac optimizer driver\n", registry);
  if (isPlanFile(inputFilename)) {
    llvm::errs() << "megac-opt: error: " << inputFilename
                 << " is a megac plan, not MLIR: megac-opt reads models and "
                    "IR dumps (.mlir); `megac inspect` prints a plan\n";
    return 1;
  }
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, inputFilename, outputFilename, registry));
}
