// RUN: megac-opt %s --split-input-file --megac-specialize-shapes="batch=2 seq=16" | FileCheck %s
// RUN: megac-opt %s --split-input-file --megac-specialize-shapes | FileCheck %s --check-prefix=DEFAULT

// Tests that dynamic batch and sequence become the requested sizes (or
// 4 x 64 by default) and every result type follows by inference.
// CHECK-LABEL: func.func @dynamic
// CHECK-SAME: tensor<2x16xi32> {megac.input = "tokens"}) -> tensor<2x16x512xf32>
// CHECK: megac.embedding {{.*}} -> tensor<2x16x32xf32>
// CHECK: megac.position_embedding {{.*}} -> tensor<16x32xf32>
// CHECK: megac.linear {{.*}} -> tensor<2x16x512xf32>
// DEFAULT-LABEL: func.func @dynamic
// DEFAULT-SAME: tensor<4x64xi32> {megac.input = "tokens"}) -> tensor<4x64x512xf32>
func.func @dynamic(%wte: tensor<512x32xf32>, %wpe: tensor<128x32xf32>,
                   %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?x512xf32> {
  %0 = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
  %1 = megac.position_embedding %wpe, %ids : (tensor<128x32xf32>, tensor<?x?xi32>) -> tensor<?x32xf32>
  %2 = megac.add %0, %1 : (tensor<?x?x32xf32>, tensor<?x32xf32>) -> tensor<?x?x32xf32>
  %3 = megac.linear %2, %wte {transpose_weight} : (tensor<?x?x32xf32>, tensor<512x32xf32>) -> tensor<?x?x512xf32>
  return %3 : tensor<?x?x512xf32>
}

// -----

// Tests that a static model keeps its sizes unless asked (DEFAULT keeps 3x8).
// CHECK-LABEL: func.func @static
// CHECK-SAME: tensor<2x16xi32>
// DEFAULT-LABEL: func.func @static
// DEFAULT-SAME: tensor<3x8xi32>
func.func @static(%wte: tensor<512x32xf32>, %ids: tensor<3x8xi32> {megac.input = "tokens"}) -> tensor<3x8x32xf32> {
  %0 = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<3x8xi32>) -> tensor<3x8x32xf32>
  return %0 : tensor<3x8x32xf32>
}

// -----

// Tests that, with no length given, a position table shorter than the
// default 64 sets the sequence length (the whole table).
// CHECK-LABEL: func.func @short_table
// CHECK-SAME: tensor<2x16xi32>
// DEFAULT-LABEL: func.func @short_table
// DEFAULT-SAME: tensor<4x32xi32> {megac.input = "tokens"}) -> tensor<4x32x32xf32>
func.func @short_table(%wte: tensor<512x32xf32>, %wpe: tensor<32x32xf32>,
                       %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x?x32xf32> {
  %0 = megac.embedding %wte, %ids : (tensor<512x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
  %1 = megac.position_embedding %wpe, %ids : (tensor<32x32xf32>, tensor<?x?xi32>) -> tensor<?x32xf32>
  %2 = megac.add %0, %1 : (tensor<?x?x32xf32>, tensor<?x32xf32>) -> tensor<?x?x32xf32>
  return %2 : tensor<?x?x32xf32>
}

// -----

// Tests that the data inputs share the sizes one of them states: dynamic
// tokens beside labels of [3, 5] take 3 x 5, not the default 4 x 64.
// CHECK-LABEL: func.func @labels_state
// CHECK-SAME: tensor<2x16xi32> {megac.input = "tokens"}, %{{.*}}: tensor<2x16xi32> {megac.input = "labels"}
// DEFAULT-LABEL: func.func @labels_state
// DEFAULT-SAME: tensor<3x5xi32> {megac.input = "tokens"}, %{{.*}}: tensor<3x5xi32> {megac.input = "labels"}) -> tensor<f32>
func.func @labels_state(%wte: tensor<16x8xf32>, %ids: tensor<?x?xi32> {megac.input = "tokens"},
                        %labels: tensor<3x5xi32> {megac.input = "labels"}) -> tensor<f32> {
  %x = megac.embedding %wte, %ids : (tensor<16x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %l = megac.linear %x, %wte {transpose_weight} : (tensor<?x?x8xf32>, tensor<16x8xf32>) -> tensor<?x?x16xf32>
  %loss = megac.cross_entropy %l, %labels : (tensor<?x?x16xf32>, tensor<3x5xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
