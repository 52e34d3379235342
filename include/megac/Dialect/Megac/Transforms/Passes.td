//===- Passes.td - megac transformation passes ------------*- tablegen -*-===//
//
// The passes between a model as written (global shapes, annotated weights)
// and per-rank IR ready for plan emission. `megac compile` runs them through
// buildPartitionPipeline(); `megac-opt` runs any one alone.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_TD
#define MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def SetMeshPass : Pass<"megac-set-mesh", "mlir::ModuleOp"> {
  let summary = "Attach the device grid to the module";
  let description = [{
    Parses a grid such as `tp=4` or `dp=2,tp=4` (outermost axis first) and
    stores it as the module's `megac.mesh` attribute, replacing any grid the
    module already had.
  }];
  let options = [
    Option<"mesh", "mesh", "std::string", /*default=*/"\"\"",
           "Grid axes as name=size pairs separated by commas">,
  ];
  let dependentDialects = ["::megac::MegacDialect"];
}

def SpecializeShapesPass : Pass<"megac-specialize-shapes", "mlir::ModuleOp"> {
  // Every megac pass may build megac attributes (shardings) or ops,
  // whether or not the input already loaded the dialect.
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Fix batch and sequence length and infer every static shape";
  let description = [{
    Data inputs (`megac.input`) are `[batch, seq]` token tensors. This pass
    gives them the requested sizes (0 keeps a static size, and a dynamic one
    becomes the default 4 x 64), re-infers every result type in program order
    and updates the function type. Afterwards every value is static. With
    `micro-batches` m > 1 the batch is that of one micro-batch (the batch
    divided by m, which must divide it). Being the first pass over the
    model, it also refuses a function that takes or returns anything but
    ranked tensors (a scalar is `tensor<f32>`), two parameters, or two
    results, of one name, and data inputs split differently.
  }];
  let options = [
    Option<"batch", "batch", "int64_t", /*default=*/"0",
           "Batch size (0: keep the model's, or 4 if it is dynamic)">,
    Option<"seq", "seq", "int64_t", /*default=*/"0",
           "Sequence length (0: keep the model's, or if it is dynamic 64 "
           "or the position table's length, whichever is smaller)">,
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Micro-batches per step: the IR describes one, batch / this rows">,
  ];
}

def PropagateShardingPass : Pass<"megac-propagate-sharding", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Derive the sharding of every value from parameter annotations";
  let description = [{
    Walks each function in program order. Parameters take their
    `megac.sharding` annotation (axes missing from the grid, or of size 1,
    are dropped); data inputs are whole. For every op the pass reads the
    op's sharding rule, gives each factor the axis of an operand that
    splits it (parameters before other operands, parallel factors before
    reduction factors, when they compete for an axis), records the operand
    shardings the op requires
    (`megac.operand_shardings`) and the result's sharding (`megac.sharding`,
    including partial-sum axes produced by split reduction factors or
    carried by linear ops). Function results are required whole.

    Errors: a split that does not divide a dimension, or a block factor
    (attention heads) that the axis does not divide; an op without a
    sharding rule.
  }];
}

def SplitCrossEntropyPass
    : Pass<"megac-split-cross-entropy", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Vocabulary-parallel cross-entropy for split logits";
  let description = [{
    Runs after sharding propagation. Where the logits of `megac.cross_entropy`
    (or of its gradient) arrive split over their vocabulary dimension, as
    behind a vocabulary-parallel output layer, gathering them would move the
    whole `[B, S, V]` tensor. Instead the loss becomes
    `megac.cross_entropy_from_stats` of `megac.cross_entropy_stats` (per
    vocabulary block: the largest logit, the sum of exponentials, the
    label's logit), so only three scalars per token and rank cross the grid,
    in one all-gather; the gradient reuses those statistics and stays split.
    This is Megatron's fused cross-entropy with one collective instead of
    three. Propagation must run again afterwards to shard the new ops.
    A forward plan that returns the logits gathers them anyway, and its
    loss reads that copy; in a differentiated function the returned logits
    serve generation only (training steps skip them), so they do not count.
  }];
}

