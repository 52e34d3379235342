//===- InitAll.h - Register every megac dialect and pass --------*- C++ -*-===//
//
// One place for tools to register what megac provides, so `megac` and
// `megac-opt` can never disagree about the available dialects and passes.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_INITALL_H
#define MEGAC_INITALL_H

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"

namespace megac {

inline void registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<MegacDialect, mlir::func::FuncDialect>();
}

inline void registerAllPasses() { registerMegacPassesAndPipelines(); }

} // namespace megac

#endif // MEGAC_INITALL_H
