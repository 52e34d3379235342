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

/// A control character (below 0x20, or DEL): ends a line or a comment,
/// or is cut at a NUL, where text is written out.
inline bool isControlChar(char c) {
  return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
}

/// Why \p name cannot name a tensor in plans, checkpoints and safetensors
/// files (a parameter's, a result's): "" if it can. Names are JSON
/// strings there: valid UTF-8 without control characters (invalid bytes
/// became U+FFFD and two names one; a NUL cut a name short).
std::string tensorNameProblem(llvm::StringRef name);
} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACDIALECT_H
