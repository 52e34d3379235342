//===- executor.h - Runs one rank's instruction stream --------*- C++ -*-===//
//
// The executor owns a rank's buffers and interprets its instructions with
// the CPU kernels. Communication is behind the Collectives interface so the
// executor (and its tests) do not depend on MPI; megac-run supplies an MPI
// implementation, single-rank tests use LocalCollectives.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_EXECUTOR_H
#define MEGAC_RT_EXECUTOR_H

#include "init.h"
#include "kernels.h"
#include "megac_rt/plan_file.h"
#include "megac_rt/trace.h"
#include "plan_enums.h"
#include "safetensors.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace megac_rt {

/// One buffer: fp32 or int32 data in row-major order.
/// Elements of a tensor: its own vector, or a view of a slot in the rank's
/// memory-planned arena. Copies always own their elements (a scratch copy
/// never aliases the arena); a view is made with bind().
template <typename T> class Storage {
public:
  Storage() = default;
  Storage(const Storage &O) : Own(O.begin(), O.end()) { point(); }
  Storage(Storage &&O) noexcept { *this = std::move(O); }
  Storage &operator=(const Storage &O) {
    if (this != &O) {
      Own.assign(O.begin(), O.end());
      point();
    }
    return *this;
  }
  Storage &operator=(Storage &&O) noexcept {
    if (this != &O) {
      const bool View = O.P != O.Own.data();
      Own = std::move(O.Own);
      if (View) {
        P = O.P;
        N = O.N;
      } else {
        point();
      }
      O.Own.clear();
      O.point();
    }
    return *this;
  }
  /// Views \p Count elements at \p Data (owned by someone else), zeroed.
  void bind(T *Data, size_t Count) {
    Own.clear();
    Own.shrink_to_fit();
    P = Data;
    N = Count;
    std::fill(P, P + N, T());
  }
  void assign(size_t Count, T Value) {
    Own.assign(Count, Value);
    point();
  }
  template <typename It> void assign(It First, It Last) {
    Own.assign(First, Last);
    point();
  }
  T *data() { return P; }
  const T *data() const { return P; }
  size_t size() const { return N; }
  bool empty() const { return N == 0; }
  T *begin() { return P; }
  T *end() { return P + N; }
  const T *begin() const { return P; }
  const T *end() const { return P + N; }
  T &operator[](size_t K) { return P[K]; }
  const T &operator[](size_t K) const { return P[K]; }
  /// A copy of the elements.
  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }
  friend bool operator==(const Storage &A, const std::vector<T> &B) {
    return A.size() == B.size() && std::equal(A.begin(), A.end(), B.begin());
  }
  friend bool operator==(const Storage &A, const Storage &B) {
    return A.size() == B.size() && std::equal(A.begin(), A.end(), B.begin());
  }
  friend bool operator!=(const Storage &A, const std::vector<T> &B) {
    return !(A == B);
  }

private:
  void point() {
    P = Own.data();
    N = Own.size();
  }
  std::vector<T> Own;
  T *P = nullptr;
  size_t N = 0;
};

struct Tensor {
  megac::plan::DType dtype = dt::F32;
  std::vector<int64_t> shape;
  Storage<float> f;
  Storage<int32_t> i;

  int64_t numel() const;
  bool isF32() const { return dtype == dt::F32; }
  void *data() { return isF32() ? (void *)f.data() : (void *)i.data(); }
  const void *data() const {
    return isF32() ? (const void *)f.data() : (const void *)i.data();
  }
  size_t bytes() const { return size_t(numel()) * 4; }
};

