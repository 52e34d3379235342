//===- PropagateSharding.cpp - Derive every value's sharding --------------===//
//
// Forward propagation over op sharding rules. For each op, each factor takes
// the grid axis of an operand that splits it (if that axis is still free in
// the op and divides the factor; parameters and parallel factors choose
// first); operands are then required in the
// sharding the chosen factors imply, and the result gets the matching
// sharding. A split reduction factor makes the result a partial sum over its
// axis, and partial operands flow through ops that are linear in them, so an
// all-reduce is placed only where a non-linear op (or a mismatched sum)
// needs the whole value. That is how a row-parallel product followed by its
// bias add gets exactly one all-reduce, before the bias.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringSet.h"
#include <numeric>

namespace megac {
#define GEN_PASS_DEF_PROPAGATESHARDINGPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

/// What to do about a dimension that a grid axis does not divide.
std::string divisibilityHint(func::FuncOp func, unsigned index, int64_t dim,
                             int64_t size) {
  if (func.getArgAttr(index, MegacDialect::kInputAttrName) && dim == 0) {
    auto module = func->getParentOfType<ModuleOp>();
    auto micro = module ? module->getAttrOfType<IntegerAttr>(
                              MegacDialect::kMicroBatchesAttrName)
                        : IntegerAttr();
    if (micro && micro.getInt() > 1)
      return " (the rows of a micro-batch: --batch / --micro-batches must "
             "be a multiple of " +
             std::to_string(size) + ")";
    return " (the batch's rows: --batch must be a multiple of " +
           std::to_string(size) + ")";
  }
  if (!func.getArgAttr(index, MegacDialect::kParamAttrName))
    return "";
  // An embedding table's rows are a vocabulary, which may be padded.
  Value arg = func.getArgument(index);
  bool vocabulary = dim == 0 && llvm::any_of(arg.getUsers(), [&](Operation *u) {
    auto embedding = dyn_cast<EmbeddingOp>(u);
    return embedding && embedding.getTable() == arg;
  });
  if (vocabulary) {
    // Padding helps only if the rest splits: attention heads do not pad.
    std::optional<int64_t> heads;
    func.walk([&](AttentionOp attention) {
      if (attention.getNumHeads() % size != 0)
        heads = attention.getNumHeads();
    });
    if (heads)
      return " (nor do the model's " + std::to_string(*heads) +
             " attention heads split over it: a tp size must divide the "
             "heads)";
    const int64_t multiple = std::lcm<int64_t>(128, size);
    return " (a vocabulary: `megac import --pad-vocab-to " +
           std::to_string(multiple) +
           "` pads it to a multiple the axis divides, as Megatron does)";
  }
  return " (megac pads only vocabularies: the model needs a size here that "
         "the axis divides)";
}

/// A parameter, or its bf16 compute copy.
bool isParameter(Value value) {
  while (auto round = value.getDefiningOp<RoundBf16Op>())
    value = round.getInput();
  auto arg = dyn_cast<BlockArgument>(value);
  if (!arg)
    return false;
  auto func = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
  return func && func.getArgAttr(arg.getArgNumber(), MegacDialect::kParamAttrName);
}

class Propagator {
public:
  explicit Propagator(MeshAttr mesh) : mesh(mesh) {}

  /// The argument's given sharding with only the axes of size > 1, after
  /// checking they divide the dimensions.
  FailureOr<ShardingAttr> seedArgument(func::FuncOp func, BlockArgument arg) {
    auto type = dyn_cast<RankedTensorType>(arg.getType());
    if (!type)
      return func.emitError("megac functions take ranked tensors only");
    MLIRContext *ctx = func.getContext();
    ShardingAttr given = getSharding(arg);
    SmallVector<StringAttr> dims;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      StringRef axis = given ? given.getDimAxis(d) : "";
      int64_t size = getAxisSizeOrOne(mesh, axis);
      if (size <= 1) {
        dims.push_back(StringAttr::get(ctx, ""));
        continue;
      }
      if (!type.isDynamicDim(d) && type.getDimSize(d) % size != 0)
        return func.emitError()
               << "dimension " << d << " (size " << type.getDimSize(d)
               << ") of " << describeArgument(func, arg.getArgNumber())
               << " is not divisible by grid axis '" << axis << "' (size "
               << size << ")"
               << divisibilityHint(func, arg.getArgNumber(), d, size);
      dims.push_back(StringAttr::get(ctx, axis));
    }
    return ShardingAttr::get(ctx, dims, {});
  }