def InsertCollectivesPass : Pass<"megac-insert-collectives", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Insert the collectives that reconcile shardings";
  let description = [{
    Where a value's sharding differs from what its user requires, inserts
    `megac.all_reduce` (partial to whole), `megac.all_gather` (split to
    whole) and `megac.slice_shard` (whole to split, free). One reshard of a
    value to a given sharding is shared by all users that need it.

    With `regather`, a backward op (one the returned values do not depend
    on) that needs a split value whole gets its own all-gather, right
    before it, instead of sharing the forward pass's: the step keeps the
    split value (1/axis of the bytes) for the backward pass rather than the
    gathered one. That is what Megatron's sequence parallelism does with
    the LayerNorm outputs the weight gradients read: one more all-gather
    per column-parallel product for sbh (34/t) activation bytes per layer.
  }];
  let options = [
    Option<"regather", "regather", "bool", /*default=*/"false",
           "Gather split values again in the backward pass instead of "
           "keeping the forward pass's gathered copy">,
  ];
}

def LocalizeShapesPass : Pass<"megac-localize-shapes", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Rewrite global shapes into per-rank shapes";
  let description = [{
    Divides every split dimension by its axis size, in function signatures
    and results, and rescales attributes that count split things (the number
    of attention heads, cross-entropy blocks) or hold a result's shape
    (`reshape`, `fill`). Collectives change shape accordingly. Marks the
    module `megac.localized`.

    Runs after megac-propagate-sharding and megac-insert-collectives: on a
    grid, an op without shardings, or an operand not as its op requires
    it, is refused (localized, a partial sum would stay partial).
  }];
}

def BucketAllReducesPass : Pass<"megac-bucket-all-reduces", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Fuse the gradient all-reduces of one axis into buckets";
  let description = [{
    Runs on per-rank IR (after megac-localize-shapes, so sizes are real
    bytes). Walking the program in order, each `megac.all_reduce` joins the
    open bucket of its axis; a bucket becomes one `megac.all_reduce_bucket`
    placed just before the first op that reads one of its sums, when it
    reaches `bucket-bytes`, or at the end. As in PyTorch DDP's gradient
    buckets, the sums the backward pass only hands to the optimizer wait
    for their bucket, and activation all-reduces, whose sum the next op
    needs at once, stay single. All-reduces that the returned values depend
    on (the forward pass and its loss) are left alone, so the forward part
    of a training step keeps its own collectives. A bucket of one stays a
    plain all-reduce.
  }];
  let options = [
    Option<"bucketBytes", "bucket-bytes", "int64_t", /*default=*/"25 << 20",
           "Close a bucket once it holds this many bytes (0: no buckets)">,
  ];
}

