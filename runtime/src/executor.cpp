//===- executor.cpp - Runs one rank's instruction stream ------------------===//
//
// Instruction semantics are those of plan.fbs; shapes were validated by the
// verifier, so the executor only derives loop bounds from them.
//
//===----------------------------------------------------------------------===//

#include "executor.h"
#include "megac_rt/memory_plan.h"
#include "error.h"
#include "init.h"
#include "kernels.h"
#include "rng.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <new>

using namespace megac::plan;

namespace megac_rt {

Collectives::~Collectives() = default;

void Collectives::send(int Peer, int64_t, const void *, size_t) {
  throw RunError("this run cannot send to rank " + std::to_string(Peer) +
                 " (pipeline transfers need the MPI launcher)");
}

void Collectives::recv(int Peer, int64_t, void *, size_t) {
  throw RunError("this run cannot receive from rank " + std::to_string(Peer) +
                 " (pipeline transfers need the MPI launcher)");
}

void LocalCollectives::allGather(int, const void *Send, size_t Bytes,
                                 void *Recv) {
  std::memcpy(Recv, Send, Bytes);
}

void LocalCollectives::reduceScatterSum(int, const float *Send, float *Recv,
                                        size_t N) {
  std::memcpy(Recv, Send, N * sizeof(float));
}

int64_t Tensor::numel() const {
  int64_t N = 1;
  for (int64_t D : shape)
    N *= D;
  return N;
}

std::string shapeString(const std::vector<int64_t> &Shape) {
  std::string R = "[";
  for (size_t I = 0; I < Shape.size(); ++I)
    R += (I ? "x" : "") + std::to_string(Shape[I]);
  return R + "]";
}

static std::vector<int64_t> vec(const flatbuffers::Vector<int64_t> *V) {
  return V ? std::vector<int64_t>(V->begin(), V->end())
           : std::vector<int64_t>();
}

std::string nonFiniteState(const Executor &E) {
  const RankProgram &RP = E.rankProgram();
  // Named by the element's place in the whole parameter (its slice's
  // offset added), as the message of a weights file is.
  auto Check = [&](const std::string &What, const std::vector<float> &V,
                   const std::vector<int64_t> &Local,
                   const std::vector<int64_t> &Offset) -> std::string {
    const int64_t At = firstNonFinite(V.data(), V.size());
    if (At < 0)
      return "";
    return What + " holds " + nonFiniteName(V[size_t(At)]) + " at " +
           elementPlace(At, Local, Offset) + " (on rank " +
           std::to_string(RP.rank()) + ")";
  };
  if (RP.params())
    for (const Param *Pa : *RP.params()) {
      const Tensor &T = E.buffer(Pa->buffer());
      if (std::string Err = Check("parameter " + Pa->name()->str(), T.f,
                                  T.shape, vec(Pa->offset()));
          !Err.empty())
        return Err;
    }
  for (const AdamState &St : E.adamStates())
    for (int K = 0; K < 2; ++K)
      if (std::string Err =
              Check(std::string(K ? "AdamW's second moment"
                                  : "AdamW's first moment") +
                        " of " + St.param,
                    K ? St.v : St.m, E.buffer(St.buffer).shape, St.offset);
          !Err.empty())
        return Err;
  return "";
}

Executor::Executor(const Program &P, uint32_t Rank)
    : P(P), RP(*P.ranks()->Get(Rank)), RunSeed(P.seed()) {}

void Executor::allocate() {
  size_t N = RP.buffers() ? RP.buffers()->size() : 0;
  uint64_t Total = 0, Asking = 0; // allocated, and the allocation under way
  try {
    // Parameters get their own storage; every other buffer a slot of the
    // arena the compiler's memory plan lays out (buffers whose lifetimes
    // do not overlap share bytes).
    const MemoryPlan Plan = planMemory(P, RP);
    ArenaBytes = Plan.arenaBytes;
    Asking = ArenaBytes;
    Arena.reset(new uint64_t[(ArenaBytes + 7) / 8]);
    Total += ArenaBytes;
    auto *Base = reinterpret_cast<unsigned char *>(Arena.get());
    Bufs.resize(N);
    // A pipeline rank keeps one copy of a micro-batch's buffers per
    // micro-batch in flight: slot 0's in Bufs, the others' aside.
    PerMicroBufs.clear();
    ActiveSlot = 0;
    SlotTensors.assign(Plan.slots, {});
    auto Bind = [&](Tensor &T, const Buffer *Buf, int64_t Offset) {
      T.dtype = Buf->dtype();
      T.shape = vec(Buf->shape());
      const size_t Count = size_t(T.numel());
      unsigned char *At = Base + Offset;
      if (T.isF32())
        T.f.bind(reinterpret_cast<float *>(At), Count);
      else
        T.i.bind(reinterpret_cast<int32_t *>(At), Count);
    };
    for (size_t B = 0; B < N; ++B) {
      const Buffer *Buf = RP.buffers()->Get(B);
      Tensor &T = Bufs[B];
      T.dtype = Buf->dtype();
      T.shape = vec(Buf->shape());
      const size_t Count = size_t(T.numel());
      if (Plan.offset[B] >= 0 && Plan.perMicro[B]) {
        PerMicroBufs.push_back(uint32_t(B));
        Bind(T, Buf, int64_t(Plan.slotBase) + Plan.offset[B]);
        SlotTensors[0].emplace_back();
        for (uint32_t S = 1; S < Plan.slots; ++S) {
          SlotTensors[S].emplace_back();
          Bind(SlotTensors[S].back(), Buf,
               int64_t(Plan.slotBase + S * Plan.slotBytes) + Plan.offset[B]);
        }
        continue;
      }
      if (Plan.offset[B] >= 0) {
        Bind(T, Buf, Plan.offset[B]);
        continue;
      }
      Asking = T.bytes();
      if (T.isF32())
        T.f.assign(Count, 0.0f);
      else
        T.i.assign(Count, 0);
      Total += T.bytes();
    }
    // Moments of every adam_w, zero until the first step (or a checkpoint).
    size_t NI = RP.instrs() ? RP.instrs()->size() : 0;
    AdamOfInstr.assign(NI, -1);
    Adam.clear();
    for (uint32_t I = 0; I < NI; ++I) {
      const Instr *In = RP.instrs()->Get(I);
      if (In->op() != op::AdamW)
        continue;
      AdamState St;
      St.instr = I;
      St.buffer = In->inputs()->Get(0);
      // The verifier guarantees the parameter exists (named, or input 0).
      std::string Named = In->param_name() ? In->param_name()->str() : "";
      for (const Param *Pa : *RP.params())
        if (Named.empty() ? Pa->buffer() == St.buffer
                          : Pa->name()->str() == Named) {
          St.param = Pa->name()->str();
          St.globalShape = vec(Pa->global_shape());
          St.offset = Named.empty() ? vec(Pa->offset())
                                    : vec(In->param_offset());
        }
      Asking = 2 * Bufs[St.buffer].bytes();
      St.m.assign(Bufs[St.buffer].f.size(), 0.0f);
      St.v.assign(Bufs[St.buffer].f.size(), 0.0f);
      Total += 2 * Bufs[St.buffer].bytes();
      AdamOfInstr[I] = int32_t(Adam.size());
      Adam.push_back(std::move(St));
    }
  } catch (const std::bad_alloc &) {
    throw RunError("out of memory allocating the buffers of rank " +
                   std::to_string(RP.rank()) + ": " +
                   std::to_string(Asking >> 20) + " MiB more asked after " +
                   std::to_string(Total >> 20) +
                   " MiB (megac compile --memory-report shows the plan)");
  }
}

uint64_t Executor::paramElements() const {
  uint64_t N = 0;
  if (RP.params())
    for (const Param *Pa : *RP.params())
      N += uint64_t(Bufs[Pa->buffer()].numel());
  return N;
}

static InitMode initMode(InitKind K) {
  return K == ik::Ones     ? InitMode::Ones
         : K == ik::Normal ? InitMode::Normal
                                 : InitMode::Zeros;
}

static void initOne(const Param &Pa, Tensor &T, uint64_t Seed) {
  initParamSlice(Pa.name()->str(), initMode(Pa.init()), Pa.std(),
                 vec(Pa.global_shape()), vec(Pa.offset()), T.shape, Seed,
                 T.f.data());
}

void Executor::initParams(uint64_t Seed) {
  if (RP.params())
    for (const Param *Pa : *RP.params())
      initOne(*Pa, Bufs[Pa->buffer()], Seed);
}

size_t Executor::loadParams(const WeightFiles &File, uint64_t Seed) {
  size_t Loaded = 0;
  if (!RP.params())
    return 0;
  // A merged checkpoint holds every parameter, those without an HF name
  // too: a new run starts from the trained values, all of them.
  const std::vector<std::string> Names = File.names();
  const bool Merged =
      std::any_of(Names.begin(), Names.end(), [](const std::string &N) {
        return N.rfind("param/", 0) == 0;
      });
  // The extent of each HF tensor that parameters take slices of (q, k and
  // v of GPT-2's fused c_attn, all on the rank that holds the layer).
  std::map<std::string, ShapeVec> SlicedWhole;
  for (const Param *Pa : *RP.params())
    if (Pa->hf_name() && Pa->hf_name()->str() != Pa->name()->str() &&
        !Pa->hf_shape()) {
      const ShapeVec Global = vec(Pa->global_shape());
      const ShapeVec HfOffset = vec(Pa->hf_offset());
      ShapeVec &Whole = SlicedWhole[Pa->hf_name()->str()];
      Whole.resize(Global.size(), 0);
      for (size_t D = 0; D < Global.size() && D < HfOffset.size(); ++D)
        Whole[D] = std::max(Whole[D], HfOffset[D] + Global[D]);
    }
  for (const Param *Pa : *RP.params()) {
    Tensor &T = Bufs[Pa->buffer()];
    if (Merged) {
      if (!loadMergedCheckpointParam(File, Pa->name()->str(),
                                     vec(Pa->global_shape()), vec(Pa->offset()),
                                     T.shape, T.f.data()))
        throw RunError(File.path() +
                       ": a merged checkpoint without "
                       "\"param/" +
                       Pa->name()->str() +
                       "\": another model's, or not all of one");
      ++Loaded;
      continue;
    }
    if (!Pa->hf_name() || Pa->hf_name()->size() == 0) {
      initOne(*Pa, T, Seed);
      continue;
    }
    const auto Sliced = SlicedWhole.find(Pa->hf_name()->str());
    loadParamSlice(File, Pa->name()->str(), Pa->hf_name()->str(),
                   vec(Pa->hf_offset()), vec(Pa->global_shape()),
                   vec(Pa->offset()), T.shape, T.f.data(),
                   Pa->hf_shape() ? vec(Pa->hf_shape()) : ShapeVec{},
                   Sliced == SlicedWhole.end() ? ShapeVec{} : Sliced->second);
    ++Loaded;
  }
  return Loaded;
}

bool Executor::needsLabels() const {
  if (RP.inputs())
    for (const Input *In : *RP.inputs())
      if (In->kind()->str() == "labels")
        return true;
  return false;
}

int64_t Executor::globalBatch() const {
  return P.global_batch() > 0 ? P.global_batch() : P.batch();
}

uint64_t Executor::tokensPerStep() const {
  return uint64_t(globalBatch()) * uint64_t(P.seq());
}

size_t Executor::tokensNeeded() const {
  return size_t(tokensPerStep()) + (needsLabels() ? 1 : 0);
}

int64_t Executor::microBatches() const {
  return std::max<int64_t>(1, P.micro_batches());
}

void Executor::setInputs(const TokenSource &Stream, uint64_t Pos) {
  if (!RP.inputs())
    return;
  const int64_t B = P.batch(), S = P.seq(), M = microBatches();
  // Micro-batch K is the K-th block of the global batch, split over the
  // data-parallel ranks like a whole batch.
  const int64_t MicroRows0 = globalBatch() / M;
  MicroRows.assign(RP.inputs()->size(), {});
  for (uint32_t N = 0; N < RP.inputs()->size(); ++N) {
    const Input *In = RP.inputs()->Get(N);
    uint64_t Shift = In->kind()->str() == "labels" ? 1 : 0;
    std::vector<int32_t> &Rows = MicroRows[N];
    Rows.resize(size_t(M * B * S));
    for (int64_t K = 0; K < M; ++K) {
      const int64_t Row0 = K * MicroRows0 + In->batch_offset();
      if (RandomWindows) {
        if (Stream.length() < uint64_t(S) + 2)
          throw RunError("the token stream is shorter than one sequence");
        const uint64_t Key =
            splitmix64(splitmix64(RunSeed ^ kWindowTag) + uint64_t(CurStep));
        for (int64_t Bi = 0; Bi < B; ++Bi) {
          const uint64_t Start =
              splitmix64(Key + uint64_t(Row0 + Bi)) %
                  (Stream.length() - uint64_t(S) - 1) +
              Shift;
          Stream.read(Start, size_t(S), &Rows[size_t((K * B + Bi) * S)]);
        }
        continue;
      }
      uint64_t First = Pos + uint64_t(Row0 * S) + Shift;
      if (First + uint64_t(B * S) > Stream.length())
        throw RunError("internal error: token stream too short");
      Stream.read(First, size_t(B * S), &Rows[size_t(K * B * S)]);
    }
  }
  loadMicroBatch(0);
}

void Executor::loadMicroBatch(int64_t K) {
  if (!RP.inputs() || MicroRows.size() != RP.inputs()->size())
    return;
  const size_t N = size_t(P.batch() * P.seq());
  for (uint32_t I = 0; I < RP.inputs()->size(); ++I)
    std::copy(MicroRows[I].begin() + long(size_t(K) * N),
              MicroRows[I].begin() + long(size_t(K + 1) * N),
              Bufs[RP.inputs()->Get(I)->buffer()].i.begin());
  CurMicro = K;
}

void Executor::setInputs(const std::vector<int32_t> &Stream) {
  setInputs(TokenSource::fromTokens(Stream), 0);
}

uint32_t Executor::forwardEnd() const {
  uint32_t N = RP.instrs() ? RP.instrs()->size() : 0;
  return RP.forward_end() >= 0 ? uint32_t(RP.forward_end()) : N;
}

void Executor::activateSlot(uint32_t Slot) {
  if (Slot == ActiveSlot)
    return;
  for (size_t J = 0; J < PerMicroBufs.size(); ++J) {
    Tensor &Live = Bufs[PerMicroBufs[J]];
    std::swap(Live, SlotTensors[ActiveSlot][J]);
    std::swap(Live, SlotTensors[Slot][J]);
  }
  ActiveSlot = Slot;
}

void forEachPipelineTask(
    const RankProgram &RP, int64_t MicroBatches, uint32_t Slots,
    const std::function<void(const Task &, uint32_t Slot, bool First)> &Fn) {
  const uint32_t NTasks = RP.schedule()->size();
  // A micro-batch holds a slot from its first task on this rank to its
  // last (the memory plan counts the same way).
  std::vector<int64_t> LastTask(size_t(MicroBatches), -1),
      SlotOf(size_t(MicroBatches), -1);
  for (uint32_t T = 0; T < NTasks; ++T)
    LastTask[RP.schedule()->Get(T)->micro_batch()] = T;
  std::vector<uint32_t> Free;
  for (uint32_t S = Slots; S-- > 0;)
    Free.push_back(S);
  for (uint32_t T = 0; T < NTasks; ++T) {
    const Task &Tk = *RP.schedule()->Get(T);
    const int64_t K = Tk.micro_batch();
    const bool First = SlotOf[size_t(K)] < 0;
    if (First) {
      if (Free.empty())
        throw RunError("internal error: no buffer slot free for micro-batch " +
                       std::to_string(K));
      SlotOf[size_t(K)] = Free.back();
      Free.pop_back();
    }
    Fn(Tk, uint32_t(SlotOf[size_t(K)]), First);
    if (LastTask[size_t(K)] == int64_t(T))
      Free.push_back(uint32_t(SlotOf[size_t(K)]));
  }
}

RunStats Executor::runPipeline(Collectives &C, uint32_t End, RunStats Stats) {
  forEachPipelineTask(
      RP, microBatches(), uint32_t(SlotTensors.size()),
      [&](const Task &Tk, uint32_t Slot, bool First) {
        activateSlot(Slot);
        if (First)
          loadMicroBatch(Tk.micro_batch());
        CurMicro = Tk.micro_batch();
        const Segment &Seg = *RP.segments()->Get(Tk.segment());
        Stats = runRange(C, Seg.begin(), Seg.end(), Stats);
      });
  // The sums are complete: the once-per-step part (reduction, update).
  CurMicro = 0;
  Stats = runRange(C, uint32_t(RP.accumulate_end()), End, Stats);
  C.finishSends();
  return Stats;
}

RunStats Executor::runForward(Collectives &C) {
  if (!pipelined())
    return run(C, forwardEnd());
  RunStats Stats;
  CurMicro = 0;
  for (const Task *T : *RP.schedule()) {
    const Segment &Seg = *RP.segments()->Get(T->segment());
    if (T->micro_batch() == 0 && !Seg.backward())
      Stats = runRange(C, Seg.begin(), Seg.end(), Stats);
  }
  C.finishSends();
  return Stats;
}

RunStats Executor::run(Collectives &C, uint32_t End) {
  RunStats Stats;
  auto Start = std::chrono::steady_clock::now();
  const int64_t M = microBatches();
  const uint32_t AccEnd =
      RP.accumulate_end() >= 0 ? uint32_t(RP.accumulate_end()) : 0;
  if (pipelined() && End >= AccEnd) {
    Stats = runPipeline(C, End, Stats);
  } else if (M > 1 && AccEnd > 0 && End >= AccEnd) {
    for (int64_t K = 0; K < M; ++K) {
      loadMicroBatch(K);
      Stats = runRange(C, 0, AccEnd, Stats);
    }
    Stats = runRange(C, AccEnd, End, Stats);
  } else {
    CurMicro = 0;
    Stats = runRange(C, 0, End, Stats);
  }
  Stats.seconds = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - Start)
                      .count();
  return Stats;
}

