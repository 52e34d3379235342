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

namespace megac::detail {

/// Verification-time type refinement, deliberately silent: the op's
/// verifier (verifyByInference) reports failed shape rules with their labels
/// and mismatching declared result types, each exactly once.
template <typename OpT>
llvm::LogicalResult refineByInference(mlir::MLIRContext *, std::optional<mlir::Location>,
                                      mlir::ValueRange, mlir::DictionaryAttr,
                                      mlir::OpaqueProperties, mlir::RegionRange,
                                      llvm::SmallVectorImpl<mlir::Type> &) {
  return mlir::success();
}

/// The verifier of a model op: runs its type inference, which checks the
/// labelled shape rules, then compares the declared result type.
template <typename OpT>
llvm::LogicalResult verifyByInference(OpT op) {
  llvm::SmallVector<mlir::Type, 1> inferred;
  if (mlir::failed(OpT::inferReturnTypes(op.getContext(), op.getLoc(),
                                         typename OpT::Adaptor(op), inferred)))
    return mlir::failure();
  if (!OpT::isCompatibleReturnTypes(inferred, op->getResultTypes()))
    return op.emitOpError("inferred type(s) ")
           << inferred << " are incompatible with return type(s) of operation "
           << op->getResultTypes();
  return mlir::success();
}

} // namespace megac::detail

#define GET_OP_CLASSES
#include "megac/Dialect/Megac/IR/MegacOps.h.inc"

namespace megac {

/// Pipeline placement (megac.stage, megac.phase): phases in the order one
/// micro-batch runs them, forward 0, backward 1, step 2; -1 for others.
int phaseRank(llvm::StringRef phase);
/// The stages \p op runs on; empty when it is not placed.
llvm::ArrayRef<int64_t> getStages(mlir::Operation *op);
/// Its phase, "" when not placed.
llvm::StringRef getPhase(mlir::Operation *op);
/// Places \p op on \p stages in \p phase.
void setPlacement(mlir::Operation *op, llvm::ArrayRef<int64_t> stages,
                  llvm::StringRef phase);

} // namespace megac

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACOPS_H
