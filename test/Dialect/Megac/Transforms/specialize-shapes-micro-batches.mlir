// RUN: megac-opt %s --split-input-file --megac-specialize-shapes="batch=8 micro-batches=4" | FileCheck %s
// RUN: not megac-opt %s --megac-specialize-shapes="batch=6 micro-batches=4" 2>&1 | FileCheck %s --check-prefix=MICRO

// Tests that with micro-batches the IR describes one micro-batch: a batch
// of 8 in 4 micro-batches gives 2 rows; 4 does not divide 6.
// CHECK-LABEL: func.func @tokens
// CHECK-SAME: tensor<2x64xi32>
// MICRO: error: the batch (6 rows) is not divisible by the 4 micro-batches
func.func @tokens(%ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?xi32> {
  return %ids : tensor<?x?xi32>
}
