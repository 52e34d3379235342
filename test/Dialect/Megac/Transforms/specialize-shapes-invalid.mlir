// RUN: megac-opt %s --split-input-file --megac-specialize-shapes="seq=256" -verify-diagnostics

// Tests that re-inference re-checks rules against the new sizes: 256
// positions do not fit a 128-row table.
func.func @too_long(%wpe: tensor<128x32xf32>, %ids: tensor<?x?xi32> {megac.input = "tokens"}) -> tensor<?x32xf32> {
  // expected-error@+1 {{position_embedding_c2: sequence length 256 exceeds the 128 positions of the table}}
  %0 = megac.position_embedding %wpe, %ids : (tensor<128x32xf32>, tensor<?x?xi32>) -> tensor<?x32xf32>
  return %0 : tensor<?x32xf32>
}

// -----

// Tests that only data inputs may be dynamic.
// expected-error@+1 {{argument 0 has a dynamic shape; only megac.input data may}}
func.func @dynamic_param(%w: tensor<?x32xf32>) {
  return
}

// -----

// Tests that two parameters of one name are refused: checkpoints and
// --weights find a parameter by its name.
// expected-error@+1 {{parameter name 'b' is given to arguments 0 and 1; each parameter needs its own}}
func.func @same_param(%a: tensor<8xf32> {megac.param = {name = "b", init = "zeros"}},
                      %b: tensor<8xf32> {megac.param = {name = "b", init = "zeros"}}) {
  return
}

// -----

// Tests that two results of one name are refused: --save-outputs would
// keep one of them.
// expected-error@+1 {{result name 'y' is given to results 0 and 1; each output needs its own}}
func.func @same_result(%a: tensor<8xf32> {megac.param = {name = "a", init = "zeros"}}) -> (tensor<8xf32> {megac.name = "y"}, tensor<8xf32> {megac.name = "y"}) {
  return %a, %a : tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that data inputs must be split alike: each rank reads the same
// rows of every input. (`_`, no sharding and an axis of one rank are
// alike: whole.)
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 1>} {
// expected-error@+1 {{data inputs must be split alike (each rank reads the same rows of every input): argument 0 is split [dp, _] but argument 1 [_, _]}}
func.func @inputs_apart(%ids: tensor<?x?xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>},
                        %lab: tensor<?x?xi32> {megac.input = "labels", megac.sharding = #megac.sharding<[tp, _]>}) {
  return
}
}

// -----

// Tests that inputs alike pass: `_`, no sharding and dp of one rank.
module attributes {megac.mesh = #megac.mesh<dp = 1, tp = 2>} {
func.func @inputs_alike(%ids: tensor<?x?xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>},
                        %lab: tensor<?x?xi32> {megac.input = "labels"}) {
  return
}
}

// -----

// Tests that a weight is not split over an axis that splits the data: each
// dp rank looked its own tokens up in its own half of the vocabulary, and
// the sum of the halves mixed two ranks' rows (a wrong loss, silently).
module attributes {megac.mesh = #megac.mesh<dp = 2, tp = 2>} {
// expected-error@+1 {{parameter 'wte' is split over grid axis 'dp', which splits the data (input 'tokens'): an axis splits either the batch, each rank with its own rows and the weights whole (as dp), or the weights, every rank with the same rows (as tp)}}
func.func @weight_on_data_axis(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "zeros"}, megac.sharding = #megac.sharding<[dp, _]>},
                               %ids: tensor<?x?xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>}) {
  return
}
}

// -----

// Tests that the same weight on tp, which splits no input, passes, and so
// does dp of one rank.
module attributes {megac.mesh = #megac.mesh<dp = 1, tp = 2>} {
func.func @weight_on_model_axis(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "zeros"}, megac.sharding = #megac.sharding<[tp, _]>},
                                %w: tensor<64x16xf32> {megac.param = {name = "w", init = "zeros"}, megac.sharding = #megac.sharding<[dp, _]>},
                                %ids: tensor<?x?xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[dp, _]>}) {
  return
}
}

// -----

