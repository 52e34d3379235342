// RUN: megac-opt %s --megac-localize-shapes -verify-diagnostics

// Tests that localizing twice is refused (shapes would shrink again).
// expected-error@+1 {{the module is already localized}}
module attributes {megac.localized, megac.mesh = #megac.mesh<tp = 2>} {
}