/// Communication along the axes of the grid. Every call is collective over
/// this rank's group on \p Axis.
class Collectives {
public:
  virtual ~Collectives();
  /// In-place sum of \p N floats over the group.
  virtual void allReduceSum(int Axis, float *Data, size_t N) = 0;
  /// Concatenates every member's \p Bytes from \p Send into \p Recv in group
  /// order (Recv holds group size * Bytes).
  virtual void allGather(int Axis, const void *Send, size_t Bytes,
                         void *Recv) = 0;
  /// Sums every member's \p Send (group size * \p N floats, member k's
  /// chunk at k * N) and leaves chunk (this member's position) of the sum
  /// in \p Recv (\p N floats).
  virtual void reduceScatterSum(int Axis, const float *Send, float *Recv,
                                size_t N) = 0;
  /// Pipeline transfers between two ranks: send hands \p Bytes to rank
  /// \p Peer without waiting for it (the data is copied), recv waits for
  /// the message with the same \p Tag from \p Peer. finishSends waits
  /// until every send has completed.
  virtual void send(int Peer, int64_t Tag, const void *Data, size_t Bytes);
  virtual void recv(int Peer, int64_t Tag, void *Data, size_t Bytes);
  virtual void finishSends() {}
};

/// Collectives for a plan whose groups all have one member.
class LocalCollectives : public Collectives {
public:
  void allReduceSum(int, float *, size_t) override {}
  void allGather(int, const void *Send, size_t Bytes, void *Recv) override;
  void reduceScatterSum(int, const float *Send, float *Recv,
                        size_t N) override;
};

/// Optimizer state of one adam_w instruction: the first and second moments
/// of the values it updates (zero before the first step). Those are the
/// rank's slice of a parameter (its buffer) or, under ZeRO, a slice of that
/// slice (Instr.param_name / param_offset); globalShape and offset place
/// them in the whole parameter, as the checkpoint records them.
struct AdamState {
  uint32_t instr = 0;  // index of the adam_w instruction
  uint32_t buffer = 0; // the buffer it updates (input 0)
  std::string param;   // the parameter's name
  std::vector<int64_t> globalShape, offset;
  std::vector<float> m, v;
};

struct RunStats {
  size_t instructions = 0;
  size_t collectives = 0;
  double seconds = 0;
};

class Executor {
public:
  Executor(const megac::plan::Program &P, uint32_t Rank);

