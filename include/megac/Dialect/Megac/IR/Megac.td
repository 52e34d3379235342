//===- Megac.td - the whole megac dialect -----------------*- tablegen -*-===//
//
// Includes every part of the dialect; used to generate docs/dialect.md.
//
//===----------------------------------------------------------------------===//

include "megac/Dialect/Megac/IR/MegacBase.td"
include "megac/Dialect/Megac/IR/MegacAttrs.td"
include "megac/Dialect/Megac/IR/MegacInterfaces.td"
include "megac/Dialect/Megac/IR/MegacOps.td"
