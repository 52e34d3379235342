//===- TransformUtils.h - Helpers shared by megac passes --------*- C++ -*-===//

#ifndef MEGAC_LIB_DIALECT_MEGAC_TRANSFORMS_TRANSFORMUTILS_H
#define MEGAC_LIB_DIALECT_MEGAC_TRANSFORMS_TRANSFORMUTILS_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace megac {

/// Index of the model's loss among `func`'s results: the result named
/// "loss" (megac.name), else the only scalar result; an error otherwise.
mlir::FailureOr<unsigned> findLoss(mlir::func::FuncOp func,
                                   llvm::StringRef pass);

/// Name of a function argument for messages: its parameter or input name
/// ("parameter 'wte.weight'", "input 'tokens'"), else "argument N".
std::string describeArgument(mlir::func::FuncOp func, unsigned index);

/// Fails, naming the first offender, unless every argument and result of
/// `func` is a ranked tensor (what megac functions take and return; a
/// scalar is `tensor<f32>`).
mlir::LogicalResult checkTensorSignature(mlir::func::FuncOp func);

/// The grid axis of more than one rank that splits the batch of `func`'s
/// data inputs (dp's role: each rank its own rows, the weights whole), or
/// "" where none does.
llvm::StringRef batchAxis(mlir::func::FuncOp func);

/// Why `option` naming grid axis `axis` cannot be right for `module` ("" if
/// it can): an axis other than the option's default that the grid lacks is
/// a slip (a misspelt name). The default axis missing is not: that pass
/// then has nothing to do on this grid, as documented.
std::string missingAxisProblem(mlir::ModuleOp module, llvm::StringRef option,
                               llvm::StringRef axis,
                               llvm::StringRef defaultAxis);

} // namespace megac

#endif // MEGAC_LIB_DIALECT_MEGAC_TRANSFORMS_TRANSFORMUTILS_H
