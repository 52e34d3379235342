// RUN: megac-opt %s --megac-partition-pipeline="mesh=tp=2 batch=2 seq=8" | FileCheck %s
// RUN: megac import --tiny -o %t.tiny.mlir
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true bucket-bytes=0" | FileCheck %s --check-prefix=UNBUCKETED
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true" | FileCheck %s --check-prefix=BUCKETED
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true" | FileCheck %s --check-prefix=BUCKETED-LOSS
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true micro-batches=2" | FileCheck %s --check-prefix=MICRO
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true fusion-groups=" | FileCheck %s --check-prefix=NOFUSION
// The pipeline is megac compile's: the same choices give the IR its
// last dump shows.
// RUN: rm -rf %t.ir && megac compile %t.tiny.mlir --train --mesh dp=2,tp=2 --micro-batches 2 --precision bf16 --sequence-parallel --recompute selective --zero 1 --lr 1e-3 --beta2 0.99 --max-grad-norm 0.5 --bucket-mb 1 -o %t.mgc --dump-ir %t.ir --quiet
// RUN: megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2,tp=2 train=true micro-batches=2 bf16=true sequence-parallel=true recompute=selective zero-stage=1 lr=1e-3 beta2=0.99 max-grad-norm=0.5 bucket-bytes=1048576" > %t.opt.mlir
// RUN: grep -v '^//' %t.ir/*-megac-fuse-elementwise.mlir | diff -B - %t.opt.mlir
// megac compile's refusals of combinations are the pipeline's too:
// RUN: not megac-opt %t.tiny.mlir --megac-partition-pipeline="train=true recompute=some" 2>&1 | FileCheck %s --check-prefix=BADMODE
// RUN: not megac-opt %t.tiny.mlir --megac-partition-pipeline="micro-batches=2" 2>&1 | FileCheck %s --check-prefix=MICROFWD
// RUN: not megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=pp=2" 2>&1 | FileCheck %s --check-prefix=PPFWD
// RUN: not megac compile %t.tiny.mlir --mesh pp=2 -o %t.pp.mgc 2>&1 | FileCheck %s --check-prefix=PPFWD-COMPILE
// RUN: not megac-opt %t.tiny.mlir --megac-partition-pipeline="lr=-1" 2>&1 | FileCheck %s --check-prefix=BADLR
// A misspelt ZeRO axis is refused before any pass runs (not after
// autodiff, with the whole module printed):
// RUN: not megac-opt %t.tiny.mlir --megac-partition-pipeline="mesh=dp=2 train=true zero-stage=1 zero-axis=pd" 2>&1 | FileCheck %s --check-prefix=BADZEROAXIS
// BADZEROAXIS: error: megac-partition-pipeline: zero-axis 'pd' is not an axis of the grid (dp=2)
// BADZEROAXIS-NOT: func.func

// Tests the whole pipeline on one transformer MLP block: per-rank shapes,
// exactly one all-reduce (after the row-parallel product, before its bias).
// CHECK: module attributes {megac.localized, megac.mesh = #megac.mesh<tp = 2>}
// CHECK-LABEL: func.func @block
// CHECK-SAME: tensor<32x64xf32>
// CHECK-SAME: tensor<64x32xf32>
// CHECK-SAME: tensor<2x8xi32>
// CHECK: megac.linear {{.*}} -> tensor<2x8x64xf32>
// CHECK: megac.gelu {{.*}} -> tensor<2x8x64xf32>
// CHECK: %[[P:.*]] = megac.linear {{.*}} -> tensor<2x8x32xf32>
// CHECK-NEXT: %[[R:.*]] = megac.all_reduce %[[P]] {axis = "tp"
// CHECK-NEXT: megac.add %[[R]]
// CHECK-NOT: megac.all_
func.func @block(%wte: tensor<512x32xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                 %w1: tensor<32x128xf32> {megac.param = {name = "w1", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[_, tp]>},
                 %w2: tensor<128x32xf32> {megac.param = {name = "w2", init = "normal", std = 0.02 : f64}, megac.sharding = #megac.sharding<[tp, _]>},
                 %b2: tensor<32xf32> {megac.param = {name = "b2", init = "zeros"}},
                 %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?x32xf32> {
  %x = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
  %h = megac.linear %x, %w1 : (tensor<?x?x32xf32>, tensor<32x128xf32>) -> tensor<?x?x128xf32>
  %g = megac.gelu %h : (tensor<?x?x128xf32>) -> tensor<?x?x128xf32>
  %p = megac.linear %g, %w2 : (tensor<?x?x128xf32>, tensor<128x32xf32>) -> tensor<?x?x32xf32>
  %y = megac.add %p, %b2 : (tensor<?x?x32xf32>, tensor<32xf32>) -> tensor<?x?x32xf32>
  return %y : tensor<?x?x32xf32>
}

// The tiny GPT-2 has 4 layers of 16 parameters (q, k and v apart) and 4
// more: 68 gradients, each all-reduced over dp, or all in one bucket
// (25 MiB by default), beside the loss's all-reduce; with two
// micro-batches each gradient and the loss are accumulated. Its
// attentions' gradient steps form the CPU's kernel groups (a) unless
// fusion-groups is empty.
// UNBUCKETED-COUNT-69: megac.all_reduce %
// UNBUCKETED-NOT: megac.all_reduce
// BUCKETED: megac.fusion
// BUCKETED-COUNT-1: megac.all_reduce_bucket
// BUCKETED-NOT: megac.all_reduce_bucket
// BUCKETED-LOSS-COUNT-1: megac.all_reduce %
// BUCKETED-LOSS-NOT: megac.all_reduce %
// MICRO-COUNT-69: megac.accumulate
// MICRO-NOT: megac.accumulate
// NOFUSION-NOT: megac.fusion
// BADMODE: error: megac-partition-pipeline: recompute must be none, selective or full, got 'some'
// MICROFWD: error: megac-partition-pipeline: micro-batches needs train or gradients (it accumulates gradients)
// PPFWD: error: megac-partition-pipeline: a pp axis (pipeline parallelism) needs train: the pipeline runs training steps
// PPFWD-COMPILE: megac: error: a pp axis (pipeline parallelism) needs --train: the pipeline runs training steps
// BADLR: error: megac-partition-pipeline: lr must be a finite number > 0, got -1
