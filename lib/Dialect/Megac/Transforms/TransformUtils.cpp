//===- TransformUtils.cpp - Helpers shared by megac passes ----------------===//

#include "TransformUtils.h"

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"

using namespace mlir;

namespace megac {

FailureOr<unsigned> findLoss(func::FuncOp func, StringRef pass) {
  std::optional<unsigned> scalar;
  unsigned scalars = 0;
  for (unsigned i = 0; i < func.getNumResults(); ++i) {
    auto name = func.getResultAttrOfType<StringAttr>(
        i, MegacDialect::kResultNameAttrName);
    Type type = func.getResultTypes()[i];
    auto tensor = dyn_cast<RankedTensorType>(type);
    // A loss is one f32 number: the gradient of anything else is not
    // what training means (and an integer result has none).
    const bool scalarF32 =
        tensor && tensor.getRank() == 0 && tensor.getElementType().isF32();
    if (name && name.getValue() == "loss") {
      if (!scalarF32)
        return func.emitError()
               << pass << ": the result named 'loss' must be a scalar f32 "
               << "(tensor<f32>), got " << type;
      // Which one would be trained is anyone's guess: say so.
      for (unsigned j = i + 1; j < func.getNumResults(); ++j)
        if (auto other = func.getResultAttrOfType<StringAttr>(
                j, MegacDialect::kResultNameAttrName);
            other && other.getValue() == "loss")
          return func.emitError() << pass << ": results " << i << " and " << j
                                  << " are both named 'loss'; name one loss";
      return i;
    }
    if (name && name.getValue().starts_with("grad:"))
      continue;
    if (scalarF32) {
      scalar = i;
      ++scalars;
    }
  }
  if (scalars == 1)
    return *scalar;
  return func.emitError() << pass
                          << " needs the loss: a scalar result named 'loss' "
                             "(megac.name) or the only scalar f32 result";
}

StringRef batchAxis(func::FuncOp func) {
  MeshAttr mesh = getMesh(func->getParentOfType<ModuleOp>());
  for (BlockArgument arg : func.getArguments())
    if (func.getArgAttr(arg.getArgNumber(), MegacDialect::kInputAttrName))
      if (auto sharding = func.getArgAttrOfType<ShardingAttr>(
              arg.getArgNumber(), MegacDialect::kShardingAttrName))
        if (!sharding.getDims().empty() &&
            getAxisSizeOrOne(mesh, sharding.getDimAxis(0)) > 1)
          return sharding.getDimAxis(0);
  return "";
}

std::string missingAxisProblem(ModuleOp module, StringRef option,
                               StringRef axis, StringRef defaultAxis) {
  MeshAttr mesh = getMesh(module);
  if (axis == defaultAxis || (mesh && mesh.getAxisSize(axis)))
    return "";
  const std::string grid = gridText(mesh);
  return option.str() + " '" + axis.str() + "' is not an axis of the grid (" +
         (grid.empty() ? std::string("the module has no megac.mesh") : grid) +
         ")";
}

} // namespace megac

std::string megac::describeArgument(func::FuncOp func, unsigned index) {
  if (auto spec = func.getArgAttrOfType<DictionaryAttr>(
          index, MegacDialect::kParamAttrName))
    if (auto name = spec.getAs<StringAttr>("name"))
      return "parameter '" + name.getValue().str() + "'";
  if (auto kind = func.getArgAttrOfType<StringAttr>(
          index, MegacDialect::kInputAttrName))
    return "input '" + kind.getValue().str() + "'";
  return "argument " + std::to_string(index);
}

LogicalResult megac::checkTensorSignature(func::FuncOp func) {
  auto refuse = [&](const std::string &what, Type type) {
    return func.emitError()
           << what << " has type " << type
           << ": megac functions take and return ranked tensors only (a "
              "scalar is a rank-0 tensor, e.g. tensor<f32>)";
  };
  for (unsigned i = 0; i < func.getNumArguments(); ++i)
    if (!isa<RankedTensorType>(func.getArgument(i).getType()))
      return refuse(describeArgument(func, i), func.getArgument(i).getType());
  for (auto [i, type] : llvm::enumerate(func.getResultTypes()))
    if (!isa<RankedTensorType>(type))
      return refuse("result " + std::to_string(i), type);
  return success();
}
