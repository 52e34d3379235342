// RUN: not megac-opt %s --megac-specialize-shapes="batch=144115188075855872 seq=64" 2>&1 | FileCheck %s --check-prefix=INPUT
// RUN: not megac-opt %s --megac-specialize-shapes="batch=1125899906842624 seq=64" 2>&1 | FileCheck %s --check-prefix=RESULT
// RUN: megac-opt %s --megac-specialize-shapes="batch=1099511627776 seq=64" | FileCheck %s

// Tests that sizes whose tensors no int64 can count in bytes are refused
// where they are made: a batch of 2^57 rows of 64 i32 tokens is 2^65
// bytes; 2^50 rows fit as tokens (2^58 bytes) but not once embedded in 64
// f32 features (2^64). Such shapes wrapped around in the later passes'
// byte counts. 2^40 rows still specialize (the global shape; megac compile
// asks each rank's share to fit a plan's buffer).
// INPUT: error: input 'tokens' would be a 'tensor<144115188075855872x64xi32>' of 2^63 bytes or more: the batch and sequence sizes are too large for any grid
// RESULT: [[@LINE+4]]:{{[0-9]+}}: error: a result would be a 'tensor<1125899906842624x64x64xf32>' of 2^63 bytes or more: the batch and sequence sizes are too large for any grid
// CHECK: tensor<1099511627776x64x64xf32>
func.func @embed(%wte: tensor<16x64xf32> {megac.param = {name = "wte", init = "zeros"}},
                 %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?x64xf32> {
  %x = megac.embedding %wte, %ids : (tensor<16x64xf32>, tensor<?x?xi32>) -> tensor<?x?x64xf32>
  return %x : tensor<?x?x64xf32>
}
