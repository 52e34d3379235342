// RUN: megac-opt %s --megac-disable-dropout | FileCheck %s
// RUN: megac-opt %s --megac-autodiff | FileCheck %s --check-prefix=VJP

// Tests that inference removes dropout (its users read its input).
// CHECK-LABEL: func.func @model
// CHECK-NOT: megac.dropout
// CHECK: %[[G:.*]] = megac.gelu %arg0
// CHECK-NEXT: megac.reshape %[[G]]
//
// and that the gradient of dropout is the same dropout (same rate, same
// stream: the mask depends on the stream, step and position only).
// VJP: megac.dropout %{{.*}} {rate = 2.500000e-01 : f64, stream = 7 : i64}
// VJP: %[[D:.*]] = megac.dropout %{{.*}} {rate = 2.500000e-01 : f64, stream = 7 : i64}
// VJP: megac.gelu_grad %arg0, %[[D]]
func.func @model(%x: tensor<4x8xf32> {megac.param = {name = "x", init = "zeros"}},
                 %y: tensor<4x1xi32> {megac.input = "labels"}) -> (tensor<f32> {megac.name = "loss"}) {
  %0 = megac.gelu %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = megac.dropout %0 {rate = 0.25 : f64, stream = 7 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = megac.reshape %1 {shape = array<i64: 4, 1, 8>} : (tensor<4x8xf32>) -> tensor<4x1x8xf32>
  %3 = megac.cross_entropy %2, %y : (tensor<4x1x8xf32>, tensor<4x1xi32>) -> tensor<f32>
  return %3 : tensor<f32>
}