RunStats Executor::runRange(Collectives &C, uint32_t Begin, uint32_t End,
                            RunStats Stats) {
  if (RP.instrs())
    for (uint32_t I = Begin; I < RP.instrs()->size() && I < End; ++I) {
      const Instr &In = *RP.instrs()->Get(I);
      if (Training && In.generation_only())
        continue;
      Beat.fetch_add(1, std::memory_order_relaxed);
      Current.store(I, std::memory_order_relaxed);
      const bool Tracing = Trace.size() < TraceLimit;
      if (!Tracing && TraceLimit && !FirstUntracedStep)
        FirstUntracedStep = CurStep;
      const auto T0 = Tracing ? std::chrono::steady_clock::now()
                              : std::chrono::steady_clock::time_point();
      // Every instruction's span, transfers too: a receive's span is the
      // time its rank waited for the peer stage (a send's, posting it).
      auto recordSpan = [&] {
        if (!Tracing)
          return;
        const auto T1 = std::chrono::steady_clock::now();
        using Us = std::chrono::duration<double, std::micro>;
        Trace.push_back({I, Us(T0 - TraceEpoch).count(), Us(T1 - T0).count(),
                         CurStep, CurMicro});
      };
      if (In.op() == op::Send || In.op() == op::Recv) {
        try {
          transfer(In, C);
        } catch (const RunError &E) {
          throw RunError("rank " + std::to_string(RP.rank()) +
                         ", instruction " + std::to_string(I) + " (" +
                         opcodeName(In.op()) + "): " + E.what());
        }
        recordSpan();
        ++Stats.instructions;
        continue;
      }
      uint32_t OutId = In.outputs()->Get(0);
      // The verifier lets an instruction write one of its inputs only
      // where updatesInPlace says (elementwise, in place). Should anything
      // else, compute into a scratch tensor so kernels never see aliased
      // arguments.
      bool Aliased = false;
      if (In.inputs())
        for (uint32_t K = 0; K < In.inputs()->size(); ++K)
          Aliased |=
              In.inputs()->Get(K) == OutId && !updatesInPlace(In.op(), K, 0);
      try {
        if (Aliased) {
          Tensor Tmp = Bufs[OutId];
          exec(I, In, C, Tmp);
          Bufs[OutId] = std::move(Tmp);
        } else {
          exec(I, In, C, Bufs[OutId]);
        }
        // Rounded as it is written (format 7): what a round_bf16 after the
        // op gives, bit for bit (each output: linear_bias may have two).
        if (In.round_bf16())
          for (uint32_t Out : *In.outputs()) {
            Tensor &Y = Bufs[Out];
            kernels::roundBf16(Y.f.data(), Y.numel(), Y.f.data());
          }
      } catch (const RunError &E) {
        std::string Loc = In.loc() ? In.loc()->str() : "";
        throw RunError("rank " + std::to_string(RP.rank()) + ", instruction " +
                       std::to_string(I) + " (" + opcodeName(In.op()) +
                       (Loc.empty() ? "" : " at " + Loc) + "): " + E.what());
      }
      recordSpan();
      ++Stats.instructions;
      if (In.op() == op::AllReduce || In.op() == op::AllGather ||
          In.op() == op::ReduceScatter)
        ++Stats.collectives;
    }
  Current.store(UINT32_MAX, std::memory_order_relaxed);
  return Stats;
}

