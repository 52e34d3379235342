//===- MegacDialect.cpp - megac dialect and attributes --------------------===//
//
// Dialect registration, the custom syntax of #megac.mesh and
// #megac.sharding, and the verification of megac's discardable attributes
// (on modules, function arguments and ops), so that a malformed annotation
// is reported where it is written rather than crashing a later pass.
//
//===----------------------------------------------------------------------===//

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace megac;

#include "megac/Dialect/Megac/IR/MegacDialect.cpp.inc"
#include "megac/Dialect/Megac/IR/MegacInterfaces.cpp.inc"

std::string megac::tensorNameProblem(llvm::StringRef name) {
  if (!llvm::json::isUTF8(name))
    return "is not valid UTF-8";
  if (llvm::any_of(name, isControlChar))
    return "holds a control character";
  return "";
}

#define GET_ATTRDEF_CLASSES
#include "megac/Dialect/Megac/IR/MegacAttrs.cpp.inc"

void MegacDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "megac/Dialect/Megac/IR/MegacOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "megac/Dialect/Megac/IR/MegacAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// MeshAttr
//===----------------------------------------------------------------------===//

Attribute MeshAttr::parse(AsmParser &parser, Type) {
  SmallVector<StringAttr> axes;
  SmallVector<int64_t> sizes;
  auto parseAxis = [&]() -> ParseResult {
    std::string name;
    int64_t size;
    if (parser.parseKeywordOrString(&name) || parser.parseEqual() ||
        parser.parseInteger(size))
      return failure();
    axes.push_back(StringAttr::get(parser.getContext(), name));
    sizes.push_back(size);
    return success();
  };
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::LessGreater,
                                     parseAxis))
    return {};
  return parser.getChecked<MeshAttr>(parser.getContext(), axes, sizes);
}

void MeshAttr::print(AsmPrinter &printer) const {
  printer << "<";
  llvm::interleaveComma(llvm::zip(getAxes(), getSizes()), printer,
                        [&](auto pair) {
                          printer << std::get<0>(pair).getValue() << " = "
                                  << std::get<1>(pair);
                        });
  printer << ">";
}

LogicalResult MeshAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               ArrayRef<StringAttr> axes,
                               ArrayRef<int64_t> sizes) {
  llvm::SmallSet<StringRef, 4> seen;
  for (auto [axis, size] : llvm::zip(axes, sizes)) {
    // (A name the IR cannot spell back: `#megac.mesh<1 = 2>` did not
    // parse again, and `_` is a sharding's unsplit dimension.)
    StringRef name = axis.getValue();
    if (name.empty() || name == "_" || llvm::isDigit(name.front()) ||
        !llvm::all_of(name,
                      [](char c) { return llvm::isAlnum(c) || c == '_'; }))
      return emitError() << "mesh_c4: grid axis name '" << name
                         << "' is not a name: a letter or '_' first, then "
                            "letters, digits and '_' ('_' alone marks an "
                            "unsplit dimension in #megac.sharding)";
    if (!seen.insert(axis.getValue()).second)
      return emitError() << "mesh_c1: grid axis '" << axis.getValue()
                         << "' appears more than once";
    if (size < 1)
      return emitError() << "mesh_c2: grid axis '" << axis.getValue()
                         << "' has size " << size << "; sizes must be >= 1";
  }
  // Checked one axis at a time so the product cannot wrap.
  int64_t ranks = 1;
  for (int64_t size : sizes) {
    if (size > kMaxGridRanks || ranks * size > kMaxGridRanks)
      return emitError() << "mesh_c3: the grid has more than 2^24 ("
                         << kMaxGridRanks << ") ranks, a plan's limit";
    ranks *= size;
  }
  return success();
}

std::optional<int64_t> MeshAttr::getAxisSize(StringRef axis) const {
  int64_t index = getAxisIndex(axis);
  if (index < 0)
    return std::nullopt;
  return getSizes()[index];
}

int64_t MeshAttr::getAxisIndex(StringRef axis) const {
  for (auto [i, name] : llvm::enumerate(getAxes()))
    if (name.getValue() == axis)
      return i;
  return -1;
}

int64_t MeshAttr::getNumRanks() const {
  int64_t n = 1;
  for (int64_t size : getSizes())
    n *= size;
  return n;
}

