//===- PlanEmitter.cpp - Localized IR to a FlatBuffers plan ---------------===//
//
// Every SSA value becomes one buffer; every op one instruction. The IR after
// megac-localize-shapes is the same program for all ranks up to their grid
// coordinates, so the emitter walks it once per rank and fills in what a
// coordinate decides: parameter slice offsets, the first vocabulary row of a
// split embedding, and each collective's axis.
//
//===----------------------------------------------------------------------===//

#include "megac/Target/Plan/PlanEmitter.h"
#include "SharedTables.h"

#include "ElementwiseSource.inc"

#include "megac/Dialect/Megac/IR/GemmEpilogue.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ModelStructure.h"
#include "megac/Dialect/Megac/IR/ShardingUtils.h"
#include "megac_rt/plan_file.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"
#include <type_traits>

#include <functional>
#include <future>
#include <map>

using namespace mlir;
namespace fb = flatbuffers;
namespace mp = megac::plan;

namespace megac {
namespace {

/// The grid as the emitter sees it: possibly no axes (one rank).
struct Grid {
  MeshAttr mesh;
  int64_t numRanks() const { return mesh ? mesh.getNumRanks() : 1; }
  SmallVector<int64_t> coords(int64_t rank) const {
    return mesh ? mesh.getCoords(rank) : SmallVector<int64_t>{};
  }
  /// Index of `axis` in the grid, -1 if absent.
  int64_t axisIndex(StringRef axis) const {
    return mesh && !axis.empty() ? mesh.getAxisIndex(axis) : -1;
  }
  int64_t axisSize(StringRef axis) const {
    return getAxisSizeOrOne(mesh, axis);
  }
};

std::vector<int64_t> toVector(ArrayRef<int64_t> values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

std::string locationString(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName().stripDialect();
  if (auto loc = dyn_cast<FileLineColLoc>(op->getLoc()))
    os << " @ " << loc.getFilename().getValue() << ":" << loc.getLine();
  return text;
}

/// The generated kernels of a plan, shared by all ranks: one per distinct
/// sequence of steps (the same chain in every layer is one kernel).
struct KernelTable {
  struct Entry {
    std::string name;
    std::vector<std::pair<std::string, std::vector<int>>> steps; // op, args
    std::vector<mp::OpCode> codes;
    unsigned inputs = 0;
  };
  std::vector<Entry> kernels;
  std::map<std::string, uint32_t> bySignature;

  uint32_t get(Entry entry) {
    std::string signature = std::to_string(entry.inputs);
    for (auto &[op, args] : entry.steps) {
      signature += ";" + op;
      for (int a : args)
        signature += "," + std::to_string(a);
    }
    auto [it, added] = bySignature.emplace(signature, kernels.size());
    if (added) {
      // megac_fused3_add2_gelu: the steps, repeats counted.
      entry.name = "megac_fused" + std::to_string(kernels.size());
      for (size_t i = 0; i < entry.steps.size();) {
        size_t j = i;
        while (j < entry.steps.size() &&
               entry.steps[j].first == entry.steps[i].first)
          ++j;
        entry.name += "_" + entry.steps[i].first +
                      (j - i > 1 ? std::to_string(j - i) : "");
        i = j;
      }
      kernels.push_back(std::move(entry));
    }
    return it->second;
  }
};

class RankEmitter {
public:
  RankEmitter(SharedTables &tables, const Grid &grid, int64_t rank,
              int64_t microBatches)
      : tables(tables), fbb(tables.builder()), grid(grid), rank(rank),
        microBatches(microBatches), coords(toVector(grid.coords(rank))) {}

  FailureOr<fb::Offset<mp::RankProgram>> emit(func::FuncOp func) {
    if (pipeline)
      return emitPipelined(func);
    Block &body = func.getBody().front();
    for (BlockArgument arg : body.getArguments()) {
      if (failed(addBuffer(arg, "")))
        return failure();
      if (failed(addArgument(func, arg)))
        return failure();
    }
    llvm::DenseSet<Operation *> forwardOps = returnedCone(body);
    generationOnly = collectGenerationOnlyOps(func);
    int32_t forwardEnd = -1, accumulateEnd = -1;
    bool training = false;
    for (Operation &op : body) {
      if (isa<AdamWOp>(op))
        training = true;
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        addOutputs(func, ret);
        continue;
      }
      if (failed(emitOp(op)))
        return failure();
      // After the op's instruction, if it has one (a fused or absorbed op
      // has none of its own).
      if (isa<AccumulateOp>(op))
        accumulateEnd = static_cast<int32_t>(instrs.size());
      if (forwardOps.contains(&op))
        forwardEnd = static_cast<int32_t>(instrs.size());
    }
    return finishRank(training ? forwardEnd : -1,
                      microBatches > 1 ? accumulateEnd : -1, {}, {});
  }

  /// What a pipeline needs to know beyond the grid.
  struct Pipeline {
    int64_t chunks = 1, ranks = 1, axis = -1;
    const PipelineSchedule *schedule = nullptr;
    /// Each megac.transfer's number, the same on both ends.
    llvm::DenseMap<Operation *, int64_t> transferIds;
  };
  void setPipeline(const Pipeline *p) { pipeline = p; }
  void setKernels(KernelTable *table) { kernelTable = table; }

private:
  /// One entry of a pipeline rank's instruction list.
  enum class ItemKind { Op, Send, Recv };
  struct Item {
    Operation *op;
    ItemKind kind;
  };

  /// The rank at this rank's coordinates but pipeline coordinate \p pp.
  int64_t pipelinePeer(int64_t pp) const {
    SmallVector<int64_t> at(coords.begin(), coords.end());
    at[pipeline->axis] = pp;
    int64_t r = 0;
    for (auto [c, size] : llvm::zip(at, grid.mesh.getSizes()))
      r = r * size + c;
    return r;
  }

  /// A pipeline rank's program: the ops of its stages (model chunks), cut
  /// into one forward and one backward segment per chunk, laid out in the
  /// order one micro-batch runs them (forward chunks ascending, backward
  /// descending), then the once-per-step part; and the schedule's tasks.
  FailureOr<fb::Offset<mp::RankProgram>> emitPipelined(func::FuncOp func) {
    Block &body = func.getBody().front();
    const int64_t pp = pipeline->ranks;
    const int64_t chunks = pipeline->chunks / pp;
    const int64_t me = coords[pipeline->axis];
    auto mine = [&](int64_t stage) { return stage % pp == me; };
    SmallVector<SmallVector<Item>> forward(chunks), backward(chunks);
    SmallVector<Item> step;
    for (Operation &op : body.without_terminator()) {
      int64_t last = pipeline->chunks - 1;
      bool bad = llvm::any_of(getStages(&op),
                              [&](int64_t s) { return s > last; });
      if (auto t = dyn_cast<TransferOp>(op))
        bad |= t.getSrcStage() > last || t.getDstStage() > last;
      if (bad)
        return op.emitOpError("is placed on a stage beyond the pipeline's ")
               << pipeline->chunks << " stages";
    }
    auto listFor = [&](int64_t stage, int phase) -> SmallVector<Item> & {
      return phase == 0   ? forward[stage / pp]
             : phase == 1 ? backward[stage / pp]
                          : step;
    };
    generationOnly = collectGenerationOnlyOps(func);
    for (Operation &op : body.without_terminator()) {
      if (auto t = dyn_cast<TransferOp>(op)) {
        int64_t src = t.getSrcStage(), dst = t.getDstStage();
        if (src % pp == dst % pp)
          continue; // both chunks on this rank: the value is already here
        if (mine(src))
          listFor(src, phaseRank(t.getSrcPhase())).push_back({&op, ItemKind::Send});
        if (mine(dst))
          listFor(dst, phaseRank(t.getDstPhase())).push_back({&op, ItemKind::Recv});
        continue;
      }
      int phase = phaseRank(getPhase(&op));
      if (phase < 0)
        return op.emitOpError("is not placed on a pipeline stage; run "
                              "megac-pipeline-stages first");
      // A constant several of this rank's chunks use is made once, by the
      // chunk that runs first.
      std::optional<int64_t> pick;
      for (int64_t stage : getStages(&op))
        if (mine(stage) && (!pick || (phase == 1 ? stage > *pick : stage < *pick)))
          pick = stage;
      if (pick)
        listFor(*pick, phase).push_back({&op, ItemKind::Op});
    }
    // Only the parameters and inputs this rank's ops read.
    llvm::SetVector<BlockArgument> used;
    auto noteUses = [&](Operation *op) {
      for (Value operand : op->getOperands())
        if (auto arg = dyn_cast<BlockArgument>(operand))
          used.insert(arg);
    };
    for (auto *list : {&step})
      for (Item &item : *list)
        noteUses(item.op);
    for (int64_t j = 0; j < chunks; ++j)
      for (auto *list : {&forward[j], &backward[j]})
        for (Item &item : *list)
          if (item.kind != ItemKind::Recv)
            noteUses(item.op);
    for (BlockArgument arg : body.getArguments())
      if (used.contains(arg))
        if (failed(addBuffer(arg, "")) || failed(addArgument(func, arg)))
          return failure();

    std::vector<fb::Offset<mp::Segment>> segments;
    auto emitSegment = [&](SmallVector<Item> &items, int64_t stage,
                           bool isBackward) -> LogicalResult {
      uint32_t begin = instrs.size();
      if (failed(emitItems(items)))
        return failure();
      uint32_t end = instrs.size();
      auto key = TableKey(TableKey::Kind::Segment)
                     .scalar(begin)
                     .scalar(end)
                     .scalar(stage)
                     .scalar(isBackward);
      segments.push_back(tables.get<mp::Segment>(key, [&] {
        return mp::CreateSegment(fbb, begin, end, static_cast<uint32_t>(stage),
                                 isBackward);
      }));
      return success();
    };
    for (int64_t j = 0; j < chunks; ++j)
      if (failed(emitSegment(forward[j], j * pp + me, false)))
        return failure();
    for (int64_t j = chunks - 1; j >= 0; --j)
      if (failed(emitSegment(backward[j], j * pp + me, true)))
        return failure();
    int32_t accumulateEnd = static_cast<int32_t>(instrs.size());
    if (failed(emitItems(step)))
      return failure();
    addOutputs(func, cast<func::ReturnOp>(body.getTerminator()));

    std::vector<fb::Offset<mp::Task>> tasks;
    for (const PipelineTask &task : pipeline->schedule->ranks[me]) {
      uint32_t segment = task.backward
                             ? static_cast<uint32_t>(2 * chunks - 1 - task.chunk)
                             : static_cast<uint32_t>(task.chunk);
      auto micro = static_cast<uint32_t>(task.microBatch);
      auto key = TableKey(TableKey::Kind::Task).scalar(segment).scalar(micro);
      tasks.push_back(tables.get<mp::Task>(
          key, [&] { return mp::CreateTask(fbb, segment, micro); }));
    }
    return finishRank(/*forwardEnd=*/-1, accumulateEnd, segments, tasks);
  }

  /// The rank's table: its coordinates, and the lists it may share with
  /// other ranks (empty segments and tasks: no pipeline).
  fb::Offset<mp::RankProgram>
  finishRank(int32_t forwardEnd, int32_t accumulateEnd,
             const std::vector<fb::Offset<mp::Segment>> &segments,
             const std::vector<fb::Offset<mp::Task>> &tasks) {
    auto coordsVector = fbb.CreateVector(coords);
    auto bufferVector = tables.vector(bufferOffsets);
    auto paramVector = tables.vector(params);
    auto inputVector = tables.vector(inputs);
    auto outputVector = tables.vector(outputs);
    auto instrVector = tables.vector(instrs);
    auto segmentVector = segments.empty() ? 0 : tables.vector(segments);
    auto taskVector = tasks.empty() ? 0 : tables.vector(tasks);
    return mp::CreateRankProgram(fbb, rank, coordsVector, bufferVector,
                                 paramVector, inputVector, outputVector,
                                 instrVector, forwardEnd, accumulateEnd,
                                 segmentVector, taskVector);
  }

  /// Appends an instruction; the ranks that have the same one share its
  /// table. \p paramName and \p paramOffset: AdamW only.
  void addInstr(mp::OpCode code, const std::vector<uint32_t> &in,
                const std::vector<uint32_t> &out,
                const std::vector<int64_t> &ints,
                const std::vector<double> &floats, int32_t axis,
                const std::string &loc, bool isGenerationOnly, bool rounds,
                const std::string &paramName = "",
                const std::vector<int64_t> &paramOffset = {}) {
    auto key = TableKey(TableKey::Kind::Instr)
                   .scalar(code)
                   .list(in)
                   .list(out)
                   .list(ints)
                   .list(floats)
                   .scalar(axis)
                   .text(loc)
                   .text(paramName)
                   .list(paramOffset)
                   .scalar(isGenerationOnly)
                   .scalar(rounds);
    instrs.push_back(tables.get<mp::Instr>(key, [&] {
      auto inVector = fbb.CreateVector(in);
      auto outVector = fbb.CreateVector(out);
      auto intVector = fbb.CreateVector(ints);
      auto floatVector = fbb.CreateVector(floats);
      auto locString = fbb.CreateSharedString(loc);
      fb::Offset<fb::String> nameString;
      fb::Offset<fb::Vector<int64_t>> offsetVector;
      if (!paramName.empty()) {
        nameString = fbb.CreateSharedString(paramName);
        offsetVector = fbb.CreateVector(paramOffset);
      }
      return mp::CreateInstr(fbb, code, inVector, outVector, intVector,
                             floatVector, axis, locString, nameString,
                             offsetVector, isGenerationOnly, rounds);
    }));
  }

  LogicalResult emitItems(ArrayRef<Item> items) {
    for (const Item &item : items) {
      if (item.kind == ItemKind::Op) {
        if (failed(emitOp(*item.op)))
          return failure();
        continue;
      }
      auto t = cast<TransferOp>(item.op);
      Value value = t.getInput();
      bool send = item.kind == ItemKind::Send;
      // The received copy is this rank's instance of the value.
      if (!send && failed(addBuffer(value, "recv")))
        return failure();
      std::vector<uint32_t> in, out;
      (send ? in : out).push_back(buffers.lookup(value));
      std::vector<int64_t> ints = {
          pipelinePeer((send ? t.getDstStage() : t.getSrcStage()) %
                       pipeline->ranks),
          pipeline->transferIds.lookup(item.op)};
      std::vector<double> floats;
      std::string loc = locationString(item.op);
      Operation *def = value.getDefiningOp();
      addInstr(send ? mp::OpCode_Send : mp::OpCode_Recv, in, out, ints,
               floats, -1, loc, def && generationOnly.contains(def),
               /*rounds=*/false);
    }
    return success();
  }

  /// The function's results this rank holds, by name.
  void addOutputs(func::FuncOp func, func::ReturnOp ret) {
    for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
      if (!buffers.count(value))
        continue; // computed on another pipeline stage
      auto name = func.getResultAttrOfType<StringAttr>(
          i, MegacDialect::kResultNameAttrName);
      std::string text =
          name ? name.getValue().str() : "output" + std::to_string(i);
      uint32_t buffer = buffers.lookup(value);
      auto key = TableKey(TableKey::Kind::Output).text(text).scalar(buffer);
      outputs.push_back(tables.get<mp::Output>(key, [&] {
        return mp::CreateOutputDirect(fbb, text.c_str(), buffer);
      }));
    }
  }

