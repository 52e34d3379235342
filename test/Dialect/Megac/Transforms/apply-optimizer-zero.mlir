// RUN: megac-opt %s --megac-apply-optimizer="zero-stage=1" | FileCheck %s
// RUN: megac-opt %s --megac-apply-optimizer="zero-stage=1" --megac-propagate-sharding --megac-insert-collectives | FileCheck %s --check-prefix=COLL
// RUN: not megac-opt %s --megac-apply-optimizer="zero-stage=2" 2>&1 | FileCheck %s --check-prefix=STAGE
// ZeRO over an axis that splits a weight sliced it twice ([tp, tp]):
// RUN: not megac-opt %s --megac-apply-optimizer="zero-stage=1 zero-axis=tp" 2>&1 | FileCheck %s --check-prefix=WEIGHTAXIS
// WEIGHTAXIS: error: megac-apply-optimizer: zero-axis 'tp' splits parameter 'w': ZeRO shards the optimizer state over the data-parallel ranks (the axis that splits the batch, each rank with the whole weights)
// A misspelt axis was a silent no-op (the update stayed whole); the
// default dp missing from a grid still is (nothing to shard over):
// RUN: not megac-opt %s --megac-apply-optimizer="zero-stage=1 zero-axis=pd" 2>&1 | FileCheck %s --check-prefix=MISSPELT
// MISSPELT: error: megac-apply-optimizer: zero-axis 'pd' is not an axis of the grid (dp=2,tp=2)
// Without ZeRO the axis is not asked for:
// RUN: megac-opt %s --megac-apply-optimizer="zero-axis=pd" | FileCheck %s --check-prefix=OFF
// OFF-NOT: sharding_constraint
// OFF: megac.adamw %arg0, %arg3

// Tests ZeRO stage 1: each parameter with a dimension free of other splits
// and divisible by dp is updated in slices (gradient and parameter
// constrained to the slice, AdamW on the slice, the updated slice gathered
// and assigned back); the gradient norm reads the slices. The column-split
// weight is sliced on its free dimension 0 ([dp, tp]); the tp-split bias
// has no free dimension and is updated whole.
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
  // CHECK-LABEL: func.func @step
  // CHECK: %[[GW:.*]] = megac.sharding_constraint %arg3 {sharding = #megac.sharding<[dp, tp]>}
  // CHECK: megac.sum_squares %[[GW]]
  // CHECK: %[[PW:.*]] = megac.sharding_constraint %arg0 {sharding = #megac.sharding<[dp, tp]>}
  // CHECK: %[[UW:.*]] = megac.adamw %[[PW]], %[[GW]]
  // CHECK: %[[W:.*]] = megac.sharding_constraint %[[UW]] {sharding = #megac.sharding<[_, tp]>}
  // CHECK: megac.assign %arg0, %[[W]]
  // CHECK: megac.adamw %arg1, %arg4
  // Here the gradients are whole arguments, so the constraint slices them
  // for free (a partial gradient is reduce-scattered instead, see
  // insert-collectives.mlir); the parameter is sliced, its update gathered.
  // COLL: megac.slice_shard %arg3 {axis = "dp", dim = 0 : i64
  // COLL-NOT: megac.all_reduce %arg
  // COLL: megac.slice_shard %arg0 {axis = "dp", dim = 0 : i64
  // COLL: megac.all_gather %{{.*}} {axis = "dp", dim = 0 : i64
  // COLL: megac.assign %arg0
  // STAGE: error: zero-stage must be 0 or 1, got 2 (ZeRO stages 2 and 3 are not implemented)
  func.func @step(%w: tensor<16x32xf32> {megac.param = {name = "w", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[_, tp]>},
                  %b: tensor<32xf32> {megac.param = {name = "b", init = "zeros"}, megac.sharding = #megac.sharding<[tp]>},
                  %loss: tensor<f32>,
                  %gw: tensor<16x32xf32> {megac.sharding = #megac.sharding<[_, tp]>},
                  %gb: tensor<32xf32> {megac.sharding = #megac.sharding<[tp]>})
      -> (tensor<f32> {megac.name = "loss"}, tensor<16x32xf32> {megac.name = "grad:w"}, tensor<32xf32> {megac.name = "grad:b"}) {
    return %loss, %gw, %gb : tensor<f32>, tensor<16x32xf32>, tensor<32xf32>
  }
}