def SequenceParallelPass
    : Pass<"megac-sequence-parallel", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Split the residual stream on the sequence over tp";
  let description = [{
    Megatron's sequence parallelism. Pins to `[_, axis, _]` (or `[dp,
    axis, _]` when the data inputs split the batch over a `dp` axis: the
    batch stays split), with a
    `megac.sharding_constraint` right where they are produced, every
    LayerNorm input (the residual stream between the blocks) and every
    partial sum entering it (the results of row-parallel products, whose
    weight is split on its contracted dimension, and of the
    vocabulary-parallel embedding); propagation does the rest. LayerNorm, dropout and the residual adds then run on a
    sequence shard. A column-parallel product reads its input whole, so
    it gets an all-gather. A row-parallel product's partial sum meets a
    sequence-split residual, so it gets a reduce-scatter. Each replaces half
    of an all-reduce, and the backward pass gets the conjugates (the
    constraint's gradient is the same constraint). Runs before
    megac-autodiff; does nothing on a grid without the default axis
    (tp); another axis the grid lacks is an error.
  }];
  let options = [
    Option<"axis", "axis", "std::string", /*default=*/"\"tp\"",
           "The tensor-parallel axis the sequence is split over (not the "
           "axis that splits the batch, nor pp; without tp in the grid "
           "the IR stays as it is, another axis the grid lacks is an "
           "error)">,
  ];
}

def AutodiffPass : Pass<"megac-autodiff", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Append the backward pass: gradients of the loss";
  let description = [{
    Reverse-mode differentiation of the model function on global shapes.
    Starting from d(loss)/d(loss) = 1 (the scalar result named `loss`), it
    walks the ops backwards, asks each for its vector-Jacobian product
    (DifferentiableOpInterface) and sums the contributions reaching a value
    in the order they arrive. The gradient of every parameter becomes an
    extra result named `grad:<parameter>` (zeros for unused parameters).
    The model's own results (the logits) stay: `megac-run --generate` reads
    them. A training step does not compute them (the plan marks what only
    they need as generation-only), so they cost no communication there.
    The backward ops are ordinary megac ops: sharding propagation and
    collective insertion treat them like the forward pass. Every shape must
    be static (megac-specialize-shapes runs first): a gradient takes the
    type of the value it belongs to.
  }];
}

def AccumulateMicroBatchesPass
    : Pass<"megac-accumulate-micro-batches", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Gradient accumulation: sum the loss and gradients over micro-batches";
  let description = [{
    Runs after megac-autodiff on a function that describes one micro-batch.
    Wraps the loss (right after it is computed, so the forward part of the
    step stays short) and every `grad:` result in `megac.accumulate`, and
    records `megac.micro_batches` on the module. The plan then runs
    everything up to the last accumulation once per micro-batch and the
    rest (gradient reduction across data-parallel ranks, clipping, AdamW)
    once per step. Each micro-batch's loss is divided by the token count of
    the whole step, so the sums are the step's mean loss and its gradient.
    Every other result computed from the data inputs with their leading
    dimension (the logits) is wrapped in `megac.stack_micro_batches` right
    where it is computed, so that it holds the whole step's rows (unless
    `stack-rows=false`: a training step's logits, which only generation
    reads, and that from micro-batch 0, would cost m times the memory).

    On a pipeline (ops placed on stages) the pass runs even for one
    micro-batch, since the pipeline's schedule needs the per-micro-batch
    part to end somewhere, and a gradient summed from contributions of
    different stages (a tied embedding: the input embedding on the first,
    the output layer on the last) is accumulated per stage and summed once
    per step, not sent between the stages for every micro-batch.
  }];
  let options = [
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Micro-batches per step, at most 2^20 (1: nothing to do, unless "
           "on a pipeline)">,
    Option<"stackRows", "stack-rows", "bool", /*default=*/"true",
           "Stack the other per-row results (the logits) over the "
           "micro-batches">,
  ];
}

def FuseElementwisePass : Pass<"megac-fuse-elementwise", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Group elementwise chains and GEMM epilogues into kernels";
  let description = [{
    Runs on per-rank IR for a GPU target, where every op that is not fused
    is one kernel reading and writing device memory. Marks with
    `megac.fusion = "gK"` a product (`megac.linear`) followed by its bias
    add (a vector added to every row) and a GeLU of the sum: cuBLASLt
    applies both as the GEMM's epilogue. In a bf16 plan the group takes the
    roundings of the sum and of the GeLU (megac-round-after-epilogue has
    made the bias add read the fp32 product and the GeLU the fp32 sum), so
    the epilogue computes exactly what the ops one by one do.
    Where the backward pass keeps the pre-activation for GeLU's gradient,
    the group writes it too, as a second output (cuBLASLt's auxiliary
    output), provided its other readers come after the group. Without a
    GeLU, the residual add after the sum joins the group too: cuBLASLt's
    C operand with beta = 1, the result rounded once. Marks with
    `megac.fusion = "dK"` a product whose only reader is a GeLU gradient
    taking it as the output gradient (the backward pass through that
    GeLU), with the gradient's rounding in a bf16 plan: cuBLASLt's DGELU
    epilogue, the kept GeLU input its auxiliary input. Marks with
    `megac.fusion = "nK"` a LayerNorm's input gradient and the residual
    stream's gradient added to it, with the sum's rounding: the norm
    gradient's row kernel adds it before it stores dx. Marks with
    `megac.fusion = "bK"` a LayerNorm's gain gradient and the column sum
    of the same dy (the bias gradient): one pass over dy. Marks with
    `megac.fusion = "wK"` a product's weight gradient
    (`megac.linear_weight_grad`) and the column sum of its dy (the bias
    gradient): cuBLASLt's BGRADA or BGRADB epilogue sums dy's rows as the
    product reads them. Neither a "bK" nor a "wK" group takes a gradient
    written straight into a micro-batch sum. Marks with
    `megac.fusion = "tK"` the embedding's gradient and the add of another
    gradient of the table to it (a tied embedding's output layer's): the
    embedding gradient's kernel adds it as it writes, in place where
    nothing else reads it. Marks with `megac.fusion = "cK"` a product
    (without a bias) whose only reader adds another tensor of its shape to
    it, with the sum's rounding in a bf16 plan: the product reads the other
    as its C (beta = 1) and writes the sum, no pass over memory for the
    add; where both addends are such products the later takes the earlier
    (the gradient reaching q, k and v's shared input: three products, two
    "c" groups). Marks with
    `megac.fusion = "aK"` an attention's gradient steps of q, k and v (of
    k and v alone where the query's step is rounded otherwise or read
    before the others), with their roundings: one pass of the attention
    kernels. Marks
    with `megac.fusion = "eK"` each chain of elementwise ops (`add`, `mul`,
    `gelu`, `gelu_grad`, `round_bf16`) in which every value but the last
    is read only by the next op of the chain and all have its shape (or
    are a vector broadcast over its rows): the chain becomes one kernel
    that reads the chain's inputs once and writes its result once, such
    as bias + residual add, or the sum of a value's gradient
    contributions. A chain reads at most 32 inputs; a longer one (the
    gradient norm's running sum) becomes several kernels. Marks with
    `megac.fusion = "rK"` a `round_bf16` left outside such a chain and the
    op it rounds, when that op's result has no other reader and its kernel
    can round as it writes (`linear`, `layer_norm`, `layer_norm_grad`,
    `attention`, `attention_grad`, `cross_entropy_grad`, `embedding`): one
    instruction,
    the op with its result rounded, saving the rounding's pass over
    memory. Ops on different pipeline stages or phases are never grouped.
    A group of one op is left alone. Attention, LayerNorm, softmax and
    AdamW are fused kernels already. Only marks; the CUDA plan emitter
    turns each group into a kernel.

    `groups` lists the kinds of group to form, by their letters (default:
    all). A CPU target forms only "a": the CPU backend's attention
    gradient recomputes the probabilities once for all the steps of a
    group, and runs the others op by op anyway.

    Errors: a letter in `groups` that names no kind of group.
  }];
  let options = [
    Option<"groups", "groups", "std::string",
           /*default=*/"megac::kAllFusionGroups.str()",
           "Kinds of group to form, by letter (a, b, c, d, e, g, n, r, t, w)">,
  ];
}

def AssignStagesPass : Pass<"megac-assign-stages", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Place the forward pass on pipeline stages by cost";
  let description = [{
    With a `pp` axis in the grid, splits the model's transformer blocks
    into pp x `virtual-stages` contiguous stages (model chunks) whose
    largest forward-and-backward FLOP count is as small as possible (an
    exact min-max partition, see lib/Pipeline/Partition.cpp): the
    embedding goes with the first block, the final LayerNorm, the output
    layer and the loss with the last. Every op gets `megac.stage` and
    `megac.phase = "forward"`; megac-autodiff places each op of the
    backward pass on the stage of the op it differentiates, and
    megac-pipeline-stages places the rest. Records
    `megac.pipeline_stages` on the module. Does nothing without a `pp`
    axis (or with one of size 1 and one virtual stage).

    Errors: fewer transformer blocks than stages.
  }];
  let options = [
    Option<"virtualStages", "virtual-stages", "int64_t", /*default=*/"1",
           "Model chunks per pipeline rank (interleaved schedules)">,
  ];
}

def PipelineStagesPass : Pass<"megac-pipeline-stages", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Place every op on a stage and insert the stage transfers";
  let description = [{
    Runs on per-rank IR (after megac-localize-shapes) of a module whose
    forward and backward ops megac-assign-stages and megac-autodiff placed.
    Places the ops later passes created: an op runs in the latest phase of
    its operands (forward, backward, or step: once per step, for everything
    that reads a micro-batch sum) on the stage of the last operand of that
    phase (so a running sum moves between stages only with its addends); an update (`adamw`, `assign`) runs on every stage that uses its
    parameter, so a tied embedding is updated identically on the first and
    the last stage; a constant runs wherever it is used. Then, wherever a
    value is used on a stage that does not compute it, inserts one
    `megac.transfer` before its first use there. The plan emitter turns
    those into sends and receives.

    Errors: a per-micro-batch op reading a once-per-step value, or an op
    running once per step reading a per-micro-batch value that no
    accumulation sums (both mean a pass before this one went wrong).
  }];
}

def MixedPrecisionPass : Pass<"megac-mixed-precision", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "bf16 compute with fp32 master weights, by rounding";
  let description = [{
    Makes the program compute what a bf16 mixed-precision program does, on
    any backend: `megac.round_bf16` after each parameter (its bf16 compute
    copy; the f32 parameter stays the master the optimizer updates) and
    after every op that produces an activation or an activation gradient
    (products, adds, GeLU, LayerNorm, attention, softmax, dropout,
    embeddings and their backward ops). Kernels accumulate in f32 or wider,
    as tensor cores do. Stays f32: the loss and its statistics, weight
    gradients (the weight-gradient ops' results, their sums, and products
    only a token sum reads: Megatron's fp32 main gradients), norms, and
    everything of the optimizer. Runs after
    megac-autodiff (and micro-batch accumulation), before
    megac-apply-optimizer.
  }];
}

def RoundAfterEpiloguePass : Pass<"megac-round-after-epilogue", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "bf16: a product's (or norm gradient's) epilogue before its rounding";
  let description = [{
    Runs on a bf16 program after megac-insert-collectives. Where a product
    (`megac.linear`) is rounded and the rounding's only reader adds a bias
    (a vector over the rows) to it, the rounding goes: the bias is added to
    the fp32 product and the sum rounded once, as a GEMM's epilogue (and
    PyTorch's `addmm`) computes it. A GeLU of that sum reads the fp32 sum;
    the rounded sum stays what every other reader (the backward pass's
    GeLU gradient) reads. Where the rounded sum's only reader adds a
    residual (a tensor of its shape: a projection's output joining the
    residual stream) and is rounded, that rounding goes too: the residual
    is added to the fp32 sum and rounded once, as a GEMM that takes the
    residual as its C operand computes it. Every target computes these
    numbers, so a CPU plan and a GPU plan (where megac-fuse-elementwise
    makes each such group one cuBLASLt product) agree bit for bit on the
    CPU backend. A product
    whose partial sums are reduced across ranks (a collective between it
    and its bias add) keeps its rounding: each rank rounds its part, as a
    bf16 program does. Likewise a rounded product whose only reader is a
    GeLU gradient taking it as the output gradient (the backward pass
    through fc1's GeLU, whose result is rounded): the gradient reads the
    fp32 product, as cuBLASLt's `DGELU` epilogue does. And a rounded
    LayerNorm gradient whose only reader adds the residual stream's
    gradient to it (a tensor of its shape), the sum rounded: the sum reads
    the fp32 norm gradient, as the norm gradient's kernel adds the residual
    before its one rounding. And a rounded product whose only reader adds
    another tensor of its shape to it, the sum rounded, where the product
    takes that tensor as its C (not where the other is itself a product
    with a bias, a LayerNorm gradient or the embedding's gradient that
    would add the product in its own group; of two bias-less products the
    later takes the earlier): the sum reads the fp32 product, as a GEMM
    with beta = 1 adds C before its one rounding (the gradient reaching q,
    k and v's shared input, a sum of three products).
  }];
}

def RecomputePass : Pass<"megac-recompute", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Activation recomputation: keep less, compute the forward twice";
  let description = [{
    Runs right after megac-autodiff. With `mode=full` only each
    transformer block's input (the residual stream entering the LayerNorm
    that leads to attention), the parameters and the data are kept from the
    forward to the backward pass. The first backward
    op that reads any other forward value gets the ops producing it cloned
    right before it, from the kept values. Each forward op is recomputed at
    most once. The backward pass visits the layers in reverse, so a layer is
    recomputed just before its backward and its values die right after.
    Dropout masks are keyed by position, so the recomputed forward draws
    the same ones and the step does not change.

    `mode=selective` (Korthikanti et al.: recompute the attention scores,
    softmax and dropout) is what megac always does: the fused attention op
    keeps only q, k and v and recomputes its probabilities in the backward
    op. `none` and `selective` leave the IR unchanged.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"none\"",
           "none, selective or full">,
  ];
}

def ApplyOptimizerPass : Pass<"megac-apply-optimizer", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Turn gradient results into in-place AdamW updates";
  let description = [{
    Consumes the `grad:<parameter>` results of megac-autodiff: optionally
    computes the global gradient norm (sum of squares over all gradients;
    tensor-parallel ones first, so their partial sums meet one all-reduce)
    and its clipping coefficient, then updates every parameter with
    `megac.adamw` (weight decay on parameters of rank >= 2 only, not on
    biases and LayerNorm gains) and removes the gradient results. The
    learning-rate schedule is stored on the module as `megac.train` for the
    plan.

    With `zero-stage=1` each parameter that has a dimension free of other
    splits and divisible by the `zero-axis` size is updated in slices:
    sharding constraints make its gradient reduce-scattered and the
    parameter sliced over that axis, megac.adamw updates the slice (so its
    moments are sharded too), and the updated slices are gathered and
    assigned back (megac.assign). Other parameters are updated whole.
  }];
  let options = [
    Option<"lr", "lr", "double", /*default=*/"6.0e-4", "Peak learning rate">,
    Option<"minLr", "min-lr", "double", /*default=*/"6.0e-5",
           "Learning rate at the end of the cosine decay">,
    Option<"warmupSteps", "warmup-steps", "int64_t", /*default=*/"10",
           "Linear warm-up steps">,
    Option<"totalSteps", "total-steps", "int64_t", /*default=*/"1000",
           "Step at which the cosine decay reaches min-lr">,
    Option<"beta1", "beta1", "double", /*default=*/"0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", /*default=*/"0.95", "AdamW beta2">,
    Option<"epsilon", "epsilon", "double", /*default=*/"1.0e-8", "AdamW epsilon">,
    Option<"weightDecay", "weight-decay", "double", /*default=*/"0.1",
           "Decoupled weight decay for matrices">,
    Option<"maxGradNorm", "max-grad-norm", "double", /*default=*/"1.0",
           "Global gradient-norm clipping threshold (0: off)">,
    Option<"zeroStage", "zero-stage", "int64_t", /*default=*/"0",
           "1: shard the optimizer state over the data-parallel axis "
           "(ZeRO stage 1)">,
    Option<"zeroAxis", "zero-axis", "std::string", /*default=*/"\"dp\"",
           "The data-parallel axis that ZeRO shards over (the axis that "
           "splits the batch; not one that splits a weight, nor pp; "
           "without dp in the grid the update stays whole, another axis "
           "the grid lacks is an error)">,
  ];
}

def DisableDropoutPass : Pass<"megac-disable-dropout", "mlir::ModuleOp"> {
  let dependentDialects = ["::megac::MegacDialect"];
  let summary = "Remove dropout (inference)";
  let description = [{
    Replaces every megac.dropout by its input and turns attention's
    probability dropout off. `megac compile` runs it for forward (inference)
    plans; training and gradient plans keep dropout.
  }];
}

#endif // MEGAC_DIALECT_MEGAC_TRANSFORMS_PASSES_TD