  /// Whether \p op is the last op of its fusion group (the one whose
  /// result leaves it); the others are part of that op's instruction.
  static bool isGroupRoot(Operation &op, StringAttr group) {
    if (op.getNumResults() != 1 || !op.getResult(0).hasOneUse())
      return true;
    Operation *user = *op.getResult(0).getUsers().begin();
    return user->getAttr(MegacDialect::kFusionAttrName) != group;
  }

  /// One generated kernel for the elementwise group ending at \p root.
  LogicalResult emitFused(Operation *root, StringAttr group) {
    KernelTable::Entry entry;
    std::vector<uint32_t> in;
    llvm::DenseMap<Value, int> inputIndex, stepIndex;
    std::function<int(Value)> visit = [&](Value value) -> int {
      Operation *def = value.getDefiningOp();
      if (def && def->getAttr(MegacDialect::kFusionAttrName) == group) {
        if (auto it = stepIndex.find(value); it != stepIndex.end())
          return -it->second - 1;
        std::vector<int> args;
        for (Value operand : def->getOperands())
          args.push_back(visit(operand));
        entry.steps.push_back({def->getName().stripDialect().str(), args});
        stepIndex[value] = static_cast<int>(entry.steps.size()) - 1;
        return -static_cast<int>(entry.steps.size());
      }
      auto [it, added] = inputIndex.try_emplace(value, in.size());
      if (added)
        in.push_back(buffers.lookup(value));
      return it->second;
    };
    visit(root->getResult(0));
    entry.inputs = in.size();
    uint32_t kernel = kernelTable->get(std::move(entry));
    if (failed(addBuffer(root->getResult(0), "fused")))
      return failure();
    std::vector<uint32_t> out = {buffers.lookup(root->getResult(0))};
    std::vector<int64_t> ints = {kernel};
    std::vector<double> floats;
    std::string loc = locationString(root);
    addInstr(mp::OpCode_Fused, in, out, ints, floats, -1, loc,
             generationOnly.contains(root), /*rounds=*/false);
    return success();
  }

  /// Whether \p op (may be null) is marked as part of \p group.
  static bool inGroup(Operation *op, StringAttr group) {
    return op && op->getAttr(MegacDialect::kFusionAttrName) == group;
  }