  /// Allocates every buffer; throws RunError if memory runs out.
  void allocate();
  /// Total parameter elements of this rank.
  uint64_t paramElements() const;
  /// Initializes every parameter from its init kind and \p Seed.
  void initParams(uint64_t Seed);
  /// Loads every parameter with an hf_name from \p File (others are
  /// initialized from \p Seed), or every parameter from a merged
  /// checkpoint; returns how many were loaded.
  size_t loadParams(const WeightFiles &File, uint64_t Seed);
  /// Whether the plan has a "labels" input (needs one more token).
  bool needsLabels() const;
  /// Global batch rows: Program.global_batch, or the local batch if 0.
  int64_t globalBatch() const;
  /// Tokens one step consumes from the stream: global batch * seq.
  uint64_t tokensPerStep() const;
  /// Number of tokens setInputs needs: global batch * seq (+1 with labels).
  size_t tokensNeeded() const;
  /// Fills this rank's rows of the global batch starting at stream position
  /// \p Pos: tokens[b,s] = t[Pos + (batch_offset+b)*S + s], labels one
  /// token later. The caller guarantees Pos + tokensNeeded() <= length.
  /// With random windows, rows start at positions drawn for the step set by
  /// setStep (call it first).
  void setInputs(const TokenSource &Stream, uint64_t Pos = 0);
  /// The same on an in-memory stream starting at position 0.
  void setInputs(const std::vector<int32_t> &Stream);
  /// Sets the optimizer step (1-based, t of AdamW's bias correction) and
  /// learning rate used by adam_w instructions.
  void setStep(int64_t Step, double Lr) {
    CurStep = Step;
    CurLr = Lr;
    Published.store(Step, std::memory_order_relaxed);
  }
  /// The step, for another thread (the watchdog).
  int64_t publishedStep() const {
    return Published.load(std::memory_order_relaxed);
  }
  int64_t step() const { return CurStep; }
  /// Seed of the run (--seed or the plan's; the plan's by default): keys the
  /// dropout masks together with each dropout's stream and the step.
  void setSeed(uint64_t Seed) { RunSeed = Seed; }
  uint64_t seed() const { return RunSeed; }
  /// Inference (generation): dropout is the identity. Off by default, when
  /// dropout uses step() (1 unless a training loop sets it).
  void setInference(bool On) { Inference = On; }
  /// Records every executed instruction from now on (at most \p MaxEvents;
  /// times relative to this call).
  void enableTrace(size_t MaxEvents) {
    TraceLimit = MaxEvents;
    TraceEpoch = std::chrono::steady_clock::now();
    Trace.clear();
    FirstUntracedStep.reset();
  }
  const std::vector<TraceSpan> &trace() const { return Trace; }
  /// The step of the first instruction the trace's limit left out; none
  /// where the trace holds every instruction run since enableTrace.
  std::optional<int64_t> firstUntracedStep() const { return FirstUntracedStep; }
  /// Training steps skip generation-only instructions (the logits).
  void setTraining(bool On) { Training = On; }
  /// Random windows (as nanoGPT samples): setInputs ignores its position and
  /// starts row g of the step's global batch at a position drawn from
  /// (seed, step, g), so a resumed run draws the same rows.
  void setRandomWindows(bool On) { RandomWindows = On; }
  bool inference() const { return Inference; }
  /// Executes instructions [0, End) (all by default) once; with gradient
  /// accumulation, [0, accumulate_end) once per micro-batch first.
  RunStats run(Collectives &C, uint32_t End = UINT32_MAX);
  /// One forward pass on the current inputs (generation): the forward
  /// part of the plan, or on a pipeline the forward segments of
  /// micro-batch 0 in schedule order.
  RunStats runForward(Collectives &C);
  /// Number of instructions of the forward part (forward_end, or all).
  uint32_t forwardEnd() const;
  /// Progress, for a watchdog on another thread: a counter bumped at every
  /// instruction (and by note()), and the instruction being run (UINT32_MAX
  /// between instructions).
  uint64_t heartbeat() const { return Beat.load(std::memory_order_relaxed); }
  uint32_t currentInstruction() const {
    return Current.load(std::memory_order_relaxed);
  }
  /// Counts as progress (the caller finished something of its own).
  void note() { Beat.fetch_add(1, std::memory_order_relaxed); }
  /// Progress made elsewhere (the CUDA backend): instruction \p I is being
  /// run (UINT32_MAX: none), and whether the host now only waits for the
  /// device to finish what it was given.
  void notePosition(uint32_t I, bool WaitingForDevice) {
    Current.store(I, std::memory_order_relaxed);
    OnDevice.store(WaitingForDevice, std::memory_order_relaxed);
    note();
  }
  bool waitingForDevice() const {
    return OnDevice.load(std::memory_order_relaxed);
  }
  /// Whether the plan is pipelined (the rank runs a schedule of segments).
  bool pipelined() const {
    return RP.segments() && RP.segments()->size() > 0;
  }
  /// Micro-batches per step (1 without gradient accumulation).
  int64_t microBatches() const;
  /// Copies micro-batch \p K's rows (of those setInputs filled) into the
  /// input buffers.
  void loadMicroBatch(int64_t K);
  /// Whether the rank has adam_w instructions.
  bool hasOptimizer() const { return !Adam.empty(); }