// Tests that nothing is split over pp, which splits the layers into
// stages (a weight split over it once left the ranks' pipeline transfers
// unmatched, an internal error of the emitted plan).
module attributes {megac.mesh = #megac.mesh<pp = 2>} {
// expected-error@+1 {{parameter 'wte' is split over grid axis 'pp', which splits the layers into pipeline stages; no tensor is split over it}}
func.func @weight_on_pp(%wte: tensor<64x16xf32> {megac.param = {name = "wte", init = "zeros"}, megac.sharding = #megac.sharding<[pp, _]>},
                        %ids: tensor<?x?xi32> {megac.input = "tokens"}) {
  return
}
}

// -----

module attributes {megac.mesh = #megac.mesh<pp = 2>} {
// expected-error@+1 {{input 'tokens' is split over grid axis 'pp', which splits the layers into pipeline stages; no tensor is split over it}}
func.func @input_on_pp(%ids: tensor<?x?xi32> {megac.input = "tokens", megac.sharding = #megac.sharding<[pp, _]>}) {
  return
}
}

// -----

// Tests that an unnamed result's name in the plan (output<i>) counts: a
// result named so would be a second output0.
// expected-error@+1 {{result name 'output0' is given to results 0 and 1; each output needs its own (an unnamed result is output<i> in the plan)}}
func.func @default_name(%a: tensor<8xf32> {megac.param = {name = "a", init = "zeros"}}) -> (tensor<8xf32>, tensor<8xf32> {megac.name = "output0"}) {
  return %a, %a : tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that a result may not take the name --save-outputs gives a data
// input (the saved file kept only one "tokens").
// expected-error@+1 {{result name 'labels' (result 1) is the name --save-outputs gives the input labels; name the result otherwise}}
func.func @input_name(%a: tensor<8xf32> {megac.param = {name = "a", init = "zeros"}}) -> (tensor<8xf32> {megac.name = "y"}, tensor<8xf32> {megac.name = "labels"}) {
  return %a, %a : tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that names hold no control characters: a NUL cut "w\00x" to
// "w" in the plan, beside a parameter "w".
// expected-error@+1 {{parameter name 'w\00x' (argument 1) holds a control character; names key tensors in plans, checkpoints and safetensors files and must be printable UTF-8}}
func.func @nul_name(%a: tensor<8xf32> {megac.param = {name = "w", init = "zeros"}},
                    %b: tensor<8xf32> {megac.param = {name = "w\00x", init = "zeros"}}) {
  return
}

// -----

// Tests that names are UTF-8: a checkpoint's header made "w\FE" and
// "w\FF" both "w" and U+FFFD, and the checkpoint never loaded again.
// expected-error@+1 {{parameter name 'w\FF' (argument 0) is not valid UTF-8; names key tensors}}
func.func @utf8_name(%a: tensor<8xf32> {megac.param = {name = "w\FF", init = "zeros"}}) {
  return
}

// -----

// expected-error@+1 {{result name 'y\0A' (result 0) holds a control character}}
func.func @newline_result(%a: tensor<8xf32> {megac.param = {name = "a", init = "zeros"}}) -> (tensor<8xf32> {megac.name = "y\0A"}) {
  return %a : tensor<8xf32>
}

// -----

// Tests that each kind of data input is one argument's (two "tokens" and
// no labels once compiled, both filled with the same tokens).
// expected-error@+1 {{input name 'tokens' is given to arguments 0 and 1; each input needs its own}}
func.func @tokens_twice(%a: tensor<?x?xi32> {megac.input = "tokens"},
                        %b: tensor<?x?xi32> {megac.input = "tokens"}) {
  return
}

// -----

// Tests that a data input of 0 rows written in the model is refused here,
// by name (the finished plan's check once called it an internal error).
// expected-error@+1 {{input 'tokens' has 0 rows; give the model's size, or --batch and --seq}}
func.func @empty_batch(%ids: tensor<0x?xi32> {megac.input = "tokens"}) {
  return
}

// -----

// Tests that a function of scalars is refused with a message (it crashed
// the pass): megac functions take and return ranked tensors.
// expected-error@+1 {{argument 0 has type 'f32': megac functions take and return ranked tensors only (a scalar is a rank-0 tensor, e.g. tensor<f32>)}}
func.func @scalar_argument(%a: f32) {
  return
}

// -----

// expected-error@+1 {{result 0 has type 'i32': megac functions take and return ranked tensors only}}
func.func @scalar_result(%a: tensor<i32>) -> i32 {
  %0 = builtin.unrealized_conversion_cast %a : tensor<i32> to i32
  return %0 : i32
}

// -----

// Tests that data inputs stating different sizes are refused (they share
// one batch and sequence; --seq, given here, sets the sequence for all).
// expected-error@+1 {{input 'tokens' has 2 rows but input 'labels' 3; the data inputs share one batch and sequence (--batch sets it for all)}}
func.func @inputs_disagree(%wte: tensor<16x8xf32> {megac.param = {name = "wte", init = "zeros"}},
                           %ids: tensor<2x6xi32> {megac.input = "tokens"},
                           %labels: tensor<3x5xi32> {megac.input = "labels"}) -> tensor<2x6x8xf32> {
  %x = megac.embedding %wte, %ids : (tensor<16x8xf32>, tensor<2x6xi32>) -> tensor<2x6x8xf32>
  return %x : tensor<2x6x8xf32>
}