  /// Seeds every argument, with one new list of argument attributes: set
  /// one argument at a time, the function's list (uniqued, so never freed)
  /// was rebuilt per argument, quadratic in the layers (5 GB and 8 s at
  /// 1536 layers).
  LogicalResult seedArguments(func::FuncOp func) {
    MLIRContext *ctx = func.getContext();
    SmallVector<DictionaryAttr> argAttrs;
    bool changed = false;
    for (BlockArgument arg : func.getArguments()) {
      FailureOr<ShardingAttr> sharding = seedArgument(func, arg);
      if (failed(sharding))
        return failure();
      NamedAttrList attrs(func.getArgAttrDict(arg.getArgNumber()));
      if (attrs.get(MegacDialect::kShardingAttrName) != *sharding) {
        attrs.set(MegacDialect::kShardingAttrName, *sharding);
        changed = true;
      }
      argAttrs.push_back(attrs.getDictionary(ctx));
    }
    if (changed)
      func.setAllArgAttrs(argAttrs);
    return success();
  }

  /// A sharding constraint requires and produces its attribute's sharding
  /// (axes the grid lacks dropped, divisibility checked).
  LogicalResult constrain(ShardingConstraintOp op) {
    MLIRContext *ctx = op.getContext();
    auto type = cast<RankedTensorType>(op.getInput().getType());
    SmallVector<StringAttr> dims;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      StringRef axis = op.getSharding().getDimAxis(d);
      int64_t size = getAxisSizeOrOne(mesh, axis);
      if (size > 1 && !type.isDynamicDim(d) && type.getDimSize(d) % size != 0)
        return op.emitOpError()
               << "dimension " << d << " (size " << type.getDimSize(d)
               << ") is not divisible by grid axis '" << axis << "' (size "
               << size << ")";
      dims.push_back(StringAttr::get(ctx, size > 1 ? axis : ""));
    }
    auto sharding = ShardingAttr::get(ctx, dims, {});
    op->setAttr(MegacDialect::kOperandShardingsAttrName,
                ArrayAttr::get(ctx, {sharding}));
    setSharding(op.getResult(), sharding);
    return success();
  }

  /// Decides the op's operand and result shardings from its rule.
  LogicalResult propagate(ShardingRuleOpInterface op) {
    if (auto constraint = dyn_cast<ShardingConstraintOp>(op.getOperation()))
      return constrain(constraint);
    Operation *operation = op.getOperation();
    MLIRContext *ctx = operation->getContext();
    ShardingRule rule = op.getShardingRule();
    unsigned numOperands = operation->getNumOperands();
    SmallVector<ShardingAttr> current;
    for (Value operand : operation->getOperands())
      current.push_back(getShardingOrReplicated(operand));

    // 1. One axis per factor, each axis used once. When operands disagree:
    //    - parameters choose first (their layout is the plan; moving them
    //      would cost every step), then the other operands in order, so a
    //      sequence-split activation meeting a column-parallel weight is
    //      gathered, not the weight;
    //    - parallel factors before reduction factors: splitting a reduction
    //      leaves a partial sum to all-reduce, so a weight gradient keeps
    //      its weight's split and gathers a sequence-split input instead.
    SmallVector<unsigned> order;
    for (unsigned i = 0; i < numOperands; ++i)
      if (isParameter(operation->getOperand(i)))
        order.push_back(i);
    for (unsigned i = 0; i < numOperands; ++i)
      if (!isParameter(operation->getOperand(i)))
        order.push_back(i);
    SmallVector<StringRef> factorAxis(rule.factors.size());
    llvm::StringSet<> used;
    for (FactorKind kind : {FactorKind::Parallel, FactorKind::Reduction})
    for (unsigned i : order) {
      for (auto [index, factor] : llvm::enumerate(rule.factors)) {
        if (factor.kind != kind || !factorAxis[index].empty())
          continue;
        int64_t dim = factor.operandDims[i];
        if (dim < 0 || (factor.sourceOperand >= 0 && factor.sourceOperand != i))
          continue;
        StringRef axis = current[i].getDimAxis(dim);
        if (axis.empty() || used.contains(axis))
          continue;
        int64_t size = getAxisSizeOrOne(mesh, axis);
        if (factor.blocks > 0 && factor.blocks % size != 0)
          return operation->emitOpError()
                 << "cannot split its " << factor.blocks << " "
                 << factor.name << " over grid axis '" << axis << "' (size "
                 << size << "): the axis size must divide the " << factor.name;
        int64_t extent =
            cast<RankedTensorType>(operation->getOperand(i).getType())
                .getDimSize(dim);
        if (!ShapedType::isDynamic(extent) && extent % size != 0)
          return operation->emitOpError()
                 << "dimension " << dim << " (size " << extent
                 << ") of operand " << i << " is not divisible by grid axis '"
                 << axis << "' (size " << size << ")";
        factorAxis[index] = axis;
        used.insert(axis);
      }
    }

    // 2. Partial sums: which operands may stay partial, and on what axes.
    SmallVector<SmallVector<StringAttr>> keepPartial(numOperands);
    SmallVector<StringAttr> resultPartial;
    auto partialUsable = [&](ShardingAttr s) {
      return !s.getPartial().empty() &&
             llvm::none_of(s.getPartial(), [&](StringAttr a) {
               return used.contains(a.getValue());
             });
    };
    // Partial axes are a set: [dp, tp] and [tp, dp] are the same state.
    auto samePartial = [](ShardingAttr a, ShardingAttr b) {
      return a.getPartial().size() == b.getPartial().size() &&
             llvm::all_of(a.getPartial(), [&](StringAttr axis) {
               return b.isPartialOn(axis.getValue());
             });
    };
    if (rule.partial == PartialPolicy::AllOperands && numOperands > 0 &&
        llvm::all_of(current, [&](ShardingAttr s) {
          return partialUsable(s) && samePartial(s, current.front());
        })) {
      for (unsigned i = 0; i < numOperands; ++i)
        keepPartial[i].assign(current[i].getPartial().begin(),
                              current[i].getPartial().end());
      resultPartial = keepPartial.front();
    } else if (rule.partial == PartialPolicy::AnyOneOperand) {
      SmallVector<unsigned> partialOperands;
      for (unsigned i = 0; i < numOperands; ++i)
        if (!current[i].getPartial().empty())
          partialOperands.push_back(i);
      if (partialOperands.size() == 1 &&
          partialUsable(current[partialOperands.front()])) {
        unsigned i = partialOperands.front();
        keepPartial[i].assign(current[i].getPartial().begin(),
                              current[i].getPartial().end());
        resultPartial = keepPartial[i];
      }
    }
    for (auto [index, factor] : llvm::enumerate(rule.factors))
      if (factor.kind == FactorKind::Reduction && !factorAxis[index].empty())
        resultPartial.push_back(StringAttr::get(ctx, factorAxis[index]));

    // 3. Materialize the required operand shardings and the result's.
    SmallVector<Attribute> required;
    for (unsigned i = 0; i < numOperands; ++i) {
      int64_t rank =
          cast<RankedTensorType>(operation->getOperand(i).getType()).getRank();
      SmallVector<StringAttr> dims(rank, StringAttr::get(ctx, ""));
      for (auto [index, factor] : llvm::enumerate(rule.factors))
        if (factor.operandDims[i] >= 0)
          dims[factor.operandDims[i]] = StringAttr::get(ctx, factorAxis[index]);
      required.push_back(ShardingAttr::get(ctx, dims, keepPartial[i]));
    }
    int64_t resultRank =
        cast<RankedTensorType>(operation->getResult(0).getType()).getRank();
    SmallVector<StringAttr> resultDims(resultRank, StringAttr::get(ctx, ""));
    for (auto [index, factor] : llvm::enumerate(rule.factors))
      if (factor.resultDim >= 0)
        resultDims[factor.resultDim] = StringAttr::get(ctx, factorAxis[index]);
    operation->setAttr(MegacDialect::kOperandShardingsAttrName,
                       ArrayAttr::get(ctx, required));
    // Partial axes chosen for eager reduction are summed right after the op
    // (megac-insert-collectives places the all-reduce); users see the sum.
    SmallVector<Attribute> reduced;
    for (StringRef axis : eager.lookup(operation)) {
      auto it = llvm::find_if(resultPartial, [&](StringAttr a) {
        return a.getValue() == axis;
      });
      if (it == resultPartial.end())
        continue;
      reduced.push_back(*it);
      resultPartial.erase(it);
    }
    if (reduced.empty())
      operation->removeAttr(MegacDialect::kReduceResultAttrName);
    else
      operation->setAttr(MegacDialect::kReduceResultAttrName,
                         ArrayAttr::get(ctx, reduced));
    setSharding(operation->getResult(0),
                ShardingAttr::get(ctx, resultDims, resultPartial));
    return success();
  }

  /// Partial axes of op results that some user needs summed: reducing them
  /// once where they are produced serves every user, where deferring would
  /// cost one more all-reduce per user that could have kept them partial
  /// (the LayerNorm gain gradient reading the same partial output gradient
  /// as the input gradient, say). Returns true if the set grew.
  bool growEagerReductions(func::FuncOp func) {
    bool grew = false;
    for (Operation &op : func.getBody().front()) {
      if (op.getNumResults() != 1)
        continue;
      ShardingAttr sharding = getSharding(op.getResult(0));
      if (!sharding || sharding.getPartial().empty())
        continue;
      for (OpOperand &use : op.getResult(0).getUses()) {
        auto required = use.getOwner()->getAttrOfType<ArrayAttr>(
            MegacDialect::kOperandShardingsAttrName);
        if (!required)
          continue;
        auto want = cast<ShardingAttr>(required[use.getOperandNumber()]);
        for (StringAttr axis : sharding.getPartial())
          if (!want.isPartialOn(axis.getValue()) &&
              // A user splitting a dimension over the axis wants a
              // reduce-scatter, which an early all-reduce would preclude.
              !llvm::is_contained(want.getDims(), axis) &&
              !llvm::is_contained(eager[&op], axis.getValue())) {
            eager[&op].push_back(axis.getValue());
            grew = true;
          }
      }
    }
    return grew;
  }

  /// Function results must be whole on every rank.
  void requireWholeResults(func::ReturnOp ret) {
    SmallVector<Attribute> required;
    for (Value operand : ret.getOperands())
      required.push_back(ShardingAttr::getReplicated(
          ret.getContext(), cast<RankedTensorType>(operand.getType()).getRank()));
    ret->setAttr(MegacDialect::kOperandShardingsAttrName,
                 ArrayAttr::get(ret.getContext(), required));
  }

private:
  MeshAttr mesh;
  llvm::DenseMap<Operation *, SmallVector<StringRef>> eager;
};

struct PropagateShardingPass
    : public megac::impl::PropagateShardingPassBase<PropagateShardingPass> {
  void runOnOperation() override {
    Propagator propagator(getMesh(getOperation()));
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      // Propagate, then reduce eagerly where a sum is needed anyway, and
      // propagate again until that set is stable (it only grows, and at
      // most by every partial result, so this ends).
      do {
        if (failed(propagateOnce(propagator, func)))
          return signalPassFailure();
      } while (propagator.growEagerReductions(func));
    }
  }

  LogicalResult propagateOnce(Propagator &propagator, func::FuncOp func) {
    if (failed(propagator.seedArguments(func)))
      return failure();
    for (Operation &op : func.getBody().front()) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        propagator.requireWholeResults(ret);
        continue;
      }
      auto ruled = dyn_cast<ShardingRuleOpInterface>(op);
      if (!ruled || op.getNumResults() != 1)
        return op.emitOpError("has no sharding rule; megac cannot partition "
                              "it (collectives are inserted by the compiler, "
                              "not written in models)");
      if (failed(propagator.propagate(ruled)))
        return failure();
    }
    return success();
  }
};
} // namespace
