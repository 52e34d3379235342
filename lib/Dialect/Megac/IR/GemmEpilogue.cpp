//===- GemmEpilogue.cpp - A product and the epilogue it takes -------------===//

#include "megac/Dialect/Megac/IR/GemmEpilogue.h"

using namespace mlir;

namespace megac {

Operation *soleUser(Value value) {
  return value.hasOneUse() ? *value.getUsers().begin() : nullptr;
}

bool addsBias(AddOp add, Value product) {
  auto bias = cast<RankedTensorType>(add.getRhs().getType());
  auto type = cast<RankedTensorType>(product.getType());
  return add.getLhs() == product && bias.getRank() == 1 &&
         type.getRank() >= 1 && bias.getDimSize(0) == type.getShape().back() &&
         add.getType() == type;
}

Value residualOf(AddOp add, Value sum) {
  if (add.getLhs() == add.getRhs() || add.getType() != sum.getType())
    return {};
  Value other = add.getLhs() == sum   ? add.getRhs()
                : add.getRhs() == sum ? add.getLhs()
                                      : Value();
  return other && other.getType() == sum.getType() ? other : Value();
}

// (Op handles are values whose accessors are not const: copies call them.)

/// \p rounding's result where there is one, else \p op's (its only one).
static Value roundedOr(RoundBf16Op rounding, Operation *op) {
  return rounding ? Value(rounding.getResult()) : Value(op->getResult(0));
}

bool GemmEpilogue::rounded() const {
  return static_cast<bool>(sumRound) || static_cast<bool>(geluRound) ||
         static_cast<bool>(residualRound);
}

Value GemmEpilogue::preActivation() const { return roundedOr(sumRound, add); }

Value GemmEpilogue::result() const {
  if (gelu)
    return roundedOr(geluRound, gelu);
  if (residual)
    return roundedOr(residualRound, residual);
  return preActivation();
}

Value GemmEpilogue::residualInput() const {
  AddOp residualSum = residual, sum = add;
  return residualSum ? residualOf(residualSum, sum.getResult()) : Value();
}

bool GemmEpilogue::keepsPreActivation() const {
  if (!gelu)
    return false;
  Value pre = preActivation();
  // Rounded, the GeLU reads the fp32 sum: any reader of the rounded one is
  // outside. Not rounded, the GeLU is one reader of the sum.
  return sumRound ? !pre.use_empty() : !pre.hasOneUse();
}

/// The ops of \p members that are there (not null), in order.
static SmallVector<Operation *, 5> present(ArrayRef<OpState> members) {
  SmallVector<Operation *, 5> out;
  for (OpState op : members)
    if (op)
      out.push_back(op.getOperation());
  return out;
}

SmallVector<Operation *, 5> GemmEpilogue::ops() const {
  return present({OpState(linear), OpState(add), OpState(sumRound),
                  OpState(residual), OpState(residualRound), OpState(gelu),
                  OpState(geluRound)});
}

std::optional<GemmEpilogue>
matchGemmEpilogue(LinearOp linear, function_ref<bool(Operation *)> admissible) {
  GemmEpilogue g;
  g.linear = linear;
  Value product = linear.getResult();
  g.add = dyn_cast_or_null<AddOp>(soleUser(product));
  if (!g.add || !admissible(g.add) || !addsBias(g.add, product))
    return std::nullopt;
  // The sum's readers: its rounding, a GeLU, others (fp32: the backward
  // pass's).
  Value sum = g.add.getResult();
  RoundBf16Op sumRound;
  GeluOp gelu;
  bool others = false;
  for (Operation *user : sum.getUsers()) {
    if (auto r = dyn_cast<RoundBf16Op>(user); r && !sumRound && admissible(r))
      sumRound = r;
    else if (auto act = dyn_cast<GeluOp>(user); act && !gelu && admissible(act))
      gelu = act;
    else
      others = true;
  }
  if (!gelu) {
    // The rounded sum, its rounding the only reader; or the fp32 sum.
    if (sumRound && others)
      return std::nullopt;
    g.sumRound = sumRound;
    // The fp32 sum's only reader adds a residual to it (the projections'
    // output joining the residual stream): cuBLASLt's C, the residual sum
    // rounded in a bf16 plan.
    auto residual = dyn_cast_or_null<AddOp>(soleUser(sum));
    if (sumRound || !residual || !admissible(residual) ||
        !residualOf(residual, sum))
      return g;
    g.residual = residual;
    if (auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(residual.getResult()));
        r && admissible(r))
      g.residualRound = r;
    return g;
  }
  RoundBf16Op geluRound;
  if (auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(gelu.getResult()));
      r && admissible(r))
    geluRound = r;
  Operation *last = geluRound ? geluRound.getOperation() : gelu.getOperation();
  // Whether every reader of \p value but \p except follows the group.
  auto after = [&](Value value, Operation *except) {
    return llvm::all_of(value.getUsers(), [&](Operation *user) {
      return user == except || (user->getBlock() == last->getBlock() &&
                                last->isBeforeInBlock(user));
    });
  };
  if (geluRound) {
    // bf16: the GeLU reads the fp32 sum, which nothing else may read; the
    // rounded sum (the backward pass's) is read after the group.
    if (others || (sumRound && !after(sumRound.getResult(), nullptr)))
      return std::nullopt;
    g.sumRound = sumRound;
  } else {
    // fp32: the sum's other readers follow the group, else the GeLU
    // stays a kernel of its own.
    if (sumRound)
      return std::nullopt;
    if (!after(sum, gelu))
      return g;
  }
  g.gelu = gelu;
  g.geluRound = geluRound;
  return g;
}

