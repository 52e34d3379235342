// RUN: not megac-opt %s --megac-set-mesh="mesh=tp4" 2>&1 | FileCheck %s --check-prefix=SYNTAX
// RUN: not megac-opt %s --megac-set-mesh="mesh=tp=2,tp=2" 2>&1 | FileCheck %s --check-prefix=DUP
// RUN: not megac-opt %s --megac-set-mesh="mesh=tp=0" 2>&1 | FileCheck %s --check-prefix=ZERO

// Tests the grid option's errors.
// SYNTAX: error: invalid grid 'tp4': expected name=size pairs such as 'tp=4' or 'dp=2,tp=4'
// DUP: error: invalid grid 'tp=2,tp=2': mesh_c1: grid axis 'tp' appears more than once
// ZERO: error: invalid grid 'tp=0': mesh_c2: grid axis 'tp' has size 0; sizes must be >= 1
module {
}
