//===- ModelStructure.cpp - Recognizing transformer blocks ----------------===//

#include "megac/Dialect/Megac/IR/ModelStructure.h"

using namespace mlir;

namespace megac {

static bool reachesAttention(Value value, int depth) {
  if (depth == 0)
    return false;
  for (Operation *user : value.getUsers()) {
    if (isa<AttentionOp>(user))
      return true;
    if (user->getNumResults() == 1 &&
        reachesAttention(user->getResult(0), depth - 1))
      return true;
  }
  return false;
}

bool opensTransformerBlock(LayerNormOp layerNorm) {
  return reachesAttention(layerNorm.getResult(), 3);
}

llvm::DenseSet<Operation *> returnedCone(Block &body) {
  llvm::DenseSet<Operation *> cone;
  SmallVector<Value> worklist(body.getTerminator()->getOperands());
  while (!worklist.empty()) {
    Operation *op = worklist.pop_back_val().getDefiningOp();
    if (op && cone.insert(op).second)
      llvm::append_range(worklist, op->getOperands());
  }
  return cone;
}

} // namespace megac
