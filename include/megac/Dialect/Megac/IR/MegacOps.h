//===- MegacOps.h - megac operations ----------------------------*- C++ -*-===//
//
// Declares the ops generated from MegacOps.td.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACOPS_H
#define MEGAC_DIALECT_MEGAC_IR_MEGACOPS_H

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "megac/Dialect/Megac/IR/MegacOps.h.inc"

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACOPS_H