Value GemmGeluGrad::result() const { return roundedOr(round, grad); }

SmallVector<Operation *, 5> GemmGeluGrad::ops() const {
  return present({OpState(linear), OpState(grad), OpState(round)});
}

std::optional<GemmGeluGrad>
matchGemmGeluGrad(LinearOp linear, function_ref<bool(Operation *)> admissible) {
  GemmGeluGrad g;
  g.linear = linear;
  Value product = linear.getResult();
  g.grad = dyn_cast_or_null<GeluGradOp>(soleUser(product));
  if (!g.grad || !admissible(g.grad) || g.grad.getOutputGrad() != product ||
      g.grad.getInput() == product ||
      g.grad.getInput().getType() != product.getType())
    return std::nullopt;
  if (auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(g.grad.getResult()));
      r && admissible(r))
    g.round = r;
  return g;
}

/// The op that makes \p value for \p add alone: its defining op, or the
/// op a rounding read by \p add alone rounds (null: none, or read
/// elsewhere too).
static Operation *makerFor(AddOp add, Value value) {
  if (!value.hasOneUse() || soleUser(value) != add.getOperation())
    return nullptr;
  Operation *def = value.getDefiningOp();
  if (auto round = dyn_cast_or_null<RoundBf16Op>(def))
    def = round.getInput().hasOneUse() ? round.getInput().getDefiningOp()
                                       : nullptr;
  return def;
}

bool takesAddendAsC(AddOp add, Value product) {
  Value other = residualOf(add, product);
  if (!other)
    return false;
  Operation *maker = makerFor(add, other);
  if (!maker)
    return true; // read elsewhere too, or an argument: only a C
  if (auto sum = dyn_cast<AddOp>(maker)) {
    // A product with its bias, its rounding not yet taken away (by
    // megac-round-after-epilogue, in whichever order it meets the two):
    // the add is a "g" group's residual add.
    Value product = sum.getLhs();
    if (auto round = product.getDefiningOp<RoundBf16Op>();
        round && product.hasOneUse())
      product = round.getInput();
    return !isa_and_nonnull<LinearOp>(product.getDefiningOp()) ||
           !addsBias(sum, sum.getLhs());
  }
  if (isa<LayerNormGradOp, EmbeddingGradOp>(maker))
    return false; // an "n" or "t" group's
  if (auto earlier = dyn_cast<LinearOp>(maker)) {
    Operation *self = product.getDefiningOp();
    if (auto round = dyn_cast_or_null<RoundBf16Op>(self))
      self = round.getInput().getDefiningOp();
    return self && earlier->getBlock() == self->getBlock() &&
           earlier->isBeforeInBlock(self);
  }
  return true;
}

Value GemmAccumulate::into() const {
  AddOp sum = add;
  LinearOp product = linear;
  return residualOf(sum, product.getResult());
}

Value GemmAccumulate::result() const { return roundedOr(round, add); }

