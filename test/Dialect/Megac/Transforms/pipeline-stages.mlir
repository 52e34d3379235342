// RUN: megac-opt %s --megac-set-mesh=mesh=pp=2 --megac-assign-stages --megac-autodiff --megac-accumulate-micro-batches --megac-apply-optimizer --megac-pipeline-stages | FileCheck %s
// RUN: not megac-opt %s --megac-set-mesh=mesh=pp=2 --megac-assign-stages=virtual-stages=2 2>&1 | FileCheck %s --check-prefix=FOUR
// RUN: not megac-opt %s --megac-set-mesh=mesh=pp=3 --megac-assign-stages 2>&1 | FileCheck %s --check-prefix=FEW
// RUN: megac-opt %s --megac-assign-stages | FileCheck %s --check-prefix=NONE
// RUN: not megac-opt %s --megac-set-mesh=mesh=pp=2 --megac-assign-stages=virtual-stages=0 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not megac-opt %s --megac-set-mesh=mesh=pp=2 --megac-assign-stages=virtual-stages=9223372036854775807 2>&1 | FileCheck %s --check-prefix=HUGE
// RUN: not megac-opt %s --megac-set-mesh=mesh=pp=2 --megac-assign-stages --megac-autodiff --megac-apply-optimizer --megac-pipeline-stages 2>&1 | FileCheck %s --check-prefix=NOSUMS
// RUN: megac-opt %S/Inputs/pipeline-stages-unused-parameter.mlir --megac-set-mesh=mesh=pp=2 --megac-assign-stages --megac-autodiff --megac-accumulate-micro-batches --megac-apply-optimizer --megac-pipeline-stages | FileCheck %s --check-prefix=UNUSED

