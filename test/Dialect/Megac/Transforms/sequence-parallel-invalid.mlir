// RUN: megac-opt %s --split-input-file --megac-sequence-parallel=axis=dp -verify-diagnostics
// RUN: not megac-opt %s --split-input-file --megac-sequence-parallel=axis=pp 2>&1 | FileCheck %s --check-prefix=PP

// Tests that the sequence is not split over the axis that splits the
// batch: `[dp, dp, _]` left each dp rank half of its own rows.
module attributes {megac.mesh = #megac.mesh<dp = 2>} {
  // expected-error@+1 {{megac-sequence-parallel: axis 'dp' splits the batch (the data inputs); the sequence is split over a tensor-parallel axis (one that splits the weights)}}
  func.func @batch_axis(%wte: tensor<16x8xf32> {megac.param = {name = "wte", init = "zeros"}},
                        %g: tensor<8xf32> {megac.param = {name = "g", init = "ones"}},
                        %ids: tensor<4x6xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>}) -> tensor<4x6x8xf32> {
    %x = megac.embedding %wte, %ids : (tensor<16x8xf32>, tensor<4x6xi32>) -> tensor<4x6x8xf32>
    %n = megac.layer_norm %x, %g, %g : (tensor<4x6x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x6x8xf32>
    return %n : tensor<4x6x8xf32>
  }
}

// -----

// Nor over pp, which splits the layers into stages (checked by the run
// with axis=pp). Under axis=dp this grid has no dp: an axis named other
// than the default tp that the grid lacks is a slip, not "nothing to do".
// PP: error: megac-sequence-parallel: axis 'pp' splits the layers into pipeline stages; the sequence is split over a tensor-parallel axis (one that splits the weights)
// expected-error@+1 {{megac-sequence-parallel: axis 'dp' is not an axis of the grid (pp=2)}}
module attributes {megac.mesh = #megac.mesh<pp = 2>} {
  func.func @pipeline_axis(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>) -> tensor<2x8x16xf32> {
    %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    return %n : tensor<2x8x16xf32>
  }
}

// -----

// No grid at all: the named axis is missing too.
// expected-error@+1 {{megac-sequence-parallel: axis 'dp' is not an axis of the grid (the module has no megac.mesh)}}
module {
  func.func @no_grid(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>) -> tensor<2x8x16xf32> {
    %n = megac.layer_norm %x, %g, %g : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    return %n : tensor<2x8x16xf32>
  }
}
