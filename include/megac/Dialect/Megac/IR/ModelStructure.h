//===- ModelStructure.h - Blocks and the forward cone of a model -*- C++ -*-===//
//
// Passes that work per transformer block (recomputation, pipeline stage
// partitioning) find the blocks the same way: a block opens with the
// LayerNorm whose output reaches attention (through the q/k/v products
// and their bias adds).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MODELSTRUCTURE_H
#define MEGAC_DIALECT_MEGAC_IR_MODELSTRUCTURE_H

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "llvm/ADT/DenseSet.h"

namespace megac {

/// Whether \p LayerNorm opens a transformer block: its result reaches a
/// megac.attention within three ops.
bool opensTransformerBlock(LayerNormOp LayerNorm);

/// The ops the values \p Body returns depend on: in a training step, the
/// forward pass and the loss (the backward pass and the updates feed
/// nothing that is returned).
llvm::DenseSet<mlir::Operation *> returnedCone(mlir::Block &Body);

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_MODELSTRUCTURE_H