  /// The group \p match (a matcher of GemmEpilogue.h) finds from \p start,
  /// taking the ops marked \p group, where \p op is in it; none where the
  /// marks do not form one with \p op in it (IR marked by hand): its ops
  /// are then emitted one by one.
  template <class StartOp, class MatchFn>
  static std::invoke_result_t<MatchFn, StartOp,
                              llvm::function_ref<bool(Operation *)>>
  groupWith(Operation *op, StringAttr group, StartOp start, MatchFn match) {
    auto sameGroup = [&](Operation *candidate) {
      return inGroup(candidate, group);
    };
    if (!start || !sameGroup(start))
      return std::nullopt;
    auto found = match(start, sameGroup);
    if (!found || !llvm::is_contained(found->ops(), op))
      return std::nullopt;
    return found;
  }

  /// The GEMM group marked \p group that \p op belongs to.
  static std::optional<GemmEpilogue> gemmGroupOf(Operation *op,
                                                 StringAttr group) {
    // Every member but the product reads one of the group (the residual
    // add may read it as its second operand).
    Operation *start = op;
    while (!isa<LinearOp>(start)) {
      auto inside = llvm::find_if(start->getOperands(), [&](Value operand) {
        return inGroup(operand.getDefiningOp(), group);
      });
      if (inside == start->getOperands().end())
        break;
      start = (*inside).getDefiningOp();
    }
    return groupWith(op, group, dyn_cast<LinearOp>(start), matchGemmEpilogue);
  }

  /// The op a rounding group's \p round rounds (null: \p round is not
  /// the rounding of a well-formed "r" group).
  static Operation *roundedProducer(Operation *round, StringAttr group) {
    auto r = dyn_cast<RoundBf16Op>(round);
    Operation *def = r ? r.getInput().getDefiningOp() : nullptr;
    if (!def || def->getAttr(MegacDialect::kFusionAttrName) != group ||
        def->getNumResults() != 1 || !r.getInput().hasOneUse())
      return nullptr;
    return def;
  }

  /// \p producer's instruction with its result rounded to bf16 as it is
  /// written, into \p round's result.
  LogicalResult emitRounded(Operation *producer, Operation *round) {
    if (failed(
            addBuffer(round->getResult(0), producer->getName().stripDialect())))
      return failure();
    buffers[producer->getResult(0)] = buffers.lookup(round->getResult(0));
    roundingOutput = true;
    LogicalResult result = addInstruction(producer);
    roundingOutput = false;
    return result;
  }

  /// The op \p op rounds where it is a rounding (null where that has no
  /// defining op), else \p op: where a group's lookup starts from its
  /// members' last.
  static Operation *unrounded(Operation *op) {
    if (auto round = dyn_cast<RoundBf16Op>(op))
      return round.getInput().getDefiningOp();
    return op;
  }

  /// The GeLU-gradient group marked \p group that \p op belongs to.
  static std::optional<GemmGeluGrad> geluGradGroupOf(Operation *op,
                                                     StringAttr group) {
    // The rounding reads the gradient; the gradient reads the product as
    // its output gradient.
    Operation *start = unrounded(op);
    if (auto grad = dyn_cast_or_null<GeluGradOp>(start))
      start = grad.getOutputGrad().getDefiningOp();
    return groupWith(op, group, dyn_cast_or_null<LinearOp>(start),
                     matchGemmGeluGrad);
  }

  /// The product-accumulating group marked \p group that \p op belongs
  /// to.
  static std::optional<GemmAccumulate> accumulateGroupOf(Operation *op,
                                                         StringAttr group) {
    // The rounding reads the sum; the sum reads the product.
    Operation *start = unrounded(op);
    if (auto add = dyn_cast_or_null<AddOp>(start))
      for (Value operand : add->getOperands())
        if (auto linear = operand.getDefiningOp<LinearOp>();
            linear && inGroup(linear, group))
          start = linear;
    return groupWith(op, group, dyn_cast_or_null<LinearOp>(start),
                     matchGemmAccumulate);
  }

  /// \p op's instruction with \p addend, a tensor of its result's shape
  /// added as it is written, as its last input (rounded after where \p
  /// rounded), writing the group's \p result.
  LogicalResult emitWithAddend(Operation *op, Value result, Value addend,
                               bool rounded) {
    if (failed(addBuffer(result, op->getName().stripDialect())))
      return failure();
    buffers[op->getResult(0)] = buffers.lookup(result);
    roundingOutput = rounded;
    residualInput = addend;
    LogicalResult emitted = addInstruction(op);
    roundingOutput = false;
    residualInput = {};
    return emitted;
  }

  /// The norm-gradient group marked \p group that \p op belongs to.
  static std::optional<NormGradResidual> normGradGroupOf(Operation *op,
                                                         StringAttr group) {
    // The rounding reads the sum; the sum reads the norm's gradient.
    Operation *start = unrounded(op);
    if (auto add = dyn_cast_or_null<AddOp>(start))
      for (Value operand : add->getOperands())
        if (isa_and_nonnull<LayerNormGradOp>(operand.getDefiningOp()))
          start = operand.getDefiningOp();
    return groupWith(op, group, dyn_cast_or_null<LayerNormGradOp>(start),
                     matchNormGradResidual);
  }

  /// The group marked \p group that \p op belongs to, of a gradient op
  /// GradOp (a LayerNorm gain's, a weight's) and the column sum of its dy
  /// (a bias gradient), as \p match finds it.
  template <class GradOp, class MatchFn>
  static std::invoke_result_t<MatchFn, GradOp,
                              llvm::function_ref<bool(Operation *)>>
  columnSumGroupOf(Operation *op, StringAttr group, MatchFn match) {
    // The bias gradient's dy is the other op's.
    auto grad = dyn_cast<GradOp>(op);
    if (auto bias = dyn_cast<SumLeadingOp>(op))
      for (Operation *user : bias.getInput().getUsers())
        if (auto g = dyn_cast<GradOp>(user);
            g && inGroup(g, group) && g.getOutputGrad() == bias.getInput())
          grad = g;
    return groupWith(op, group, grad, match);
  }

  /// A gradient op and the bias gradient from its pass over dy (a
  /// LayerNorm's gain gradient, a product's weight gradient): the op's
  /// instruction with the bias gradient as a second output.
  LogicalResult emitWithColumnSum(Operation *grad, SumLeadingOp bias) {
    if (failed(addBuffer(grad->getResult(0), grad->getName().stripDialect())) ||
        failed(addBuffer(bias.getResult(), "sum_leading")))
      return failure();
    extraOutputs = {bias.getResult()};
    LogicalResult result = addInstruction(grad);
    extraOutputs.clear();
    return result;
  }

  /// The embedding-gradient group marked \p group that \p op belongs to.
  static std::optional<EmbeddingGradInto> tiedGroupOf(Operation *op,
                                                      StringAttr group) {
    // The add reads the embedding's gradient.
    auto grad = dyn_cast<EmbeddingGradOp>(op);
    if (auto add = dyn_cast<AddOp>(op))
      for (Value operand : add->getOperands())
        if (auto g = operand.getDefiningOp<EmbeddingGradOp>();
            g && inGroup(g, group))
          grad = g;
    return groupWith(op, group, grad, matchEmbeddingGradInto);
  }

  /// The embedding's gradient with another gradient of the table added:
  /// its instruction with that gradient as a fourth input, writing the sum
  /// (into that gradient's buffer, in place, where the add was its one
  /// reader).
  LogicalResult emitEmbeddingGradInto(EmbeddingGradInto g) {
    Value sum = g.add.getResult();
    if (g.inPlace())
      buffers[sum] = buffers.lookup(g.into());
    else if (failed(addBuffer(sum, "embedding_grad")))
      return failure();
    buffers[g.grad.getResult()] = buffers.lookup(sum);
    residualInput = g.into();
    LogicalResult result = addInstruction(g.grad);
    residualInput = {};
    return result;
  }

  /// The attention-gradient group marked \p group that \p op belongs to.
  static std::optional<AttentionInputGrads> inputGradGroupOf(Operation *op,
                                                             StringAttr group) {
    // A rounding reads its step; the key's step shares its operands with
    // the others.
    auto grad = dyn_cast_or_null<AttentionGradOp>(unrounded(op));
    if (!grad)
      return std::nullopt;
    AttentionGradOp key = grad.getOperand() == 1 ? grad : AttentionGradOp();
    for (Operation *user : grad.getOutputGrad().getUsers())
      if (auto other = dyn_cast<AttentionGradOp>(user);
          !key && other && other.getOperand() == 1 && inGroup(other, group))
        key = other;
    return groupWith(op, group, key, matchAttentionInputGrads);
  }