SmallVector<Operation *, 5> GemmAccumulate::ops() const {
  return present({OpState(linear), OpState(add), OpState(round)});
}

std::optional<GemmAccumulate>
matchGemmAccumulate(LinearOp linear,
                    function_ref<bool(Operation *)> admissible) {
  GemmAccumulate g;
  g.linear = linear;
  Value product = linear.getResult();
  g.add = dyn_cast_or_null<AddOp>(soleUser(product));
  if (!g.add || !admissible(g.add) || !takesAddendAsC(g.add, product))
    return std::nullopt;
  if (auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(g.add.getResult()));
      r && admissible(r))
    g.round = r;
  return g;
}

Value NormGradResidual::result() const { return roundedOr(round, add); }

Value NormGradResidual::residualInput() const {
  AddOp sum = add;
  LayerNormGradOp norm = grad;
  return residualOf(sum, norm.getResult());
}

SmallVector<Operation *, 5> NormGradResidual::ops() const {
  return present({OpState(grad), OpState(add), OpState(round)});
}

std::optional<NormGradResidual>
matchNormGradResidual(LayerNormGradOp grad,
                      function_ref<bool(Operation *)> admissible) {
  NormGradResidual g;
  g.grad = grad;
  g.add = dyn_cast_or_null<AddOp>(soleUser(grad.getResult()));
  if (!g.add || !admissible(g.add) || !residualOf(g.add, grad.getResult()))
    return std::nullopt;
  if (auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(g.add.getResult()));
      r && admissible(r))
    g.round = r;
  return g;
}

/// Two ops of one block, in program order.
static SmallVector<Operation *, 5> inProgramOrder(Operation *a, Operation *b) {
  if (b->isBeforeInBlock(a))
    std::swap(a, b);
  return {a, b};
}

SmallVector<Operation *, 5> NormParamGrads::ops() const {
  return inProgramOrder(OpState(gain).getOperation(),
                        OpState(bias).getOperation());
}

/// Whether \p op's result is summed over micro-batches by an accumulate
/// that is its only reader (the plan writes it straight into the sum).
static bool intoMicroBatchSum(Operation *op) {
  return isa_and_nonnull<AccumulateOp>(soleUser(op->getResult(0)));
}

/// The column sum (sum_leading keeping the last dimension, \p want's
/// type) of \p dy that \p admissible accepts, in \p first's block and
/// not a micro-batch sum's, such that the readers of whichever of \p
/// first and it comes first all follow the other (where the one
/// instruction is); null where there is none.
static SumLeadingOp
columnSumBeside(Operation *first, Value dy, Type want,
                function_ref<bool(Operation *)> admissible) {
  if (cast<RankedTensorType>(dy.getType()).getRank() < 1 ||
      intoMicroBatchSum(first))
    return {};
  for (Operation *user : dy.getUsers()) {
    auto bias = dyn_cast<SumLeadingOp>(user);
    if (!bias || bias.getInput() != dy || bias.getKeep() != 1 ||
        bias.getType() != want || bias->getBlock() != first->getBlock() ||
        intoMicroBatchSum(bias) || !admissible(bias))
      continue;
    Operation *early = first, *late = bias;
    if (late->isBeforeInBlock(early))
      std::swap(early, late);
    if (llvm::all_of(early->getResult(0).getUsers(), [&](Operation *reader) {
          return reader->getBlock() == late->getBlock() &&
                 late->isBeforeInBlock(reader);
        }))
      return bias;
  }
  return {};
}

std::optional<NormParamGrads>
matchNormParamGrads(LayerNormGainGradOp gain,
                    function_ref<bool(Operation *)> admissible) {
  if (SumLeadingOp bias = columnSumBeside(gain, gain.getOutputGrad(),
                                          gain.getType(), admissible))
    return NormParamGrads{gain, bias};
  return std::nullopt;
}

SmallVector<Operation *, 5> WeightBiasGrads::ops() const {
  return inProgramOrder(OpState(weight).getOperation(),
                        OpState(bias).getOperation());
}

std::optional<WeightBiasGrads>
matchWeightBiasGrads(LinearWeightGradOp weight,
                     function_ref<bool(Operation *)> admissible) {
  Value dy = weight.getOutputGrad();
  auto type = cast<RankedTensorType>(dy.getType());
  if (type.getRank() < 1)
    return std::nullopt;
  auto want =
      RankedTensorType::get({type.getShape().back()}, type.getElementType());
  if (SumLeadingOp bias = columnSumBeside(weight, dy, want, admissible))
    return WeightBiasGrads{weight, bias};
  return std::nullopt;
}

