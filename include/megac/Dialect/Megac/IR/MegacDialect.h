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

namespace megac {
/// The most ranks a grid may have: the plan format's bound on the world
/// (the runtime's plan verifier refuses more). Also bounds counts that
/// multiply grid axes (pipeline stages times chunks), so products of two
/// such stay far from overflow.
constexpr int64_t kMaxGridRanks = int64_t(1) << 24;
} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACDIALECT_H
