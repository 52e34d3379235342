//===- MegacAttrs.td - megac attributes -------------------*- tablegen -*-===//
//
// The device grid (`#megac.mesh`) and per-value shardings
// (`#megac.sharding`). Unlike upstream `shard` (LLVM 22), a megac sharding can
// state that a value is a partial sum over grid axes, which is what lets the
// partitioner defer all-reduces and, later, emit reduce-scatters.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACATTRS_TD
#define MEGAC_DIALECT_MEGAC_IR_MEGACATTRS_TD

include "megac/Dialect/Megac/IR/MegacBase.td"

def Megac_MeshAttr : Megac_Attr<"Mesh", "mesh"> {
  let summary = "A device grid: named axes with their sizes, outermost first";
  let description = [{
    Ranks are numbered row-major over the axes: the last axis varies fastest.

    ```mlir
    module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 4>} { ... }
    ```

    Rules: `mesh_c1` axis names are unique; `mesh_c2` every size is >= 1;
    `mesh_c3` the grid has at most 2^24 ranks (a plan's limit); `mesh_c4`
    an axis name is a letter or `_` followed by letters, digits and `_`,
    and not `_` alone (a sharding's unsplit dimension).
  }];
  let parameters = (ins
    ArrayRefParameter<"::mlir::StringAttr">:$axes,
    ArrayRefParameter<"int64_t">:$sizes
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Size of `axis`, or std::nullopt if the grid has no such axis.
    std::optional<int64_t> getAxisSize(::llvm::StringRef axis) const;
    /// Position of `axis` in the grid, or -1.
    int64_t getAxisIndex(::llvm::StringRef axis) const;
    /// Product of all axis sizes.
    int64_t getNumRanks() const;
    /// Coordinates of `rank` on every axis (row-major numbering).
    ::llvm::SmallVector<int64_t> getCoords(int64_t rank) const;
  }];
}

def Megac_ShardingAttr : Megac_Attr<"Sharding", "sharding"> {
  let summary = "How a tensor is split over the device grid";
  let description = [{
    One entry per tensor dimension: the grid axis that splits it, or `_` when
    the dimension is whole on every rank. `partial = [...]` lists axes over
    which the per-rank values are partial sums still to be all-reduced.

    ```mlir
    // Column-parallel weight: the output dimension is split over `tp`.
    %w : tensor<128x384xf32> {megac.sharding = #megac.sharding<[_, tp]>}
    // A row-parallel product before its all-reduce.
    #megac.sharding<[_, _, _], partial = [tp]>
    ```

    Rules: `sharding_c1` an axis splits at most one dimension and is not also
    partial. `sharding_c2` a sharding that annotates a tensor (a function
    argument's `megac.sharding`, an op's `megac.sharding` for its result,
    each entry of `megac.operand_shardings`) has one entry per dimension.
    `sharding_c3` a function argument's sharding is not partial.
  }];
  let parameters = (ins
    ArrayRefParameter<"::mlir::StringAttr">:$dims,
    ArrayRefParameter<"::mlir::StringAttr">:$partial
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// A sharding of rank `rank` with no split and no partial axis.
    static ShardingAttr getReplicated(::mlir::MLIRContext *ctx, int64_t rank);
    /// True when no dimension is split and nothing is partial.
    bool isReplicated() const;
    /// The axis splitting `dim`, or "" when the dimension is whole.
    ::llvm::StringRef getDimAxis(int64_t dim) const;
    /// True when `axis` is among the partial axes.
    bool isPartialOn(::llvm::StringRef axis) const;
  }];
}

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACATTRS_TD