  /// An attention's input gradients from one pass: one instruction with
  /// which = 3 (dk and dv) or 4 (dq, dk and dv) and the (rounded) results
  /// as its outputs, in that order.
  LogicalResult emitInputGrads(AttentionInputGrads g) {
    SmallVector<Value, 3> results = g.results();
    for (Value result : results)
      if (failed(addBuffer(result, "attention_grad")))
        return failure();
    AttentionGradOp first = g.query ? g.query : g.key;
    buffers[first.getResult()] = buffers.lookup(results.front());
    roundingOutput = static_cast<bool>(g.keyRound);
    extraOutputs.assign(results.begin() + 1, results.end());
    attentionWhich = g.query ? 4 : 3;
    LogicalResult result = addInstruction(first);
    roundingOutput = false;
    extraOutputs.clear();
    attentionWhich = -1;
    return result;
  }

  /// A product with GeLU's gradient as its epilogue: one instruction where
  /// the group's last op is.
  LogicalResult emitLinearGeluGrad(GemmGeluGrad g) {
    if (failed(addBuffer(g.result(), "linear_gelu_grad")))
      return failure();
    std::vector<uint32_t> in = {buffers.lookup(g.linear.getInput()),
                                buffers.lookup(g.linear.getWeight()),
                                buffers.lookup(g.grad.getInput())};
    std::vector<uint32_t> out = {buffers.lookup(g.result())};
    std::vector<int64_t> ints = {g.linear.getTransposeWeight() ? 1 : 0};
    std::vector<double> floats;
    std::string loc = locationString(g.linear);
    addInstr(mp::OpCode_LinearGeluGrad, in, out, ints, floats, -1, loc,
             generationOnly.contains(g.result().getDefiningOp()),
             static_cast<bool>(g.round));
    return success();
  }

  /// A product with its bias (and GeLU, or residual) epilogue: one
  /// instruction, where the group's last op is. Inputs: x, w, the bias,
  /// the residual where there is one. Outputs: the result, then the
  /// pre-activation where the backward pass keeps it; rounded as written
  /// in a bf16 plan.
  LogicalResult emitLinearBias(GemmEpilogue g) {
    std::vector<uint32_t> out;
    for (Value value : {g.result(), g.preActivation()}) {
      if (!out.empty() && !g.keepsPreActivation())
        break;
      if (failed(addBuffer(value, "linear_bias")))
        return failure();
      out.push_back(buffers.lookup(value));
    }
    std::vector<uint32_t> in = {buffers.lookup(g.linear.getInput()),
                                buffers.lookup(g.linear.getWeight()),
                                buffers.lookup(g.add.getRhs())};
    if (Value residual = g.residualInput())
      in.push_back(buffers.lookup(residual));
    std::vector<int64_t> ints = {g.linear.getTransposeWeight() ? 1 : 0,
                                 g.gelu ? 1 : 0};
    std::vector<double> floats;
    std::string loc = locationString(g.linear);
    addInstr(mp::OpCode_LinearBias, in, out, ints, floats, -1, loc,
             generationOnly.contains(g.result().getDefiningOp()), g.rounded());
    return success();
  }

  /// The micro-batch sum (megac.accumulate) that is the only reader of
  /// weight gradient \p op, on the same stage: the gradient can be written
  /// into it directly, saving the per-micro-batch copy.
  static AccumulateOp accumulatingUser(Operation &op) {
    if (!isa<LinearWeightGradOp, SumLeadingOp, LayerNormGainGradOp>(op) ||
        !op.getResult(0).hasOneUse())
      return {};
    auto acc = dyn_cast<AccumulateOp>(*op.getResult(0).getUsers().begin());
    if (!acc || getStages(acc) != getStages(&op) ||
        getPhase(acc) != getPhase(&op))
      return {};
    return acc;
  }

  /// Buffers and the instruction of one op.
  LogicalResult emitOp(Operation &op) {
      if (absorbed.contains(&op))
        return success(); // its work is done by an earlier instruction
      if (AccumulateOp acc = accumulatingUser(op)) {
        if (failed(addBuffer(acc.getResult(), "accumulate")))
          return failure();
        buffers[op.getResult(0)] = buffers.lookup(acc.getResult());
        absorbed.insert(acc);
        accumulating = true;
        LogicalResult result = addInstruction(&op);
        accumulating = false;
        return result;
      }
      // Fusion groups are one instruction each, emitted where the group's
      // result is made (a CPU plan has "a" groups only; an elementwise
      // chain becomes a generated kernel, in a CUDA plan alone).
      if (auto group =
              op.getAttrOfType<StringAttr>(MegacDialect::kFusionAttrName)) {
        if (group.getValue().starts_with("e") && kernelTable) {
          if (!isGroupRoot(op, group))
            return success();
          return emitFused(&op, group);
        }
        // A rounding joined to the op it rounds: that op's instruction,
        // writing the rounding's result, rounded.
        if (group.getValue().starts_with("r")) {
          if (Operation *producer = roundedProducer(&op, group))
            return emitRounded(producer, &op);
          if (!isGroupRoot(op, group) &&
              roundedProducer(*op.getResult(0).getUsers().begin(), group))
            return success(); // emitted with its rounding
        }
        // A GEMM group: one instruction where its last op is.
        if (group.getValue().starts_with("g"))
          if (std::optional<GemmEpilogue> g = gemmGroupOf(&op, group))
            return &op == g->ops().back() ? emitLinearBias(*g) : success();
        if (group.getValue().starts_with("c"))
          if (std::optional<GemmAccumulate> c = accumulateGroupOf(&op, group))
            // A product with C (cuBLAS's, beta = 1): linear's third input.
            return &op == c->ops().back()
                       ? emitWithAddend(c->linear, c->result(), c->into(),
                                        static_cast<bool>(c->round))
                       : success();
        if (group.getValue().starts_with("d"))
          if (std::optional<GemmGeluGrad> d = geluGradGroupOf(&op, group))
            return &op == d->ops().back() ? emitLinearGeluGrad(*d) : success();
        if (group.getValue().starts_with("a"))
          if (std::optional<AttentionInputGrads> a =
                  inputGradGroupOf(&op, group))
            return &op == a->ops().back() ? emitInputGrads(*a) : success();
        if (group.getValue().starts_with("b"))
          if (std::optional<NormParamGrads> b =
                  columnSumGroupOf<LayerNormGainGradOp>(&op, group,
                                                        matchNormParamGrads))
            return &op == b->ops().back() ? emitWithColumnSum(b->gain, b->bias)
                                          : success();
        if (group.getValue().starts_with("w"))
          if (std::optional<WeightBiasGrads> w =
                  columnSumGroupOf<LinearWeightGradOp>(&op, group,
                                                       matchWeightBiasGrads))
            return &op == w->ops().back()
                       ? emitWithColumnSum(w->weight, w->bias)
                       : success();
        if (group.getValue().starts_with("t"))
          if (std::optional<EmbeddingGradInto> t = tiedGroupOf(&op, group))
            return &op == t->ops().back() ? emitEmbeddingGradInto(*t)
                                          : success();
        if (group.getValue().starts_with("n"))
          if (std::optional<NormGradResidual> n = normGradGroupOf(&op, group))
            // The residual gradient: layer_norm_grad's fourth input.
            return &op == n->ops().back()
                       ? emitWithAddend(n->grad, n->result(),
                                        n->residualInput(),
                                        static_cast<bool>(n->round))
                       : success();
      }
      // A sharding constraint is only an annotation: the collectives that
      // realize it are already in place, its result is its operand.
      if (auto constraint = dyn_cast<ShardingConstraintOp>(op)) {
        buffers[constraint.getResult()] = buffers.lookup(constraint.getInput());
        return success();
      }
      // AdamW writes the storage it updates (the parameter, or under ZeRO
      // this rank's slice of it); assign writes the parameter's.
      if (auto adamw = dyn_cast<AdamWOp>(op)) {
        buffers[adamw.getResult()] = buffers.lookup(adamw.getParam());
      } else if (auto bucket = dyn_cast<AllReduceBucketOp>(op)) {
        // A gradient bucket sums in place: each sum takes its partial
        // sum's buffer when nothing else reads that (the gradients), so the
        // bucket does not hold every gradient twice.
        for (auto [input, result] :
             llvm::zip(bucket.getInputs(), bucket.getResults())) {
          if (input.hasOneUse() && !isa<BlockArgument>(input))
            buffers[result] = buffers.lookup(input);
          else if (failed(addBuffer(result, "all_reduce_bucket")))
            return failure();
        }
      } else if (auto assign = dyn_cast<AssignOp>(op)) {
        if (!isa<BlockArgument>(assign.getParam()))
          return assign.emitOpError("internal error: must assign to a "
                                    "parameter argument directly");
        buffers[assign.getResult()] = buffers.lookup(assign.getParam());
      } else {
        for (Value result : op.getResults())
          if (failed(addBuffer(result, op.getName().stripDialect())))
            return failure();
      }
      return addInstruction(&op);
  }

public:

  /// In a training step: the ops only the non-scalar results (the logits,
  /// for generation) need, which a training step need not run. Empty for
  /// other programs.
  static llvm::DenseSet<Operation *> collectGenerationOnlyOps(func::FuncOp func) {
    Block &body = func.getBody().front();
    llvm::DenseSet<Operation *> needed, all;
    SmallVector<Value> worklist;
    bool training = false;
    for (Operation &op : body) {
      all.insert(&op);
      if (isa<AdamWOp, AssignOp>(op)) {
        training = true;
        needed.insert(&op);
        llvm::append_range(worklist, op.getOperands());
      }
    }
    if (!training)
      return {};
    for (Value v : body.getTerminator()->getOperands())
      if (cast<RankedTensorType>(v.getType()).getRank() == 0)
        worklist.push_back(v);
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val().getDefiningOp();
      if (op && needed.insert(op).second)
        llvm::append_range(worklist, op->getOperands());
    }
    llvm::DenseSet<Operation *> only;
    for (Operation *op : all)
      if (!needed.contains(op) && !isa<func::ReturnOp>(op))
        only.insert(op);
    return only;
  }

  /// Global token count of a step for a [B, S, ...] value: its local rows
  /// and positions times the axes that split them, times the micro-batches
  /// (each micro-batch's loss is a share of the step's mean).
  int64_t globalTokens(Value value) {
    auto type = cast<RankedTensorType>(value.getType());
    ShardingAttr sharding = getShardingOrReplicated(value);
    return type.getDimSize(0) * grid.axisSize(sharding.getDimAxis(0)) *
           type.getDimSize(1) * grid.axisSize(sharding.getDimAxis(1)) *
           microBatches;
  }

  /// Where this rank's block of `value` starts along dimension `dim`.
  int64_t shardStart(Value value, int64_t dim) {
    int64_t index =
        grid.axisIndex(getShardingOrReplicated(value).getDimAxis(dim));
    int64_t size = cast<RankedTensorType>(value.getType()).getDimSize(dim);
    return index < 0 ? 0 : coords[index] * size;
  }

  /// Attention probability dropout: [stream, global batch, global heads,
  /// first batch row, first head] of this rank's block of [B, heads, S, S],
  /// and the rate; nothing when off.
  template <typename AttentionLike>
  void appendAttentionDropout(AttentionLike a, std::vector<int64_t> &ints,
                              std::vector<double> &floats) {
    double rate = a.getDropout().convertToDouble();
    if (rate <= 0.0)
      return;
    Value q = a.getQuery();
    auto type = cast<RankedTensorType>(q.getType());
    ShardingAttr sharding = getShardingOrReplicated(q);
    int64_t heads = static_cast<int64_t>(a.getNumHeads()); // local
    int64_t headDim = type.getDimSize(2) / heads;
    ints.insert(ints.end(),
                {static_cast<int64_t>(a.getStream()),
                 type.getDimSize(0) * grid.axisSize(sharding.getDimAxis(0)),
                 heads * grid.axisSize(sharding.getDimAxis(2)),
                 shardStart(q, 0), shardStart(q, 2) / headDim});
    floats.push_back(rate);
  }

  /// First vocabulary row this rank holds of `table` (split on dim 0).
  int64_t vocabStart(Value table) { return shardStart(table, 0); }

private:
  LogicalResult addBuffer(Value value, StringRef name) {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (!type || !type.hasStaticShape())
      return emitError(value.getLoc(), "plan emission needs static tensor "
                                       "shapes; run megac-specialize-shapes");
    mp::DType dtype;
    if (type.getElementType().isF32())
      dtype = mp::DType_F32;
    else if (type.getElementType().isInteger(32))
      dtype = mp::DType_I32;
    else
      return emitError(value.getLoc(), "unsupported element type ")
             << type.getElementType() << " (the CPU backend runs f32 and i32)";
    std::vector<int64_t> shape = toVector(type.getShape());
    buffers[value] = bufferOffsets.size();
    auto key = TableKey(TableKey::Kind::Buffer).scalar(dtype).list(shape).text(
        name);
    bufferOffsets.push_back(tables.get<mp::Buffer>(key, [&] {
      return mp::CreateBufferDirect(fbb, dtype, &shape, name.str().c_str());
    }));
    return success();
  }

