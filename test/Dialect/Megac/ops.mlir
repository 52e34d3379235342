// RUN: megac-opt %s | megac-opt | FileCheck %s
// RUN: megac-opt %s --mlir-print-op-generic | megac-opt | FileCheck %s

// Tests that every model op round-trips through the custom syntax.
// CHECK-LABEL: func.func @model_ops
func.func @model_ops(%wte: tensor<512x128xf32>, %wpe: tensor<128x128xf32>,
                     %ids: tensor<4x64xi32>, %w: tensor<128x256xf32>,
                     %b: tensor<256xf32>, %g: tensor<128xf32>) -> tensor<f32> {
  // CHECK: %[[E:.*]] = megac.embedding %{{.*}}, %{{.*}} : (tensor<512x128xf32>, tensor<4x64xi32>) -> tensor<4x64x128xf32>
  %e = megac.embedding %wte, %ids : (tensor<512x128xf32>, tensor<4x64xi32>) -> tensor<4x64x128xf32>
  // CHECK: %[[P:.*]] = megac.position_embedding {{.*}} -> tensor<64x128xf32>
  %p = megac.position_embedding %wpe, %ids : (tensor<128x128xf32>, tensor<4x64xi32>) -> tensor<64x128xf32>
  // CHECK: %[[X:.*]] = megac.add %[[E]], %[[P]]
  %x = megac.add %e, %p : (tensor<4x64x128xf32>, tensor<64x128xf32>) -> tensor<4x64x128xf32>
  // CHECK: megac.layer_norm %[[X]], %{{.*}}, %{{.*}} {epsilon = 9.9999999999999995E-7 : f64}
  %n = megac.layer_norm %x, %g, %g {epsilon = 1.0e-6 : f64} : (tensor<4x64x128xf32>, tensor<128xf32>, tensor<128xf32>) -> tensor<4x64x128xf32>
  // CHECK: megac.attention {{.*}} {num_heads = 4 : i64}
  %a = megac.attention %n, %n, %n {num_heads = 4 : i64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  // CHECK: megac.attention {{.*}} {causal = false, num_heads = 2 : i64}
  %a2 = megac.attention %a, %a, %a {num_heads = 2 : i64, causal = false} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<4x64x128xf32>
  // CHECK: %[[L:.*]] = megac.linear {{.*}} -> tensor<4x64x256xf32>
  %l = megac.linear %a2, %w : (tensor<4x64x128xf32>, tensor<128x256xf32>) -> tensor<4x64x256xf32>
  // CHECK: megac.mul %[[L]], %{{.*}} : (tensor<4x64x256xf32>, tensor<256xf32>)
  %m = megac.mul %l, %b : (tensor<4x64x256xf32>, tensor<256xf32>) -> tensor<4x64x256xf32>
  // CHECK: megac.gelu
  %gl = megac.gelu %m : (tensor<4x64x256xf32>) -> tensor<4x64x256xf32>
  // CHECK: megac.softmax
  %s = megac.softmax %gl : (tensor<4x64x256xf32>) -> tensor<4x64x256xf32>
  // CHECK: megac.reshape {{.*}} {shape = array<i64: 4, 64, 2, 128>}
  %r = megac.reshape %s {shape = array<i64: 4, 64, 2, 128>} : (tensor<4x64x256xf32>) -> tensor<4x64x2x128xf32>
  // CHECK: megac.transpose {{.*}} {permutation = array<i64: 0, 2, 1, 3>} {{.*}} -> tensor<4x2x64x128xf32>
  %t = megac.transpose %r {permutation = array<i64: 0, 2, 1, 3>} : (tensor<4x64x2x128xf32>) -> tensor<4x2x64x128xf32>
  // CHECK: megac.matmul {{.*}} -> tensor<4x2x64x64xf32>
  %t2 = megac.transpose %t {permutation = array<i64: 0, 1, 3, 2>} : (tensor<4x2x64x128xf32>) -> tensor<4x2x128x64xf32>
  %mm = megac.matmul %t, %t2 : (tensor<4x2x64x128xf32>, tensor<4x2x128x64xf32>) -> tensor<4x2x64x64xf32>
  // CHECK: megac.linear {{.*}} {transpose_weight} : (tensor<4x64x128xf32>, tensor<512x128xf32>) -> tensor<4x64x512xf32>
  %logits = megac.linear %n, %wte {transpose_weight} : (tensor<4x64x128xf32>, tensor<512x128xf32>) -> tensor<4x64x512xf32>
  // CHECK: megac.cross_entropy {{.*}} -> tensor<f32>
  %loss = megac.cross_entropy %logits, %ids : (tensor<4x64x512xf32>, tensor<4x64xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// Tests that dynamic batch and sequence dimensions are accepted.
// CHECK-LABEL: func.func @dynamic
func.func @dynamic(%wte: tensor<512x128xf32>, %ids: tensor<?x?xi32>) -> tensor<?x?x128xf32> {
  // CHECK: megac.embedding {{.*}} -> tensor<?x?x128xf32>
  %e = megac.embedding %wte, %ids : (tensor<512x128xf32>, tensor<?x?xi32>) -> tensor<?x?x128xf32>
  return %e : tensor<?x?x128xf32>
}

// Tests the collectives' syntax, on per-rank shapes.
// CHECK-LABEL: func.func @collectives
func.func @collectives(%x: tensor<4x64x256xf32>) -> tensor<4x64x256xf32> {
  // CHECK: megac.all_reduce %{{.*}} {axis = "tp"}
  %r = megac.all_reduce %x {axis = "tp"} : (tensor<4x64x256xf32>) -> tensor<4x64x256xf32>
  // CHECK: megac.all_gather %{{.*}} {axis = "tp", dim = 2 : i64} : (tensor<4x64x256xf32>) -> tensor<4x64x512xf32>
  %g = megac.all_gather %r {axis = "tp", dim = 2 : i64} : (tensor<4x64x256xf32>) -> tensor<4x64x512xf32>
  // CHECK: megac.slice_shard %{{.*}} {axis = "tp", dim = 2 : i64} : (tensor<4x64x512xf32>) -> tensor<4x64x256xf32>
  %s = megac.slice_shard %g {axis = "tp", dim = 2 : i64} : (tensor<4x64x512xf32>) -> tensor<4x64x256xf32>
  return %s : tensor<4x64x256xf32>
}

// Tests the ZeRO ops' syntax: a sharding constraint, a reduce-scatter (on
// per-rank shapes) and an assignment to a parameter.
// CHECK-LABEL: func.func @zero_ops
func.func @zero_ops(%p: tensor<128x64xf32>, %g: tensor<128x64xf32>) -> tensor<128x64xf32> {
  // CHECK: megac.sharding_constraint %{{.*}} {sharding = #megac.sharding<[dp, _]>}
  %c = megac.sharding_constraint %g {sharding = #megac.sharding<[dp, _]>} : (tensor<128x64xf32>) -> tensor<128x64xf32>
  // CHECK: megac.reduce_scatter %{{.*}} {axis = "dp", dim = 0 : i64} : (tensor<128x64xf32>) -> tensor<64x64xf32>
  %r = megac.reduce_scatter %c {axis = "dp", dim = 0 : i64} : (tensor<128x64xf32>) -> tensor<64x64xf32>
  // CHECK: megac.assign %{{.*}}, %{{.*}} : (tensor<128x64xf32>, tensor<128x64xf32>) -> tensor<128x64xf32>
  %a = megac.assign %p, %c : (tensor<128x64xf32>, tensor<128x64xf32>) -> tensor<128x64xf32>
  return %a : tensor<128x64xf32>
}

// Tests dropout's syntax.
// CHECK-LABEL: func.func @dropout
func.func @dropout(%x: tensor<4x64xf32>) -> tensor<4x64xf32> {
  // CHECK: megac.dropout %{{.*}} {rate = 1.000000e-01 : f64, stream = 3 : i64}
  %0 = megac.dropout %x {rate = 0.1 : f64, stream = 3 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// Tests the LayerNorm gain gradient's syntax: the result is the normalized
// dimension's vector, epsilon defaults to 1e-5.
// CHECK-LABEL: func.func @layer_norm_gain_grad
func.func @layer_norm_gain_grad(%x: tensor<4x64x128xf32>, %dy: tensor<4x64x128xf32>) -> (tensor<128xf32>, tensor<128xf32>) {
  // CHECK: megac.layer_norm_gain_grad %{{.*}}, %{{.*}} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<128xf32>
  %0 = megac.layer_norm_gain_grad %x, %dy : (tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<128xf32>
  // CHECK: megac.layer_norm_gain_grad %{{.*}}, %{{.*}} {epsilon = 9.9999999999999995E-7 : f64}
  %1 = megac.layer_norm_gain_grad %x, %dy {epsilon = 1.0e-6 : f64} : (tensor<4x64x128xf32>, tensor<4x64x128xf32>) -> tensor<128xf32>
  return %0, %1 : tensor<128xf32>, tensor<128xf32>
}
