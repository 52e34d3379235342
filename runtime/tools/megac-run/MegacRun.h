//===- MegacRun.h - What megac-run's parts share ----------------*- C++ -*-===//
//
// megac-run's parts, one file each: Common.cpp (the world, agreement,
// ending the job), Prepare.cpp (the failure-prone phase: plan, options,
// outputs, weights, data), Record.cpp (metrics, outputs, checkpoints,
// traces, profiles), Device.cpp (the CUDA backend's plugin and session),
// Train.cpp (training steps and forward runs), Generate.cpp (text
// generation) and megac-run.cpp (the command line, the watchdog, main).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RUN_MEGACRUN_H
#define MEGAC_RUN_MEGACRUN_H

#include "checkpoint.h"
#include "env.h"
#include "error.h"
#include "executor.h"
#include "file_io.h"
#include "init.h"
#include "kernels.h"
#include "megac_rt/trace.h"
#include "mpi_comm.h"
#include "rng.h"
#include "safetensors.h"
#include "torchrun_world.h"

#include "cuda/device_run.h"
#include "megac_rt/plan_file.h"

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace megac_run {

// (The runtime's names and the plan schema's are megac-run's vocabulary.)
using namespace megac_rt;
using namespace megac::plan;

/// megac-run's command line (runMain fills it).
struct Options {
  std::string plan, tokens, weights, saveOutputs, dumpPlan;
  uint64_t seed = 0;
  bool haveSeed = false;
  bool quiet = false;
  std::string backend = "cpu";
  // Training.
  int64_t steps = 1;
  bool haveSteps = false;
  std::string metrics, saveCheckpoint, loadCheckpoint;
  std::string sample = "sequential";
  std::string trace, profile;
  int64_t checkpointEvery = 0;
  // Seconds without progress after which a rank gives up (0: never).
  double watchdog = 300;
  // Generation.
  std::string prompt;
  bool generate = false;
  int64_t maxNewTokens = 100;
  double temperature = 0.8;
  int64_t topK = 0;
};

/// What the run does: a forward step (a plan without a training config),
/// training steps, or text generation (--generate).
enum class Mode { Forward, Train, Generate };

/// The device backend of this rank while one is open: the watchdog aborts
/// its communicators before ending the process.
extern std::atomic<DeviceRun *> LiveDevice;

/// Held by the watchdog's abort and by the session clearing LiveDevice, so
/// that the watchdog never aborts a device the main thread has freed.
extern std::mutex LiveDeviceMutex;

/// Set while the CUDA backend sets itself up (its device, then the NCCL
/// communicators, where a peer that never joins leaves this rank waiting
/// inside NCCL): what the watchdog names instead of an instruction.
extern std::atomic<bool> SettingUpDevice;

/// This process's rank in World, and World's size.
extern int WorldRank, WorldSize;

/// Every rank of the job: MPI_COMM_WORLD under an MPI launcher, the joined
/// world under a torchrun-style one (torchrun_world.h).
extern MPI_Comm World;

/// Whether World is a torchrun-style launch's joined world.
extern bool JoinedWorld;

/// Whether a launcher started this process (mpirun, srun, torchrun), read
/// before MPI_Init: a process started alone gets PMIX_RANK from MPI_Init
/// itself.
extern bool LaunchedByLauncher;

/// State built in the failure-prone phase.
struct Setup {
  LoadedPlan plan;
  std::unique_ptr<Executor> exec;
  uint64_t seed = 0;
  size_t loaded = 0;
  Mode mode = Mode::Forward;
  // Training: the token stream, the next batch's position in it, steps
  // already done (from a checkpoint), the loss buffer, the metrics file.
  TokenSource stream;
  uint64_t dataPos = 0;
  int64_t startStep = 0;
  uint32_t lossBuf = 0, logitsBuf = 0;
  std::string resumedFrom;
  CheckpointMeta resumedMeta;
  // What computes the steps besides the plan (CheckpointMeta::arithmetic).
  std::string arithmetic;
  // The step directory this run saved last ("" before its first).
  std::string lastSaved;
  FILE *metrics = nullptr;
  // Forward plans: the tokens the step read (the global batch + 1).
  std::vector<int32_t> forwardStream;
  ~Setup() {
    if (metrics)
      std::fclose(metrics);
  }
};

/// Rank 0 prints "megac-run: <message>" on standard output, unless
/// --quiet.
void info(const Options &O, const char *Fmt, ...)
    __attribute__((format(printf, 2, 3)));

/// \p S with its line breaks made spaces: every message is one line.
std::string oneLine(std::string S);

/// Returns true when every rank passes an empty \p Err. Otherwise the lowest
/// failing rank prints its message (so exactly one line appears) and every
/// rank gets false.
bool agree(const std::string &Err);

/// "950", "12.3 K", "124.4 M", "1.56 G": a count for the log.
std::string humanCount(uint64_t N);

/// Output \p Name of rank program \p RP; null if it has none.
const Output *findOutput(const RankProgram &RP, const std::string &Name);

/// The first rank that holds output \p Name (every rank, or on a pipeline
/// those of the last stage); -1 if none does.
int outputRank(const Program &P, const std::string &Name);

/// The first rank that holds the loss; -1 if none does.
int lossRank(const Program &P);

/// Whether the rank writes parameters (adam_w, or assign under ZeRO).
bool updatesParams(const RankProgram &RP);

/// Ends the whole job, this rank with status 1: under an MPI launcher
/// MPI_Abort takes the other ranks down; the ranks of a torchrun-style
/// launch are separate MPI jobs, and see this one end through their
/// connections to rank 0 (torchrun_world.h).
[[noreturn]] void endJob();

/// Ends the job after a failure on this rank alone, which its peers would
/// otherwise wait for in a collective. A job of one rank has no peers, and
/// ends with status 1 and the one line, as any other error does (MPI_Abort
/// would add Open MPI's banner).
[[noreturn]] void abortJob(const std::exception &E);

/// Builds this rank's per-axis communicators and waits for every rank, so
/// that no rank starts a step while another is still setting up.
std::unique_ptr<MpiCollectives> joinCollectives(const Program &P,
                                                int WorldRank);

/// Files written after the run (by rank 0) and the checkpoint directory
/// (by every rank): one that cannot be written fails now, not after the
/// work.
void checkOutputsWritable(const Options &O);

/// At most this many instructions are traced per rank (about 250 bytes of
/// JSON each): a --trace of a long run holds its beginning. A CPU
/// --profile alone keeps only spans (32 bytes each), so it may keep more.
/// MEGAC_TRACE_LIMIT sets either (for a longer trace where memory allows).
size_t traceLimit(const Options &O);

/// A resumed run continues its metrics file: the lines of steps up to the
/// checkpoint's \p Step stay (a fresh run would have written them), later
/// ones go (a run that went past the checkpoint before it stopped would
/// otherwise list those steps twice), and so does a last line cut short.
/// A file that is not there is left to the writer ("a" creates it), and
/// so is anything but a regular file: reading a pipe, a FIFO or a terminal
/// to its end would wait for ever, and what went down it cannot be taken
/// back anyway.
void keepMetricsUpTo(const std::string &Path, int64_t Step);

/// Everything that can fail because of user input, without communication.
void prepare(const Options &O, Setup &S);

/// What a CPU profile covers: the steps its trace holds whole, or part of
/// one step where the trace's limit is smaller than a step.
struct TraceCoverage {
  DeviceRun::ProfiledSteps Span;
  bool CutShort = false;    // the limit left instructions out
  size_t PartialInstrs = 0; // where Span.Steps is 0: the instructions held
};

/// Rank 0 opens --metrics (a resumed run continues the file), once every
/// rank has prepared: a resume another rank refuses leaves it untouched.
void openMetrics(const Options &O, Setup &S);

/// Rank 0 appends step \p T's line to --metrics: "" where it was
/// written, else why not.
std::string writeMetricsLine(const Options &O, Setup &S, int64_t T, float Loss,
                             double TokPerS, double Lr);

/// Rank 0 prints each output of its rank program: a scalar's value, a
/// tensor's shape, mean and root mean square.
void report(const Options &O, const Setup &S);

/// Rank 0 writes --save-outputs: the plan's outputs and the global
/// batch's tokens and labels, as safetensors.
void saveOutputs(const Options &O, const Setup &S);

/// What a user can do about a diverged run. The last checkpoint (saved by
/// this run, or resumed from) holds finite values, but it may already be
/// on the way: a step's update can be huge and finite.
std::string divergedAdvice(const Setup &S);

/// Saves a checkpoint of step \p Step: every rank writes its shard, the
/// ranks agree, rank 0 gathers the shard sizes and CRCs and writes
/// meta.json and then `latest`. Returns false (error already printed) if
/// any rank failed.
bool saveCheckpoint(const Options &O, Setup &S, int64_t Step);

/// A duration for the log ("3:05", "2:10:00"; "?" if none is known).
std::string clockString(double Sec);

/// Gathers every rank's measured timeline to rank 0, which writes
/// --trace. Collective over World; false (everyone) on a failure.
/// Rank 0 takes one rank's events at a time straight into the file's
/// text.
bool writeTrace(const Options &O, Setup &S);

/// Per instruction: milliseconds and runs, from the executor's trace (the
/// CPU backend's --profile) of \p StepsRun steps. Where the trace's limit
/// left instructions out, the step it stopped in is left out too, so that
/// every instruction counts the same steps.
TraceCoverage profileFromTrace(const Executor &E, int64_t StepsRun,
                               std::vector<double> &Ms,
                               std::vector<uint64_t> &Runs);

/// --profile: rank 0's instruction times summed per opcode (with the
/// cost model's FLOPs and bytes, for rates), printed and written as JSON.
bool writeProfile(const Options &O, const Setup &S, const std::string &Where,
                  const std::vector<double> &Ms,
                  const std::vector<uint64_t> &Runs,
                  const TraceCoverage &Covered);

/// What the plugin calls back into: the rank's executor (its progress,
/// for the watchdog) and its host messages (pipeline transfers).
struct DeviceHost {
  Executor *E;
  Collectives *C;
};

/// Opens this rank's device through the plugin. Collective over the world:
/// what can fail on this rank alone (the plugin, the local rank) is agreed
/// on before the plugin's own agreements, which every rank must enter.
std::unique_ptr<DeviceRun> openCudaRun(DeviceHost &Host);

/// A rank's plan on the CUDA backend, beside the executor that still
/// prepares its parameters and inputs on the host (and saves checkpoints).
class DeviceSession {
public:
  /// \p C carries pipeline transfers (may be null without a pipeline).
  explicit DeviceSession(Executor &E, Collectives *C = nullptr)
      : E(E), Host{&E, C}, Run(openCudaRun(Host)) {
    Run->setStep(1, 0.0, E.seed());
    const RankProgram &RP = E.rankProgram();
    if (RP.params())
      for (const Param *Pa : *RP.params())
        upload(Pa->buffer());
    // Moments of a resumed run.
    for (AdamState &St : E.adamStates())
      Run->moments(St.instr, St.m.data(), St.v.data(), St.m.size(), true);
    LiveDevice.store(Run.get());
  }

  /// One step on the inputs setInputs filled, at learning rate \p Lr:
  /// with gradient accumulation the accumulating part once per
  /// micro-batch, then the rest; on a pipeline the schedule's tasks.
  void step(bool Training, double Lr = 0) {
    const RankProgram &RP = E.rankProgram();
    const uint32_t End = RP.instrs() ? RP.instrs()->size() : 0;
    const int64_t M = E.microBatches();
    const uint32_t AccEnd =
        RP.accumulate_end() >= 0 ? uint32_t(RP.accumulate_end()) : 0;
    Run->setStep(E.step(), Lr, E.seed());
    if (E.pipelined()) {
      // The schedule's tasks, each micro-batch in its buffer slot, as the
      // CPU backend runs them; then the once-per-step part.
      forEachPipelineTask(
          RP, M, Run->slots(), [&](const Task &Tk, uint32_t Slot, bool First) {
            Run->activateSlot(Slot);
            if (First) {
              E.loadMicroBatch(Tk.micro_batch());
              uploadInputs();
            }
            const Segment &Seg = *RP.segments()->Get(Tk.segment());
            Run->run(Seg.begin(), Seg.end(), Tk.micro_batch(), Training);
          });
      Run->run(AccEnd, End, 0, Training);
      if (Host.C)
        Host.C->finishSends();
    } else if (M > 1 && AccEnd > 0) {
      for (int64_t K = 0; K < M; ++K) {
        E.loadMicroBatch(K);
        uploadInputs();
        Run->run(0, AccEnd, K, Training);
      }
      Run->run(AccEnd, End, 0, Training);
    } else {
      uploadInputs();
      Run->run(0, End, 0, Training);
    }
  }
  /// Generation: the forward part on the inputs as they are, dropout off.
  void forward() {
    if (E.pipelined())
      throw RunError("--generate from pipeline plans runs on the CPU backend");
    Run->setInference(true);
    uploadInputs();
    Run->run(0, E.forwardEnd(), 0, /*Training=*/false);
  }

  /// Copies buffer \p Id back into the executor's.
  void pull(uint32_t Id) {
    Run->download(Id, E.mutableBuffer(Id).data(), E.buffer(Id).bytes());
  }
  /// Parameters and moments back to the host (before a checkpoint).
  void pullState() {
    const RankProgram &RP = E.rankProgram();
    if (RP.params())
      for (const Param *Pa : *RP.params())
        pull(Pa->buffer());
    for (AdamState &St : E.adamStates())
      Run->moments(St.instr, St.m.data(), St.v.data(), St.m.size(), false);
  }
  ~DeviceSession() {
    std::lock_guard<std::mutex> Hold(LiveDeviceMutex);
    LiveDevice.store(nullptr);
  }
  void enableProfiling() { Run->enableProfiling(); }
  DeviceRun::ProfiledSteps profile(std::vector<double> &Ms,
                                   std::vector<uint64_t> &Runs) const {
    return Run->profile(Ms, Runs);
  }
  DeviceSession(const DeviceSession &) = delete;
  DeviceSession &operator=(const DeviceSession &) = delete;
  const DeviceRun &device() const { return *Run; }

private:
  void upload(uint32_t Id) {
    Run->upload(Id, E.buffer(Id).data(), E.buffer(Id).bytes());
  }
  void uploadInputs() {
    const RankProgram &RP = E.rankProgram();
    if (RP.inputs())
      for (const Input *In : *RP.inputs())
        upload(In->buffer());
  }

  Executor &E;
  DeviceHost Host; // before Run: the plugin keeps a pointer to it
  std::unique_ptr<DeviceRun> Run;
};

/// Opens this rank's device (every rank agrees on success, so none is left
/// waiting) and checks that every rank runs it alike; \p C carries
/// pipeline transfers. Null after a failure, which has been reported.
std::unique_ptr<DeviceSession> openDevice(Executor &E,
                                          Collectives *C = nullptr);

/// --profile from the device's events (the steps after its first, where
/// it ran more than one), or from the executor's trace (all \p StepsRun).
bool writeDeviceOrHostProfile(const Options &O, const Setup &S,
                              const DeviceSession *Dev, int64_t StepsRun);

/// Records what computes this run's steps besides the plan, for its
/// checkpoints, and warns (rank 0) when the checkpoint it resumed from
/// was computed otherwise: the same plan on another CPU's BLAS kernels,
/// another thread count or another device sums in another order, so the
/// run may continue only within rounding of the saved one (users
/// comparing a resumed run with an uninterrupted one should know why the
/// last bits differ).
/// (On the CUDA backend the record is the device, what computes
/// attention and the other MEGAC_CUDA_* settings that change arithmetic,
/// MEGAC_CUDA_ATTENTION left out; its
/// runs differ in their last bits from run to run anyway, dq's atomics.)
void noteArithmetic(Setup &S, const DeviceSession *Dev);

/// The training loop of a training plan: --steps steps on the CPU or the
/// device, metrics, checkpoints, trace and profile. The exit status.
int runTraining(const Options &O, Setup &S);

/// After a forward step (on any backend): the report, and the outputs
/// saved by rank 0 when asked.
int reportForward(const Options &O, const Setup &S);

/// A forward run on the CUDA backend: parameters and inputs go to the
/// device, the plan runs there, the outputs come back for the report.
int runForwardOnDevice(const Options &O, Setup &S);

/// --generate: byte tokens sampled from the plan's forward part and
/// printed as they come. The exit status.
int runGeneration(const Options &O, Setup &S);

} // namespace megac_run

#endif // MEGAC_RUN_MEGACRUN_H
