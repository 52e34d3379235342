//===- ModelStructure.h - Recognizing transformer blocks --------*- C++ -*-===//
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

namespace megac {

/// Whether \p LayerNorm opens a transformer block: its result reaches a
/// megac.attention within three ops.
bool opensTransformerBlock(LayerNormOp LayerNorm);

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_MODELSTRUCTURE_H