const std::vector<kernels::FusedStep> &Executor::fusedSteps(uint32_t Kernel) {
  if (FusedCache.size() <= Kernel)
    FusedCache.resize(Kernel + 1);
  std::vector<kernels::FusedStep> &Steps = FusedCache[Kernel];
  if (!Steps.empty())
    return Steps;
  // The verifier checked the steps (ops, arguments, at least one).
  for (const FusedStep *S : *P.kernels()->Get(Kernel)->steps()) {
    kernels::FusedStep K;
    K.Op = S->op() == op::Add        ? kernels::FusedOp::Add
           : S->op() == op::Mul      ? kernels::FusedOp::Mul
           : S->op() == op::Gelu     ? kernels::FusedOp::Gelu
           : S->op() == op::GeluGrad ? kernels::FusedOp::GeluGrad
                                     : kernels::FusedOp::RoundBf16;
    K.A = S->args()->Get(0);
    K.B = S->args()->size() > 1 ? S->args()->Get(1) : 0;
    Steps.push_back(K);
  }
  return Steps;
}

void Executor::transfer(const Instr &In, Collectives &C) {
  // The message of transfer t for micro-batch k has tag t * m + k: the
  // micro-batches a schedule keeps in flight cannot be confused.
  const int Peer = int(In.ints()->Get(0));
  const int64_t Tag = In.ints()->Get(1) * microBatches() + CurMicro;
  if (In.op() == op::Send) {
    const Tensor &X = Bufs[In.inputs()->Get(0)];
    C.send(Peer, Tag, X.data(), X.bytes());
  } else {
    Tensor &Y = Bufs[In.outputs()->Get(0)];
    C.recv(Peer, Tag, Y.data(), Y.bytes());
  }
}

