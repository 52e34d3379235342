//===- Autodiff.cpp - Reverse-mode differentiation of the model -----------===//
//
// Appends the backward pass to the model function. Gradient contributions
// to one value are summed in the order they arrive (reverse program order):
// the three contributions of the q, k and v products to a LayerNorm output
// are partial sums over `tp` and meet first, so their sum needs one
// all-reduce, as in Megatron.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"
#include "TransformUtils.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

namespace megac {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {

LogicalResult differentiate(func::FuncOp func) {
  // Differentiating again would return every gradient twice (and --train
  // would update each parameter twice).
  for (unsigned i = 0; i < func.getNumResults(); ++i)
    if (auto name = func.getResultAttrOfType<StringAttr>(
            i, MegacDialect::kResultNameAttrName);
        name && name.getValue().starts_with("grad:"))
      return func.emitError()
             << "megac-autodiff: the function is differentiated already (it "
                "returns '"
             << name.getValue() << "'); give the forward model";
  FailureOr<unsigned> lossIndex = findLoss(func, "megac-autodiff");
  if (failed(lossIndex))
    return failure();
  Block &body = func.getBody().front();
  // The gradient ops take their types from the values they differentiate;
  // a dynamic size there could meet a static one (a VJP knows more than
  // its value's type says) and the gradient op would not build.
  auto dynamic = [](Type type) {
    auto shaped = dyn_cast<ShapedType>(type);
    return shaped && !shaped.hasStaticShape();
  };
  auto refuse =
      [](Operation *at, const std::string &what, Type type) {
        return at->emitError()
               << "megac-autodiff needs static shapes (megac-specialize-shapes "
                  "gives them): "
               << what << " has type " << type;
      };
  for (BlockArgument arg : body.getArguments())
    if (dynamic(arg.getType()))
      return refuse(func, describeArgument(func, arg.getArgNumber()),
                    arg.getType());
  for (Operation &op : body.without_terminator())
    for (Type type : op.getResultTypes())
      if (dynamic(type))
        return refuse(&op, "this result", type);
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);

  OpBuilder b(ret);
  llvm::DenseMap<Value, Value> grads;
  auto accumulate = [&](Value value, Value grad) {
    Value &slot = grads[value];
    slot = slot ? Value(AddOp::create(b, grad.getLoc(), slot, grad)) : grad;
  };
  // On a pipeline (ops placed by megac-assign-stages) the ops built for
  // an op's gradient run in the backward pass of that op's stage, and so
  // do the sums of the gradient contributions they make.
  Operation *placedUpTo = ret->getPrevNode();
  auto placeNewOps = [&](Operation *forwardOp) {
    Operation *from = placedUpTo ? placedUpTo->getNextNode()
                                 : &body.front();
    ArrayRef<int64_t> stages =
        forwardOp ? getStages(forwardOp) : ArrayRef<int64_t>();
    for (Operation *op = from; op && op != ret.getOperation();
         op = op->getNextNode())
      if (!stages.empty())
        setPlacement(op, stages, "backward");
    placedUpTo = ret->getPrevNode();
  };
  Value loss = ret.getOperand(*lossIndex);
  accumulate(loss, FillOp::create(b, ret.getLoc(), b.getDenseI64ArrayAttr({}),
                                  b.getF64FloatAttr(1.0)));
  placeNewOps(loss.getDefiningOp());

  for (Operation *op : llvm::reverse(forward)) {
    if (op->getNumResults() != 1)
      continue;
    auto it = grads.find(op->getResult(0));
    if (it == grads.end())
      continue;
    auto differentiable = dyn_cast<DifferentiableOpInterface>(op);
    if (!differentiable)
      return op->emitOpError("is not differentiable; megac-autodiff cannot "
                             "propagate the loss gradient through it");
    SmallVector<Value> operandGrads;
    if (failed(differentiable.buildVJP(b, it->second, operandGrads)))
      return failure();
    for (auto [operand, grad] : llvm::zip(op->getOperands(), operandGrads))
      if (grad)
        accumulate(operand, grad);
    placeNewOps(op);
  }

  SmallVector<Value> results(ret.getOperands());
  SmallVector<DictionaryAttr> resultAttrs;
  func.getAllResultAttrs(resultAttrs);
  for (BlockArgument arg : body.getArguments()) {
    auto spec = func.getArgAttrOfType<DictionaryAttr>(
        arg.getArgNumber(), MegacDialect::kParamAttrName);
    if (!spec)
      continue;
    Value grad = grads.lookup(arg);
    if (!grad)
      grad = FillOp::create(
          b, arg.getLoc(),
          b.getDenseI64ArrayAttr(cast<RankedTensorType>(arg.getType()).getShape()),
          b.getF64FloatAttr(0.0));
    results.push_back(grad);
    std::string name =
        "grad:" + spec.getAs<StringAttr>("name").getValue().str();
    resultAttrs.push_back(b.getDictionaryAttr(b.getNamedAttr(
        MegacDialect::kResultNameAttrName, b.getStringAttr(name))));
  }
  func::ReturnOp::create(b, ret.getLoc(), results);
  ret.erase();
  func.setFunctionType(FunctionType::get(func.getContext(),
                                         body.getArgumentTypes(),
                                         ValueRange(results).getTypes()));
  func.setAllResultAttrs(resultAttrs);
  return success();
}

struct AutodiffPass : public megac::impl::AutodiffPassBase<AutodiffPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(differentiate(func)))
        return signalPassFailure();
  }
};
} // namespace