SmallVector<int64_t> MeshAttr::getCoords(int64_t rank) const {
  SmallVector<int64_t> coords(getSizes().size());
  for (int64_t i = coords.size() - 1; i >= 0; --i) {
    coords[i] = rank % getSizes()[i];
    rank /= getSizes()[i];
  }
  return coords;
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

/// Parses `[a, _, b]` into axis names, "" for `_`.
static ParseResult parseAxisList(AsmParser &parser,
                                 SmallVectorImpl<StringAttr> &axes) {
  return parser.parseCommaSeparatedList(
      AsmParser::Delimiter::Square, [&]() -> ParseResult {
        std::string name;
        if (parser.parseKeywordOrString(&name))
          return failure();
        axes.push_back(
            StringAttr::get(parser.getContext(), name == "_" ? "" : name));
        return success();
      });
}

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  SmallVector<StringAttr> dims, partial;
  if (parser.parseLess() || parseAxisList(parser, dims))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") || parser.parseEqual() ||
        parseAxisList(parser, partial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<ShardingAttr>(parser.getContext(), dims, partial);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  auto printAxes = [&](ArrayRef<StringAttr> axes) {
    printer << "[";
    llvm::interleaveComma(axes, printer, [&](StringAttr axis) {
      printer << (axis.getValue().empty() ? StringRef("_") : axis.getValue());
    });
    printer << "]";
  };
  printer << "<";
  printAxes(getDims());
  if (!getPartial().empty()) {
    printer << ", partial = ";
    printAxes(getPartial());
  }
  printer << ">";
}

LogicalResult
ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     ArrayRef<StringAttr> dims, ArrayRef<StringAttr> partial) {
  llvm::SmallSet<StringRef, 4> used;
  for (StringAttr axis : dims)
    if (!axis.getValue().empty() && !used.insert(axis.getValue()).second)
      return emitError() << "sharding_c1: grid axis '" << axis.getValue()
                         << "' splits more than one dimension";
  for (StringAttr axis : partial)
    if (axis.getValue().empty() || !used.insert(axis.getValue()).second)
      return emitError() << "sharding_c1: partial axis '" << axis.getValue()
                         << "' also splits a dimension or is repeated";
  return success();
}

ShardingAttr ShardingAttr::getReplicated(MLIRContext *ctx, int64_t rank) {
  SmallVector<StringAttr> dims(rank, StringAttr::get(ctx, ""));
  return ShardingAttr::get(ctx, dims, {});
}

bool ShardingAttr::isReplicated() const {
  return getPartial().empty() &&
         llvm::all_of(getDims(),
                      [](StringAttr axis) { return axis.getValue().empty(); });
}

StringRef ShardingAttr::getDimAxis(int64_t dim) const {
  return getDims()[dim].getValue();
}

bool ShardingAttr::isPartialOn(StringRef axis) const {
  return llvm::any_of(getPartial(),
                      [&](StringAttr a) { return a.getValue() == axis; });
}

//===----------------------------------------------------------------------===//
// Discardable attribute verification
//===----------------------------------------------------------------------===//

/// Checks a `megac.param` dictionary against the argument's type.
static LogicalResult verifyParamSpec(Operation *op, DictionaryAttr spec,
                                     Type argType) {
  auto name = spec.getAs<StringAttr>("name");
  if (!name || name.getValue().empty())
    return op->emitOpError("param_c1: megac.param needs a non-empty 'name'");
  auto init = spec.getAs<StringAttr>("init");
  if (!init || !llvm::is_contained(ArrayRef<StringRef>{"normal", "zeros", "ones"},
                                   init.getValue()))
    return op->emitOpError("param_c2: parameter '")
           << name.getValue()
           << "' needs init = \"normal\", \"zeros\" or \"ones\"";
  if (init.getValue() == "normal") {
    auto stddev = spec.getAs<FloatAttr>("std");
    if (!stddev || !(stddev.getValueAsDouble() > 0.0) ||
        !std::isfinite(stddev.getValueAsDouble()))
      return op->emitOpError("param_c3: parameter '")
             << name.getValue()
             << "' with normal init needs a positive, finite 'std'";
  }
  auto tensorType = dyn_cast<RankedTensorType>(argType);
  if (!tensorType || !tensorType.hasStaticShape() ||
      !tensorType.getElementType().isF32())
    return op->emitOpError("param_c4: parameter '")
           << name.getValue() << "' must be a static f32 tensor";
  // (An embedding table of no rows bounds no token id; a layer of width
  // 0 computes nothing: a slip in the model, named here.)
  if (llvm::is_contained(tensorType.getShape(), 0))
    return op->emitOpError("param_c6: parameter '")
           << name.getValue() << "' has a dimension of size 0 (" << tensorType
           << "): a parameter holds at least one value";
  if (auto offset = spec.get("hf_offset")) {
    auto array = dyn_cast<DenseI64ArrayAttr>(offset);
    if (!array || array.size() != tensorType.getRank() ||
        llvm::any_of(array.asArrayRef(), [](int64_t v) { return v < 0; }))
      return op->emitOpError("param_c5: 'hf_offset' of parameter '")
             << name.getValue()
             << "' must be non-negative, one entry per dimension";
  }
  return success();
}