Value EmbeddingGradInto::into() const {
  return residualOf(add, OpState(grad)->getResult(0));
}

bool EmbeddingGradInto::inPlace() const {
  Value other = into();
  Operation *def = other.getDefiningOp();
  return other.hasOneUse() && def &&
         def->getBlock() == OpState(add)->getBlock();
}

SmallVector<Operation *, 5> EmbeddingGradInto::ops() const {
  return present({OpState(grad), OpState(add)});
}

std::optional<EmbeddingGradInto>
matchEmbeddingGradInto(EmbeddingGradOp grad,
                       function_ref<bool(Operation *)> admissible) {
  auto add = dyn_cast_or_null<AddOp>(soleUser(grad.getResult()));
  if (!add || !admissible(add) || !residualOf(add, grad.getResult()))
    return std::nullopt;
  return EmbeddingGradInto{grad, add};
}

SmallVector<Value, 3> AttentionInputGrads::results() const {
  SmallVector<Value, 3> out;
  if (query)
    out.push_back(roundedOr(queryRound, query));
  out.push_back(roundedOr(keyRound, key));
  out.push_back(roundedOr(valueRound, value));
  return out;
}

SmallVector<Operation *, 6> AttentionInputGrads::ops() const {
  SmallVector<Operation *, 6> out;
  for (Operation *op :
       present({OpState(query), OpState(queryRound), OpState(key),
                OpState(keyRound), OpState(value), OpState(valueRound)}))
    out.push_back(op);
  llvm::sort(out,
             [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return out;
}

std::optional<AttentionInputGrads>
matchAttentionInputGrads(AttentionGradOp key,
                         function_ref<bool(Operation *)> admissible) {
  if (key.getOperand() != 1)
    return std::nullopt;
  // The rounding that is a step's result's only reader, where admissible.
  auto roundingOf = [&](AttentionGradOp step) {
    auto r = dyn_cast_or_null<RoundBf16Op>(soleUser(step.getResult()));
    return r && admissible(r) ? r : RoundBf16Op();
  };
  // Another step of the key's attention: the gradient of its input
  // \p operand.
  auto stepOf = [&](unsigned operand) -> AttentionGradOp {
    for (Operation *user : key.getOutputGrad().getUsers()) {
      auto step = dyn_cast<AttentionGradOp>(user);
      if (step && step.getOperand() == operand && step != key &&
          llvm::equal(step->getOperands(), key->getOperands()) &&
          step.getNumHeads() == key.getNumHeads() &&
          step.getCausal() == key.getCausal() &&
          step.getDropout() == key.getDropout() &&
          step.getStream() == key.getStream() &&
          step->getBlock() == key->getBlock() && admissible(step))
        return step;
    }
    return AttentionGradOp();
  };
  // Every result the group writes is read after its last op, where the
  // one instruction is.
  auto wellFormed = [](const AttentionInputGrads &g) {
    SmallVector<Operation *, 6> members = g.ops();
    Operation *last = members.back();
    return llvm::all_of(members, [&](Operation *op) {
      return llvm::all_of(op->getResult(0).getUsers(), [&](Operation *reader) {
        return llvm::is_contained(members, reader) ||
               (reader->getBlock() == last->getBlock() &&
                last->isBeforeInBlock(reader));
      });
    });
  };
  AttentionGradOp value = stepOf(2);
  if (!value)
    return std::nullopt;
  AttentionInputGrads g;
  g.key = key;
  g.value = value;
  g.keyRound = roundingOf(key);
  g.valueRound = roundingOf(value);
  if (static_cast<bool>(g.keyRound) != static_cast<bool>(g.valueRound))
    return std::nullopt;
  if (AttentionGradOp query = stepOf(0)) {
    AttentionInputGrads all = g;
    all.query = query;
    all.queryRound = roundingOf(query);
    if (static_cast<bool>(all.queryRound) == static_cast<bool>(g.keyRound) &&
        wellFormed(all))
      return all;
  }
  if (wellFormed(g))
    return g;
  return std::nullopt;
}

} // namespace megac
