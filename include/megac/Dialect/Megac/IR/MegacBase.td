//===- MegacBase.td - megac dialect definition ------------*- tablegen -*-===//
//
// The `megac` dialect describes Transformer models as graphs of tensor ops on
// global (unsharded) shapes. Sharding, collectives and per-rank shapes are
// introduced by passes; see docs/architecture.md.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_DIALECT_MEGAC_IR_MEGACBASE_TD
#define MEGAC_DIALECT_MEGAC_IR_MEGACBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Megac_Dialect : Dialect {
  let name = "megac";
  let cppNamespace = "::megac";
  let summary = "Parallel Transformer graphs: model ops, shardings and collectives";
  let description = [{
    Models are `func.func`s whose arguments are parameters (marked with
    `megac.param`) and data inputs (marked with `megac.input`). Parameters may
    carry a `megac.sharding` annotation; the sharding propagation pass derives
    the sharding of every other value from those annotations and the device
    grid stored on the module as `megac.mesh`. A grid axis has one role: an
    axis that splits the data inputs (`dp`) gives each of its ranks its own
    rows and leaves the weights whole there, any other axis (`tp`) splits
    weights while every rank reads the same rows, and `pp` splits the
    layers into pipeline stages and no tensor.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasRegionArgAttrVerify = 1;
  let hasOperationAttrVerify = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
  let extraClassDeclaration = [{
    /// The most micro-batches a step may have (as many as a plan holds).
    static constexpr int64_t kMaxMicroBatches = int64_t(1) << 20;
    /// Attribute names used on functions, arguments and ops.
    static constexpr ::llvm::StringLiteral kMeshAttrName = "megac.mesh";
    static constexpr ::llvm::StringLiteral kShardingAttrName = "megac.sharding";
    static constexpr ::llvm::StringLiteral kOperandShardingsAttrName =
        "megac.operand_shardings";
    static constexpr ::llvm::StringLiteral kParamAttrName = "megac.param";
    static constexpr ::llvm::StringLiteral kInputAttrName = "megac.input";
    static constexpr ::llvm::StringLiteral kResultNameAttrName = "megac.name";
    static constexpr ::llvm::StringLiteral kModelAttrName = "megac.model";
    static constexpr ::llvm::StringLiteral kLocalizedAttrName = "megac.localized";
    static constexpr ::llvm::StringLiteral kTrainAttrName = "megac.train";
    static constexpr ::llvm::StringLiteral kMicroBatchesAttrName =
        "megac.micro_batches";
    static constexpr ::llvm::StringLiteral kReduceResultAttrName =
        "megac.reduce_result";
    /// Pipeline parallelism: the stages (model chunks) an op runs on (one,
    /// or several for the update of a parameter that several stages hold),
    /// and the part of the step it belongs to: "forward" and "backward"
    /// run once per micro-batch, "step" once per step.
    static constexpr ::llvm::StringLiteral kStageAttrName = "megac.stage";
    static constexpr ::llvm::StringLiteral kPhaseAttrName = "megac.phase";
    /// The kernel an op belongs to on a GPU target (megac-fuse-elementwise):
    /// "gK" a GEMM with its epilogue, "dK" a GEMM with GeLU's gradient as
    /// its epilogue, "eK" an elementwise chain, "rK" an op with the
    /// rounding to bf16 of its result.
    static constexpr ::llvm::StringLiteral kFusionAttrName = "megac.fusion";
    /// On the module: model chunks (pp x virtual stages) of the pipeline.
    static constexpr ::llvm::StringLiteral kPipelineStagesAttrName =
        "megac.pipeline_stages";
  }];
}

class Megac_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Megac_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // MEGAC_DIALECT_MEGAC_IR_MEGACBASE_TD