LogicalResult MegacDialect::verifyRegionArgAttribute(Operation *op,
                                                     unsigned regionIndex,
                                                     unsigned argIndex,
                                                     NamedAttribute attr) {
  auto func = dyn_cast<func::FuncOp>(op);
  if (!func)
    return op->emitOpError("megac argument attributes belong on func.func");
  Type argType = func.getArgument(argIndex).getType();
  StringRef name = attr.getName().getValue();
  if (name == kParamAttrName) {
    auto spec = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!spec)
      return op->emitOpError("param_c1: megac.param must be a dictionary");
    return verifyParamSpec(op, spec, argType);
  }
  if (name == kInputAttrName) {
    auto kind = dyn_cast<StringAttr>(attr.getValue());
    if (!kind || (kind.getValue() != "tokens" && kind.getValue() != "labels"))
      return op->emitOpError(
          "input_c1: megac.input must be \"tokens\" or \"labels\"");
    auto type = dyn_cast<RankedTensorType>(argType);
    if (!type || type.getRank() != 2 || !type.getElementType().isInteger(32))
      return op->emitOpError("input_c2: input '")
             << kind.getValue() << "' must be a [batch, seq] i32 tensor";
    return success();
  }
  if (name == kShardingAttrName) {
    auto sharding = dyn_cast<ShardingAttr>(attr.getValue());
    auto type = dyn_cast<RankedTensorType>(argType);
    if (!sharding || !type)
      return op->emitOpError("megac.sharding must be a #megac.sharding on a "
                             "ranked tensor argument");
    if (static_cast<int64_t>(sharding.getDims().size()) != type.getRank())
      return op->emitOpError("sharding_c2: argument ")
             << argIndex << "'s sharding has " << sharding.getDims().size()
             << " entries but its type is " << argType;
    if (!sharding.getPartial().empty())
      return op->emitOpError("sharding_c3: arguments cannot be partial sums");
    return success();
  }
  return op->emitOpError("unknown megac argument attribute '") << name << "'";
}

