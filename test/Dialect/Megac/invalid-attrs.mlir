// RUN: megac-opt %s -split-input-file -verify-diagnostics

// Tests mesh_c1: axis names are unique.
// expected-error@+1 {{mesh_c1: grid axis 'tp' appears more than once}}
module attributes {megac.mesh = #megac.mesh<tp = 2, tp = 4>} {}

// -----

// Tests mesh_c2: axis sizes are at least 1.
// expected-error@+1 {{mesh_c2: grid axis 'dp' has size 0; sizes must be >= 1}}
module attributes {megac.mesh = #megac.mesh<dp = 0>} {}

// -----

// Tests mesh_c3: at most 2^24 ranks, also where the product would wrap.
// expected-error@+1 {{mesh_c3: the grid has more than 2^24 (16777216) ranks, a plan's limit}}
module attributes {megac.mesh = #megac.mesh<a = 65536, b = 65536>} {}

// -----

// expected-error@+1 {{mesh_c3: the grid has more than 2^24 (16777216) ranks, a plan's limit}}
module attributes {megac.mesh = #megac.mesh<a = 4611686018427387904, b = 4>} {}

// -----

// Tests mesh_c4: axis names are names, and not '_' (an unsplit dimension).
// expected-error@+1 {{mesh_c4: grid axis name '_' is not a name: a letter or '_' first, then letters, digits and '_' ('_' alone marks an unsplit dimension in #megac.sharding)}}
module attributes {megac.mesh = #megac.mesh<_ = 2>} {}

// -----

// Tests that megac.mesh belongs on a module.
// expected-error@+1 {{megac.mesh must be a #megac.mesh on a module}}
func.func @mesh_on_func() attributes {megac.mesh = #megac.mesh<tp = 2>} {
  return
}

// -----

// Tests sharding_c1: one axis splits at most one dimension.
// expected-error@+1 {{sharding_c1: grid axis 'tp' splits more than one dimension}}
func.func @sharding_c1(%w: tensor<8x8xf32> {megac.sharding = #megac.sharding<[tp, tp]>}) {
  return
}

// -----

// Tests sharding_c1: a partial axis may not also split a dimension.
// expected-error@+1 {{sharding_c1: partial axis 'tp' also splits a dimension or is repeated}}
func.func @sharding_c1_partial(%w: tensor<8x8xf32> {megac.sharding = #megac.sharding<[tp, _], partial = [tp]>}) {
  return
}

// -----

// Tests sharding_c2: one entry per dimension.
// expected-error@+1 {{sharding_c2: argument 0's sharding has 1 entries but its type is 'tensor<8x8xf32>'}}
func.func @sharding_c2(%w: tensor<8x8xf32> {megac.sharding = #megac.sharding<[tp]>}) {
  return
}

// -----

// Tests sharding_c3: arguments are never partial sums.
// expected-error@+1 {{sharding_c3: arguments cannot be partial sums}}
func.func @sharding_c3(%w: tensor<8x8xf32> {megac.sharding = #megac.sharding<[_, _], partial = [tp]>}) {
  return
}

// -----

// Tests param_c1: a parameter needs a name.
// expected-error@+1 {{param_c1: megac.param needs a non-empty 'name'}}
func.func @param_c1(%w: tensor<8xf32> {megac.param = {init = "zeros"}}) {
  return
}

// -----

// Tests param_c2: the init kind must be known.
// expected-error@+1 {{param_c2: parameter 'w' needs init = "normal", "zeros" or "ones"}}
func.func @param_c2(%w: tensor<8xf32> {megac.param = {name = "w", init = "xavier"}}) {
  return
}

// -----

// Tests param_c3: normal init needs a positive standard deviation.
// expected-error@+1 {{param_c3: parameter 'w' with normal init needs a positive, finite 'std'}}
func.func @param_c3(%w: tensor<8xf32> {megac.param = {name = "w", init = "normal"}}) {
  return
}

// -----

// expected-error@+1 {{param_c3: parameter 'w' with normal init needs a positive, finite 'std'}}
func.func @param_c3_inf(%w: tensor<8xf32> {megac.param = {name = "w", init = "normal", std = 0x7FF0000000000000 : f64}}) {
  return
}

// -----

// Tests param_c4: parameters are static f32 tensors.
// expected-error@+1 {{param_c4: parameter 'w' must be a static f32 tensor}}
func.func @param_c4(%w: tensor<?xf32> {megac.param = {name = "w", init = "zeros"}}) {
  return
}

// -----

// Tests param_c5: hf_offset has one non-negative entry per dimension.
// expected-error@+1 {{param_c5: 'hf_offset' of parameter 'w' must be non-negative, one entry per dimension}}
func.func @param_c5(%w: tensor<8x8xf32> {megac.param = {name = "w", init = "zeros", hf_offset = array<i64: 0>}}) {
  return
}

// -----

// Tests param_c6: parameters have no dimension of size 0.
// expected-error@+1 {{param_c6: parameter 'wte' has a dimension of size 0 ('tensor<0x8xf32>'): a parameter holds at least one value}}
func.func @param_c6(%w: tensor<0x8xf32> {megac.param = {name = "wte", init = "zeros"}}) {
  return
}

// -----

// Tests input_c1: inputs are tokens or labels.
// expected-error@+1 {{input_c1: megac.input must be "tokens" or "labels"}}
func.func @input_c1(%ids: tensor<4x8xi32> {megac.input = "images"}) {
  return
}

// -----

// Tests input_c2: inputs are [batch, seq] i32 tensors.
// expected-error@+1 {{input_c2: input 'tokens' must be a [batch, seq] i32 tensor}}
func.func @input_c2(%ids: tensor<4x8xf32> {megac.input = "tokens"}) {
  return
}

// -----

// Tests that unknown megac argument attributes are rejected.
// expected-error@+1 {{unknown megac argument attribute 'megac.weight'}}
func.func @unknown_arg_attr(%w: tensor<8xf32> {megac.weight = 1 : i64}) {
  return
}

// -----

// Tests that a sharding on an op must describe its one result.
func.func @op_sharding_rank(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{sharding_c2: the result's sharding has 1 entries but its type is 'tensor<4x8xf32>'}}
  %0 = megac.gelu %x {megac.sharding = #megac.sharding<[_]>} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests that megac.sharding on an op must be a sharding attribute.
func.func @op_sharding_kind(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{megac.sharding on an op must be a #megac.sharding and the op must have one result}}
  %0 = megac.gelu %x {megac.sharding = "tp"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests that operand shardings come one per operand.
func.func @operand_shardings(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{megac.operand_shardings must hold one #megac.sharding per operand}}
  %0 = megac.gelu %x {megac.operand_shardings = []} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests that an operand's sharding describes each of its dimensions.
func.func @operand_sharding_rank(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{sharding_c2: operand 0's sharding has 3 entries but its type is 'tensor<4x8xf32>'}}
  %0 = megac.gelu %x {megac.operand_shardings = [#megac.sharding<[_, _, tp]>]} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests that unknown megac attributes on ops are rejected.
func.func @unknown_op_attr(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{unknown or malformed megac attribute 'megac.shard'}}
  %0 = megac.gelu %x {megac.shard = 1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

// Tests that an argument sharding must be a #megac.sharding.
// expected-error@+1 {{megac.sharding must be a #megac.sharding on a ranked tensor argument}}
func.func @arg_sharding_kind(%w: tensor<8xf32> {megac.sharding = "tp"}) {
  return
}

// -----

// Tests that megac.param must be a dictionary.
// expected-error@+1 {{param_c1: megac.param must be a dictionary}}
func.func @param_not_dict(%w: tensor<8xf32> {megac.param = "w"}) {
  return
}

// -----

// Tests that megac.train is the schedule dictionary on a module.
// expected-error@+1 {{megac.train must be a dictionary {max_lr, min_lr, warmup_steps, total_steps} on a module}}
module attributes {megac.train = {max_lr = 1.0e-3 : f64}} {}

// -----

// Tests that the learning rates are finite numbers (a NaN one made a plan
// that failed its own check, an "internal error").
// expected-error@+1 {{megac.train: max_lr must be finite and not negative, got nan}}
module attributes {megac.train = {max_lr = 0x7FF8000000000000 : f64, min_lr = 0.0 : f64, warmup_steps = 0 : i64, total_steps = 10 : i64}} {}

// -----

// expected-error@+1 {{megac.train: warmup_steps must not be negative, got -1}}
module attributes {megac.train = {max_lr = 1.0e-3 : f64, min_lr = 0.0 : f64, warmup_steps = -1 : i64, total_steps = 10 : i64}} {}

// -----

// Tests that micro-batches are as many as a plan may hold (2^62 overflowed
// the global batch).
// expected-error@+1 {{megac.micro_batches must be an integer from 1 to 1048576 on a module}}
module attributes {megac.micro_batches = 4611686018427387904 : i64} {}

// -----

// expected-error@+1 {{megac.micro_batches must be an integer from 1 to 1048576 on a module}}
module attributes {megac.micro_batches = 0 : i64} {}

// -----

// Tests that megac.reduce_result lists grid axes.
func.func @reduce_result(%x: tensor<4x8xf32>) {
  // expected-error@+1 {{megac.reduce_result must list grid axes (as strings) on a one-result op}}
  %0 = megac.gelu %x {megac.reduce_result = [1 : i64]} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @bad_stage(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{megac.stage must be a non-empty array of non-negative stage numbers}}
  %y = megac.gelu %x {megac.stage = array<i64: -1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @bad_phase(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{megac.phase must be "forward", "backward" or "step"}}
  %y = megac.gelu %x {megac.phase = "sideways"} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// expected-error @+1 {{megac.pipeline_stages must be a positive integer on a module}}
module attributes {megac.pipeline_stages = 0 : i64} {
}

// -----

func.func @bad_fusion(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{megac.fusion must name a kernel group as "a<number>", "b<number>", "c<number>", "d<number>", "e<number>", "g<number>", "n<number>", "r<number>", "t<number>" or "w<number>"}}
  %y = megac.gelu %x {megac.fusion = "k1"} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