  LogicalResult addArgument(func::FuncOp func, BlockArgument arg) {
    unsigned index = arg.getArgNumber();
    uint32_t buffer = buffers.lookup(arg);
    if (auto kind = func.getArgAttrOfType<StringAttr>(
            index, MegacDialect::kInputAttrName)) {
      // Rows of the global batch this rank holds (data parallelism).
      int64_t axisIndex =
          grid.axisIndex(getShardingOrReplicated(arg).getDimAxis(0));
      int64_t rows = cast<RankedTensorType>(arg.getType()).getDimSize(0);
      int64_t batchOffset = axisIndex < 0 ? 0 : coords[axisIndex] * rows;
      std::string text = kind.getValue().str();
      auto key = TableKey(TableKey::Kind::Input)
                     .text(text)
                     .scalar(buffer)
                     .scalar(batchOffset);
      inputs.push_back(tables.get<mp::Input>(key, [&] {
        return mp::CreateInputDirect(fbb, text.c_str(), buffer, text.c_str(),
                                     batchOffset);
      }));
      return success();
    }
    auto spec =
        func.getArgAttrOfType<DictionaryAttr>(index, MegacDialect::kParamAttrName);
    if (!spec)
      return func.emitError("argument ")
             << index << " is neither a megac.param nor a megac.input";
    auto type = cast<RankedTensorType>(arg.getType());
    ShardingAttr sharding = getShardingOrReplicated(arg);
    std::vector<int64_t> globalShape, offset;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      StringRef axis = sharding.getDimAxis(d);
      int64_t local = type.getDimSize(d);
      globalShape.push_back(local * grid.axisSize(axis));
      int64_t axisIndex = grid.axisIndex(axis);
      offset.push_back(axisIndex < 0 ? 0 : coords[axisIndex] * local);
    }
    StringRef init = spec.getAs<StringAttr>("init").getValue();
    mp::InitKind kind = init == "normal"  ? mp::InitKind_Normal
                        : init == "ones" ? mp::InitKind_Ones
                                         : mp::InitKind_Zeros;
    double stddev = 0.0;
    if (auto attr = spec.getAs<FloatAttr>("std"))
      stddev = attr.getValueAsDouble();
    std::string name = spec.getAs<StringAttr>("name").getValue().str();
    std::string hfName = name;
    if (auto attr = spec.getAs<StringAttr>("hf_name"))
      hfName = attr.getValue().str();
    std::vector<int64_t> hfOffset(type.getRank(), 0);
    if (auto attr = spec.getAs<DenseI64ArrayAttr>("hf_offset"))
      hfOffset = toVector(attr.asArrayRef());
    std::vector<int64_t> hfShape;
    if (auto attr = spec.getAs<DenseI64ArrayAttr>("hf_shape"))
      hfShape = toVector(attr.asArrayRef());
    auto key = TableKey(TableKey::Kind::Param)
                   .text(name)
                   .scalar(buffer)
                   .list(globalShape)
                   .list(offset)
                   .scalar(kind)
                   .scalar(stddev)
                   .text(hfName)
                   .list(hfOffset)
                   .list(hfShape);
    params.push_back(tables.get<mp::Param>(key, [&] {
      return mp::CreateParamDirect(fbb, name.c_str(), buffer, &globalShape,
                                   &offset, kind, stddev, hfName.c_str(),
                                   &hfOffset,
                                   hfShape.empty() ? nullptr : &hfShape);
    }));
    return success();
  }

  /// The parameter an AdamW update applies to, through the constraints and
  /// slices of ZeRO, and where the updated slice starts in it.
  LogicalResult describeUpdatedParameter(AdamWOp adamw, std::string &name,
                                         std::vector<int64_t> &offset) {
    Value value = adamw.getParam();
    while (Operation *def = value.getDefiningOp()) {
      if (!isa<ShardingConstraintOp, SliceShardOp>(def))
        return adamw.emitOpError("internal error: the update must apply to a "
                                 "parameter or a slice of one");
      value = def->getOperand(0);
    }
    auto arg = cast<BlockArgument>(value);
    auto func = cast<func::FuncOp>(arg.getOwner()->getParentOp());
    name = func.getArgAttrOfType<DictionaryAttr>(arg.getArgNumber(),
                                                 MegacDialect::kParamAttrName)
               .getAs<StringAttr>("name")
               .getValue()
               .str();
    // The slice's offset follows from its sharding and local shape.
    auto type = cast<RankedTensorType>(adamw.getParam().getType());
    ShardingAttr sharding = getShardingOrReplicated(adamw.getParam());
    offset.clear();
    for (int64_t d = 0; d < type.getRank(); ++d) {
      int64_t index = grid.axisIndex(sharding.getDimAxis(d));
      offset.push_back(index < 0 ? 0 : coords[index] * type.getDimSize(d));
    }
    return success();
  }

  LogicalResult addInstruction(Operation *op) {
    // A collective's axis, by index into the grid; it must exist.
    auto resolveAxis = [&](StringRef name, int32_t &index) -> LogicalResult {
      index = static_cast<int32_t>(grid.axisIndex(name));
      if (index < 0)
        return op->emitOpError("refers to grid axis '")
               << name << "' which the module's grid does not have";
      return success();
    };
    std::vector<uint32_t> in;
    for (Value operand : op->getOperands())
      in.push_back(buffers.lookup(operand));
    if (residualInput)
      in.push_back(buffers.lookup(residualInput));
    // An assignment reads only its value; the parameter is its output.
    if (auto assign = dyn_cast<AssignOp>(op))
      in = {buffers.lookup(assign.getValue())};
    std::vector<uint32_t> out;
    for (Value result : op->getResults())
      out.push_back(buffers.lookup(result));
    for (Value extra : extraOutputs)
      out.push_back(buffers.lookup(extra));
    std::vector<int64_t> ints;
    std::vector<double> floats;
    std::string paramName;
    std::vector<int64_t> paramOffset;
    int32_t axis = -1;
    mp::OpCode code;
    LogicalResult result = success();
    llvm::TypeSwitch<Operation *>(op)
        .Case<EmbeddingOp>([&](EmbeddingOp e) {
          code = mp::OpCode_Embedding;
          ints = {vocabStart(e.getTable())};
        })
        .Case<PositionEmbeddingOp>(
            [&](auto) { code = mp::OpCode_PositionEmbedding; })
        .Case<LinearOp>([&](LinearOp l) {
          code = mp::OpCode_Linear;
          ints = {l.getTransposeWeight() ? 1 : 0};
        })
        .Case<MatMulOp>([&](auto) { code = mp::OpCode_MatMul; })
        .Case<AddOp>([&](auto) { code = mp::OpCode_Add; })
        .Case<MulOp>([&](auto) { code = mp::OpCode_Mul; })
        .Case<GeluOp>([&](auto) { code = mp::OpCode_Gelu; })
        .Case<SoftmaxOp>([&](auto) { code = mp::OpCode_Softmax; })
        .Case<LayerNormOp>([&](LayerNormOp l) {
          code = mp::OpCode_LayerNorm;
          floats = {l.getEpsilon().convertToDouble()};
        })
        .Case<AttentionOp>([&](AttentionOp a) {
          code = mp::OpCode_Attention;
          ints = {static_cast<int64_t>(a.getNumHeads()), a.getCausal() ? 1 : 0};
          appendAttentionDropout(a, ints, floats);
        })
        .Case<ReshapeOp>([&](auto) { code = mp::OpCode_Reshape; })
        .Case<TransposeOp>([&](TransposeOp t) {
          code = mp::OpCode_Transpose;
          ints = toVector(t.getPermutation());
        })
        // A padded vocabulary's class count (format 14) comes last.
        .Case<CrossEntropyOp>([&](CrossEntropyOp c) {
          code = mp::OpCode_CrossEntropy;
          ints = {globalTokens(c.getLogits())};
          if (std::optional<uint64_t> classes = c.getClasses())
            ints.push_back(int64_t(*classes));
        })
        .Case<CrossEntropyStatsOp>([&](CrossEntropyStatsOp c) {
          code = mp::OpCode_CrossEntropyStats;
          ints = {shardStart(c.getLogits(), 2)};
          if (std::optional<uint64_t> classes = c.getClasses())
            ints.push_back(int64_t(*classes));
        })
        .Case<CrossEntropyFromStatsOp>([&](CrossEntropyFromStatsOp c) {
          code = mp::OpCode_CrossEntropyFromStats;
          ints = {globalTokens(c.getStats())};
        })
        .Case<LinearWeightGradOp>([&](LinearWeightGradOp l) {
          code = mp::OpCode_LinearWeightGrad;
          ints = {l.getTransposeWeight() ? 1 : 0};
          if (accumulating)
            ints.push_back(1); // into the micro-batch sum
        })
        .Case<GeluGradOp>([&](auto) { code = mp::OpCode_GeluGrad; })
        .Case<LayerNormGradOp>([&](LayerNormGradOp l) {
          code = mp::OpCode_LayerNormGrad;
          floats = {l.getEpsilon().convertToDouble()};
        })
        .Case<NormalizeOp>([&](NormalizeOp n) {
          code = mp::OpCode_Normalize;
          floats = {n.getEpsilon().convertToDouble()};
        })
        .Case<LayerNormGainGradOp>([&](LayerNormGainGradOp l) {
          code = mp::OpCode_LayerNormGainGrad;
          floats = {l.getEpsilon().convertToDouble()};
          if (accumulating)
            ints = {1}; // into the micro-batch sum
        })
        .Case<AttentionGradOp>([&](AttentionGradOp a) {
          code = mp::OpCode_AttentionGrad;
          // which = 3: dk and dv together, 4: dq, dk and dv (an "a" group).
          ints = {static_cast<int64_t>(a.getNumHeads()), a.getCausal() ? 1 : 0,
                  attentionWhich >= 0 ? attentionWhich
                                      : static_cast<int64_t>(a.getOperand())};
          appendAttentionDropout(a, ints, floats);
        })
        .Case<SoftmaxGradOp>([&](auto) { code = mp::OpCode_SoftmaxGrad; })
        .Case<EmbeddingGradOp>([&](EmbeddingGradOp e) {
          code = mp::OpCode_EmbeddingGrad;
          ints = {vocabStart(e.getTable())};
        })
        .Case<PositionEmbeddingGradOp>(
            [&](auto) { code = mp::OpCode_PositionEmbeddingGrad; })
        .Case<CrossEntropyGradOp>([&](CrossEntropyGradOp c) {
          code = mp::OpCode_CrossEntropyGrad;
          ints = {globalTokens(c.getLogits())};
          std::optional<uint64_t> classes = c.getClasses();
          if (c.getStats() || classes)
            ints.push_back(c.getStats() ? shardStart(c.getLogits(), 2) : 0);
          if (classes)
            ints.push_back(int64_t(*classes));
        })
        .Case<SumLeadingOp>([&](auto) {
          code = mp::OpCode_SumLeading;
          if (accumulating)
            ints = {1}; // into the micro-batch sum
        })
        .Case<SumSquaresOp>([&](auto) { code = mp::OpCode_SumSquares; })
        .Case<ClipCoefficientOp>([&](ClipCoefficientOp c) {
          code = mp::OpCode_ClipCoefficient;
          floats = {c.getMaxNorm().convertToDouble()};
        })
        .Case<FillOp>([&](FillOp f) {
          code = mp::OpCode_Fill;
          floats = {f.getValue().convertToDouble()};
        })
        .Case<AdamWOp>([&](AdamWOp a) {
          code = mp::OpCode_AdamW;
          floats = {a.getBeta1().convertToDouble(), a.getBeta2().convertToDouble(),
                    a.getEpsilon().convertToDouble(),
                    a.getWeightDecay().convertToDouble()};
          result = describeUpdatedParameter(a, paramName, paramOffset);
        })
        .Case<AssignOp>([&](auto) { code = mp::OpCode_Assign; })
        .Case<AccumulateOp>([&](auto) { code = mp::OpCode_Accumulate; })
        .Case<StackMicroBatchesOp>(
            [&](auto) { code = mp::OpCode_StackMicroBatches; })
        .Case<RoundBf16Op>([&](auto) { code = mp::OpCode_RoundBf16; })
        .Case<DropoutOp>([&](DropoutOp d) {
          // The mask is drawn by global position: the plan says where this
          // rank's block sits in the whole tensor.
          code = mp::OpCode_Dropout;
          floats = {d.getRate().convertToDouble()};
          auto type = cast<RankedTensorType>(d.getResult().getType());
          ShardingAttr sharding = getShardingOrReplicated(d.getResult());
          ints = {static_cast<int64_t>(d.getStream()), type.getRank()};
          for (int64_t dim = 0; dim < type.getRank(); ++dim)
            ints.push_back(type.getDimSize(dim) *
                           grid.axisSize(sharding.getDimAxis(dim)));
          for (int64_t dim = 0; dim < type.getRank(); ++dim) {
            int64_t index = grid.axisIndex(sharding.getDimAxis(dim));
            ints.push_back(index < 0 ? 0 : coords[index] * type.getDimSize(dim));
          }
        })
        .Case<ReduceScatterOp>([&](ReduceScatterOp c) {
          code = mp::OpCode_ReduceScatter;
          ints = {static_cast<int64_t>(c.getDim())};
          result = resolveAxis(c.getAxis(), axis);
        })
        .Case<AllReduceOp>([&](AllReduceOp c) {
          code = mp::OpCode_AllReduce;
          result = resolveAxis(c.getAxis(), axis);
        })
        .Case<AllReduceBucketOp>([&](AllReduceBucketOp c) {
          // One all-reduce of several tensors (plan format 5).
          code = mp::OpCode_AllReduce;
          result = resolveAxis(c.getAxis(), axis);
        })
        .Case<AllGatherOp>([&](AllGatherOp c) {
          code = mp::OpCode_AllGather;
          ints = {static_cast<int64_t>(c.getDim())};
          result = resolveAxis(c.getAxis(), axis);
        })
        .Case<SliceShardOp>([&](SliceShardOp c) {
          code = mp::OpCode_SliceShard;
          ints = {static_cast<int64_t>(c.getDim())};
          result = resolveAxis(c.getAxis(), axis);
        })
        .Default([&](Operation *other) {
          result = other->emitOpError("cannot be emitted into a plan");
        });
    if (failed(result))
      return failure();
    std::string loc = locationString(op);
    addInstr(code, in, out, ints, floats, axis, loc, generationOnly.contains(op),
             roundingOutput, paramName, paramOffset);
    return success();
  }

  const Pipeline *pipeline = nullptr;
  KernelTable *kernelTable = nullptr;
  /// Accumulations done by the weight gradient before them.
  llvm::DenseSet<Operation *> absorbed;
  bool accumulating = false;
  /// The instruction being added rounds its output (an "r" group).
  bool roundingOutput = false;
  /// An input the instruction being added reads after its op's operands
  /// (an "n" group's residual gradient, a "c" group's C).
  Value residualInput;
  /// Outputs the instruction being added writes after its op's result (a
  /// "b" group's bias gradient, an "a" group's dk and dv or dv).
  SmallVector<Value, 2> extraOutputs;
  /// The "which" of the attention gradient being added where an "a" group
  /// sets it (3: dk and dv, 4: dq, dk and dv); -1 otherwise.
  int64_t attentionWhich = -1;
  SharedTables &tables;
  fb::FlatBufferBuilder &fbb;
  const Grid &grid;
  uint32_t rank;
  int64_t microBatches;
  std::vector<int64_t> coords;
  llvm::DenseSet<Operation *> generationOnly;
  llvm::DenseMap<Value, uint32_t> buffers;
  std::vector<fb::Offset<mp::Buffer>> bufferOffsets;
  std::vector<fb::Offset<mp::Param>> params;
  std::vector<fb::Offset<mp::Input>> inputs;
  std::vector<fb::Offset<mp::Output>> outputs;
  std::vector<fb::Offset<mp::Instr>> instrs;
};

