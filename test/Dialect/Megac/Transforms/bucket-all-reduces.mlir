// RUN: megac-opt %s --split-input-file --megac-bucket-all-reduces | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-bucket-all-reduces=bucket-bytes=40 | FileCheck %s --check-prefix=SMALL
// RUN: megac-opt %s --split-input-file --megac-bucket-all-reduces=bucket-bytes=0 | FileCheck %s --check-prefix=OFF

// Tests gradient-like all-reduces (their sums read only at the end) fused
// into one bucket per axis, placed before the first reader of a sum; an
// activation all-reduce read at once stays single, and the all-reduce of
// a returned value is left in place.
// CHECK-LABEL: func.func @buckets
// SMALL-LABEL: func.func @buckets
// OFF-LABEL: func.func @buckets
func.func @buckets(%a: tensor<4xf32>, %b: tensor<2x3xf32>, %c: tensor<5xf32>, %d: tensor<4xf32>, %l: tensor<f32>) -> tensor<f32> {
  // CHECK: %[[LOSS:.*]] = megac.all_reduce %arg4 {axis = "dp"}
  %loss = megac.all_reduce %l {axis = "dp"} : (tensor<f32>) -> tensor<f32>
  %ga = megac.all_reduce %a {axis = "dp"} : (tensor<4xf32>) -> tensor<4xf32>
  // CHECK-NEXT: %[[ACT:.*]] = megac.all_reduce %arg3 {axis = "tp"}
  // CHECK-NEXT: megac.gelu %[[ACT]]
  %act = megac.all_reduce %d {axis = "tp"} : (tensor<4xf32>) -> tensor<4xf32>
  %h = megac.gelu %act : (tensor<4xf32>) -> tensor<4xf32>
  %gb = megac.all_reduce %b {axis = "dp"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %gc = megac.all_reduce %c {axis = "dp"} : (tensor<5xf32>) -> tensor<5xf32>
  // CHECK-NEXT: %[[SUMS:.*]]:3 = megac.all_reduce_bucket %arg0, %arg1, %arg2 {axis = "dp"}
  // CHECK-SAME: (tensor<4xf32>, tensor<2x3xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<2x3xf32>, tensor<5xf32>)
  // CHECK-NEXT: megac.sum_squares %[[SUMS]]#0
  // CHECK: megac.sum_squares %[[SUMS]]#1
  // CHECK: megac.sum_squares %[[SUMS]]#2
  %sa = megac.sum_squares %ga : (tensor<4xf32>) -> tensor<f32>
  %sb = megac.sum_squares %gb : (tensor<2x3xf32>) -> tensor<f32>
  %sc = megac.sum_squares %gc : (tensor<5xf32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// With 40-byte buckets the first closes after 16 + 24 = 40 bytes (a and b);
// c, alone in the next, stays a plain all-reduce.
// SMALL: megac.all_reduce_bucket %arg0, %arg1 {axis = "dp"}
// SMALL-NOT: megac.all_reduce_bucket
// SMALL: megac.all_reduce %arg2 {axis = "dp"}

// Without buckets nothing changes.
// OFF-NOT: megac.all_reduce_bucket
