// RUN: megac-opt %s --megac-insert-collectives -verify-diagnostics

// Tests that an operand required partial that is not (shardings gone stale:
// an op added after megac-propagate-sharding) is refused, naming the cure.
module attributes {megac.mesh = #megac.mesh<tp = 2>} {
  func.func @stale(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %0 = megac.gelu %x {megac.operand_shardings = [#megac.sharding<[_, _]>], megac.sharding = #megac.sharding<[_, _]>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    // expected-error@+1 {{'megac.add' op operand 0 is required partial over 'tp' but is not: the shardings are stale (ops added after megac-propagate-sharding? run it again)}}
    %1 = megac.add %0, %0 {megac.operand_shardings = [#megac.sharding<[_, _], partial = [tp]>, #megac.sharding<[_, _], partial = [tp]>], megac.sharding = #megac.sharding<[_, _], partial = [tp]>} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    return %1 : tensor<4x16xf32>
  }
}
