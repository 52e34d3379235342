// Input of pipeline-stages.mlir: its two blocks and a parameter the loss does
// not read (its gradient is a constant zero).
func.func @two_blocks(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "normal", std = 0.02 : f64}},
                      %g: tensor<16xf32> {megac.param = {name = "g", init = "ones"}},
                      %g2: tensor<16xf32> {megac.param = {name = "g2", init = "ones"}},
                      %unused: tensor<8xf32> {megac.param = {name = "unused", init = "zeros"}},
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