LogicalResult MegacDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  Attribute value = attr.getValue();
  if (name == kMeshAttrName) {
    if (!isa<MeshAttr>(value) || !isa<ModuleOp>(op))
      return op->emitOpError("megac.mesh must be a #megac.mesh on a module");
    return success();
  }
  if (name == kShardingAttrName) {
    auto sharding = dyn_cast<ShardingAttr>(value);
    if (!sharding || op->getNumResults() != 1)
      return op->emitOpError(
          "megac.sharding on an op must be a #megac.sharding and the op must "
          "have one result");
    auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
    if (!type ||
        static_cast<int64_t>(sharding.getDims().size()) != type.getRank())
      return op->emitOpError("sharding_c2: the result's sharding has ")
             << sharding.getDims().size() << " entries but its type is "
             << op->getResult(0).getType();
    return success();
  }
  if (name == kOperandShardingsAttrName) {
    auto array = dyn_cast<ArrayAttr>(value);
    if (!array || array.size() != op->getNumOperands() ||
        !llvm::all_of(array, [](Attribute a) { return isa<ShardingAttr>(a); }))
      return op->emitOpError("megac.operand_shardings must hold one "
                             "#megac.sharding per operand");
    for (auto [index, entry] : llvm::enumerate(array)) {
      const int64_t entries = cast<ShardingAttr>(entry).getDims().size();
      auto type = dyn_cast<RankedTensorType>(op->getOperand(index).getType());
      if (!type || entries != type.getRank())
        return op->emitOpError("sharding_c2: operand ")
               << index << "'s sharding has " << entries
               << " entries but its type is "
               << op->getOperand(index).getType();
    }
    return success();
  }
  if (name == kModelAttrName && isa<StringAttr>(value))
    return success();
  if (name == kLocalizedAttrName && isa<UnitAttr>(value))
    return success();
  if (name == kReduceResultAttrName) {
    auto axes = dyn_cast<ArrayAttr>(value);
    if (!axes || op->getNumResults() != 1 ||
        !llvm::all_of(axes, [](Attribute a) { return isa<StringAttr>(a); }))
      return op->emitOpError("megac.reduce_result must list grid axes (as "
                             "strings) on a one-result op");
    return success();
  }
  if (name == kStageAttrName) {
    auto stages = dyn_cast<DenseI64ArrayAttr>(value);
    if (!stages || stages.empty() ||
        llvm::any_of(stages.asArrayRef(), [](int64_t s) { return s < 0; }))
      return op->emitOpError("megac.stage must be a non-empty array of "
                             "non-negative stage numbers");
    return success();
  }
  if (name == kPhaseAttrName) {
    auto phase = dyn_cast<StringAttr>(value);
    if (!phase || (phase.getValue() != "forward" &&
                   phase.getValue() != "backward" &&
                   phase.getValue() != "step"))
      return op->emitOpError("megac.phase must be \"forward\", \"backward\" "
                             "or \"step\"");
    return success();
  }
  if (name == kFusionAttrName) {
    auto group = dyn_cast<StringAttr>(value);
    if (!group || group.getValue().size() < 2 ||
        !llvm::is_contained(StringRef("abcdegnrtw"), group.getValue()[0]) ||
        !llvm::all_of(group.getValue().drop_front(),
                      [](char c) { return c >= '0' && c <= '9'; }))
      return op->emitOpError(
          "megac.fusion must name a kernel group as "
          "\"a<number>\", \"b<number>\", \"c<number>\", \"d<number>\", "
          "\"e<number>\", \"g<number>\", "
          "\"n<number>\", \"r<number>\", \"t<number>\" "
          "or \"w<number>\"");
    return success();
  }
  if (name == kPipelineStagesAttrName) {
    auto count = dyn_cast<IntegerAttr>(value);
    if (!count || !isa<ModuleOp>(op) || count.getInt() < 1)
      return op->emitOpError("megac.pipeline_stages must be a positive "
                             "integer on a module");
    return success();
  }
  if (name == kMicroBatchesAttrName) {
    auto count = dyn_cast<IntegerAttr>(value);
    if (!count || !isa<ModuleOp>(op) || count.getInt() < 1 ||
        count.getInt() > kMaxMicroBatches)
      return op->emitOpError("megac.micro_batches must be an integer from 1 "
                             "to 1048576 on a module");
    return success();
  }
  if (name == kTrainAttrName) {
    auto dict = dyn_cast<DictionaryAttr>(value);
    if (!dict || !isa<ModuleOp>(op) || !dict.getAs<FloatAttr>("max_lr") ||
        !dict.getAs<FloatAttr>("min_lr") ||
        !dict.getAs<IntegerAttr>("warmup_steps") ||
        !dict.getAs<IntegerAttr>("total_steps"))
      return op->emitOpError("megac.train must be a dictionary {max_lr, "
                             "min_lr, warmup_steps, total_steps} on a module");
    for (StringRef rate : {"max_lr", "min_lr"}) {
      const double value = dict.getAs<FloatAttr>(rate).getValueAsDouble();
      if (!std::isfinite(value) || value < 0)
        return op->emitOpError("megac.train: ")
               << rate << " must be finite and not negative, got " << value;
    }
    for (StringRef steps : {"warmup_steps", "total_steps"})
      if (dict.getAs<IntegerAttr>(steps).getInt() < 0)
        return op->emitOpError("megac.train: ")
               << steps << " must not be negative, got "
               << dict.getAs<IntegerAttr>(steps).getInt();
    return success();
  }
  return op->emitOpError("unknown or malformed megac attribute '")
         << name << "'";
}
