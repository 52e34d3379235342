// The same row-parallel product followed by a second product as in
// propagate-sharding-vs-upstream.mlir, written for the upstream shard dialect.
shard.grid @grid(shape = 2)
func.func @row_parallel(%x: tensor<4x64xf32>, %w: tensor<64x16xf32>, %b: tensor<16xf32>, %v: tensor<16x16xf32>) -> tensor<4x16xf32> {
  %sx = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %x1 = shard.shard %x to %sx : tensor<4x64xf32>
  %sw = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %w1 = shard.shard %w to %sw : tensor<64x16xf32>
  %e = tensor.empty() : tensor<4x16xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %y = linalg.matmul ins(%x1, %w1 : tensor<4x64xf32>, tensor<64x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %y2 = linalg.matmul ins(%y, %v : tensor<4x16xf32>, tensor<16x16xf32>) outs(%f2 : tensor<4x16xf32>) -> tensor<4x16xf32>
  return %y2 : tensor<4x16xf32>
}