uint64_t Executor::dropoutStep() const {
  // With gradient accumulation each micro-batch draws its own masks: the
  // key's step counts micro-batches ((t - 1) m + k + 1; t itself when m = 1).
  return uint64_t(CurStep - 1) * uint64_t(microBatches()) +
         uint64_t(CurMicro) + 1;
}

const kernels::AttentionDropout *
Executor::attentionDropout(const Instr &In, unsigned First,
                           kernels::AttentionDropout &Drop) const {
  // ints [.., stream, global batch, global heads, batch offset, head offset]
  // from index First, floats [rate]; generation runs without dropout.
  if (Inference || !In.floats() || In.floats()->size() != 1 ||
      !In.ints() || In.ints()->size() != First + 5)
    return nullptr;
  Drop.Rate = In.floats()->Get(0);
  Drop.Key = dropoutKey(RunSeed, uint64_t(In.ints()->Get(First)),
                        dropoutStep());
  Drop.GlobalHeads = In.ints()->Get(First + 2);
  Drop.BatchOffset = In.ints()->Get(First + 3);
  Drop.HeadOffset = In.ints()->Get(First + 4);
  return &Drop;
}

void Executor::linearBiasEpilogue(const Instr &In, Tensor &Y) {
  // The bias, then the residual or the GeLU, each as the unfused ops
  // compute it; the GeLU reads the fp32 sum, which a second output keeps
  // (both are rounded after, where the plan asks, as the epilogue rounds).
  const Tensor &Bias = Bufs[In.inputs()->Get(2)];
  kernels::add(Y.f.data(), Y.numel(), Bias.f.data(), Bias.numel(), Y.f.data());
  if (In.inputs()->size() == 4) { // a residual, added to the sum
    const Tensor &Residual = Bufs[In.inputs()->Get(3)];
    kernels::add(Y.f.data(), Y.numel(), Residual.f.data(), Residual.numel(),
                 Y.f.data());
  }
  if (In.outputs()->size() == 2) {
    Tensor &Pre = Bufs[In.outputs()->Get(1)];
    std::copy(Y.f.begin(), Y.f.end(), Pre.f.begin());
  }
  if (In.ints()->Get(1) != 0)
    kernels::gelu(Y.f.data(), Y.numel(), Y.f.data());
}