/// Groups along each axis: ranks that agree on every other coordinate.
std::vector<fb::Offset<mp::Axis>> emitAxes(fb::FlatBufferBuilder &fbb,
                                           const Grid &grid) {
  std::vector<fb::Offset<mp::Axis>> axes;
  if (!grid.mesh)
    return axes;
  for (auto [a, name] : llvm::enumerate(grid.mesh.getAxes())) {
    std::map<std::vector<int64_t>, std::vector<uint32_t>> groups;
    for (int64_t r = 0; r < grid.numRanks(); ++r) {
      SmallVector<int64_t> key = grid.coords(r);
      key[a] = 0;
      groups[toVector(key)].push_back(r);
    }
    std::vector<fb::Offset<mp::Group>> groupOffsets;
    for (auto &entry : groups)
      groupOffsets.push_back(mp::CreateGroupDirect(fbb, &entry.second));
    axes.push_back(mp::CreateAxisDirect(fbb, name.getValue().str().c_str(),
                                        grid.mesh.getSizes()[a],
                                        &groupOffsets));
  }
  return axes;
}

} // namespace

std::string cudaKernelSource(
    const std::string &name,
    const std::vector<std::pair<std::string, std::vector<int>>> &steps,
    unsigned inputs) {
  // The formulas the CUDA backend's own kernels use, from one file
  // (runtime/src/cuda/elementwise.cuh, embedded at build time).
  std::string s = "// Generated by megac: one elementwise kernel of a fusion "
                  "group.\n";
  s += kElementwiseDeviceSource;
  auto list = [&](const std::string &prefix, const std::string &type,
                  bool leadingComma) {
    std::string out;
    for (unsigned k = 0; k < inputs; ++k)
      out +=
          (k || leadingComma ? ", " : "") + type + prefix + std::to_string(k);
    return out;
  };
  // The chain itself, once, for both loops below.
  s += "static __device__ __forceinline__ float " + name + "_chain(" +
       list("a", "float ", false) + ") {\n";
  auto arg = [](int a) {
    return a >= 0 ? "a" + std::to_string(a) : "t" + std::to_string(-a - 1);
  };
  for (size_t j = 0; j < steps.size(); ++j) {
    const auto &[op, args] = steps[j];
    std::string expr =
        op == "add"         ? arg(args[0]) + " + " + arg(args[1])
        : op == "mul"       ? arg(args[0]) + " * " + arg(args[1])
        : op == "gelu"      ? "megac_gelu(" + arg(args[0]) + ")"
        : op == "gelu_grad" ? "megac_gelu_grad(" + arg(args[0]) + ", " +
                                  arg(args[1]) + ")"
                            : "megac_round_bf16(" + arg(args[0]) + ")";
    s += "  const float t" + std::to_string(j) + " = " + expr + ";\n";
  }
  s += "  return t" + std::to_string(steps.size() - 1) + ";\n}\n";
  // A kernel that ends in a rounding also writes the bf16 bits of its
  // output to y16 when the backend asks (y16 not null): the copy that
  // products read instead of packing y again. The backend may keep such
  // an output in bf16 only (y null). Input k comes as fp32 (xk) or, where
  // the backend has its bf16 copy, as those bits (hk not null).
  const bool rounds = !steps.empty() && steps.back().first == "round_bf16";
  s += "struct alignas(16) " + name + "_f4 { float v[4]; };\n";
  s += "struct alignas(8) " + name + "_b4 { unsigned short v[4]; };\n";
  s += "static __device__ __forceinline__ " + name + "_f4 " + name +
       "_load4(const float *x, const unsigned short *h, long long i) {\n"
       "  if (!h)\n    return *(const " +
       name + "_f4 *)(x + i);\n  const " + name + "_b4 b = *(const " + name +
       "_b4 *)(h + i);\n  " + name +
       "_f4 out;\n  for (int j = 0; j < 4; ++j)\n"
       "    out.v[j] = megac_bf16_value(b.v[j]);\n  return out;\n}\n";
  s += "extern \"C\" __global__ void " + name +
       "(float *__restrict__ y, unsigned short *__restrict__ y16" +
       list("x", "const float *__restrict__ ", true) +
       list("h", "const unsigned short *__restrict__ ", true) +
       ", long long n" + list("p", "long long ", true) + ") {\n";
  s += "  // Input k is read at i % pk: its size, or a row it repeats. Four\n"
       "  // elements at a time where every pointer is aligned for it and\n"
       "  // every period a multiple of 4; the rest one at a time.\n"
       "  const long long stride = (long long)gridDim.x * blockDim.x;\n"
       "  const long long first = blockIdx.x * (long long)blockDim.x + "
       "threadIdx.x;\n"
       "  const bool wide = n % 4 == 0 && (unsigned long long)y % 16 == 0 &&\n"
       "                    (unsigned long long)y16 % 8 == 0";
  for (unsigned k = 0; k < inputs; ++k) {
    std::string K = std::to_string(k);
    s += " &&\n                    p" + K + " % 4 == 0 && (h" + K +
         " ? (unsigned long long)h" + K + " % 8 == 0 : (unsigned long long)x" +
         K + " % 16 == 0)";
  }
  s += ";\n  const long long groups = wide ? n / 4 : 0;\n";
  s += "  for (long long g = first; g < groups; g += stride) {\n"
       "    const long long i = 4 * g;\n";
  for (unsigned k = 0; k < inputs; ++k) {
    std::string K = std::to_string(k);
    s += "    const " + name + "_f4 a" + K + " = " + name + "_load4(x" + K +
         ", h" + K + ", p" + K + " == n ? i : i % p" + K + ");\n";
  }
  s += "    " + name + "_f4 out;\n";
  if (rounds)
    s += "    " + name + "_b4 bits;\n";
  s +=
      "    for (int j = 0; j < 4; ++j) {\n      out.v[j] = " + name + "_chain(";
  for (unsigned k = 0; k < inputs; ++k)
    s += (k ? ", a" : "a") + std::to_string(k) + ".v[j]";
  s += ");\n";
  if (rounds)
    s += "      bits.v[j] = (unsigned short)(__float_as_uint(out.v[j]) >> "
         "16);\n";
  s += "    }\n    if (y)\n      *(" + name + "_f4 *)(y + i) = out;\n";
  if (rounds)
    s += "    if (y16)\n      *(" + name + "_b4 *)(y16 + i) = bits;\n";
  s += "  }\n  for (long long i = 4 * groups + first; i < n; i += stride) {\n"
       "    const float t = " +
       name + "_chain(";
  for (unsigned k = 0; k < inputs; ++k) {
    std::string K = std::to_string(k);
    std::string at = "[p" + K + " == n ? i : i % p" + K + "]";
    s += (k ? ", " : "") +
         ("h" + K + " ? megac_bf16_value(h" + K + at + ") : x" + K + at);
  }
  s += ");\n    if (y)\n      y[i] = t;\n";
  if (rounds)
    s += "    if (y16)\n      y16[i] = (unsigned short)(__float_as_uint(t) "
         ">> 16);\n";
  s += "  }\n}\n";
  return s;
}

