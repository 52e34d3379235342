// RUN: megac-opt %s --megac-set-mesh="mesh=tp=4" | FileCheck %s --check-prefix=TP
// RUN: megac-opt %s --megac-set-mesh="mesh=dp=2,tp=4" | FileCheck %s --check-prefix=DPTP
// RUN: megac-opt %s --megac-set-mesh | FileCheck %s --check-prefix=KEEP

// Tests that the grid option becomes the module's #megac.mesh, replacing
// the module's own, axes in the order given; no option keeps the module's.
// TP: module attributes {megac.mesh = #megac.mesh<tp = 4>}
// DPTP: module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 4>}
// KEEP: module attributes {megac.mesh = #megac.mesh<tp = 8>}
module attributes {megac.mesh = #megac.mesh<tp = 8>} {
}
