//===- MegacDialect.h - megac dialect, attributes, interfaces ---*- C++ -*-===//
//
// Declares the dialect, its attributes (#megac.mesh, #megac.sharding) and the
// sharding-rule op interface.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACDIALECT_H
#define MEGAC_DIALECT_MEGAC_IR_MEGACDIALECT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"

#include "megac/Dialect/Megac/IR/ShardingRule.h"

#include "megac/Dialect/Megac/IR/MegacDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "megac/Dialect/Megac/IR/MegacAttrs.h.inc"

#include "megac/Dialect/Megac/IR/MegacInterfaces.h.inc"

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACDIALECT_H