FailureOr<std::vector<uint8_t>> emitPlan(ModuleOp module,
                                         const PlanEmitOptions &options) {
  if (!module->hasAttr(MegacDialect::kLocalizedAttrName))
    return module.emitError("plan emission needs per-rank IR; run the "
                            "partition pipeline first");
  SmallVector<func::FuncOp> funcs;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func.isExternal())
      funcs.push_back(func);
  if (funcs.size() != 1)
    return module.emitError("expected exactly one function with a body (the "
                            "model), found ")
           << funcs.size();
  func::FuncOp func = funcs.front();
  Grid grid{getMesh(module)};

  int64_t batch = 0, seq = 0, vocab = 0, globalBatch = 0;
  for (BlockArgument arg : func.getArguments())
    if (func.getArgAttr(arg.getArgNumber(), MegacDialect::kInputAttrName)) {
      auto type = cast<RankedTensorType>(arg.getType());
      batch = type.getDimSize(0);
      seq = type.getDimSize(1);
      globalBatch =
          batch * grid.axisSize(getShardingOrReplicated(arg).getDimAxis(0));
    }
  func.walk([&](EmbeddingOp e) {
    StringRef axis = getShardingOrReplicated(e.getTable()).getDimAxis(0);
    vocab = e.getTable().getType().getDimSize(0) * grid.axisSize(axis);
  });
  // A padded vocabulary: the plan's vocabulary is the real one (tokens and
  // labels must lie in it), not the tables' padded rows.
  func.walk([&](Operation *op) {
    if (auto classes = op->getAttrOfType<IntegerAttr>("classes");
        classes && isa<CrossEntropyOp, CrossEntropyStatsOp, CrossEntropyGradOp>(op))
      vocab = std::min<int64_t>(vocab, classes.getInt());
  });

  if (batch > 0 && vocab == 0)
    return func.emitError("the model takes token inputs but has no "
                          "megac.embedding to bound their ids");

  int64_t microBatches = 1;
  if (auto attr = module->getAttrOfType<IntegerAttr>(
          MegacDialect::kMicroBatchesAttrName))
    microBatches = attr.getInt();
  globalBatch *= microBatches;

  // Pipeline parallelism: the stages the ops are placed on, the schedule
  // each pipeline rank follows, and one number per transfer.
  RankEmitter::Pipeline pipeline;
  int64_t chunks = 1;
  if (auto attr = module->getAttrOfType<IntegerAttr>(
          MegacDialect::kPipelineStagesAttrName))
    chunks = attr.getInt();
  if (chunks > 1) {
    pipeline.chunks = chunks;
    pipeline.axis = grid.axisIndex("pp");
    pipeline.ranks = grid.axisSize("pp");
    const PipelineSchedule &schedule = options.schedule;
    if (schedule.stages != pipeline.ranks ||
        schedule.stages * schedule.virtualStages != chunks ||
        schedule.microBatches != microBatches ||
        static_cast<int64_t>(schedule.ranks.size()) != pipeline.ranks)
      return module.emitError("the pipeline schedule is for ")
             << schedule.stages << " stages x " << schedule.virtualStages
             << " virtual stages and " << schedule.microBatches
             << " micro-batches, but the program has " << pipeline.ranks
             << " pipeline ranks, " << chunks << " model chunks and "
             << microBatches << " micro-batches";
    pipeline.schedule = &schedule;
    func.walk([&](TransferOp t) {
      int64_t id = static_cast<int64_t>(pipeline.transferIds.size());
      pipeline.transferIds[t] = id;
    });
  }

  fb::FlatBufferBuilder fbb(1 << 16);
  std::vector<fb::Offset<mp::RankProgram>> ranks;
  const bool cuda = options.target == "cuda";
  if (!cuda && options.target != "cpu")
    return module.emitError("unknown target '")
           << options.target << "' (expected cpu or cuda)";
  KernelTable kernels;
  SharedTables tables(fbb);
  for (int64_t rank = 0; rank < grid.numRanks(); ++rank) {
    RankEmitter emitter(tables, grid, rank, microBatches);
    if (chunks > 1)
      emitter.setPipeline(&pipeline);
    if (cuda)
      emitter.setKernels(&kernels);
    FailureOr<fb::Offset<mp::RankProgram>> program = emitter.emit(func);
    if (failed(program))
      return failure();
    ranks.push_back(*program);
  }
  std::vector<fb::Offset<mp::Axis>> axes = emitAxes(fbb, grid);
  std::string modelName = "model";
  if (auto name = module->getAttrOfType<StringAttr>(MegacDialect::kModelAttrName))
    modelName = name.getValue().str();
  fb::Offset<mp::TrainConfig> train;
  if (auto config =
          module->getAttrOfType<DictionaryAttr>(MegacDialect::kTrainAttrName))
    train = mp::CreateTrainConfig(
        fbb, config.getAs<FloatAttr>("max_lr").getValueAsDouble(),
        config.getAs<FloatAttr>("min_lr").getValueAsDouble(),
        config.getAs<IntegerAttr>("warmup_steps").getInt(),
        config.getAs<IntegerAttr>("total_steps").getInt());
  // Generated kernels: their steps, CUDA source and compiled binaries.
  // Every kernel compiles at once (each in its own thread; the compiler
  // may split further by architecture): the kernels are independent, and
  // a cold compile is most of --target cuda's time.
  const size_t numKernels = kernels.kernels.size();
  std::vector<std::string> sources(numKernels), errors(numKernels);
  std::vector<PlanEmitOptions::Binaries> compiled(numKernels);
  if (numKernels && !options.compileKernel)
    return module.emitError("--target cuda needs a CUDA kernel compiler "
                            "(NVRTC); this megac was built without one");
  {
    std::vector<std::future<void>> jobs;
    for (size_t k = 0; k < numKernels; ++k) {
      const KernelTable::Entry &kernel = kernels.kernels[k];
      sources[k] = cudaKernelSource(kernel.name, kernel.steps, kernel.inputs);
      jobs.push_back(std::async(std::launch::async, [&, k] {
        errors[k] = options.compileKernel(kernels.kernels[k].name, sources[k],
                                          compiled[k]);
      }));
    }
    for (std::future<void> &job : jobs)
      job.get();
  }
  std::vector<fb::Offset<mp::Kernel>> kernelOffsets;
  for (size_t k = 0; k < numKernels; ++k) {
    const KernelTable::Entry &kernel = kernels.kernels[k];
    if (!errors[k].empty())
      return module.emitError("generated kernel ")
             << kernel.name << " does not compile: " << errors[k];
    std::vector<fb::Offset<mp::FusedStep>> steps;
    for (auto &[name, args] : kernel.steps) {
      mp::OpCode code = name == "add"         ? mp::OpCode_Add
                        : name == "mul"       ? mp::OpCode_Mul
                        : name == "gelu"      ? mp::OpCode_Gelu
                        : name == "gelu_grad" ? mp::OpCode_GeluGrad
                                              : mp::OpCode_RoundBf16;
      std::vector<int32_t> argv(args.begin(), args.end());
      steps.push_back(mp::CreateFusedStepDirect(fbb, code, &argv));
    }
    const std::string &source = sources[k];
    PlanEmitOptions::Binaries &binaries = compiled[k];
    std::vector<fb::Offset<mp::KernelBinary>> binaryOffsets;
    for (auto &[arch, cubin] : binaries)
      binaryOffsets.push_back(
          mp::CreateKernelBinaryDirect(fbb, arch.c_str(), &cubin));
    kernelOffsets.push_back(mp::CreateKernelDirect(
        fbb, kernel.name.c_str(), &steps, kernel.inputs, source.c_str(),
        &binaryOffsets));
  }
  auto program = mp::CreateProgramDirect(
      fbb, modelName.c_str(), options.modelHash, grid.numRanks(), &axes, batch,
      seq, vocab, options.seed, &ranks, train, globalBatch,
      microBatches > 1 || chunks > 1 ? microBatches : 0,
      chunks > 1 ? static_cast<uint32_t>(chunks) : 0,
      chunks > 1 ? options.scheduleName.c_str() : nullptr,
      options.target.c_str(), cuda ? &kernelOffsets : nullptr);
  fbb.Finish(program);
  return megac_rt::wrapProgram(fbb.GetBufferPointer(), fbb.GetSize(),
                               options.producer);
}

} // namespace megac
