//===- SpecializeShapes.cpp - Fix batch and sequence sizes ----------------===//
//
// Models are usually written with dynamic batch and sequence dimensions; a
// plan needs static shapes. This pass sets the data inputs' sizes and then
// re-runs every op's type inference in program order, which also re-checks
// each op's shape rules against the concrete sizes. It also checks that
// parameter and result names are unique, and that the data inputs are
// split alike.
//
//===----------------------------------------------------------------------===//

#include "TransformUtils.h"
#include "megac/Dialect/Megac/Transforms/Passes.h"

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"

namespace megac {
#define GEN_PASS_DEF_SPECIALIZESHAPESPASS
#include "megac/Dialect/Megac/Transforms/Passes.h.inc"
} // namespace megac

using namespace mlir;
using namespace megac;

namespace {
constexpr int64_t kDefaultBatch = 4;
constexpr int64_t kDefaultSeq = 64;

struct SpecializeShapesPass
    : public megac::impl::SpecializeShapesPassBase<SpecializeShapesPass> {
  using SpecializeShapesPassBase::SpecializeShapesPassBase;

  /// The size to use for a data dimension currently `current`.
  static int64_t chooseSize(int64_t requested, int64_t current,
                            int64_t fallback) {
    if (requested > 0)
      return requested;
    return ShapedType::isDynamic(current) ? fallback : current;
  }

  /// Parameter and result names are the model's interface (checkpoints,
  /// --weights and --save-outputs find tensors by them), so each is one
  /// tensor's; so is each kind of data input (the runtime fills each kind
  /// once). The per-argument verifier cannot see two arguments at once;
  /// this pass, every pipeline's first over the model, checks it.
  static LogicalResult checkNamesUnique(func::FuncOp func) {
    /// Names of one kind ("parameter", "result"), each at its first index.
    struct Names {
      const char *kind, *places, *owner;
      llvm::StringMap<unsigned> first;
    };
    Names params{"parameter", "arguments", "parameter"},
        results{"result", "results", "output"},
        inputs{"input", "arguments", "input"}; // (tokens and labels)
    auto claim = [&](Names &names, StringRef name, unsigned i,
                     StringRef note = "") -> LogicalResult {
      // (A NUL cut the name short in the plan: two parameters "w" and
      // "w\00x" became two "w"s; bytes "\FE" and "\FF" both became U+FFFD
      // in a checkpoint's header.)
      if (std::string problem = tensorNameProblem(name); !problem.empty()) {
        std::string escaped;
        llvm::raw_string_ostream os(escaped);
        llvm::printEscapedString(name, os);
        return func.emitError()
               << names.kind << " name '" << escaped << "' ("
               << StringRef(names.places).drop_back() << " " << i << ") "
               << problem << "; names key tensors in plans, checkpoints and "
               << "safetensors files and must be printable UTF-8";
      }
      auto [it, fresh] = names.first.try_emplace(name, i);
      if (fresh)
        return success();
      return func.emitError()
             << names.kind << " name '" << name << "' is given to "
             << names.places << " " << it->second << " and " << i << "; each "
             << names.owner << " needs its own" << note;
    };
    for (unsigned i = 0; i < func.getNumArguments(); ++i)
      if (auto spec = func.getArgAttrOfType<DictionaryAttr>(
              i, MegacDialect::kParamAttrName))
        if (auto name = spec.getAs<StringAttr>("name"))
          if (failed(claim(params, name.getValue(), i)))
            return failure();
    for (unsigned i = 0; i < func.getNumArguments(); ++i)
      if (auto kind = func.getArgAttrOfType<StringAttr>(
              i, MegacDialect::kInputAttrName))
        if (failed(claim(inputs, kind.getValue(), i)))
          return failure();
    // An unnamed result is "output<i>" in the plan: a result named so
    // would be a second tensor of that name. --save-outputs writes the
    // data inputs beside the results under "tokens" and "labels".
    for (unsigned i = 0; i < func.getNumResults(); ++i) {
      auto named = func.getResultAttrOfType<StringAttr>(
          i, MegacDialect::kResultNameAttrName);
      std::string name =
          named ? named.getValue().str() : "output" + std::to_string(i);
      if (name == "tokens" || name == "labels")
        return func.emitError()
               << "result name '" << name << "' (result " << i
               << ") is the name --save-outputs gives the input " << name
               << "; name the result otherwise";
      if (failed(claim(results, name, i,
                       StringRef(name).starts_with("output")
                           ? " (an unnamed result is output<i> in the plan)"
                           : "")))
        return failure();
    }
    return success();
  }

  /// The runtime hands every data input the same rows of the batch (one
  /// batch_offset per rank), so the inputs must be split alike: over the
  /// same axes of more than one rank (no sharding, `_` and an axis of one
  /// rank all mean whole).
  static LogicalResult checkInputsAlike(func::FuncOp func) {
    MeshAttr mesh = getMesh(func->getParentOfType<ModuleOp>());
    auto split = [&](unsigned arg) {
      std::string text;
      auto sharding = func.getArgAttrOfType<ShardingAttr>(
          arg, MegacDialect::kShardingAttrName);
      int64_t rank =
          cast<RankedTensorType>(func.getArgument(arg).getType()).getRank();
      for (int64_t d = 0; d < rank; ++d) {
        StringRef axis = sharding && d < int64_t(sharding.getDims().size())
                             ? sharding.getDims()[d].getValue()
                             : "";
        text += (d ? ", " : "[");
        text += getAxisSizeOrOne(mesh, axis) > 1 ? axis.str() : "_";
      }
      return text + "]";
    };
    std::optional<unsigned> first;
    for (unsigned i = 0; i < func.getNumArguments(); ++i) {
      if (!func.getArgAttr(i, MegacDialect::kInputAttrName))
        continue;
      if (!first) {
        first = i;
        continue;
      }
      if (split(*first) != split(i))
        return func.emitError()
               << "data inputs must be split alike (each rank reads the "
                  "same rows of every input): argument "
               << *first << " is split " << split(*first) << " but argument "
               << i << " " << split(i);
    }
    return success();
  }

  /// A grid axis has one role: pp splits the layers into stages, an axis
  /// that splits the data inputs gives its ranks their own rows (with the
  /// weights whole), any other splits the weights (every rank reads the
  /// same rows). A parameter split over pp or over a data axis would
  /// mix two ranks' work (a vocabulary split over dp once gave a wrong
  /// loss silently).
  static LogicalResult checkAxisRoles(func::FuncOp func) {
    MeshAttr mesh = getMesh(func->getParentOfType<ModuleOp>());
    auto axesOf = [&](unsigned arg) {
      SmallVector<StringRef> axes;
      if (auto sharding = func.getArgAttrOfType<ShardingAttr>(
              arg, MegacDialect::kShardingAttrName))
        for (StringAttr axis : sharding.getDims())
          if (getAxisSizeOrOne(mesh, axis.getValue()) > 1)
            axes.push_back(axis.getValue());
      return axes;
    };
    llvm::StringMap<unsigned> dataAxes; // axis -> an input it splits
    for (unsigned i = 0; i < func.getNumArguments(); ++i)
      if (func.getArgAttr(i, MegacDialect::kInputAttrName))
        for (StringRef axis : axesOf(i))
          dataAxes.try_emplace(axis, i);
    for (unsigned i = 0; i < func.getNumArguments(); ++i) {
      bool param = func.getArgAttr(i, MegacDialect::kParamAttrName) != nullptr;
      for (StringRef axis : axesOf(i)) {
        if (axis == "pp")
          return func.emitError()
                 << describeArgument(func, i)
                 << " is split over grid axis 'pp', which splits the layers "
                    "into pipeline stages; no tensor is split over it";
        auto data = dataAxes.find(axis);
        if (param && data != dataAxes.end())
          return func.emitError()
                 << describeArgument(func, i) << " is split over grid axis '"
                 << axis << "', which splits the data ("
                 << describeArgument(func, data->second)
                 << "): an axis splits either the batch, each rank with its "
                    "own rows and the weights whole (as dp), or the weights, "
                    "every rank with the same rows (as tp)";
      }
    }
    return success();
  }

  /// Whether a tensor of \p type has a byte size an int64 holds: the
  /// later passes and the memory plan count bytes in one (a batch of 2^62
  /// rows wrapped around into nonsense there).
  static bool fitsInBytes(Type type) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !tensor.hasStaticShape())
      return true;
    Type element = tensor.getElementType();
    int64_t bytes = element.isIntOrFloat()
                        ? std::max(1u, element.getIntOrFloatBitWidth() / 8)
                        : 8;
    for (int64_t size : tensor.getShape())
      if (llvm::MulOverflow(bytes, size, bytes))
        return false;
    return true;
  }

  LogicalResult specialize(func::FuncOp func) {
    if (failed(checkTensorSignature(func)) || failed(checkNamesUnique(func)) ||
        failed(checkInputsAlike(func)) || failed(checkAxisRoles(func)))
      return failure();
    if (batch < 0 || seq < 0)
      return func.emitError("batch and sequence sizes must be positive");
    if (microBatches < 1)
      return func.emitError("the number of micro-batches must be positive");
    Block &body = func.getBody().front();
    // Without a length given or in the model, a model whose position table
    // is shorter than the default sequence takes the whole table.
    int64_t defaultSeq = kDefaultSeq;
    for (auto positions : body.getOps<PositionEmbeddingOp>())
      if (auto table =
              dyn_cast<RankedTensorType>(positions.getTable().getType()))
        if (!table.isDynamicDim(0))
          defaultSeq = std::min(defaultSeq, table.getDimSize(0));
    // The data inputs share one batch and sequence: a size one of them
    // states (labels of [4, 5] beside tokens of [?, ?]) is the others'
    // too, rather than their default. A size asked for replaces them all.
    const int64_t requested[2] = {batch, seq};
    int64_t modelSize[2] = {ShapedType::kDynamic, ShapedType::kDynamic};
    unsigned stating[2] = {0, 0};
    for (BlockArgument arg : body.getArguments()) {
      if (!func.getArgAttr(arg.getArgNumber(), MegacDialect::kInputAttrName))
        continue;
      auto type = cast<RankedTensorType>(arg.getType());
      for (unsigned d = 0; d < 2; ++d) {
        if (type.isDynamicDim(d) || requested[d] > 0)
          continue;
        if (ShapedType::isDynamic(modelSize[d])) {
          modelSize[d] = type.getDimSize(d);
          stating[d] = arg.getArgNumber();
        } else if (modelSize[d] != type.getDimSize(d)) {
          return func.emitError()
                 << describeArgument(func, stating[d]) << " has "
                 << (d ? "a sequence length of " : "") << modelSize[d]
                 << (d ? "" : " rows") << " but "
                 << describeArgument(func, arg.getArgNumber()) << " "
                 << type.getDimSize(d)
                 << "; the data inputs share one batch and sequence (--"
                 << (d ? "seq" : "batch") << " sets it for all)";
        }
      }
    }
    for (BlockArgument arg : body.getArguments()) {
      auto type = cast<RankedTensorType>(arg.getType());
      if (func.getArgAttr(arg.getArgNumber(), MegacDialect::kInputAttrName)) {
        int64_t rows = chooseSize(batch, modelSize[0], kDefaultBatch);
        const int64_t length = chooseSize(seq, modelSize[1], defaultSeq);
        // (A size of 0 written in the model: nothing to compute, and the
        // plan's checks would call it an internal error at the end.)
        if (rows == 0 || length == 0)
          return func.emitError()
                 << describeArgument(func, arg.getArgNumber()) << " has "
                 << (rows == 0 ? "0 rows" : "a sequence length of 0")
                 << "; give the model's size, or --batch and --seq";
        if (rows % microBatches != 0)
          return func.emitError()
                 << "the batch (" << rows << " rows) is not divisible by the "
                 << static_cast<int64_t>(microBatches) << " micro-batches";
        SmallVector<int64_t> shape = {rows / microBatches, length};
        auto specialized = RankedTensorType::get(shape, type.getElementType());
        if (!fitsInBytes(specialized))
          return func.emitError()
                 << describeArgument(func, arg.getArgNumber()) << " would be a "
                 << specialized << " of 2^63 bytes or more: the "
                 << "batch and sequence sizes are too large for any grid";
        arg.setType(specialized);
      } else if (!type.hasStaticShape()) {
        return func.emitError("argument ")
               << arg.getArgNumber()
               << " has a dynamic shape; only megac.input data may";
      }
    }
    for (Operation &op : body.without_terminator()) {
      auto infer = dyn_cast<InferTypeOpInterface>(&op);
      if (!infer)
        continue;
      SmallVector<Type> types;
      if (failed(infer.inferReturnTypes(
              op.getContext(), op.getLoc(), op.getOperands(),
              op.getRawDictionaryAttrs(), op.getPropertiesStorage(),
              op.getRegions(), types)))
        return failure();
      for (auto [result, type] : llvm::zip(op.getResults(), types)) {
        if (!fitsInBytes(type))
          return op.emitError()
                 << "a result would be a " << type
                 << " of 2^63 bytes or more: the batch and sequence sizes "
                 << "are too "
                    "large for any grid";
        result.setType(type);
      }
    }
    func.setFunctionType(FunctionType::get(
        func.getContext(), body.getArgumentTypes(),
        body.getTerminator()->getOperandTypes()));
    return success();
  }

  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && failed(specialize(func)))
        return signalPassFailure();
  }
};
} // namespace
