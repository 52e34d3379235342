//===- megac-opt.cpp - Run megac passes on MLIR files ---------------------===//
//
// The mlir-opt of megac: every megac pass and pipeline, one at a time, for
// lit tests and for looking at what a pass does.
//
//===----------------------------------------------------------------------===//

#include "megac/InitAll.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  megac::registerAllDialects(registry);
  megac::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "megac optimizer driver\n", registry));
}
