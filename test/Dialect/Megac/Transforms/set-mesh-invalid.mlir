// RUN: not megac-opt %s --split-input-file --megac-set-mesh="mesh=tp4" 2>&1 | FileCheck %s --check-prefix=SYNTAX
// RUN: not megac-opt %s --split-input-file --megac-set-mesh="mesh=tp=2,tp=2" 2>&1 | FileCheck %s --check-prefix=DUP
// RUN: not megac-opt %s --split-input-file --megac-set-mesh="mesh=tp=0" 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not megac-opt %s --split-input-file --megac-set-mesh="mesh=tp=2" --megac-propagate-sharding --megac-set-mesh="mesh=tp=4" 2>&1 | FileCheck %s --check-prefix=SHARDED
// RUN: megac-opt %s --split-input-file --megac-set-mesh="mesh=tp=2" --megac-propagate-sharding --megac-set-mesh="mesh=tp=2" | FileCheck %s --check-prefix=SAME

// Tests the grid option's errors.
// SYNTAX: error: invalid grid 'tp4': expected name=size pairs such as 'tp=4' or 'dp=2,tp=4'
// DUP: error: invalid grid 'tp=2,tp=2': mesh_c1: grid axis 'tp' appears more than once
// ZERO: error: invalid grid 'tp=0': mesh_c2: grid axis 'tp' has size 0; sizes must be >= 1
module {
}

// -----

// Tests that a sharded module keeps its grid: its shardings name the
// grid's axes. Setting the same grid again changes nothing.
// SHARDED: error: megac-set-mesh: the module is already sharded on #megac.mesh<tp = 2>; it cannot move to grid 'tp=4' (set the grid on the unsharded model)
// SAME: module attributes {megac.mesh = #megac.mesh<tp = 2>}
// SAME: megac.linear {{.*}}megac.sharding
module {
  func.func @f(%x: tensor<4x16xf32>,
               %w: tensor<16x32xf32> {megac.param = {name = "w", init = "zeros"}, megac.sharding = #megac.sharding<[_, tp]>}) -> tensor<4x32xf32> {
    %0 = megac.linear %x, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32>
    return %0 : tensor<4x32xf32>
  }
}
