//===- SetMesh.cpp - Attach the device grid to a module -------------------===//
//
// Turns the command-line spelling of a grid (`dp=2,tp=4`) into the module's
// #megac.mesh, with a message that shows the expected spelling on error.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/IR/BuiltinOps.h"

namespace megac {
#define GEN_PASS_DEF_SETMESHPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
/// Whether sharding propagation (or later passes) ran on \p module.
bool isSharded(ModuleOp module) {
  if (module->hasAttr(MegacDialect::kLocalizedAttrName))
    return true;
  return module
      .walk([](Operation *op) {
        return op->hasAttr(MegacDialect::kShardingAttrName) ||
                       op->hasAttr(MegacDialect::kOperandShardingsAttrName)
                   ? WalkResult::interrupt()
                   : WalkResult::advance();
      })
      .wasInterrupted();
}

struct SetMeshPass : public megac::impl::SetMeshPassBase<SetMeshPass> {
  using SetMeshPassBase::SetMeshPassBase;

  void runOnOperation() override {
    if (mesh.empty())
      return;
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    SmallVector<GridAxisText> parsed;
    if (!parseGridText(mesh, parsed)) {
      module.emitError() << "invalid grid '" << mesh
                         << "': expected name=size pairs such as 'tp=4' or "
                            "'dp=2,tp=4'";
      return signalPassFailure();
    }
    SmallVector<StringAttr> axes;
    SmallVector<int64_t> sizes;
    for (const GridAxisText &axis : parsed) {
      axes.push_back(StringAttr::get(ctx, axis.name));
      sizes.push_back(axis.size);
    }
    auto diag = [&]() { return module.emitError() << "invalid grid '" << mesh << "': "; };
    if (failed(MeshAttr::verify(diag, axes, sizes)))
      return signalPassFailure();
    auto grid = MeshAttr::get(ctx, axes, sizes);
    // The shardings and collectives of a sharded module name the grid's
    // axes and count its sizes: a different grid would change their
    // meaning without changing the ops.
    if (auto old = module->getAttrOfType<MeshAttr>(MegacDialect::kMeshAttrName);
        old && old != grid && isSharded(module)) {
      module.emitError() << "megac-set-mesh: the module is already sharded on "
                         << old << "; it cannot move to grid '" << mesh
                         << "' (set the grid on the unsharded model)";
      return signalPassFailure();
    }
    module->setAttr(MegacDialect::kMeshAttrName, grid);
  }
};
} // namespace

bool megac::parseGridText(StringRef text, SmallVectorImpl<GridAxisText> &axes) {
  axes.clear();
  SmallVector<StringRef> items;
  text.split(items, ',');
  for (StringRef item : items) {
    auto [name, sizeText] = item.trim().split('=');
    name = name.trim();
    int64_t size = 0;
    if (name.empty() || sizeText.trim().getAsInteger(10, size) ||
        !llvm::all_of(name, [](char c) { return isalnum(c) || c == '_'; }))
      return false;
    axes.push_back({name.str(), size});
  }
  return true;
}
