// RUN: megac-opt %s --megac-bucket-all-reduces -verify-diagnostics
// RUN: not megac-opt %s --megac-bucket-all-reduces=bucket-bytes=-1 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not megac-opt %s --megac-partition-pipeline="bucket-bytes=-1" 2>&1 | FileCheck %s --check-prefix=PIPELINE

// Tests that a negative bucket size is refused (it read as no buckets).
// NEGATIVE: error: megac-bucket-all-reduces: bucket-bytes must be >= 0 (0: one all-reduce per gradient), got -1
// PIPELINE: error: megac-partition-pipeline: bucket-bytes must be >= 0 (0: one all-reduce per gradient), got -1

// Tests that a module on a grid must be localized first: buckets count
// per-rank bytes, and a bucket localized later would keep global results.
// expected-error@+1 {{megac-bucket-all-reduces runs on per-rank IR: run megac-localize-shapes first}}
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  func.func @global(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = megac.all_reduce %a {axis = "dp"} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
