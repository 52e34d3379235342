//===- ShardingUtils.cpp - Reading and writing shardings ------------------===//

#include "megac/Dialect/Megac/IR/ShardingUtils.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;

namespace megac {

MeshAttr getMesh(ModuleOp module) {
  return module->getAttrOfType<MeshAttr>(MegacDialect::kMeshAttrName);
}

ShardingAttr getSharding(Value value) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    if (!func)
      return {};
    return func.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                               MegacDialect::kShardingAttrName);
  }
  return value.getDefiningOp()->getAttrOfType<ShardingAttr>(
      MegacDialect::kShardingAttrName);
}

ShardingAttr getShardingOrReplicated(Value value) {
  if (ShardingAttr sharding = getSharding(value))
    return sharding;
  auto type = cast<RankedTensorType>(value.getType());
  return ShardingAttr::getReplicated(value.getContext(), type.getRank());
}

void setSharding(Value value, ShardingAttr sharding) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = cast<func::FuncOp>(arg.getOwner()->getParentOp());
    func.setArgAttr(arg.getArgNumber(), MegacDialect::kShardingAttrName,
                    sharding);
    return;
  }
  value.getDefiningOp()->setAttr(MegacDialect::kShardingAttrName, sharding);
}

int64_t getAxisSizeOrOne(MeshAttr mesh, StringRef axis) {
  if (!mesh || axis.empty())
    return 1;
  return mesh.getAxisSize(axis).value_or(1);
}

std::string gridText(MeshAttr mesh) {
  std::string text;
  if (mesh)
    for (auto [axis, size] : llvm::zip(mesh.getAxes(), mesh.getSizes()))
      text +=
          (text.empty() ? "" : ",") + axis.str() + "=" + std::to_string(size);
  return text;
}

RankedTensorType getLocalType(RankedTensorType type, ShardingAttr sharding,
                              MeshAttr mesh) {
  if (!sharding)
    return type;
  SmallVector<int64_t> shape(type.getShape());
  for (auto [dim, size] : llvm::enumerate(shape))
    if (!ShapedType::isDynamic(size))
      size /= getAxisSizeOrOne(mesh, sharding.getDimAxis(dim));
  return RankedTensorType::get(shape, type.getElementType());
}

} // namespace megac