// Tests megac-assign-stages and megac-pipeline-stages on two blocks with a
// tied embedding, on pp=2. The embedding and block 0 form stage 0, block 1,
// the output layer and the loss stage 1 (the equal split is the min-max
// one). Autodiff puts each gradient op on its op's stage.
// CHECK: megac.embedding {{.*}}megac.phase = "forward", megac.stage = array<i64: 0>
// CHECK: %[[H:.*]] = megac.add {{.*}}megac.phase = "forward", megac.stage = array<i64: 0>
// The residual stream goes to stage 1 right before its first use there:
// CHECK-NEXT: megac.transfer %[[H]] {dst_phase = "forward", dst_stage = 1 : i64, src_phase = "forward", src_stage = 0 : i64}
// CHECK-NEXT: megac.layer_norm %[[H]], {{.*}}megac.stage = array<i64: 1>
// CHECK: megac.cross_entropy {{.*}}megac.stage = array<i64: 1>
// The loss is summed over micro-batches where it is computed:
// CHECK-NEXT: megac.accumulate {{.*}}megac.phase = "forward", megac.stage = array<i64: 1>
// CHECK: megac.fill {{.*}}megac.phase = "backward", megac.stage = array<i64: 1>
// Its gradient comes back in the backward pass:
// CHECK: megac.transfer %[[DH:[0-9]+]] {dst_phase = "backward", dst_stage = 0 : i64, src_phase = "backward", src_stage = 1 : i64}
// CHECK-NEXT: megac.attention_grad %{{.*}}, %[[DH]] {{{.*}}megac.stage = array<i64: 0>
// The tied embedding's two contributions accumulate on their own stages
// and meet once per step; the update runs on both stages, which both hold
// the embedding, after the sum reached the second.
// CHECK: %[[HEAD:.*]] = megac.accumulate %{{.*}} {megac.phase = "backward", megac.stage = array<i64: 1>} : (tensor<64x16xf32>)
// CHECK-NEXT: %[[EMB:.*]] = megac.accumulate %{{.*}} {megac.phase = "backward", megac.stage = array<i64: 0>} : (tensor<64x16xf32>)
// CHECK-NEXT: megac.transfer %[[HEAD]] {dst_phase = "step", dst_stage = 0 : i64, src_phase = "step", src_stage = 1 : i64}
// CHECK-NEXT: %[[SUM:.*]] = megac.add %[[HEAD]], %[[EMB]] {megac.phase = "step", megac.stage = array<i64: 0>}
// The gradient norm's running sum moves to stage 1 once:
// CHECK: %[[PART:.*]] = megac.add {{.*}}megac.phase = "step", megac.stage = array<i64: 0>} : (tensor<f32>, tensor<f32>)
// CHECK: megac.transfer %[[PART]] {dst_phase = "step", dst_stage = 1 : i64
// CHECK: %[[COEF:.*]] = megac.clip_coefficient {{.*}}megac.stage = array<i64: 1>
// CHECK: megac.transfer %[[SUM]] {dst_phase = "step", dst_stage = 1 : i64, src_phase = "step", src_stage = 0 : i64}
// CHECK-NEXT: megac.transfer %[[COEF]] {dst_phase = "step", dst_stage = 0 : i64, src_phase = "step", src_stage = 1 : i64}
// CHECK-NEXT: megac.adamw %arg0, %[[SUM]], %[[COEF]] {{.*}}megac.phase = "step", megac.stage = array<i64: 0, 1>
// CHECK-NEXT: megac.adamw %arg1, {{.*}}megac.stage = array<i64: 0>
// CHECK-NEXT: megac.adamw %arg2, {{.*}}megac.stage = array<i64: 1>
//
// Two chunks per pipeline rank: four stages would need four blocks.
// FOUR: error: megac-assign-stages: cannot split 2 transformer blocks into 4 pipeline stages (2 pipeline ranks x 2 virtual stages, a model chunk each): each stage holds at least one block; use fewer virtual stages or fewer pipeline ranks
// FEW: error: megac-assign-stages: cannot split 2 transformer blocks into 3 pipeline stages
// ZERO: error: megac-assign-stages: virtual-stages must be positive, got 0
// (The stage count once overflowed and nothing was placed.)
// Without the micro-batch sums (once an 'internal error' on the adamw):
// NOSUMS: error: megac-pipeline-stages needs the micro-batch sums: run megac-accumulate-micro-batches first
// HUGE: error: megac-assign-stages: virtual-stages 9223372036854775807 is too large (at most 16777216)
// A parameter the loss does not read (once a crash): its zero gradient is
// summed over the micro-batches in the backward phase, on the stages that
// read it, and its update runs on stage 0.
// UNUSED: %[[FILL:.*]] = megac.fill {megac.phase = "backward", megac.stage = array<i64: 0, 1>, shape = array<i64: 8>, value = 0.000000e+00 : f64}
// UNUSED: %[[SUM:.*]] = megac.accumulate %[[FILL]] {megac.phase = "backward", megac.stage = array<i64: 0, 1>}
// UNUSED: megac.sum_squares %[[SUM]] {megac.phase = "step", megac.stage = array<i64: 1>}
// UNUSED: megac.adamw %arg3, %[[SUM]], %{{.*}} {{.*}}megac.phase = "step", megac.stage = array<i64: 0>
// Without a pp axis nothing is placed.
// NONE-NOT: megac.stage
func.func @two_blocks(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                      %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                      %g2: tensor<16xf32> {megac.param = {name = "g2", init = "ones"}},
                      %ids: tensor<2x8xi32> {megac.input = "tokens"},
                      %labels: tensor<2x8xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %x = megac.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %a = megac.attention %n, %n, %n {num_heads = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %h = megac.add %x, %a : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %n2 = megac.layer_norm %h, %g2, %g2 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %a2 = megac.attention %n2, %n2, %n2 {num_heads = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %h2 = megac.add %h, %a2 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %l = megac.linear %h2, %wte {transpose_weight} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = megac.cross_entropy %l, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
