//===- MegacInterfaces.td - megac op interfaces -----------*- tablegen -*-===//
//
// Ops describe how they may be split across the grid with a factor-based
// sharding rule (as Shardy's OpShardingRule does): each factor is one loop
// dimension of the op, mapped to a dimension of some operands and maybe of
// the result. The propagation pass works on rules only, never on op kinds.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACINTERFACES_TD
#define MEGAC_DIALECT_MEGAC_IR_MEGACINTERFACES_TD

include "mlir/IR/OpBase.td"

def Megac_ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::megac";
  let description = [{
    Gives the op's sharding rule: its factors (parallel, reduction, or
    must-stay-whole), which operand and result dimensions each factor indexes,
    and whether a partial-sum operand may flow through to the result.
  }];
  let methods = [
    InterfaceMethod<"Returns the op's factor-based sharding rule.",
      "::megac::ShardingRule", "getShardingRule", (ins)>,
  ];
}

def Megac_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::megac";
  let description = [{
    Reverse-mode autodiff: given the gradient of the op's result, builds the
    gradients of its operands (a null value for operands without one, such
    as token ids) with `builder`, right after the op's position in the
    backward pass.
  }];
  let methods = [
    InterfaceMethod<"Builds the operand gradients (vector-Jacobian product).",
      "::llvm::LogicalResult", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder, "::mlir::Value":$resultGrad,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACINTERFACES_TD