  const Tensor &buffer(uint32_t Id) const { return Bufs[Id]; }
  Tensor &mutableBuffer(uint32_t Id) { return Bufs[Id]; }
  const megac::plan::RankProgram &rankProgram() const { return RP; }
  const megac::plan::Program &program() const { return P; }
  /// Bytes of the arena (the memory plan's), 0 before allocate().
  uint64_t arenaBytes() const { return ArenaBytes; }
  std::vector<AdamState> &adamStates() { return Adam; }
  const std::vector<AdamState> &adamStates() const { return Adam; }

private:
  const megac::plan::Program &P;
  const megac::plan::RankProgram &RP;
  std::vector<Tensor> Bufs;
  /// The memory-planned arena the non-parameter buffers live in.
  std::unique_ptr<uint64_t[]> Arena;
  uint64_t ArenaBytes = 0;
  std::vector<AdamState> Adam;
  std::vector<int32_t> AdamOfInstr; // instruction -> index in Adam, or -1
  std::atomic<uint64_t> Beat{0};
  std::atomic<int64_t> Published{1};
  std::atomic<uint32_t> Current{UINT32_MAX};
  std::atomic<bool> OnDevice{false};
  int64_t CurStep = 1;
  double CurLr = 0;
  uint64_t RunSeed = 0;
  bool Inference = false;
  bool Training = false;
  bool RandomWindows = false;
  size_t TraceLimit = 0;
  std::optional<int64_t> FirstUntracedStep;
  std::chrono::steady_clock::time_point TraceEpoch;
  std::vector<TraceSpan> Trace;
  /// Gradient accumulation: the micro-batch being run, and every
  /// micro-batch's rows of each input (filled by setInputs), in input order.
  int64_t CurMicro = 0;
  std::vector<std::vector<int32_t>> MicroRows;

  /// Pipeline parallelism: the buffers kept per micro-batch in flight, and
  /// for each slot but the active one (whose tensors are in Bufs) their
  /// tensors; the active slot's entry holds placeholders.
  std::vector<uint32_t> PerMicroBufs;
  std::vector<std::vector<Tensor>> SlotTensors;
  uint32_t ActiveSlot = 0;
  void activateSlot(uint32_t Slot);
  /// Runs the schedule's tasks, then the once-per-step part.
  RunStats runPipeline(Collectives &C, uint32_t End, RunStats Stats);

  /// The step that keys dropout masks (micro-batches counted).
  uint64_t dropoutStep() const;
  /// Attention probability dropout of \p In (its dropout ints start at
  /// \p First), filled into \p Drop; null when off or in inference.
  const kernels::AttentionDropout *
  attentionDropout(const megac::plan::Instr &In, unsigned First,
                   kernels::AttentionDropout &Drop) const;
  RunStats runRange(Collectives &C, uint32_t Begin, uint32_t End,
                    RunStats Stats);
  /// linear_bias's epilogue on its product \p Y (and its second output).
  void linearBiasEpilogue(const megac::plan::Instr &In, Tensor &Y);
  void exec(uint32_t Idx, const megac::plan::Instr &In, Collectives &C,
            Tensor &Out);
  /// The steps of generated kernel \p Kernel, as the CPU kernels run them.
  const std::vector<kernels::FusedStep> &fusedSteps(uint32_t Kernel);
  std::vector<std::vector<kernels::FusedStep>> FusedCache;
  /// A Send or Recv of the current micro-batch.
  void transfer(const megac::plan::Instr &In, Collectives &C);
};

/// Walks rank program \p RP's pipeline schedule for one step: \p Fn gets
/// each task in order with the buffer slot its micro-batch holds (from its
/// first task on this rank to its last; \p First on the first, when its
/// inputs are loaded). Used by every backend, so they agree on slots.
void forEachPipelineTask(
    const megac::plan::RankProgram &RP, int64_t MicroBatches, uint32_t Slots,
    const std::function<void(const megac::plan::Task &, uint32_t Slot,
                             bool First)> &Fn);

/// "[4x64x512]".
std::string shapeString(const std::vector<int64_t> &Shape);

/// "" when every parameter and optimizer moment of \p E is finite, else
/// which is not ("parameter wte.weight holds nan at [256,0] (on rank 1)":
/// its place in the whole parameter).
/// A checkpoint of such a state would hold a diverged run.
std::string nonFiniteState(const Executor &E);

} // namespace megac_rt

#endif // MEGAC_RT_EXECUTOR_H
