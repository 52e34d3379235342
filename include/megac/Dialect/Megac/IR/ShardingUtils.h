//===- ShardingUtils.h - Reading and writing shardings ----------*- C++ -*-===//
//
// Where a value's sharding lives (a function argument attribute or the
// defining op's `megac.sharding`) and how a global type becomes a per-rank
// type. Shared by the passes and the plan emitter.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_SHARDINGUTILS_H
#define MEGAC_DIALECT_MEGAC_IR_SHARDINGUTILS_H

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"

namespace megac {

/// The module's grid, or null when it has none (a single rank).
MeshAttr getMesh(mlir::ModuleOp module);

/// The sharding recorded for `value`, or null when none was recorded.
ShardingAttr getSharding(mlir::Value value);

/// The sharding of `value`, whole (replicated) when none was recorded.
ShardingAttr getShardingOrReplicated(mlir::Value value);

/// Records `sharding` for `value` (argument attribute or op attribute).
void setSharding(mlir::Value value, ShardingAttr sharding);

/// Size of `axis` in `mesh`; 1 when the grid is null or lacks the axis.
int64_t getAxisSizeOrOne(MeshAttr mesh, llvm::StringRef axis);

/// The grid as the command line spells it ("dp=2,tp=4"); "" when null.
std::string gridText(MeshAttr mesh);

/// The per-rank type of a value of global type `type` split by `sharding`.
mlir::RankedTensorType getLocalType(mlir::RankedTensorType type,
                                    ShardingAttr sharding, MeshAttr mesh);

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_SHARDINGUTILS_H
