//===- FuseElementwise.cpp - Kernel groups for a GPU target ---------------===//
//
// On a GPU an elementwise op costs a pass over memory, not arithmetic: a
// bias add, a GeLU and a residual add done one by one read and write the
// activation three times. Grouping them makes one kernel of them. The
// groups are marked (megac.fusion), not outlined, so the CPU path and every
// other pass see the same ops; the CUDA emitter reads the marks.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/GemmEpilogue.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

namespace megac {
#define GEN_PASS_DEF_FUSEELEMENTWISEPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

/// Inputs one generated kernel reads at most (its parameters stay far
/// below CUDA's 4 KiB); a longer chain, like the gradient norm's running
/// sum over hundreds of parameters, is cut into several kernels.
constexpr int64_t kMaxKernelInputs = 32;

bool isElementwise(Operation *op) {
  return isa<AddOp, MulOp, GeluOp, GeluGradOp, RoundBf16Op>(op);
}

RankedTensorType typeOf(Value value) {
  return cast<RankedTensorType>(value.getType());
}

/// Every operand has the result's shape, or is a vector of its last
/// dimension (a bias broadcast over the rows).
bool fitsOneKernel(Operation *op) {
  RankedTensorType result = typeOf(op->getResult(0));
  for (Value operand : op->getOperands()) {
    RankedTensorType type = typeOf(operand);
    if (type.getShape() == result.getShape())
      continue;
    if (type.getRank() == 1 && result.getRank() >= 1 &&
        type.getDimSize(0) == result.getShape().back())
      continue;
    return false;
  }
  return true;
}

/// Same pipeline stage and phase (or both unplaced).
bool samePlace(Operation *a, Operation *b) {
  return getStages(a) == getStages(b) && getPhase(a) == getPhase(b);
}

/// Ops whose kernels can round their result to bf16 as they write it: a
/// rounding after one of them joins it (no pass over memory of its own).
/// A product (not one with a bias epilogue, already grouped) has cuBLAS
/// write its result in bf16.
bool roundsAsItWrites(Operation *op) {
  return isa<LinearOp, LayerNormOp, LayerNormGradOp, AttentionOp,
             AttentionGradOp, CrossEntropyGradOp, EmbeddingOp>(op);
}

struct FuseElementwisePass
    : public megac::impl::FuseElementwisePassBase<FuseElementwisePass> {
  using FuseElementwisePassBase::FuseElementwisePassBase;

  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    for (char kind : groups)
      if (!kAllFusionGroups.contains(kind)) {
        getOperation().emitError("megac-fuse-elementwise: '")
            << kind << "' in groups=" << groups
            << " names no kind of group (expected letters of " << kAllFusionGroups
            << ")";
        return signalPassFailure();
      }
    auto forms = [&](char kind) { return StringRef(groups).contains(kind); };
    // Groups of each kind are numbered in program order: "g0", "g1", ...
    llvm::StringMap<int64_t> counts;
    auto nameOf = [&](StringRef kind) {
      return (kind + Twine(counts[kind]++)).str();
    };
    auto mark = [&](Operation *op, StringRef group) {
      op->setAttr(MegacDialect::kFusionAttrName, StringAttr::get(ctx, group));
    };
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      Block &body = func.getBody().front();
      // Epilogues (GemmEpilogue.h): linear -> + bias [-> gelu | -> +
      // residual] ("g"), the roundings included in a bf16 plan, a
      // pre-activation the backward pass keeps the group's second output;
      // linear -> gelu_grad (the product its output gradient)
      // [-> round_bf16] ("d"); layer_norm_grad -> + residual gradient
      // [-> round_bf16] ("n"); a LayerNorm's gain and bias gradients, one
      // pass over dy ("b"); a product's weight and bias gradients, one
      // product whose epilogue sums dy ("w"); an attention's dk and dv,
      // and its dq where it fits [with their roundings] ("a"); the
      // embedding's gradient and another gradient of the table added to
      // it ("t"); linear -> + another tensor of its shape, the product's
      // C [-> round_bf16] ("c").
      for (Operation &op : body) {
        if (op.hasAttr(MegacDialect::kFusionAttrName))
          continue;
        auto admissible = [&](Operation *candidate) {
          return !candidate->hasAttr(MegacDialect::kFusionAttrName) &&
                 samePlace(&op, candidate) &&
                 (!isa<AddOp>(candidate) || fitsOneKernel(candidate));
        };
        SmallVector<Operation *, 5> members;
        std::string group;
        // Takes the group a matcher found, if any, as a group of \p kind.
        auto take = [&](const auto &found, StringRef kind) {
          if (!found || !forms(kind.front()))
            return false;
          members = found->ops();
          group = nameOf(kind);
          return true;
        };
        if (auto linear = dyn_cast<LinearOp>(op))
          take(matchGemmEpilogue(linear, admissible), "g") ||
              take(matchGemmGeluGrad(linear, admissible), "d") ||
              take(matchGemmAccumulate(linear, admissible), "c");
        else if (auto grad = dyn_cast<LayerNormGradOp>(op))
          take(matchNormGradResidual(grad, admissible), "n");
        else if (auto gain = dyn_cast<LayerNormGainGradOp>(op))
          take(matchNormParamGrads(gain, admissible), "b");
        else if (auto weight = dyn_cast<LinearWeightGradOp>(op))
          take(matchWeightBiasGrads(weight, admissible), "w");
        else if (auto embedding = dyn_cast<EmbeddingGradOp>(op))
          take(matchEmbeddingGradInto(embedding, admissible), "t");
        else if (auto key = dyn_cast<AttentionGradOp>(op))
          take(matchAttentionInputGrads(key, admissible), "a");
        for (Operation *member : members)
          mark(member, group);
      }
      // A rounding whose operand's only reader it is, made by an op that
      // can round as it writes: one instruction, the op with its result
      // rounded. Before the chains: a product rounded by cuBLAS into bf16
      // hands the bias add's kernel 2 bytes an element to read, where a
      // chain starting with the rounding would read the fp32 product.
      for (Operation &op : body) {
        auto round = dyn_cast<RoundBf16Op>(op);
        if (!forms('r') || !round || op.hasAttr(MegacDialect::kFusionAttrName))
          continue;
        Operation *def = round.getInput().getDefiningOp();
        if (!def || def->getNumResults() != 1 || !roundsAsItWrites(def) ||
            def->hasAttr(MegacDialect::kFusionAttrName) ||
            !round.getInput().hasOneUse() || !samePlace(def, &op))
          continue;
        std::string group = nameOf("r");
        mark(def, group);
        mark(&op, group);
      }
      // Elementwise chains: an op joins the chain of an operand whose only
      // reader it is.
      llvm::DenseMap<Operation *, int64_t> chainOf;
      llvm::DenseMap<int64_t, int64_t> size, inputs;
      int64_t next = 0;
      for (Operation &op : body) {
        if (!forms('e') || !isElementwise(&op) ||
            op.hasAttr(MegacDialect::kFusionAttrName) || !fitsOneKernel(&op))
          continue;
        int64_t chain = -1;
        Value through;
        for (Value operand : op.getOperands()) {
          Operation *def = operand.getDefiningOp();
          auto it = def ? chainOf.find(def) : chainOf.end();
          if (it != chainOf.end() && operand.hasOneUse() &&
              typeOf(operand) == typeOf(op.getResult(0)) &&
              samePlace(def, &op) &&
              inputs[it->second] + op.getNumOperands() - 1 <=
                  kMaxKernelInputs) {
            chain = it->second;
            through = operand;
            break;
          }
        }
        if (chain < 0)
          chain = next++;
        chainOf[&op] = chain;
        ++size[chain];
        // What the kernel reads (an upper bound: shared inputs count twice).
        for (Value operand : op.getOperands())
          if (operand != through)
            ++inputs[chain];
      }
      // Number the chains of two or more in program order.
      llvm::DenseMap<int64_t, std::string> name;
      for (Operation &op : body) {
        auto it = chainOf.find(&op);
        if (it == chainOf.end() || size[it->second] < 2)
          continue;
        std::string &group = name[it->second];
        if (group.empty())
          group = nameOf("e");
        mark(&op, group);
      }
    }
  }
};

} // namespace