void Executor::exec(uint32_t Idx, const Instr &In, Collectives &C,
                    Tensor &Y) {
  auto X = [&](unsigned K) -> const Tensor & {
    return Bufs[In.inputs()->Get(K)];
  };
  auto Int = [&](unsigned K) { return In.ints()->Get(K); };
  auto Flt = [&](unsigned K) { return In.floats()->Get(K); };
  auto NumInts = [&]() { return In.ints() ? In.ints()->size() : 0u; };
  if (In.op() == op::Fill) { // the only opcode without inputs
    std::fill(Y.f.begin(), Y.f.end(), float(Flt(0)));
    return;
  }
  const Tensor &A = X(0);
  const int64_t Last = A.shape.empty() ? 1 : A.shape.back();
  const int64_t Rows = Last ? A.numel() / Last : 0;
  // Labels are checked against the model's vocabulary; a plan without one
  // (hand-built, no inputs) is checked against the block itself.
  auto VocabSize = [&](int64_t Start) {
    return P.vocab_size() > 0 ? P.vocab_size() : Start + Last;
  };
  switch (In.op()) {
  case op::Embedding: {
    const Tensor &Tab = X(0), &Ids = X(1);
    kernels::embedding(Tab.f.data(), Tab.shape[0], Tab.shape[1], Ids.i.data(),
                       Ids.numel(), Int(0), P.vocab_size(), Y.f.data());
    return;
  }
  case op::PositionEmbedding: {
    // Rows 0..S-1 of the table, which are contiguous.
    std::memcpy(Y.f.data(), A.f.data(), Y.bytes());
    return;
  }
  case op::Linear:
  case op::LinearBias:
  case op::LinearGeluGrad: {
    // y = x w (ints[0]: w [N,K], read transposed), then the epilogue.
    const Tensor &W = X(1);
    bool T = Int(0) != 0;
    int64_t N = T ? W.shape[0] : W.shape[1];
    int64_t M = N ? Y.numel() / N : 0;
    kernels::linear(A.f.data(), M, Last, W.f.data(), N, T, Y.f.data());
    if (In.op() == op::Linear && In.inputs()->size() == 3)
      // A third input (format 15): added to the fp32 product, as the add
      // of the two did (megac-round-after-epilogue took the product's
      // rounding away; the sum is rounded after, with round_bf16).
      kernels::add(X(2).f.data(), X(2).numel(), Y.f.data(), Y.numel(),
                   Y.f.data());
    else if (In.op() == op::LinearBias)
      linearBiasEpilogue(In, Y);
    else if (In.op() == op::LinearGeluGrad)
      // GeLU's gradient at x with the fp32 product as the output gradient,
      // as the unfused ops with the product's rounding taken away
      // (megac-round-after-epilogue) compute it.
      kernels::geluGrad(X(2).f.data(), Y.f.data(), Y.numel(), Y.f.data());
    return;
  }
  case op::Fused: {
    std::vector<const float *> Args;
    std::vector<int64_t> Period;
    for (uint32_t K = 0; K < In.inputs()->size(); ++K) {
      Args.push_back(X(K).f.data());
      Period.push_back(std::max<int64_t>(1, X(K).numel()));
    }
    kernels::fusedElementwise(fusedSteps(uint32_t(Int(0))), Args, Period,
                              Y.numel(), Y.f.data());
    return;
  }
  case op::MatMul: {
    const Tensor &B = X(1);
    size_t R = A.shape.size();
    int64_t M = A.shape[R - 2], K = A.shape[R - 1], N = B.shape[R - 1];
    if (M * N == 0)
      return;
    kernels::matmul(A.f.data(), B.f.data(), Y.numel() / (M * N), M, K, N,
                    Y.f.data());
    return;
  }
  case op::Add:
    kernels::add(A.f.data(), A.numel(), X(1).f.data(), X(1).numel(),
                 Y.f.data());
    return;
  case op::Mul:
    kernels::mul(A.f.data(), A.numel(), X(1).f.data(), X(1).numel(),
                 Y.f.data());
    return;
  case op::Gelu:
    kernels::gelu(A.f.data(), A.numel(), Y.f.data());
    return;
  case op::LayerNorm:
    if (Last)
      kernels::layerNorm(A.f.data(), A.numel() / Last, Last, X(1).f.data(),
                         X(2).f.data(), In.floats()->Get(0), Y.f.data());
    return;
  case op::Attention: {
    kernels::AttentionDropout Drop;
    if (A.numel())
      kernels::attention(A.f.data(), X(1).f.data(), X(2).f.data(),
                         A.shape[0], A.shape[1], A.shape[2], Int(0),
                         Int(1) != 0, Y.f.data(),
                         attentionDropout(In, 2, Drop));
    return;
  }
  case op::Softmax:
    if (Last)
      kernels::softmax(A.f.data(), A.numel() / Last, Last, Y.f.data());
    return;
  case op::Reshape:
    std::memcpy(Y.data(), A.data(), Y.bytes());
    return;
  case op::Transpose:
    kernels::transpose(static_cast<const uint32_t *>(A.data()), A.shape,
                       vec(In.ints()), static_cast<uint32_t *>(Y.data()));
    return;
  case op::CrossEntropy:
    Y.f[0] = float(kernels::crossEntropy(
        A.f.data(), Rows, Last, X(1).i.data(),
        NumInts() ? double(Int(0)) : 0.0, NumInts() > 1 ? Int(1) : 0));
    return;
  case op::LinearWeightGrad: {
    // With the accumulate flag the output is a micro-batch sum: micro-batch
    // 0 writes it, later ones add to it (beta = 1).
    const Tensor &DY = X(1);
    const int64_t N = DY.shape.back();
    const bool Add = NumInts() > 1 && Int(1) != 0 && CurMicro > 0;
    kernels::linearWeightGrad(A.f.data(), Rows, Last, DY.f.data(), N,
                              Int(0) != 0, Y.f.data(), Add ? 1.0f : 0.0f);
    if (In.outputs()->size() == 2 && N) // the bias gradient (format 13),
      kernels::sumLeading(DY.f.data(), DY.numel() / N, N, // as sum_leading
                          Bufs[In.outputs()->Get(1)].f.data()); // sums it
    return;
  }
  case op::GeluGrad:
    kernels::geluGrad(A.f.data(), X(1).f.data(), A.numel(), Y.f.data());
    return;
  case op::LayerNormGrad:
    kernels::layerNormGrad(A.f.data(), Rows, Last, X(1).f.data(),
                           X(2).f.data(), Flt(0), Y.f.data());
    if (In.inputs()->size() == 4) // the residual gradient, added after
      kernels::add(Y.f.data(), Y.numel(), X(3).f.data(), X(3).numel(),
                   Y.f.data());
    return;
  case op::Normalize:
    kernels::normalize(A.f.data(), Rows, Last, Flt(0), Y.f.data());
    return;
  case op::AttentionGrad: {
    kernels::AttentionDropout Drop;
    // which = 3 (format 11) or 4 (format 12): one output per step, all
    // from one pass (each with the bits its own step would give it).
    const AttentionGradSteps Steps = attentionGradSteps(Int(2));
    if (!A.numel())
      return;
    kernels::AttentionGradOutputs Outs;
    for (int K = 0; K < Steps.Count; ++K)
      Outs.ofStep(Steps.First + K) =
          (K == 0 ? Y : Bufs[In.outputs()->Get(K)]).f.data();
    kernels::attentionGrads(A.f.data(), X(1).f.data(), X(2).f.data(),
                            X(3).f.data(), A.shape[0], A.shape[1], A.shape[2],
                            Int(0), Int(1) != 0, Outs,
                            attentionDropout(In, 3, Drop));
    return;
  }
  case op::SoftmaxGrad:
    kernels::softmaxGrad(A.f.data(), X(1).f.data(), Rows, Last, Y.f.data());
    return;
  case op::EmbeddingGrad: {
    // A fourth input (format 13): another gradient of the table, added as
    // the add of the two adds (in place where it is the output).
    const bool Into = In.inputs()->size() == 4;
    std::vector<float> Own(Into ? Y.f.size() : 0);
    kernels::embeddingGrad(X(1).i.data(), X(1).numel(), X(2).f.data(),
                           A.shape[0], A.shape[1], Int(0),
                           Into ? Own.data() : Y.f.data());
    if (Into)
      kernels::add(X(3).f.data(), X(3).numel(), Own.data(), int64_t(Own.size()),
                   Y.f.data());
    return;
  }
  case op::PositionEmbeddingGrad:
    kernels::positionEmbeddingGrad(X(1).f.data(), X(1).shape[0], A.shape[0],
                                   A.shape[1], Y.f.data());
    return;
  case op::CrossEntropyStats:
    kernels::crossEntropyStats(A.f.data(), Rows, Last, X(1).i.data(), Int(0),
                               VocabSize(Int(0)), Y.shape.back() / 3,
                               Y.f.data(), NumInts() > 1 ? Int(1) : 0);
    return;
  case op::CrossEntropyFromStats:
    Y.f[0] = float(kernels::crossEntropyFromStats(
        A.f.data(), Rows, Last / 3, NumInts() ? double(Int(0)) : 0.0));
    return;
  case op::CrossEntropyGrad:
    if (In.inputs()->size() == 4) {
      const Tensor &St = X(3);
      kernels::crossEntropyGradFromStats(
          A.f.data(), Rows, Last, X(1).i.data(), St.f.data(),
          St.shape.back() / 3, Int(1), VocabSize(Int(1)), double(X(2).f[0]),
          double(Int(0)), Y.f.data(), NumInts() > 2 ? Int(2) : 0);
      return;
    }
    kernels::crossEntropyGrad(A.f.data(), Rows, Last, X(1).i.data(),
                              double(X(2).f[0]),
                              NumInts() ? double(Int(0)) : 0.0, Y.f.data(),
                              NumInts() > 2 ? Int(2) : 0);
    return;
  case op::SumLeading:
  case op::LayerNormGainGrad: {
    const int64_t Inner = Y.numel();
    if (!Inner)
      return;
    // Output 0: the op's sum; output 1 of a gain gradient (format 11):
    // the bias gradient, dy's sum_leading.
    auto Sum = [&](unsigned Output, float *Out) {
      if (In.op() == op::SumLeading)
        kernels::sumLeading(A.f.data(), A.numel() / Inner, Inner, Out);
      else if (Output == 1)
        kernels::sumLeading(X(1).f.data(), X(1).numel() / Inner, Inner, Out);
      else
        kernels::layerNormGainGrad(A.f.data(), X(1).f.data(), A.numel() / Inner,
                                   Inner, Flt(0), Out);
    };
    for (unsigned Output = 0; Output < In.outputs()->size(); ++Output) {
      Tensor &Out = Output == 0 ? Y : Bufs[In.outputs()->Get(Output)];
      if (NumInts() > 0 && Int(0) != 0 && CurMicro > 0) {
        // Accumulating into a micro-batch sum: this micro-batch's sum,
        // added.
        std::vector<float> Part(static_cast<size_t>(Inner), 0.0f);
        Sum(Output, Part.data());
        for (int64_t J = 0; J < Inner; ++J)
          Out.f[size_t(J)] += Part[size_t(J)];
      } else {
        Sum(Output, Out.f.data());
      }
    }
    return;
  }
  case op::SumSquares:
    Y.f[0] = float(kernels::sumSquares(A.f.data(), A.numel()));
    return;
  case op::ClipCoefficient: {
    double Norm = std::sqrt(std::max(0.0, double(A.f[0])));
    Y.f[0] = float(std::min(1.0, Flt(0) / (Norm + 1e-6)));
    return;
  }
  case op::AdamW: {
    AdamState &St = Adam[size_t(AdamOfInstr[Idx])];
    kernels::adamw(Y.f.data(), X(1).f.data(), Y.numel(), double(X(2).f[0]),
                   St.m.data(), St.v.data(), CurStep, CurLr, Flt(0), Flt(1),
                   Flt(2), Flt(3));
    return;
  }
  case op::Fill:
    return; // handled above
  case op::Send:
  case op::Recv:
    break; // the run loop hands transfers to transfer(), never here
  case op::Assign:
    std::memcpy(Y.f.data(), A.f.data(), Y.bytes());
    return;
  case op::RoundBf16:
    kernels::roundBf16(A.f.data(), A.numel(), Y.f.data());
    return;
  case op::Accumulate:
    if (CurMicro == 0)
      std::memcpy(Y.f.data(), A.f.data(), Y.bytes());
    else
      for (int64_t K = 0; K < Y.numel(); ++K)
        Y.f[size_t(K)] += A.f[size_t(K)];
    return;
  case op::StackMicroBatches: {
    // Micro-batch k's rows; a forward run alone (generation) is micro-batch 0.
    const size_t Bytes = A.bytes();
    if (size_t(CurMicro + 1) * Bytes > Y.bytes())
      throw RunError("internal error: stack_micro_batches of micro-batch " +
                     std::to_string(CurMicro) + " past its output");
    std::memcpy(static_cast<unsigned char *>(Y.data()) +
                    size_t(CurMicro) * Bytes,
                A.data(), Bytes);
    return;
  }
  case op::Dropout: {
    // ints: stream, r, global_shape (r), offset (r); floats: rate. Training
    // steps key the mask with t (1-based); a plain forward run uses step 1;
    // generation (inference) skips dropout.
    if (Inference) {
      std::memcpy(Y.f.data(), A.f.data(), Y.bytes());
      return;
    }
    const size_t R = size_t(Int(1));
    std::vector<int64_t> Global(R), Offset(R);
    for (size_t D = 0; D < R; ++D) {
      Global[D] = Int(unsigned(2 + D));
      Offset[D] = Int(unsigned(2 + R + D));
    }
    kernels::dropout(A.f.data(), A.shape, Global, Offset, Flt(0), RunSeed,
                     uint64_t(Int(0)), dropoutStep(), Y.f.data());
    return;
  }
  case op::ReduceScatter: {
    // Member k receives chunk k along dim D of the sum. MPI's reduce-scatter
    // hands out contiguous blocks, so unless D = 0 the chunks are first
    // laid out one after another (the inverse of all_gather's concat).
    const int64_t D = Int(0);
    const int64_t G = P.axes()->Get(In.axis())->size();
    int64_t Outer = 1, Inner = 1;
    for (int64_t K = 0; K < D; ++K)
      Outer *= A.shape[size_t(K)];
    for (size_t K = size_t(D) + 1; K < A.shape.size(); ++K)
      Inner *= A.shape[K];
    const size_t N = size_t(Y.numel());
    if (Outer == 1) {
      C.reduceScatterSum(In.axis(), A.f.data(), Y.f.data(), N);
      return;
    }
    std::vector<float> Send(size_t(A.numel()));
    for (int64_t K = 0; K < G; ++K)
      kernels::sliceChunk(reinterpret_cast<const uint8_t *>(A.f.data()),
                          Outer, Y.shape[size_t(D)], Inner, G, K, 4,
                          reinterpret_cast<uint8_t *>(Send.data() +
                                                      size_t(K) * N));
    C.reduceScatterSum(In.axis(), Send.data(), Y.f.data(), N);
    return;
  }
  case op::AllReduce: {
    const uint32_t N = In.inputs()->size();
    if (N == 1) {
      if (Y.f.data() != A.f.data()) // not in place
        std::memcpy(Y.f.data(), A.f.data(), Y.bytes());
      C.allReduceSum(In.axis(), Y.f.data(), size_t(Y.numel()));
      return;
    }
    // A bucket: one collective over the inputs laid end to end.
    size_t Total = 0;
    for (uint32_t K = 0; K < N; ++K)
      Total += size_t(X(K).numel());
    std::vector<float> Packed(Total);
    size_t At = 0;
    for (uint32_t K = 0; K < N; ++K) {
      std::copy(X(K).f.begin(), X(K).f.end(), Packed.begin() + long(At));
      At += X(K).f.size();
    }
    C.allReduceSum(In.axis(), Packed.data(), Total);
    At = 0;
    for (uint32_t K = 0; K < N; ++K) {
      Tensor &Out = K == 0 ? Y : Bufs[In.outputs()->Get(K)];
      std::copy(Packed.begin() + long(At),
                Packed.begin() + long(At + Out.f.size()), Out.f.begin());
      At += Out.f.size();
    }
    return;
  }
  case op::AllGather:
  case op::SliceShard: {
    const int64_t D = Int(0);
    const int64_t G = P.axes()->Get(In.axis())->size();
    int64_t Outer = 1, Inner = 1;
    for (int64_t K = 0; K < D; ++K)
      Outer *= A.shape[K];
    for (size_t K = size_t(D) + 1; K < A.shape.size(); ++K)
      Inner *= A.shape[K];
    if (In.op() == op::SliceShard) {
      int64_t Coord = RP.coords()->Get(In.axis());
      kernels::sliceChunk(static_cast<const uint8_t *>(A.data()), Outer,
                          Y.shape[D], Inner, G, Coord, 4,
                          static_cast<uint8_t *>(Y.data()));
      return;
    }
    std::vector<uint8_t> Chunks(A.bytes() * size_t(G));
    C.allGather(In.axis(), A.data(), A.bytes(), Chunks.data());
    kernels::concatChunks(Chunks.data(), Outer, A.shape[D], Inner, G, 4,
                          static_cast<uint8_t *>(Y.data()));
    return;
  }
  }
  throw RunError("unknown opcode");
}

} // namespace megac_rt
