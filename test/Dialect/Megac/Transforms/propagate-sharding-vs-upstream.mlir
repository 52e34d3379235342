// REQUIRES: mlir-opt
// RUN: mlir-opt %S/Inputs/upstream-row-parallel.mlir --pass-pipeline='builtin.module(func.func(sharding-propagation))' | FileCheck %s --check-prefix=UPSTREAM
// RUN: megac-opt %s --megac-propagate-sharding --megac-insert-collectives | FileCheck %s --check-prefix=MEGAC

// Tests a case upstream `shard` (LLVM 22) cannot express and megac gets
// right: x [4x64] split on K and w [64x16] split on K (row parallel), then a
// second product with a whole [16x16] weight.
//
// Upstream has no partial-sum state (removed from shardings in LLVM 22), so
// its propagation must call the first product's result whole: the sum over
// ranks happens immediately, at [4x16] before the second product.
// UPSTREAM: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<4x64xf32>, tensor<64x16xf32>)
// UPSTREAM-NEXT: shard.sharding @grid split_axes = {{\[\[\]\]}} : !shard.sharding
//
// megac records the product as partial over tp, carries that through the
// second product (linear in its input), and places the one all-reduce
// after it, where a later pass may turn it into a reduce-scatter.
// MEGAC-LABEL: func.func @row_parallel
// MEGAC: %[[Y:.*]] = megac.linear {{.*}}partial = [tp]>
// MEGAC-NOT: megac.all_reduce
// MEGAC: %[[Y2:.*]] = megac.linear %[[Y]], {{.*}}partial = [tp]>
// MEGAC-NEXT: megac.all_reduce %[[Y2]] {axis = "tp"
// MEGAC-NEXT: return
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @row_parallel(%x: tensor<4x64xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                          %w: tensor<64x16xf32> {megac.sharding = #megac.sharding<[tp, _]>},
                          %v: tensor<16x16xf32>) -> tensor<4x16xf32> {
    %y = megac.linear %x, %w : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32>
    %y2 = megac.linear %y, %v : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
    return %y2 : tensor<4x16xf32>
  }
}
