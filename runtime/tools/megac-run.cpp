//===- megac-run.cpp - Execute a megac plan on CPUs with MPI --------------===//
//
// Every process loads the same plan, runs its own rank's instruction stream
// with fp32 CPU kernels and talks to its peers through MPI sub-communicators
// (one per grid axis). Rank 0 reports what happened and optionally saves the
// outputs.
//
// Three modes: a forward step (plans without a training config), a training
// loop (plans with Program.train: --steps, --metrics, sharded checkpoints
// with --save-checkpoint / --load-checkpoint) and byte-level text generation
// (--generate, which runs only the forward part [0, forward_end)).
//
// Error discipline: all work that can fail on bad input (plan, weights,
// tokens, memory) happens before the first communication, and the ranks then
// agree through one MPI_Allreduce whether everyone succeeded. A failure is
// reported once, as one line, and every rank exits 1, so nothing hangs in a
// collective waiting for a rank that has already given up. The same holds
// for checkpoint writes inside the training loop (each is followed by an
// agreement); a failure inside a step is an internal error and ends the
// job (endJob: MPI_Abort, or under a torchrun-style launch the end of this
// rank's connection to rank 0).
//
//===----------------------------------------------------------------------===//

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

#include "megac_rt/plan_file.h"
#include "cuda/device_run.h"

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
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
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace megac_rt;
using namespace megac::plan;

namespace {

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

enum class Mode { Forward, Train, Generate };

/// Ends the job when this rank makes no progress for a while: a peer that
/// died or hangs leaves this rank waiting in a collective or a pipeline
/// receive forever. The launcher then stops the other ranks, since this
/// one exits non-zero. The message names the instruction it waited in.
/// The device backend of this rank while one is open: the watchdog aborts
/// its communicators before ending the process.
std::atomic<DeviceRun *> LiveDevice{nullptr};
/// Held by the watchdog's abort and by the session clearing LiveDevice, so
/// that the watchdog never aborts a device the main thread has freed.
std::mutex LiveDeviceMutex;
/// Set while the CUDA backend sets itself up (its device, then the NCCL
/// communicators, where a peer that never joins leaves this rank waiting
/// inside NCCL): what the watchdog names instead of an instruction.
std::atomic<bool> SettingUpDevice{false};

class Watchdog {
public:
  Watchdog(const Executor &E, double Seconds, int Rank)
      : E(E), Seconds(Seconds), Rank(Rank) {
    if (Seconds > 0)
      Thread = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    Stop.store(true);
    if (Thread.joinable())
      Thread.join();
  }
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

private:
  void watch() {
    using Clock = std::chrono::steady_clock;
    uint64_t Seen = E.heartbeat();
    auto Since = Clock::now();
    while (!Stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const uint64_t Now = E.heartbeat();
      if (Now != Seen) {
        Seen = Now;
        Since = Clock::now();
        continue;
      }
      if (std::chrono::duration<double>(Clock::now() - Since).count() <
          Seconds)
        continue;
      std::fprintf(stderr,
                   "megac-run: error: rank %d made no progress for %.0f s, "
                   "%s; a peer rank is probably dead or hung, so this rank "
                   "ends the job (--watchdog)\n",
                   Rank, Seconds, whereWaiting().c_str());
      std::fflush(stderr);
      if (LiveDevice.load()) {
        // ncclCommAbort could itself block (the main thread may be inside
        // NCCL): give it a few seconds on its own thread, then exit anyway.
        // (Under the mutex: a session ending meanwhile waits for it rather
        // than free the device under it.)
        static std::atomic<bool> Done{false}; // outlives this frame
        std::thread([] {
          std::lock_guard<std::mutex> Hold(LiveDeviceMutex);
          if (DeviceRun *D = LiveDevice.load())
            D->abort();
          Done.store(true);
        }).detach();
        for (int K = 0; K < 50 && !Done.load(); ++K)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::_Exit(3);
    }
  }

  /// What this rank waits for: its device's set-up, or the instruction
  /// (and step) it has come to.
  std::string whereWaiting() const {
    if (SettingUpDevice.load())
      return "setting up the CUDA backend (its device, then the NCCL "
             "communicators)";
    std::string Where = "waiting between instructions";
    const uint32_t I = E.currentInstruction();
    const RankProgram &RP = E.rankProgram();
    if (RP.instrs() && I < RP.instrs()->size()) {
      const Instr &In = *RP.instrs()->Get(I);
      // The CUDA backend issues work ahead of the device: it may be
      // waiting for everything up to I rather than in I itself.
      Where = (E.waitingForDevice()
                   ? "waiting for the device to finish instructions up to "
                   : "waiting in instruction ") +
              std::to_string(I) + " (" + opcodeName(In.op());
      if (In.axis() >= 0 && E.program().axes())
        Where += " over " + E.program().axes()->Get(In.axis())->name()->str();
      if ((In.op() == op::Send || In.op() == op::Recv) && In.ints())
        Where += std::string(In.op() == op::Recv ? " from" : " to") + " rank " +
                 std::to_string(In.ints()->Get(0));
      if (In.loc() && In.loc()->size())
        Where += " at " + In.loc()->str();
      Where += ")";
    }
    return Where + " of step " + std::to_string(E.publishedStep());
  }

  const Executor &E;
  double Seconds;
  int Rank;
  std::atomic<bool> Stop{false};
  std::thread Thread;
};

int WorldRank = 0, WorldSize = 1;
/// Every rank of the job: MPI_COMM_WORLD under an MPI launcher, the joined
/// world under a torchrun-style one (torchrun_world.h).
MPI_Comm World = MPI_COMM_WORLD;
/// Whether World is a torchrun-style launch's joined world.
bool JoinedWorld = false;
/// Whether a launcher started this process (mpirun, srun, torchrun), read
/// before MPI_Init: a process started alone gets PMIX_RANK from MPI_Init
/// itself.
bool LaunchedByLauncher = false;

std::string oneLine(std::string S) {
  for (char &C : S)
    if (C == '\n' || C == '\r')
      C = ' ';
  return S;
}

/// Returns true when every rank passes an empty \p Err. Otherwise the lowest
/// failing rank prints its message (so exactly one line appears) and every
/// rank gets false.
bool agree(const std::string &Err) {
  int Mine = Err.empty() ? WorldSize : WorldRank, Lowest = WorldSize;
  MPI_Allreduce(&Mine, &Lowest, 1, MPI_INT, MPI_MIN, World);
  if (Lowest == WorldRank)
    std::fprintf(stderr, "megac-run: error: %s\n", oneLine(Err).c_str());
  return Lowest == WorldSize;
}

void info(const Options &O, const char *Fmt, ...)
    __attribute__((format(printf, 2, 3)));
void info(const Options &O, const char *Fmt, ...) {
  if (O.quiet || WorldRank != 0)
    return;
  va_list Ap;
  va_start(Ap, Fmt);
  std::fputs("megac-run: ", stdout);
  std::vfprintf(stdout, Fmt, Ap);
  std::fputc('\n', stdout);
  va_end(Ap);
}

std::string humanCount(uint64_t N) {
  char Buf[64];
  if (N < 10000)
    std::snprintf(Buf, sizeof(Buf), "%llu", (unsigned long long)N);
  else if (N < 10000000)
    std::snprintf(Buf, sizeof(Buf), "%.1f K", double(N) / 1e3);
  else if (N < 10000000000ull)
    std::snprintf(Buf, sizeof(Buf), "%.1f M", double(N) / 1e6);
  else
    std::snprintf(Buf, sizeof(Buf), "%.2f G", double(N) / 1e9);
  return Buf;
}

/// How many tasks srun started for this step (0: none, or not srun).
long slurmStepTasks() {
  for (const char *Var : {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"})
    if (const char *V = std::getenv(Var); V && *V) {
      char *End = nullptr;
      const long N = std::strtol(V, &End, 10);
      if (!*End && N > 0)
        return N;
    }
  return 0;
}

/// How to launch a plan of \p Want ranks, where \p Launched were.
std::string launcherHint(uint32_t Want, int64_t Launched) {
  const std::string N = std::to_string(Want);
  // srun without an MPI plugin starts its tasks as MPI processes of their
  // own, each a world of one.
  if (const long Tasks = slurmStepTasks(); Launched == 1 && Tasks > 1)
    return "; srun started " + std::to_string(Tasks) +
           " tasks, but without an MPI plugin each is a world of its "
           "own: srun --mpi=pmix -n " +
           N + " (srun --mpi=list lists the plugins)";
  return "; launch with mpirun -np " + N + " (or torchrun --nproc-per-node " +
         N + " --no-python)";
}

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

const Output *findOutput(const RankProgram &RP, const std::string &Name) {
  if (RP.outputs())
    for (const Output *O : *RP.outputs())
      if (O->name() && O->name()->str() == Name)
        return O;
  return nullptr;
}

/// The first rank that holds output \p Name (every rank, or on a pipeline
/// those of the last stage); -1 if none does.
int outputRank(const Program &P, const std::string &Name) {
  for (uint32_t R = 0; R < P.ranks()->size(); ++R)
    if (findOutput(*P.ranks()->Get(R), Name))
      return int(R);
  return -1;
}
int lossRank(const Program &P) { return outputRank(P, "loss"); }

/// Whether the rank writes parameters (adam_w, or assign under ZeRO).
bool updatesParams(const RankProgram &RP) {
  if (RP.instrs())
    for (const Instr *In : *RP.instrs())
      if (In->op() == op::AdamW || In->op() == op::Assign)
        return true;
  return false;
}

/// Creates the new file \p Probe and removes it again: "" where that
/// works, else why not. The only sure test that a directory takes a file
/// (permission bits say nothing for root or a read-only mount).
std::string createAndRemove(const std::string &Probe) {
  const int Fd = ::open(Probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (Fd < 0)
    return std::strerror(errno);
  ::close(Fd);
  ::unlink(Probe.c_str());
  return "";
}

/// Throws unless \p Path can be written as file_io.h writes it: a device
/// or a pipe in place (it must be writable), anything else by a temporary
/// renamed over the file the path leads to (links followed), so that
/// file, if there, opens for writing (nothing is truncated) and its
/// directory takes a new file.
void checkWritableFile(const std::string &Path) {
  struct stat St;
  if (::stat(Path.c_str(), &St) == 0 && !S_ISREG(St.st_mode)) {
    if (S_ISDIR(St.st_mode))
      throw RunError(Path + ": is a directory, not a file");
    // (Opening a pipe would wait for its reader, then end its input.)
    if (::access(Path.c_str(), W_OK) != 0)
      throw RunError(Path + ": cannot write: " + std::strerror(errno));
    return;
  }
  const std::string Target = writeTarget(Path);
  const size_t Slash = Target.find_last_of('/');
  const std::string Dir =
      Slash == std::string::npos ? "." : Target.substr(0, Slash + 1);
  if (::stat(Dir.c_str(), &St) != 0 || !S_ISDIR(St.st_mode))
    throw RunError(Path + ": the directory " + Dir + " does not exist");
  if (::stat(Target.c_str(), &St) == 0) {
    const int Fd = ::open(Target.c_str(), O_WRONLY);
    if (Fd < 0)
      throw RunError(Path + ": cannot write: " + std::strerror(errno));
    ::close(Fd);
  }
  if (std::string Why = createAndRemove(Target + ".megac-write-probe-" +
                                        std::to_string(::getpid()));
      !Why.empty())
    throw RunError(Path + ": cannot create a file in " + Dir + ": " + Why);
}

/// Throws unless \p Dir is (or is created now as) a directory this rank
/// can write a file into: the checkpoint's shards are written at the end.
void checkWritableDirectory(const std::string &Dir) {
  // A step directory holds one step's shards and meta.json: a checkpoint
  // saved into it would nest its own steps there, beside them.
  struct stat St;
  if (::stat((Dir + "/meta.json").c_str(), &St) == 0)
    throw RunError(Dir + ": is one step of a checkpoint (it holds "
                         "meta.json); --save-checkpoint takes the "
                         "checkpoint's directory (its parent) or a new one");
  makeDirs(Dir);
  if (std::string Why = createAndRemove(Dir + "/.megac-write-probe-" +
                                        std::to_string(WorldRank) + "-" +
                                        std::to_string(::getpid()));
      !Why.empty())
    throw RunError(Dir + ": cannot write a checkpoint there: " + Why);
}

/// Which file \p Path names, links followed: its device and inode where
/// it exists, else its directory's and its own name. Empty where the path
/// names no regular file (a device such as /dev/null may take several
/// outputs).
std::string fileIdentity(const std::string &Path) {
  struct stat St;
  if (::stat(Path.c_str(), &St) == 0)
    return S_ISREG(St.st_mode)
               ? std::to_string(St.st_dev) + ":" + std::to_string(St.st_ino)
               : "";
  const std::string Target = writeTarget(Path);
  const size_t Slash = Target.find_last_of('/');
  const std::string Dir =
      Slash == std::string::npos ? "." : Target.substr(0, Slash + 1);
  if (::stat(Dir.c_str(), &St) != 0)
    return "";
  return std::to_string(St.st_dev) + ":" + std::to_string(St.st_ino) + "/" +
         Target.substr(Slash == std::string::npos ? 0 : Slash + 1);
}

/// Refuses an output that would overwrite an input of the run (the plan,
/// the weights, the tokens, a checkpoint's files) or another output:
/// written after the work, it would destroy the file without a word. The
/// inputs are the files the run reads, not only the paths given: a
/// Megatron dataset's .bin and .idx, a weights index's shards, a model
/// directory's file.
void checkOutputsApart(const Options &O) {
  const std::pair<std::string, const std::string *> Outputs[] = {
      {"--save-outputs", &O.saveOutputs},
      {"--metrics", &O.metrics},
      {"--trace", &O.trace},
      {"--profile", &O.profile}};
  if (std::none_of(std::begin(Outputs), std::end(Outputs),
                   [](const auto &Out) { return !Out.second->empty(); }))
    return;
  // What each file is called in the message, and its path.
  std::vector<std::pair<std::string, std::string>> Seen = {
      {"the plan " + O.plan, O.plan}};
  // The path given (a Megatron prefix too: a file put there would be read
  // as tokens next time) and the files read for it.
  auto addInputs = [&Seen](const std::string &Flag, const std::string &Given,
                           const std::vector<std::string> &Files) {
    Seen.push_back({Flag + " " + Given, Given});
    for (const std::string &File : Files)
      if (File != Given)
        Seen.push_back(
            {File + ", which " + Flag + " " + Given + " reads", File});
  };
  if (!O.weights.empty())
    addInputs("--weights", O.weights, WeightFiles::filesOf(O.weights));
  if (!O.tokens.empty())
    addInputs("--data/--tokens", O.tokens, tokenInputFiles(O.tokens));
  std::vector<std::string> Ids;
  for (const auto &[What, Path] : Seen)
    Ids.push_back(fileIdentity(Path));
  for (const auto &[Flag, Path] : Outputs) {
    if (Path->empty())
      continue;
    const std::string Id = fileIdentity(*Path);
    for (size_t I = 0; I < Seen.size() && !Id.empty(); ++I)
      if (Ids[I] == Id)
        throw RunError(Flag + " " + *Path + " is the same file as " +
                       Seen[I].first +
                       ": writing it would destroy that; name another file");
    for (const std::string *Dir : {&O.loadCheckpoint, &O.saveCheckpoint})
      if (!Dir->empty() && isCheckpointFile(*Path, *Dir))
        throw RunError(
            Flag + " " + *Path + " is a file of the checkpoint " + *Dir +
            " (its latest, its lock, a step directory or a file in one): "
            "writing it would destroy that, or keep the step "
            "from being saved; name another file");
    Seen.push_back({Flag + " " + *Path, *Path});
    Ids.push_back(Id);
  }
}

/// Files written after the run (by rank 0) and the checkpoint directory
/// (by every rank): one that cannot be written fails now, not after the
/// work.
void checkOutputsWritable(const Options &O) {
  checkOutputsApart(O);
  if (WorldRank == 0)
    for (const std::string *Out :
         {&O.saveOutputs, &O.profile, &O.trace, &O.metrics})
      if (!Out->empty())
        checkWritableFile(*Out);
  if (!O.saveCheckpoint.empty()) {
    checkWritableDirectory(O.saveCheckpoint);
    if (WorldRank == 0)
      if (const std::string Warning = lockCheckpointDirectory(O.saveCheckpoint);
          !Warning.empty())
        std::fprintf(stderr, "megac-run: warning: %s\n", Warning.c_str());
  }
}

/// Warns about the tensors of --weights no parameter of the plan reads
/// (a checkpoint of a larger model loads without an error otherwise),
/// but for GPT-2's attention masks, which are buffers, not weights, and
/// lm_head.weight, which a tied model reads as wte.weight, and a merged
/// checkpoint's AdamW moments (a new run starts its own).
void warnUnusedWeights(const Program &P, const WeightFiles &W) {
  std::set<std::string> Used;
  const std::string Pfx = "transformer.";
  for (const RankProgram *R : *P.ranks())
    if (R->params())
      for (const Param *Pa : *R->params()) {
        Used.insert("param/" + Pa->name()->str()); // (a merged checkpoint's)
        if (Pa->hf_name() && Pa->hf_name()->size()) {
          const std::string N = Pa->hf_name()->str();
          Used.insert(N);
          Used.insert(N.rfind(Pfx, 0) == 0 ? N.substr(Pfx.size()) : Pfx + N);
        }
      }
  std::vector<std::string> Unused;
  for (const std::string &Name : W.names())
    if (!Used.count(Name) && !endsWith(Name, ".attn.bias") &&
        !endsWith(Name, ".attn.masked_bias") && Name != "lm_head.weight" &&
        Name.rfind("adam_", 0) != 0)
      Unused.push_back(Name);
  if (Unused.empty())
    return;
  std::string List;
  for (size_t I = 0; I < Unused.size() && I < 6; ++I)
    List += (I ? ", " : "") + Unused[I];
  if (Unused.size() > 6)
    List += ", ...";
  std::fprintf(stderr,
               "megac-run: warning: %zu tensor%s of --weights %s %s not read "
               "by the plan (%s): a checkpoint of another model?\n",
               Unused.size(), Unused.size() == 1 ? "" : "s", W.path().c_str(),
               Unused.size() == 1 ? "is" : "are", List.c_str());
}

/// At most this many instructions are traced per rank (about 250 bytes of
/// JSON each): a --trace of a long run holds its beginning. A CPU
/// --profile alone keeps only spans (32 bytes each), so it may keep more.
/// MEGAC_TRACE_LIMIT sets either (for a longer trace where memory allows).
size_t traceLimit(const Options &O) {
  const long Default = O.trace.empty() ? 4000000 : 1000000;
  return size_t(
      envWholeNumber("MEGAC_TRACE_LIMIT", 1, 1L << 40).value_or(Default));
}

/// What a plan without a training config is: "a gradients plan" (megac
/// compile --gradients: its outputs include grad:<param>) or "a forward
/// plan".
std::string untrainedPlanKind(const Program &P) {
  for (const RankProgram *R : *P.ranks())
    if (R->outputs())
      for (const Output *Out : *R->outputs())
        if (Out->name() && Out->name()->string_view().rfind("grad:", 0) == 0)
          return "a gradients plan";
  return "a forward plan";
}

/// Option combinations that make no sense for the plan's mode.
void checkModeOptions(const Options &O, const Setup &S, const Program &P) {
  const RankProgram &RP = *P.ranks()->Get(uint32_t(WorldRank));
  const std::string Plan = O.plan;
  if (S.mode == Mode::Generate && !O.profile.empty())
    throw RunError("--profile times forward runs and training steps, not "
                   "--generate");
  if (S.mode == Mode::Generate && !O.trace.empty())
    throw RunError("--trace records forward runs and training steps, not "
                   "--generate");
  if (O.backend == "cuda" && !O.trace.empty())
    throw RunError("--trace records the CPU backend's instructions; the "
                   "CUDA backend has no timeline yet");
  if (!O.trace.empty() || !O.profile.empty())
    traceLimit(O); // a malformed MEGAC_TRACE_LIMIT is refused before work
  // (Pipeline plans are training plans: never Mode::Forward.)
  const bool Pipelined = P.pipeline_stages() > 1;
  if (S.mode == Mode::Generate) {
    if (O.haveSteps || !O.metrics.empty() || !O.saveCheckpoint.empty() ||
        O.checkpointEvery)
      throw RunError("--generate cannot be combined with --steps, --metrics "
                     "or --save-checkpoint");
    if (!O.saveOutputs.empty())
      throw RunError("--generate cannot be combined with --save-outputs");
    if (!O.tokens.empty())
      throw RunError("--generate reads its prompt, not --data or --tokens");
    if (O.sample != "sequential")
      throw RunError("--sample " + O.sample +
                     " chooses training steps' windows; --generate reads its "
                     "prompt");
    if (P.vocab_size() < 256)
      throw RunError(Plan + ": --generate uses byte-level tokens and needs a "
                            "vocabulary of at least 256 (the plan has " +
                     std::to_string(P.vocab_size()) + ")");
    // On a pipeline the last stage's ranks hold the logits.
    const int Owner = outputRank(P, "logits");
    const Output *L =
        Owner < 0 ? nullptr : findOutput(*P.ranks()->Get(uint32_t(Owner)),
                                         "logits");
    if (!L)
      throw RunError(Plan + ": --generate needs a \"logits\" output");
    const RankProgram &LR = *P.ranks()->Get(uint32_t(Owner));
    // Outputs are whole on every rank: under data parallelism the logits
    // hold the global batch. Every row holds the prompt, row 0 is read.
    const Buffer *B = LR.buffers()->Get(L->buffer());
    std::vector<int64_t> Have(B->shape()->begin(), B->shape()->end());
    // A padded vocabulary's logits are wider than the vocabulary.
    const int64_t Width = !Have.empty() && Have.back() >= P.vocab_size()
                              ? Have.back()
                              : P.vocab_size();
    // With micro-batches a gradients plan's logits stack every
    // micro-batch's rows, a training plan's hold one micro-batch's;
    // generation runs micro-batch 0, which holds row 0 either way.
    const int64_t Rows = std::max(P.global_batch(), P.batch());
    std::vector<int64_t> Want = {Rows, P.seq(), Width};
    std::vector<int64_t> WantMicro = {
        std::max<int64_t>(Rows / std::max<int64_t>(1, P.micro_batches()),
                          P.batch()),
        P.seq(), Width};
    if (Have != Want && Have != WantMicro)
      throw RunError(Plan + ": --generate needs logits of shape " +
                     shapeString(Want) + " (batch, seq, vocab)");
    bool HasTokens = false;
    for (const RankProgram *R : *P.ranks())
      if (R->inputs())
        for (const Input *In : *R->inputs())
          HasTokens |= In->kind()->str() == "tokens";
    if (!HasTokens)
      throw RunError(Plan + ": --generate needs a \"tokens\" input");
    if (!Pipelined && RP.forward_end() < 0 && updatesParams(RP))
      throw RunError(Plan + ": the plan updates parameters (adam_w) but does "
                            "not say where its forward part ends "
                            "(forward_end); refusing to generate with it");
    // (Found here, before the prompt is echoed, rather than by the
    // device session at the first token, where ranks end unevenly.)
    if (Pipelined && O.backend == "cuda")
      throw RunError("--generate from pipeline plans runs on the CPU "
                     "backend (leave out --backend cuda)");
    if (O.prompt.empty())
      throw RunError("--generate needs a non-empty prompt");
    if (int64_t(O.prompt.size()) > P.seq())
      throw RunError("the prompt has " + std::to_string(O.prompt.size()) +
                     " bytes but the plan's sequence length is " +
                     std::to_string(P.seq()));
    return;
  }
  if (S.mode == Mode::Forward) {
    if (O.sample != "sequential")
      throw RunError("--sample " + O.sample +
                     " chooses training steps' windows; a forward run reads "
                     "the first batch of its tokens");
    if (O.haveSteps && O.steps > 1)
      throw RunError(Plan + " is " + untrainedPlanKind(P) +
                     " (no training config): --steps " +
                     std::to_string(O.steps) + " needs a training plan");
    if (!O.metrics.empty() || !O.saveCheckpoint.empty() || O.checkpointEvery)
      throw RunError(Plan + " is " + untrainedPlanKind(P) +
                     " (no training config): --metrics and --save-checkpoint "
                     "need a training plan");
    return;
  }
  // On a pipeline only the last stage's ranks compute the loss.
  if (lossRank(P) < 0)
    throw RunError(Plan + ": training plan has no \"loss\" output");
  if (O.checkpointEvery && O.saveCheckpoint.empty())
    throw RunError("--checkpoint-every needs --save-checkpoint DIR");
  if (!O.saveOutputs.empty())
    throw RunError("--save-outputs is for forward plans; use "
                   "--save-checkpoint with a training plan");
}

/// A resumed run continues its metrics file: the lines of steps up to the
/// checkpoint's \p Step stay (a fresh run would have written them), later
/// ones go (a run that went past the checkpoint before it stopped would
/// otherwise list those steps twice), and so does a last line cut short.
/// A file that is not there is left to the writer ("a" creates it), and
/// so is anything but a regular file: reading a pipe, a FIFO or a terminal
/// to its end would wait for ever, and what went down it cannot be taken
/// back anyway.
void keepMetricsUpTo(const std::string &Path, int64_t Step) {
  struct stat St;
  if (::stat(Path.c_str(), &St) != 0 || !S_ISREG(St.st_mode))
    return;
  // (A metrics line is a few hundred bytes: a far longer one means the
  // file is something else, which is not read whole into memory.)
  constexpr size_t kLongestLine = size_t(1) << 20;
  // Calls Keep(line, kept) for each whole line; true when a last line
  // was cut short.
  auto ForEachLine =
      [&](const std::function<void(const std::string &, bool)> &Keep) {
        std::FILE *In = std::fopen(Path.c_str(), "r");
        if (!In)
          return false;
        std::string Line;
        for (int C; (C = std::fgetc(In)) != EOF;) {
          Line.push_back(char(C));
          if (Line.size() > kLongestLine) {
            std::fclose(In);
            throw RunError(Path +
                           ": not a metrics file of megac-run (a line of "
                           "more than 1 MiB); --metrics names another "
                           "file to continue in");
          }
          if (C != '\n')
            continue;
          long long At = 0;
          Keep(Line,
               !(std::sscanf(Line.c_str(), "{\"step\": %lld,", &At) == 1 &&
                 At > Step));
          Line.clear();
        }
        std::fclose(In);
        return !Line.empty();
      };
  // The usual file lists its steps in order: what goes is its tail, cut
  // off in place, without holding the rest in memory.
  uint64_t Offset = 0, KeptEnd = 0;
  bool Dropped = false, KeptAfterDrop = false;
  Dropped |= ForEachLine([&](const std::string &Line, bool Kept) {
    Offset += Line.size();
    if (!Kept)
      Dropped = true;
    else if (Dropped)
      KeptAfterDrop = true;
    else
      KeptEnd = Offset;
  });
  if (!Dropped)
    return;
  if (!KeptAfterDrop) {
    if (::truncate(Path.c_str(), off_t(KeptEnd)) != 0)
      throw RunError(Path +
                     ": cannot rewrite metrics file: " + std::strerror(errno));
    return;
  }
  // Steps out of order (files of several runs appended): the kept lines
  // are gathered and written again.
  std::string Kept;
  ForEachLine([&](const std::string &Line, bool Keep) {
    if (Keep)
      Kept += Line;
  });
  std::FILE *Out = std::fopen(Path.c_str(), "w");
  if (!Out)
    throw RunError(Path +
                   ": cannot rewrite metrics file: " + std::strerror(errno));
  const bool Ok = std::fwrite(Kept.data(), 1, Kept.size(), Out) == Kept.size();
  if (std::fclose(Out) != 0 || !Ok)
    throw RunError(Path + ": cannot rewrite metrics file");
}

/// Warns when --save-checkpoint names a directory that already holds a
/// checkpoint this run did not load from: its `latest` will name this
/// run's steps, beside the other run's.
void warnForeignCheckpoint(const Options &O) {
  if (O.saveCheckpoint.empty())
    return;
  struct stat St;
  if (::stat((O.saveCheckpoint + "/latest").c_str(), &St) != 0)
    return;
  auto Real = [](const std::string &Path) {
    char Buf[PATH_MAX];
    return ::realpath(Path.c_str(), Buf) ? std::string(Buf) : Path;
  };
  const std::string Save = Real(O.saveCheckpoint);
  if (!O.loadCheckpoint.empty()) {
    // Loaded from DIR itself, or from one of its step directories.
    const std::string Load = Real(O.loadCheckpoint);
    const size_t Slash = Load.find_last_of('/');
    if (Load == Save ||
        (Slash != std::string::npos && Load.substr(0, Slash) == Save))
      return;
  }
  std::fprintf(stderr,
               "megac-run: warning: --save-checkpoint %s already holds a "
               "checkpoint this run did not load; this run's checkpoints go "
               "beside it, replacing its steps of the same numbers, and its "
               "'latest' will name them\n",
               O.saveCheckpoint.c_str());
}

/// Warns when a resumed training run reads other data than the run that
/// saved the checkpoint did (a forgotten --data, another file, another
/// --sample): its batches then differ from the uninterrupted run's. A
/// warning, not an error (fine-tuning on new data is a resume too), and
/// printed under --quiet, which silences progress, not warnings.
void warnOtherData(const Options &O, const Setup &S) {
  const CheckpointMeta &M = S.resumedMeta;
  if (!M.hasData) // saved before checkpoints recorded their data
    return;
  auto Describe = [](const std::string &File, uint64_t Tokens,
                     const std::string &Sample) {
    return (File.empty() ? std::string("the seeded token stream (")
                         : "--data " + File + " (" + std::to_string(Tokens) +
                               " tokens, ") +
           "--sample " + Sample + ")";
  };
  const uint64_t Tokens = O.tokens.empty() ? 0 : S.stream.length();
  // (Checkpoints saved before the fingerprint was recorded have none.)
  const bool SameSource =
      M.dataFile.empty() == O.tokens.empty() && M.dataTokens == Tokens &&
      (!M.hasDataCrc || M.dataCrc == S.stream.fingerprint());
  if (SameSource && M.sample == O.sample)
    return;
  std::fprintf(
      stderr,
      "megac-run: warning: the checkpoint's run read %s; this run "
      "reads %s, so its batches differ from those the saved run "
      "would have read next (pass the same --data and --sample to "
      "continue it)\n",
      // (The record is the checkpoint's text: a hand-edited
      // control character stays off the terminal.)
      Describe(printableText(M.dataFile), M.dataTokens, printableText(M.sample))
          .c_str(),
      Describe(O.tokens, Tokens, O.sample).c_str());
}

/// Everything that can fail because of user input, without communication.
void prepare(const Options &O, Setup &S) {
  std::string Err = loadPlanFile(O.plan, S.plan);
  if (!Err.empty())
    throw RunError(Err);
  const Program &P = *S.plan.program;
  if (!O.dumpPlan.empty())
    return;
  if (int64_t(P.world_size()) != WorldSize)
    throw RunError("plan was compiled for " + std::to_string(P.world_size()) +
                   (P.world_size() == 1 ? " rank" : " ranks") + " (grid " +
                   gridString(P) + ") but " + std::to_string(WorldSize) +
                   (WorldSize == 1 ? " was" : " were") + " launched" +
                   launcherHint(P.world_size(), WorldSize));
  S.mode = O.generate ? Mode::Generate
           : P.train() ? Mode::Train
                       : Mode::Forward;
  checkModeOptions(O, S, P);
  S.seed = O.haveSeed ? O.seed : P.seed();
  S.exec = std::make_unique<Executor>(P, uint32_t(WorldRank));
  S.exec->allocate();
  const RankProgram &RP = S.exec->rankProgram();
  if (!O.loadCheckpoint.empty()) {
    std::string StepDir;
    CheckpointMeta M = readCheckpointMeta(O.loadCheckpoint, P, StepDir);
    loadCheckpointShard(StepDir, M, *S.exec, S.mode == Mode::Train);
    S.resumedFrom = StepDir;
    S.resumedMeta = M;
    if (S.mode == Mode::Train) {
      S.startStep = M.step;
      S.dataPos = M.dataPosition;
      // The default token stream depends on the seed: keep the run's.
      if (!O.haveSeed)
        S.seed = M.seed;
    }
  } else if (!O.weights.empty()) {
    WeightFiles W(O.weights);
    S.loaded = S.exec->loadParams(W, S.seed);
    if (WorldRank == 0)
      warnUnusedWeights(P, W);
  } else {
    S.exec->initParams(S.seed);
  }
  // Dropout masks are keyed by the run's seed (after a checkpoint's, so a
  // resumed run draws the masks the uninterrupted one would have) and the
  // step: 1 for a forward run, t in the training loop; generation is
  // inference, where dropout is the identity.
  S.exec->setSeed(S.seed);
  S.exec->setInference(S.mode == Mode::Generate);
  size_t Need = S.exec->tokensNeeded();
  if (S.mode == Mode::Forward) {
    // (A rank without token inputs, a collective test's or a middle
    // pipeline stage's, draws none from the seeded stream: its batch need
    // not be small, nor its vocabulary more than 0. A token file is still
    // checked on every rank alike.)
    if (O.tokens.empty() && (!RP.inputs() || RP.inputs()->size() == 0))
      Need = 0;
    std::vector<int32_t> Stream =
        O.tokens.empty() ? defaultTokenStream(S.seed, Need, P.vocab_size())
                         : readTokenFile(O.tokens, Need, P.vocab_size());
    S.exec->setInputs(Stream);
    S.forwardStream = std::move(Stream);
    return;
  }
  if (S.mode == Mode::Generate) {
    if (const Output *L = findOutput(RP, "logits"))
      S.logitsBuf = L->buffer();
    return;
  }
  if (const Output *L = findOutput(RP, "loss"))
    S.lossBuf = L->buffer();
  S.stream = O.tokens.empty()
                 ? TokenSource::seeded(S.seed, P.vocab_size())
                 : TokenSource::fromFile(O.tokens, Need, P.vocab_size());
  const uint64_t Stride = S.exec->tokensPerStep();
  if (S.stream.length() < Stride + 1)
    throw RunError(O.tokens + ": holds " +
                   std::to_string(S.stream.length()) +
                   " tokens but one global batch needs " +
                   std::to_string(Stride + 1));
  // A random window starts anywhere before the stream's last sequence
  // and its label: one start alone is no choice.
  if (O.sample == "random" && S.stream.length() < uint64_t(P.seq()) + 2)
    throw RunError(O.tokens + ": holds " + std::to_string(S.stream.length()) +
                   " tokens, one window of seq " + std::to_string(P.seq()) +
                   " and its labels: --sample random needs at least " +
                   std::to_string(P.seq() + 2) +
                   " to choose among (or use --sample sequential)");
  // A checkpoint's position refers to the stream it was saved with; reduced
  // modulo this stream's period it is a valid position of any stream.
  const uint64_t Period = S.stream.length() - Stride - 1;
  S.dataPos = Period ? S.dataPos % Period : 0;
  if (!S.resumedFrom.empty() && WorldRank == 0)
    warnOtherData(O, S);
  if (WorldRank == 0)
    warnForeignCheckpoint(O);
}

/// Rank 0 opens --metrics (a resumed run continues the file), once every
/// rank has prepared: a resume another rank refuses leaves it untouched.
void openMetrics(const Options &O, Setup &S) {
  if (O.metrics.empty() || WorldRank != 0 || S.mode != Mode::Train)
    return;
  if (!S.resumedFrom.empty())
    keepMetricsUpTo(O.metrics, S.startStep);
  S.metrics = std::fopen(O.metrics.c_str(), S.resumedFrom.empty() ? "w" : "a");
  if (!S.metrics)
    throw RunError(O.metrics +
                   ": cannot create metrics file: " + std::strerror(errno));
}

/// Rank 0 appends step \p T's line to --metrics: "" where it was
/// written, else why not.
std::string writeMetricsLine(const Options &O, Setup &S, int64_t T, float Loss,
                             double TokPerS, double Lr) {
  if (!S.metrics)
    return "";
  char LossStr[64];
  if (std::isfinite(Loss))
    std::snprintf(LossStr, sizeof(LossStr), "%.9g", double(Loss));
  else
    std::snprintf(LossStr, sizeof(LossStr), "null");
  errno = 0;
  if (std::fprintf(S.metrics,
                   "{\"step\": %lld, \"loss\": %s, \"tokens_per_s\": %.1f, "
                   "\"lr\": %.9g}\n",
                   (long long)T, LossStr, TokPerS, Lr) < 0 ||
      std::fflush(S.metrics) != 0)
    return O.metrics + ": cannot write the metrics of step " +
           std::to_string(T) + ": " + std::strerror(errno ? errno : EIO);
  return "";
}

std::string outputName(const Output &O, const RankProgram &RP) {
  if (O.name() && O.name()->size())
    return O.name()->str();
  const Buffer *B = RP.buffers()->Get(O.buffer());
  if (B->name() && B->name()->size())
    return B->name()->str();
  return "output" + std::to_string(O.buffer());
}

void report(const Options &O, const Setup &S) {
  const RankProgram &RP = S.exec->rankProgram();
  if (!RP.outputs())
    return;
  for (const Output *Out : *RP.outputs()) {
    const Tensor &T = S.exec->buffer(Out->buffer());
    std::string Name = outputName(*Out, RP);
    auto At = [&](int64_t I) {
      return T.isF32() ? double(T.f[size_t(I)]) : double(T.i[size_t(I)]);
    };
    if (T.shape.empty()) {
      info(O, "output %s = %.9g", Name.c_str(), At(0));
      continue;
    }
    double Sum = 0, Sq = 0;
    int64_t N = T.numel();
    for (int64_t I = 0; I < N; ++I) {
      Sum += At(I);
      Sq += At(I) * At(I);
    }
    double Mean = N ? Sum / double(N) : 0, Rms = N ? std::sqrt(Sq / double(N)) : 0;
    info(O, "output %s %s: mean %.4g, rms %.4g", Name.c_str(),
         shapeString(T.shape).c_str(), Mean, Rms);
  }
}

void saveOutputs(const Options &O, const Setup &S) {
  const RankProgram &RP = S.exec->rankProgram();
  std::vector<TensorToWrite> Ts;
  std::map<std::string, bool> Seen;
  auto Add = [&](const std::string &Name, const Tensor &T) {
    if (Seen[Name])
      return;
    Seen[Name] = true;
    Ts.push_back({Name, T.isF32() ? "F32" : "I32", T.shape, T.data(),
                  T.bytes()});
  };
  const int64_t G = S.exec->globalBatch();
  std::map<std::string, std::string> Meta = {{"producer", "megac-run"},
                                             {"plan", O.plan},
                                             {"seed", std::to_string(S.seed)}};
  if (RP.outputs())
    for (const Output *Out : *RP.outputs())
      Add(outputName(*Out, RP), S.exec->buffer(Out->buffer()));
  // The inputs of the whole global batch (outputs are whole too, so runs on
  // different grids save the same tensors), cut from the stream as every
  // rank cuts its rows.
  std::vector<Tensor> Global;
  if (RP.inputs())
    Global.reserve(RP.inputs()->size());
  const int64_t Seq = S.plan.program->seq();
  if (RP.inputs())
    for (const Input *In : *RP.inputs()) {
      const size_t Shift = In->kind()->str() == "labels" ? 1 : 0;
      Tensor T;
      T.dtype = dt::I32;
      T.shape = {G, Seq};
      T.i.assign(S.forwardStream.begin() + long(Shift),
                 S.forwardStream.begin() + long(Shift + size_t(G * Seq)));
      Global.push_back(std::move(T));
      Add(In->kind()->str(), Global.back());
    }
  writeSafetensors(O.saveOutputs, Ts, Meta);
}

/// Ends the whole job, this rank with status 1: under an MPI launcher
/// MPI_Abort takes the other ranks down; the ranks of a torchrun-style
/// launch are separate MPI jobs, and see this one end through their
/// connections to rank 0 (torchrun_world.h).
[[noreturn]] void endJob() {
  std::fflush(stdout);
  std::fflush(stderr);
  if (!JoinedWorld)
    MPI_Abort(World, 1);
  std::_Exit(1);
}

/// Ends the job after a failure on this rank alone, which its peers would
/// otherwise wait for in a collective. A job of one rank has no peers, and
/// ends with status 1 and the one line, as any other error does (MPI_Abort
/// would add Open MPI's banner).
[[noreturn]] void abortJob(const std::exception &E) {
  std::fflush(stdout); // (what it printed comes before the error)
  std::fprintf(stderr, "megac-run: error: %s\n", oneLine(E.what()).c_str());
  std::fflush(stderr);
  if (WorldSize == 1) {
    MPI_Finalize();
    std::exit(1);
  }
  endJob();
}

/// Builds this rank's per-axis communicators and waits for every rank, so
/// that no rank starts a step while another is still setting up.
std::unique_ptr<MpiCollectives> joinCollectives(const Program &P,
                                                int WorldRank) {
  std::unique_ptr<MpiCollectives> Comm;
  try {
    Comm = std::make_unique<MpiCollectives>(P, uint32_t(WorldRank), World);
  } catch (const std::exception &Ex) {
    abortJob(Ex);
  }
  MPI_Barrier(World);
  return Comm;
}

/// What a user can do about a diverged run. The last checkpoint (saved by
/// this run, or resumed from) holds finite values, but it may already be
/// on the way: a step's update can be huge and finite.
std::string divergedAdvice(const Setup &S) {
  std::string Advice = "compile the plan with a lower --lr";
  const std::string &Last = S.lastSaved.empty() ? S.resumedFrom : S.lastSaved;
  if (!Last.empty())
    Advice += " and resume from the last checkpoint, " + Last +
              ", or, if it diverges again, from an earlier one";
  return Advice;
}

/// Saves a checkpoint of step \p Step: every rank writes its shard, the
/// ranks agree, rank 0 gathers the shard sizes and CRCs and writes
/// meta.json and then `latest`. Returns false (error already printed) if
/// any rank failed.
bool saveCheckpoint(const Options &O, Setup &S, int64_t Step) {
  const Program &P = *S.plan.program;
  // A step's loss can be finite while its update is not (an infinite
  // gradient): such a state would overwrite a good checkpoint with one
  // nothing can resume from. (Checked by all before any rank writes.)
  std::string Err = nonFiniteState(*S.exec);
  if (!Err.empty())
    Err = "step " + std::to_string(Step) + ": " + Err +
          ": training diverged; the checkpoint is not saved (" +
          divergedAdvice(S) + ")";
  // The shards go to a staging directory, moved into place whole once
  // meta.json is written (rank 0 clears it first).
  if (Err.empty() && WorldRank == 0)
    try {
      prepareStepStaging(O.saveCheckpoint, Step);
    } catch (const std::exception &E) {
      Err = E.what();
    }
  if (!agree(Err))
    return false;
  ShardInfo Mine;
  try {
    // Writing a shard is progress; the watchdog counts from its end.
    Mine = writeCheckpointShard(O.saveCheckpoint, Step, *S.exec);
    S.exec->note();
  } catch (const std::exception &E) {
    Err = E.what();
  }
  if (!agree(Err))
    return false;
  uint64_t Send[2] = {Mine.bytes, Mine.crc32};
  std::vector<uint64_t> All(size_t(2 * WorldSize));
  MPI_Gather(Send, 2, MPI_UINT64_T, All.data(), 2, MPI_UINT64_T, 0, World);
  crashHookAfterShards();
  if (WorldRank == 0)
    try {
      CheckpointMeta M;
      M.step = Step;
      M.dataPosition = S.dataPos;
      M.seed = S.seed;
      M.worldSize = P.world_size();
      M.grid = gridString(P);
      M.modelHash = P.model_hash();
      M.hasData = true;
      M.dataFile = O.tokens;
      M.dataTokens = O.tokens.empty() ? 0 : S.stream.length();
      M.hasDataCrc = true;
      M.dataCrc = S.stream.fingerprint();
      M.sample = O.sample;
      M.arithmetic = S.arithmetic;
      for (int R = 0; R < WorldSize; ++R)
        M.shards.push_back({uint32_t(R), shardFileName(uint32_t(R)),
                            All[size_t(2 * R)],
                            uint32_t(All[size_t(2 * R + 1)])});
      writeCheckpointMeta(O.saveCheckpoint, M);
    } catch (const std::exception &E) {
      // (Also the data's fingerprint: a file changed during the run.)
      Err = E.what();
    }
  if (!agree(Err))
    return false;
  S.lastSaved = O.saveCheckpoint + "/" + stepDirName(Step);
  return true;
}

std::string clockString(double Sec) {
  if (!(Sec >= 0) || Sec > 1e8)
    return "?";
  long long T = (long long)std::llround(Sec);
  char Buf[48];
  if (T >= 3600)
    std::snprintf(Buf, sizeof(Buf), "%lld:%02lld:%02lld", T / 3600,
                  T / 60 % 60, T % 60);
  else
    std::snprintf(Buf, sizeof(Buf), "%lld:%02lld", T / 60, T % 60);
  return Buf;
}

/// Writes \p Text to \p Path whole (writeFileAtomic): "" where it was
/// written, else why not.
std::string writeTextFile(const std::string &Path, const std::string &Text) {
  try {
    writeFileAtomic(Path, Text.data(), Text.size());
  } catch (const RunError &E) {
    return E.what();
  }
  return "";
}

/// Gathers every rank's measured timeline to rank 0, which writes
/// --trace. Collective over World; false (everyone) on a failure.
/// Rank 0 takes one rank's events at a time straight into the file's
/// text.
bool writeTrace(const Options &O, Setup &S) {
  const Program &P = *S.plan.program;
  std::string Mine = traceEventsJson(P, uint32_t(WorldRank), S.exec->trace());
  std::string Err;
  // (In pieces of at most 1 GiB: MPI counts are ints.)
  constexpr uint64_t kPiece = uint64_t(1) << 30;
  if (WorldRank != 0) {
    const uint64_t Len = Mine.size();
    MPI_Send(&Len, 1, MPI_UINT64_T, 0, 0, World);
    for (uint64_t At = 0; At < Len; At += kPiece)
      MPI_Send(Mine.data() + At, int(std::min(kPiece, Len - At)), MPI_CHAR, 0,
               1, World);
  } else {
    // traceFileJson's document, built in place: its head, each rank's
    // events, its tail ("\n]}\n").
    std::string File = traceFileJson({});
    const std::string Tail = File.substr(File.size() - 4);
    File.resize(File.size() - 4);
    File.reserve(File.size() + Mine.size() + 8);
    File += "\n";
    File += Mine;
    std::string().swap(Mine);
    for (int R = 1; R < WorldSize; ++R) {
      uint64_t Len = 0;
      MPI_Recv(&Len, 1, MPI_UINT64_T, R, 0, World, MPI_STATUS_IGNORE);
      const size_t At = File.size();
      File.resize(At + 2 + Len);
      File[At] = ',';
      File[At + 1] = '\n';
      for (uint64_t Got = 0; Got < Len; Got += kPiece)
        MPI_Recv(File.data() + At + 2 + Got, int(std::min(kPiece, Len - Got)),
                 MPI_CHAR, R, 1, World, MPI_STATUS_IGNORE);
    }
    File += Tail;
    if (std::string Why = writeTextFile(O.trace, File); !Why.empty())
      Err = "cannot write the trace: " + Why;
  }
  if (!agree(Err))
    return false;
  const size_t Events = S.exec->trace().size();
  info(O, "wrote the measured timeline to %s (%zu events on rank 0%s)",
       O.trace.c_str(), Events,
       S.exec->firstUntracedStep()
           ? ": the first instructions only, the trace's limit"
           : "");
  return true;
}

/// What a CPU profile covers: the steps its trace holds whole, or part of
/// one step where the trace's limit is smaller than a step.
struct TraceCoverage {
  DeviceRun::ProfiledSteps Span;
  bool CutShort = false;    // the limit left instructions out
  size_t PartialInstrs = 0; // where Span.Steps is 0: the instructions held
};

/// Per instruction: milliseconds and runs, from the executor's trace (the
/// CPU backend's --profile) of \p StepsRun steps. Where the trace's limit
/// left instructions out, the step it stopped in is left out too, so that
/// every instruction counts the same steps.
TraceCoverage profileFromTrace(const Executor &E, int64_t StepsRun,
                               std::vector<double> &Ms,
                               std::vector<uint64_t> &Runs) {
  const RankProgram &RP = E.rankProgram();
  const std::vector<TraceSpan> &Trace = E.trace();
  const size_t N = RP.instrs() ? RP.instrs()->size() : 0;
  Ms.assign(N, 0.0);
  Runs.assign(N, 0);
  TraceCoverage C{{StepsRun, false}};
  int64_t CutStep = std::numeric_limits<int64_t>::max();
  if (const std::optional<int64_t> Untraced = E.firstUntracedStep()) {
    C.CutShort = true;
    const int64_t FirstStep = Trace.empty() ? *Untraced : Trace.front().step;
    C.Span.Steps = std::max<int64_t>(*Untraced - FirstStep, 0);
    // Less than a step: its part is all there is.
    if (C.Span.Steps > 0)
      CutStep = *Untraced;
    else
      C.PartialInstrs = Trace.size();
  }
  for (const TraceSpan &Sp : Trace)
    if (Sp.instr < N && Sp.step < CutStep) {
      Ms[Sp.instr] += Sp.durUs / 1e3;
      Runs[Sp.instr] += 1;
    }
  return C;
}

/// --profile: rank 0's instruction times summed per opcode (with the
/// cost model's FLOPs and bytes, for rates), printed and written as JSON.
bool writeProfile(const Options &O, const Setup &S, const std::string &Where,
                  const std::vector<double> &Ms,
                  const std::vector<uint64_t> &Runs,
                  const TraceCoverage &Covered) {
  const DeviceRun::ProfiledSteps &Span = Covered.Span;
  std::string Err;
  if (WorldRank == 0) {
    const RankProgram &RP = S.exec->rankProgram();
    struct OpSum {
      uint64_t Instrs = 0, Runs = 0;
      double Ms = 0, Flops = 0, Bytes = 0;
    };
    std::map<std::string, OpSum> Sums;
    double Total = 0;
    for (size_t I = 0; I < Ms.size() && RP.instrs() && I < RP.instrs()->size();
         ++I) {
      if (!Runs[I])
        continue;
      const Instr &In = *RP.instrs()->Get(uint32_t(I));
      OpSum &Sum = Sums[opcodeName(In.op())];
      Sum.Instrs += 1;
      Sum.Runs += Runs[I];
      Sum.Ms += Ms[I];
      Sum.Flops += flopsOf(RP, In) * double(Runs[I]);
      Sum.Bytes += bytesOf(RP, In) * double(Runs[I]);
      Total += Ms[I];
    }
    std::vector<std::pair<std::string, OpSum>> Order(Sums.begin(), Sums.end());
    std::sort(Order.begin(), Order.end(), [](const auto &A, const auto &B) {
      return A.second.Ms > B.second.Ms;
    });
    std::string Json =
        "{\n  \"device\": \"" + Where +
        "\",\n  \"rank\": 0,\n"
        "  \"steps\": " +
        std::to_string(Span.Steps) + ",\n  \"first_step_left_out\": " +
        (Span.FirstLeftOut ? "true" : "false") +
        ",\n  \"cut_short\": " + (Covered.CutShort ? "true" : "false") +
        ",\n  \"total_ms\": " + std::to_string(Total) + ",\n  \"ops\": [";
    for (size_t K = 0; K < Order.size(); ++K) {
      const OpSum &Sum = Order[K].second;
      const double Sec = Sum.Ms / 1e3;
      char Buf[512];
      std::snprintf(Buf, sizeof(Buf),
                    "%s\n    {\"op\": \"%s\", \"instructions\": %llu, "
                    "\"runs\": %llu, \"ms\": %.6f, \"share\": %.6f, "
                    "\"flops\": %.6g, \"bytes\": %.6g, \"flops_per_s\": "
                    "%.6g, \"bytes_per_s\": %.6g}",
                    K ? "," : "", Order[K].first.c_str(),
                    (unsigned long long)Sum.Instrs,
                    (unsigned long long)Sum.Runs, Sum.Ms,
                    Total > 0 ? Sum.Ms / Total : 0.0, Sum.Flops, Sum.Bytes,
                    Sec > 0 ? Sum.Flops / Sec : 0.0,
                    Sec > 0 ? Sum.Bytes / Sec : 0.0);
      Json += Buf;
    }
    Json += "\n  ]\n}\n";
    if (std::string Why = writeTextFile(O.profile, Json); !Why.empty())
      Err = "cannot write the profile: " + Why;
    if (Err.empty() && !O.quiet) {
      // What the times sum: whole steps, or a part of one.
      const std::string Over =
          Span.Steps == 0 && Covered.CutShort
              ? "the first " + std::to_string(Covered.PartialInstrs) +
                    " instructions of a step (the trace's instruction "
                    "limit, MEGAC_TRACE_LIMIT, is less than a step)"
              : std::to_string(Span.Steps) +
                    (Span.Steps == 1 ? " step" : " steps") +
                    (Covered.CutShort
                         ? " (the first ones only: the trace's instruction "
                           "limit stopped it; profile fewer steps to see "
                           "them all)"
                         : "");
      std::printf("profile of rank 0 on %s: %.1f ms in %zu ops over %s%s%s\n",
                  Where.c_str(), Total, Order.size(), Over.c_str(),
                  Span.FirstLeftOut ? " (the first left out: it loads "
                                      "kernels, plans and times products)"
                                    : "",
                  Order.size() > 10 ? " (the costliest 10 below; all in the "
                                      "JSON)"
                                    : "");
      std::printf("  %-26s %8s %10s %6s %10s %10s\n", "op", "runs", "ms",
                  "share", "GFLOP/s", "GB/s");
      for (size_t K = 0; K < Order.size() && K < 10; ++K) {
        const OpSum &Sum = Order[K].second;
        const double Sec = Sum.Ms / 1e3;
        std::printf("  %-26s %8llu %10.2f %5.1f%% %10.1f %10.1f\n",
                    Order[K].first.c_str(), (unsigned long long)Sum.Runs,
                    Sum.Ms, Total > 0 ? 100.0 * Sum.Ms / Total : 0.0,
                    Sec > 0 ? Sum.Flops / Sec / 1e9 : 0.0,
                    Sec > 0 ? Sum.Bytes / Sec / 1e9 : 0.0);
      }
      if (O.backend == "cuda")
        std::printf("  (times are each op's own: collectives overlap compute "
                    "and include waiting for peers%s)\n",
                    Span.FirstLeftOut ? ""
                                      : "; the first run of a kernel "
                                        "includes loading it");
      else
        std::printf("  (collectives and pipeline receives include waiting for "
                    "peers)\n");
      std::fflush(stdout);
    }
  }
  if (!agree(Err))
    return false;
  info(O, "wrote the profile to %s", O.profile.c_str());
  return true;
}

/// What the plugin calls back into: the rank's executor (its progress,
/// for the watchdog) and its host messages (pipeline transfers).
struct DeviceHost {
  Executor *E;
  Collectives *C;
};

/// A failure every rank has agreed on and one of them has printed.
struct AgreedFailure {};

using CreateCudaRun = DeviceRun *(*)(const Program *, uint32_t, int,
                                     const DeviceBootstrap *, char *, size_t);

/// The CUDA backend plugin's entry: libmegac_cuda.so beside this
/// executable, or the library MEGAC_CUDA_PLUGIN names (libmegac_cuda_emu.so
/// runs the same backend on a host emulation of CUDA, for tests without a
/// GPU).
CreateCudaRun loadCudaPlugin() {
  char Self[4096];
  ssize_t Len = ::readlink("/proc/self/exe", Self, sizeof(Self) - 1);
  std::string Dir = Len > 0 ? std::string(Self, size_t(Len)) : "";
  Dir = Dir.substr(0, Dir.find_last_of('/') + 1);
  const char *Override = std::getenv("MEGAC_CUDA_PLUGIN");
  const std::string Lib = Override && *Override
                              ? std::string(Override)
                              : Dir + "libmegac_cuda.so";
  void *Handle = ::dlopen(Lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!Handle)
    throw RunError(std::string("--backend cuda: cannot load the CUDA "
                               "backend: ") +
                   ::dlerror() +
                   (Override && *Override
                        ? std::string(" (MEGAC_CUDA_PLUGIN names it)")
                        : std::string(" (megac-run was built without the "
                                      "CUDA toolkit, or the CUDA driver is "
                                      "missing)")));
  // The emulation's NCCL is MPI: it needs this job's world.
  if (auto *SetWorld = reinterpret_cast<void (*)(MPI_Comm)>(
          ::dlsym(Handle, "megacEmuSetWorld")))
    SetWorld(World);
  auto Fn =
      reinterpret_cast<CreateCudaRun>(::dlsym(Handle, "megacCreateCudaRun"));
  if (!Fn)
    throw RunError(
        "--backend cuda: cannot load the CUDA backend: " + Lib +
        " has no megacCreateCudaRun: not megac's CUDA plugin" +
        (Override && *Override ? " (MEGAC_CUDA_PLUGIN names it)" : ""));
  return Fn;
}

/// One device per rank: the launcher's local rank (the plugin takes the
/// only device visible where CUDA_VISIBLE_DEVICES leaves one). An empty
/// variable is unset; anything but a whole number is refused (atoi took
/// "abc" for device 0 and "3x" for 3).
int localDevice() {
  for (const char *Var : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
                          "SLURM_LOCALID"})
    if (const std::optional<long> Local = envWholeNumber(
            Var, 0, INT_MAX,
            "the launcher's local rank, a whole number (it picks this "
            "rank's device)"))
      return int(*Local);
  return 0;
}

/// Opens this rank's device through the plugin. Collective over the world:
/// what can fail on this rank alone (the plugin, the local rank) is agreed
/// on before the plugin's own agreements, which every rank must enter.
std::unique_ptr<DeviceRun> openCudaRun(DeviceHost &Host) {
  const Program &P = Host.E->program();
  CreateCudaRun Fn = nullptr;
  int Device = 0;
  std::string LocalErr;
  try {
    Fn = loadCudaPlugin();
    Device = localDevice();
  } catch (const RunError &E) {
    LocalErr = E.what();
  }
  if (!agree(LocalErr))
    throw AgreedFailure{};
  char Err[1024] = {0};
  // The plugin's communicators get their ids over MPI.
  DeviceBootstrap Boot;
  Boot.Ctx = &Host;
  Boot.allGather = [](const void *Mine, size_t Bytes, void *All, void *) {
    return MPI_Allgather(Mine, int(Bytes), MPI_BYTE, All, int(Bytes), MPI_BYTE,
                         World) == MPI_SUCCESS;
  };
  // The device's progress is the watchdog's heartbeat.
  Boot.progress = [](uint32_t I, bool Waiting, void *Ctx) {
    static_cast<DeviceHost *>(Ctx)->E->notePosition(I, Waiting);
  };
  // Pipeline transfers travel as the CPU backend's do.
  Boot.transfer = [](int Peer, int64_t Tag, void *Data, size_t Bytes,
                     bool Send, void *Ctx) {
    Collectives *C = static_cast<DeviceHost *>(Ctx)->C;
    if (!C)
      return false;
    try {
      if (Send)
        C->send(Peer, Tag, Data, Bytes);
      else
        C->recv(Peer, Tag, Data, Bytes);
    } catch (const std::exception &) {
      return false;
    }
    return true;
  };
  SettingUpDevice.store(true);
  DeviceRun *Run =
      Fn(&P, uint32_t(WorldRank), Device, &Boot, Err, sizeof(Err));
  SettingUpDevice.store(false);
  if (!Run)
    throw RunError(std::string("--backend cuda: ") + Err);
  return std::unique_ptr<DeviceRun>(Run);
}

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

/// This process's MEGAC_CUDA_* settings that change a step's arithmetic,
/// sorted ("MEGAC_CUDA_EPILOGUES=0 MEGAC_CUDA_WIDE_FORWARD=0"), or "" when
/// none is set. The plugin's path, the logging knobs and the emulation's
/// test knobs are not among them, nor the variable \p Except names.
std::string cudaArithmeticSettings(const char *Except = nullptr) {
  std::vector<std::string> Settings;
  for (char **Env = environ; *Env; ++Env) {
    const std::string Entry = *Env;
    const std::string Name = Entry.substr(0, Entry.find('='));
    if (Except && Name == Except)
      continue;
    if (Name.rfind("MEGAC_CUDA_", 0) == 0 && Name != "MEGAC_CUDA_PLUGIN" &&
        Name.rfind("MEGAC_CUDA_EMU_", 0) != 0 && Name != "MEGAC_CUDA_LT_LOG" &&
        Name != "MEGAC_CUDA_GEMM_PROBE")
      Settings.push_back(Entry);
  }
  std::sort(Settings.begin(), Settings.end());
  std::string Joined;
  for (const std::string &S : Settings)
    Joined += (Joined.empty() ? "" : " ") + S;
  return Joined;
}

/// "" when this rank's cudaArithmeticSettings() equal rank 0's, else
/// which differ. (Collective.) A tensor-parallel parameter's copies,
/// computed on each rank, would drift apart under different settings
/// (MEGAC_CUDA_EPILOGUES=0 on one rank did, without a word).
std::string cudaSettingsMismatch() {
  std::string Mine = cudaArithmeticSettings();
  if (Mine.empty())
    Mine = "none set";
  std::string Rank0 = Mine;
  unsigned long long Len = Rank0.size();
  MPI_Bcast(&Len, 1, MPI_UNSIGNED_LONG_LONG, 0, World);
  Rank0.resize(size_t(Len));
  MPI_Bcast(Rank0.data(), int(Len), MPI_CHAR, 0, World);
  if (Mine == Rank0)
    return "";
  return "--backend cuda: rank " + std::to_string(WorldRank) +
         " runs with MEGAC_CUDA_* " + Mine + ", rank 0 with " + Rank0 +
         ": the settings must be the same on every rank (a tensor-parallel "
         "parameter's copies would drift apart)";
}

/// Opens this rank's device (every rank agrees on success, so none is left
/// waiting) and checks that every rank runs it alike; \p C carries
/// pipeline transfers. Null after a failure, which has been reported.
std::unique_ptr<DeviceSession> openDevice(Executor &E,
                                          Collectives *C = nullptr) {
  std::unique_ptr<DeviceSession> Dev;
  std::string Err;
  try {
    Dev = std::make_unique<DeviceSession>(E, C);
  } catch (const AgreedFailure &) {
    return nullptr;
  } catch (const std::exception &Ex) {
    Err = Ex.what();
  }
  if (!agree(Err))
    return nullptr;
  if (!agree(cudaSettingsMismatch()))
    return nullptr;
  return Dev;
}

/// --profile from the device's events (the steps after its first, where
/// it ran more than one), or from the executor's trace (all \p StepsRun).
bool writeDeviceOrHostProfile(const Options &O, const Setup &S,
                              const DeviceSession *Dev, int64_t StepsRun) {
  std::vector<double> Ms;
  std::vector<uint64_t> Runs;
  TraceCoverage Covered;
  if (Dev)
    Covered.Span = Dev->profile(Ms, Runs);
  else
    Covered = profileFromTrace(*S.exec, StepsRun, Ms, Runs);
  return writeProfile(O, S, Dev ? Dev->device().deviceName() : "the CPU", Ms,
                      Runs, Covered);
}

/// Records what computes this run's steps besides the plan, for its
/// checkpoints, and warns (rank 0) when the checkpoint it resumed from
/// was computed otherwise: the same plan on another CPU's BLAS kernels,
/// another thread count or another device sums in another order, so the
/// run may continue only within rounding of the saved one (users
/// comparing a resumed run with an uninterrupted one should know why the
/// last bits differ).
/// (On the CUDA backend the record is the device, what computes
/// attention and the MEGAC_CUDA_* settings that change arithmetic; its
/// runs differ in their last bits from run to run anyway, dq's atomics.)
void noteArithmetic(Setup &S, const DeviceSession *Dev) {
  if (Dev) {
    // (MEGAC_CUDA_ATTENTION asks; "attention on" says what computes it,
    // so auto and cudnn where cuDNN loads are the same arithmetic.)
    const std::string Settings =
        cudaArithmeticSettings(/*Except=*/"MEGAC_CUDA_ATTENTION");
    S.arithmetic = "cuda (" + Dev->device().deviceName() + ", attention on " +
                   Dev->device().attentionKernels() +
                   (Settings.empty() ? "" : ", " + Settings) + ")";
  } else {
    S.arithmetic = "cpu (" + kernels::blasDescription() + ")";
  }
  const std::string &Saved = S.resumedMeta.arithmetic;
  // (CUDA records before 2026-11-29 named the attention asked for,
  // "attention auto": another text for what may be the same arithmetic,
  // not compared, as a checkpoint without the record is not.)
  const bool OlderCudaRecord =
      Saved.rfind("cuda (", 0) == 0 &&
      Saved.find(", attention on ") == std::string::npos;
  if (WorldRank != 0 || S.resumedFrom.empty() || Saved.empty() ||
      OlderCudaRecord || Saved == S.arithmetic)
    return;
  std::fprintf(stderr,
               "megac-run: warning: the checkpoint's run computed on %s, this "
               "run computes on %s: its steps may differ in their last bits "
               "from those the saved run would have taken (other kernels or "
               "threads sum in another order)\n",
               printableText(Saved).c_str(), S.arithmetic.c_str());
}

int runTraining(const Options &O, Setup &S) {
  const Program &P = *S.plan.program;
  const TrainConfig &TC = *P.train();
  Executor &E = *S.exec;
  E.setTraining(true); // the logits (generation only) are not computed
  E.setRandomWindows(O.sample == "random");
  const uint64_t Stride = E.tokensPerStep();
  const int64_t First = S.startStep + 1, Last = S.startStep + O.steps;
  if (!S.resumedFrom.empty())
    info(O, "resuming after step %lld (data position %llu)",
         (long long)S.startStep, (unsigned long long)S.dataPos);
  info(O, "training steps %lld..%lld on %s: global batch %lld x seq %lld "
          "(%llu tokens per step), lr %.3g -> %.3g (warmup %lld, cosine to "
          "step %lld)",
       (long long)First, (long long)Last,
       O.tokens.empty() ? "the seeded token stream"
                        : (O.tokens + " (" + std::to_string(S.stream.length()) +
                           " tokens)")
                              .c_str(),
       (long long)E.globalBatch(), (long long)P.seq(),
       (unsigned long long)Stride, TC.max_lr(), TC.min_lr(),
       (long long)TC.warmup_steps(), (long long)TC.total_steps());

  // Redraw the progress line in place only on a terminal of our own: a
  // launcher (mpirun, srun) hands its ranks a pseudo-terminal even when its
  // own output goes to a file or a pipe, so under one print lines instead.
  const bool Launched = LaunchedByLauncher || std::getenv("SLURM_NTASKS");
  const bool Tty =
      WorldRank == 0 && !O.quiet && !Launched && ::isatty(STDOUT_FILENO);
  const int64_t Every = std::max<int64_t>(1, O.steps / 20);
  double TotalSec = 0, FirstLoss = 0, LastLoss = 0;
  // The console's rate covers the steps since its last line (the first
  // step's start-up, kernels loading and graphs building, only in the
  // first line's), its ETA the steps after the first.
  double WindowSec = 0, FirstSec = 0;
  int64_t WindowSteps = 0;
  std::unique_ptr<MpiCollectives> Comm = joinCollectives(P, WorldRank);
  // Ranks without the loss (on a pipeline) receive it from this one; -1:
  // every rank computes it.
  const int LossRoot = E.pipelined() ? lossRank(P) : -1;
  std::unique_ptr<DeviceSession> Dev;
  if (O.backend == "cuda") {
    if (!(Dev = openDevice(E, Comm.get())))
      return 1;
    info(O, "training on %s: %s", Dev->device().deviceName().c_str(),
         Dev->device().notes().c_str());
  }
  noteArithmetic(S, Dev.get());
  if (!O.profile.empty()) {
    if (Dev)
      Dev->enableProfiling();
    else if (O.trace.empty())
      E.enableTrace(traceLimit(O));
  }
  if (!O.trace.empty()) {
    MPI_Barrier(World); // a common origin for every rank's times
    E.enableTrace(traceLimit(O));
  }
  for (int64_t T = First; T <= Last; ++T) {
    auto T0 = std::chrono::steady_clock::now();
    double Lr = kernels::learningRate(TC.max_lr(), TC.min_lr(),
                                      TC.warmup_steps(), TC.total_steps(), T);
    float Loss;
    try {
      E.setStep(T, Lr);
      E.setInputs(S.stream, S.dataPos);
      if (Dev) {
        Dev->step(/*Training=*/true, Lr);
        if (LossRoot < 0 || LossRoot == WorldRank)
          Dev->pull(S.lossBuf);
      } else {
        E.run(*Comm);
      }
      Loss = LossRoot < 0 || LossRoot == WorldRank
                 ? E.buffer(S.lossBuf).f[0]
                 : 0.0f;
      // A pipeline's loss lives on its last stage; every rank reports it.
      if (LossRoot >= 0)
        MPI_Bcast(&Loss, 1, MPI_FLOAT, LossRoot, World);
    } catch (const std::exception &Ex) {
      abortJob(Ex);
    }
    E.note();
    S.dataPos = nextDataPosition(S.dataPos, Stride, S.stream.length());
    double Sec = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - T0)
                     .count();
    TotalSec += Sec;
    WindowSec += Sec;
    ++WindowSteps;
    if (T == First) {
      FirstLoss = Loss;
      FirstSec = Sec;
    }
    LastLoss = Loss;
    const double TokPerS = Sec > 0 ? double(Stride) / Sec : 0.0;
    // A line that cannot be written (a full disk) ends the job, rather
    // than leave a metrics file that stops without a word. Rank 0 alone
    // knows: an agreement every step would add a host collective to each
    // (and the watchdog would name it, not the step's own), so it aborts.
    if (std::string Err = writeMetricsLine(O, S, T, Loss, TokPerS, Lr);
        !Err.empty())
      abortJob(RunError(Err));
    if (WorldRank == 0 && !O.quiet &&
        (Tty || (T - S.startStep) % Every == 0 || T == Last)) {
      const int64_t Done = T - S.startStep;
      const double PerStep = Done > 1 ? (TotalSec - FirstSec) / double(Done - 1)
                                      : TotalSec;
      const double Eta = PerStep * double(Last - T);
      const double RecentTok =
          WindowSec > 0 ? double(Stride) * double(WindowSteps) / WindowSec
                        : 0.0;
      WindowSec = 0;
      WindowSteps = 0;
      std::printf("%sstep %lld/%lld  loss %.6f  lr %.2e  %.0f tok/s  ETA %s%s",
                  Tty ? "\r" : "", (long long)T, (long long)Last,
                  // (printf shows a NaN's sign bit: "-nan".)
                  std::isnan(Loss) ? std::fabs(double(Loss)) : double(Loss), Lr,
                  RecentTok, clockString(Eta).c_str(),
                  Tty ? (T == Last ? "\n" : "   ") : "\n");
      std::fflush(stdout);
    }
    // Every rank holds the same loss (reduced over the grid, or broadcast
    // from a pipeline's last stage), so all stop here together. A NaN
    // reaches every parameter through the update: no later step recovers.
    if (!std::isfinite(Loss)) {
      if (Tty && T != Last)
        std::fputc('\n', stdout); // end the progress line
      std::fflush(stdout);
      if (WorldRank == 0)
        std::fprintf(stderr,
                     "megac-run: error: step %lld: the loss is %s: training "
                     "diverged; stopping without a checkpoint (%s)\n",
                     (long long)T, std::isnan(Loss) ? "nan" : "inf",
                     divergedAdvice(S).c_str());
      return 1;
    }
    if (O.checkpointEvery && T % O.checkpointEvery == 0 && T != Last) {
      if (Dev)
        Dev->pullState();
      if (!saveCheckpoint(O, S, T))
        return 1;
      info(O, "saved checkpoint %s/%s", O.saveCheckpoint.c_str(),
           stepDirName(T).c_str());
    }
  }
  if (Dev && !Dev->device().runNotes().empty())
    info(O, "%s", Dev->device().runNotes().c_str());
  if (!O.saveCheckpoint.empty()) {
    if (Dev)
      Dev->pullState();
    if (!saveCheckpoint(O, S, Last))
      return 1;
    info(O, "saved checkpoint %s/%s", O.saveCheckpoint.c_str(),
         stepDirName(Last).c_str());
  }
  if (!O.trace.empty() && !writeTrace(O, S))
    return 1;
  if (!O.profile.empty() &&
      !writeDeviceOrHostProfile(O, S, Dev.get(), Last - First + 1))
    return 1;
  double MaxSec = 0;
  MPI_Allreduce(&TotalSec, &MaxSec, 1, MPI_DOUBLE, MPI_MAX, World);
  info(O,
       "trained %lld step%s (%lld..%lld): loss %.6f -> %.6f, %.0f tokens/s "
       "mean, %.2f s",
       (long long)O.steps, O.steps == 1 ? "" : "s", (long long)First,
       (long long)Last, FirstLoss, LastLoss,
       MaxSec > 0 ? double(Stride) * double(O.steps) / MaxSec : 0.0, MaxSec);
  return 0;
}

/// After a forward step (on any backend): the report, and the outputs
/// saved by rank 0 when asked.
int reportForward(const Options &O, const Setup &S) {
  report(O, S);
  if (O.saveOutputs.empty())
    return 0;
  std::string SaveErr;
  if (WorldRank == 0) {
    try {
      saveOutputs(O, S);
    } catch (const std::exception &E) {
      SaveErr = E.what();
    }
  }
  if (!agree(SaveErr))
    return 1;
  info(O, "saved outputs to %s", O.saveOutputs.c_str());
  return 0;
}

/// A forward run on the CUDA backend: parameters and inputs go to the
/// device, the plan runs there, the outputs come back for the report.
int runForwardOnDevice(const Options &O, Setup &S) {
  const RankProgram &RP = S.exec->rankProgram();
  std::unique_ptr<DeviceSession> Dev = openDevice(*S.exec);
  if (!Dev)
    return 1;
  double Ms = 0;
  // A rank that fails mid-step leaves its peers inside a collective it never
  // joins, where no agreement can reach them: abort the job, as training
  // and the CPU backend do.
  try {
    if (!O.profile.empty())
      Dev->enableProfiling();
    auto T0 = std::chrono::steady_clock::now();
    Dev->step(/*Training=*/false);
    Ms = std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - T0)
             .count();
    if (RP.outputs())
      for (const Output *Out : *RP.outputs())
        Dev->pull(Out->buffer());
  } catch (const std::exception &Ex) {
    abortJob(Ex);
  }
  info(O, "forward step on %s: %u instructions in %.1f ms; %s",
       Dev->device().deviceName().c_str(),
       RP.instrs() ? RP.instrs()->size() : 0u, Ms,
       Dev->device().notes().c_str());
  if (!O.profile.empty() && !writeDeviceOrHostProfile(O, S, Dev.get(), 1))
    return 1;
  return reportForward(O, S);
}

/// Turns generated bytes into text as they come: printable ASCII,
/// newline and tab as they are, well-formed UTF-8 characters whole (a
/// byte-level model writes "é" as two bytes, the second a step later), and
/// everything else, control bytes and broken sequences, as \xNN.
class ByteTextPrinter {
public:
  /// The text byte \p C completes ("" while a character is incomplete).
  std::string feed(int32_t C) {
    const unsigned B = unsigned(C) & 0xFFu;
    std::string R;
    if (!Pending.empty()) {
      if (continues(B)) {
        Pending += char(B);
        if (Pending.size() == Need) {
          R.swap(Pending);
          Pending.clear();
        }
        return R;
      }
      R = flush(); // broken off: its bytes as they are, escaped
    }
    if ((B >= 0x20 && B < 0x7f) || B == '\n' || B == '\t') {
      R += char(B);
    } else if (B >= 0xC2 && B <= 0xF4) {
      Pending = char(B);
      Need = B < 0xE0 ? 2 : B < 0xF0 ? 3 : 4;
    } else {
      R += escape(B);
    }
    return R;
  }
  /// An incomplete character's bytes, escaped (the end of the text).
  std::string flush() {
    std::string R;
    for (char C : Pending)
      R += escape(static_cast<unsigned char>(C));
    Pending.clear();
    return R;
  }

private:
  static std::string escape(unsigned B) {
    char Buf[8];
    std::snprintf(Buf, sizeof(Buf), "\\x%02X", B);
    return Buf;
  }
  /// Whether \p B may follow Pending: a continuation byte, in the narrower
  /// range the lead byte allows second (no overlong forms, surrogates or
  /// code points past U+10FFFF).
  bool continues(unsigned B) const {
    unsigned Lo = 0x80, Hi = 0xBF;
    if (Pending.size() == 1) {
      const unsigned Lead = static_cast<unsigned char>(Pending[0]);
      if (Lead == 0xE0)
        Lo = 0xA0;
      else if (Lead == 0xED)
        Hi = 0x9F;
      else if (Lead == 0xF0)
        Lo = 0x90;
      else if (Lead == 0xF4)
        Hi = 0x8F;
    }
    return B >= Lo && B <= Hi;
  }
  std::string Pending;
  size_t Need = 0;
};

/// Samples a byte from \p Logits (the first 256 entries): greedy at
/// temperature 0, else softmax(logits / T) over the top K (all if 0), with
/// the uniform variate \p U in [0, 1).
int32_t sampleToken(const float *Logits, double Temperature, int64_t TopK,
                    double U) {
  const int N = 256;
  std::vector<int> Idx(N);
  std::iota(Idx.begin(), Idx.end(), 0);
  // Most likely first; ties broken by the smaller id, so it is deterministic.
  std::stable_sort(Idx.begin(), Idx.end(), [&](int A, int B) {
    return Logits[A] > Logits[B];
  });
  if (Temperature <= 0)
    return Idx[0];
  int K = (TopK > 0 && TopK < N) ? int(TopK) : N;
  std::vector<double> W(static_cast<size_t>(K), 0.0);
  const double Max = Logits[Idx[0]];
  double Sum = 0;
  for (int I = 0; I < K; ++I)
    Sum += W[size_t(I)] = std::exp((double(Logits[Idx[size_t(I)]]) - Max) /
                                   Temperature);
  double Target = U * Sum, Acc = 0;
  for (int I = 0; I < K; ++I) {
    Acc += W[size_t(I)];
    if (Target < Acc)
      return Idx[size_t(I)];
  }
  return Idx[size_t(K - 1)];
}

int runGeneration(const Options &O, Setup &S) {
  const Program &P = *S.plan.program;
  Executor &E = *S.exec;
  const RankProgram &RP = E.rankProgram();
  const int64_t B = P.batch(), Seq = P.seq();
  std::vector<int32_t> Toks;
  for (unsigned char C : O.prompt)
    Toks.push_back(C);
  const size_t PromptLen = Toks.size();
  const uint64_t Key = splitmix64(S.seed ^ 0x67656e6572617465ull);
  std::unique_ptr<MpiCollectives> Comm = joinCollectives(P, WorldRank);
  // The device first: a setup that fails prints its error, not the
  // prompt and then the error.
  std::unique_ptr<DeviceSession> Dev;
  if (O.backend == "cuda" && !(Dev = openDevice(E)))
    return 1;
  ByteTextPrinter Text;
  if (WorldRank == 0) {
    for (int32_t C : Toks)
      std::fputs(Text.feed(C).c_str(), stdout);
    std::fflush(stdout);
  }
  // The rank whose logits choose the token (on a pipeline: the first of
  // the last stage); every other rank receives its choice.
  const int Chooser = outputRank(P, "logits");
  auto Start = std::chrono::steady_clock::now();
  int64_t New = 0;
  while (New < O.maxNewTokens && int64_t(Toks.size()) < Seq) {
    const int64_t Len = int64_t(Toks.size());
    int32_t Next = 0;
    try {
      if (RP.inputs())
      for (const Input *In : *RP.inputs()) {
        const int64_t Shift = In->kind()->str() == "labels" ? 1 : 0;
        int32_t *D = E.mutableBuffer(In->buffer()).i.data();
        for (int64_t Bi = 0; Bi < B; ++Bi)
          for (int64_t Si = 0; Si < Seq; ++Si)
            D[Bi * Seq + Si] =
                Si + Shift < Len ? Toks[size_t(Si + Shift)] : 0;
      }
      if (Dev) {
        Dev->forward();
        if (WorldRank == Chooser)
          Dev->pull(S.logitsBuf);
      } else {
        E.runForward(*Comm);
      }
      if (WorldRank == Chooser) {
        // (A padded vocabulary's logits are wider than the vocabulary.)
        const int64_t V = E.buffer(S.logitsBuf).shape.back();
        const float *Row =
            E.buffer(S.logitsBuf).f.data() + size_t((Len - 1) * V);
        double U = double(splitmix64(Key + uint64_t(New)) >> 11) * 0x1.0p-53;
        Next = sampleToken(Row, O.temperature, O.topK, U);
      }
    } catch (const std::exception &Ex) {
      abortJob(Ex);
    }
    // The ranks holding logits hold the same ones; the chooser's token is
    // everyone's.
    MPI_Bcast(&Next, 1, MPI_INT, Chooser, World);
    Toks.push_back(Next);
    ++New;
    if (WorldRank == 0) {
      std::fputs(Text.feed(Next).c_str(), stdout);
      std::fflush(stdout);
    }
  }
  double Sec = std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - Start)
                   .count();
  if (WorldRank == 0) {
    std::fputs(Text.flush().c_str(), stdout);
    std::fputc('\n', stdout);
  }
  info(O, "generated %lld tokens in %.2f s%s", (long long)New, Sec,
       New < O.maxNewTokens ? " (stopped: the sequence is full)" : "");
  (void)PromptLen;
  return 0;
}

/// Option checks with messages a user can act on (CLI11's own ranges let
/// NaN through, print a 300-digit bound, and say "not in range" of "abc").
/// An empty path is refused: an unset shell variable would otherwise turn
/// `--load-checkpoint "$CKPT"` into a silent fresh start.
/// Why \p Path cannot be a path ("" if it can): empty, as from an unset
/// shell variable (`--load-checkpoint "$CKPT"` was a silent fresh start).
std::string emptyPathProblem(const std::string &Path) {
  return Path.empty() ? "an empty path (an unset variable?)" : "";
}

const CLI::Validator
    NonEmptyPath([](std::string &V) { return emptyPathProblem(V); }, "",
                 "NonEmptyPath");

/// A file or directory megac-run writes: a path, and not "-", which names
/// standard output elsewhere (megac compile -o -) but would be a file
/// named "-" here; standard output carries the run's log.
const CLI::Validator OutputPath(
    [](std::string &V) {
      if (V == "-")
        return std::string("'-', which would be a file named '-' here "
                           "(standard output carries the run's log): name a "
                           "file");
      return emptyPathProblem(V);
    },
    "", "OutputPath");

CLI::Validator wholeNumberIn(int64_t Lo, int64_t Hi) {
  return CLI::Validator(
      [Lo, Hi](std::string &V) {
        errno = 0;
        char *End = nullptr;
        const long long N = std::strtoll(V.c_str(), &End, 10);
        if (V.empty() || *End || errno == ERANGE || N < Lo || N > Hi)
          return "expected a whole number from " + std::to_string(Lo) + " to " +
                 std::to_string(Hi) + ", got '" + V + "'";
        return std::string();
      },
      "", "WholeNumber");
}

CLI::Validator finiteIn(double Lo, double Hi, const char *Range) {
  return CLI::Validator(
      [Lo, Hi, Range](std::string &V) {
        char *End = nullptr;
        const double X = std::strtod(V.c_str(), &End);
        if (V.empty() || *End || !std::isfinite(X) || X < Lo || X > Hi)
          return std::string("expected a number ") + Range + ", got '" + V +
                 "'";
        return std::string();
      },
      "", "FiniteNumber");
}

/// --seed: digits only, at most 2^64 - 1 (strtoull would wrap "-1" and
/// clamp larger numbers silently).
const CLI::Validator SeedValue(
    [](std::string &V) {
      errno = 0;
      char *End = nullptr;
      const bool Digits =
          !V.empty() && V.find_first_not_of("0123456789") == std::string::npos;
      if (Digits)
        std::strtoull(V.c_str(), &End, 10);
      if (!Digits || errno == ERANGE)
        return "expected a whole number from 0 to 18446744073709551615, "
               "got '" +
               V + "'";
      return std::string();
    },
    "", "Seed");

int runMain(int Argc, char **Argv) {
  Options O;
  CLI::App App(
      "Runs a megac execution plan (.mgc) on CPUs or GPUs: one forward step, "
      "a training loop (plans compiled with a training config) or text "
      "generation.\n\n"
      "Each process executes its own rank's instruction stream, with the "
      "CPU's fp32 kernels (--backend cpu, exchanging tensors through MPI) "
      "or on one GPU (--backend cuda: the device of the launcher's local "
      "rank, OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK or SLURM_LOCALID, or "
      "the only one CUDA_VISIBLE_DEVICES leaves it; "
      "cuBLASLt products, bf16 plans on the tensor cores, the plan's "
      "generated kernels, NCCL collectives whose ids travel over MPI). "
      "Start one process per rank of the plan's grid:\n"
      "  mpirun -np N megac-run model.mgc      (Open MPI / MPICH)\n"
      "  srun -n N --mpi=pmix megac-run model.mgc   (Slurm)\n"
      "  torchrun --nproc-per-node N --no-python megac-run model.mgc\n"
      "  megac-run model.mgc                   (single-rank plans)\n"
      "Under torchrun (or any launcher that sets WORLD_SIZE > 1, RANK, "
      "MASTER_ADDR and MASTER_PORT and no MPI variables) the processes join "
      "one MPI world themselves: rank 0 starts Open MPI's ompi-server and "
      "meets the others at MASTER_ADDR (its host), on MASTER_PORT (the next "
      "port where torchrun's own store holds it; MEGAC_RENDEZVOUS_PORT "
      "overrides), waiting MEGAC_RENDEZVOUS_TIMEOUT seconds (300) for them "
      "to meet and for each to join. Every rank must run the same command "
      "line. A rank that ends early ends the others through its connection "
      "to rank 0.\n\n"
      "Parameters are loaded from a HuggingFace safetensors checkpoint "
      "(--weights) or initialized from a seed such that every sharding of a "
      "model starts from the same weights. Inputs are cut from a token "
      "stream (--tokens/--data or a seeded default).\n\n"
      "Training: megac-run plan.mgc --steps N [--data FILE] [--metrics "
      "FILE.jsonl] [--save-checkpoint DIR [--checkpoint-every K]] "
      "[--load-checkpoint DIR]. Step k (0-based, counted over the whole run) "
      "reads the global batch at stream position (k*global_batch*seq) mod "
      "(length - global_batch*seq - 1).\n"
      "Generation: megac-run plan.mgc --generate \"prompt\" "
      "[--max-new-tokens N] [--temperature T] [--top-k K] "
      "[--load-checkpoint DIR].",
      "megac-run");
  App.add_option("plan", O.plan, "Plan file written by megac (.mgc)")
      ->required()
      ->check(NonEmptyPath);
  App.add_option("--tokens", O.tokens,
                 "Token file: raw little-endian uint16 (nanoGPT .bin), an "
                 "llm.c .bin with its 1024-byte header, or a Megatron-LM "
                 "indexed dataset (PREFIX or PREFIX.bin beside PREFIX.idx; "
                 "its sequences in index order). A forward or "
                 "gradients plan reads the first B*seq+1 tokens, B the "
                 "global batch: tokens[b,s] = t[b*seq+s], labels[b,s] = "
                 "t[b*seq+s+1]; a training plan reads it as --data. "
                 "Default: a deterministic stream derived from the seed")
      ->option_text("FILE")
      ->check(NonEmptyPath);
  auto *WeightsOpt =
      App.add_option("--weights", O.weights,
                     "HuggingFace safetensors checkpoint (F32, F16 or BF16), "
                     "the index of a sharded one "
                     "(model.safetensors.index.json), or a model directory "
                     "holding either, or a checkpoint merged by "
                     "utils/merge_checkpoint.py (a new run from its "
                     "parameters, on any grid). "
                     "Each rank reads its slice of every parameter; names may "
                     "carry a \"transformer.\" prefix. Default: seeded init")
          ->option_text("FILE.safetensors")
          ->check(NonEmptyPath);
  App.add_option("--save-outputs", O.saveOutputs,
                 "Write the plan outputs plus the \"tokens\"/\"labels\" "
                 "inputs of the whole global batch as safetensors")
      ->option_text("FILE.safetensors")
      ->check(OutputPath);
  App.add_option("--sample", O.sample,
                 "How training steps read --data: sequential (consecutive "
                 "global batches, the default) or random (each row a window "
                 "at a position drawn from the seed, step and row, as "
                 "nanoGPT samples; resumes bit-exactly)")
      ->check(CLI::IsMember({"sequential", "random"}))
      ->option_text("sequential|random");
  App.add_option("--profile", O.profile,
                 "Time every instruction of rank 0 (device events on "
                 "--backend cuda, the host's clock on the CPU), print the "
                 "costliest ops with their FLOP/s and bytes/s, and write "
                 "the summary per op as JSON")
      ->option_text("FILE.json")
      ->check(OutputPath);
  App.add_option("--trace", O.trace,
                 "Write the measured timeline (every instruction of every "
                 "rank; forward runs and training steps) as Chrome "
                 "trace-event JSON, for Perfetto or chrome://tracing")
      ->option_text("FILE.json")
      ->check(OutputPath);
  App.add_option("--data", O.tokens,
                 "Training data: a token file as for --tokens (e.g. from "
                 "utils/prepare_text.py), cut into global batches")
      ->option_text("FILE")
      ->check(NonEmptyPath)
      ->excludes("--tokens");
  auto *StepsOpt =
      App.add_option("--steps", O.steps,
                     "Training steps to run (training plans; default 1). "
                     "After --load-checkpoint they continue the saved run")
          ->check(wholeNumberIn(1, int64_t(1) << 40))
          ->option_text("N");
  App.add_option("--metrics", O.metrics,
                 "Write one JSON object per step: {\"step\", \"loss\", "
                 "\"tokens_per_s\", \"lr\"}. With --load-checkpoint "
                 "the file continues: its lines up to the checkpoint's "
                 "step stay, later ones are dropped")
      ->option_text("FILE.jsonl")
      ->check(OutputPath);
  App.add_option("--save-checkpoint", O.saveCheckpoint,
                 "Save a sharded checkpoint (DIR/step-NNNNNNNN/, DIR/latest) "
                 "at the end of training; one run at a time saves into DIR "
                 "(a lock, DIR/.megac-lock)")
      ->option_text("DIR")
      ->check(OutputPath);
  App.add_option("--checkpoint-every", O.checkpointEvery,
                 "Also save every K steps")
      ->check(wholeNumberIn(1, int64_t(1) << 40))
      ->option_text("K");
  auto *LoadOpt =
      App.add_option("--load-checkpoint", O.loadCheckpoint,
                     "Load parameters (and optimizer state) from DIR/latest "
                     "or a step directory and resume after its step")
          ->option_text("DIR")
          ->check(NonEmptyPath);
  auto *GenOpt = App.add_option("--generate", O.prompt,
                                "Generate text from this prompt (byte-level "
                                "tokens; needs vocab >= 256)")
                     ->option_text("PROMPT");
  std::vector<CLI::Option *> GenerationOnly;
  GenerationOnly.push_back(
      App.add_option("--max-new-tokens", O.maxNewTokens,
                     "Tokens to generate (default 100; stops earlier when the "
                     "sequence is full)")
          ->check(wholeNumberIn(0, int64_t(1) << 40)));
  GenerationOnly.push_back(
      App.add_option("--temperature", O.temperature,
                     "Sampling temperature (default 0.8; 0 = greedy)")
          ->check(finiteIn(0.0, 1e6, "from 0 to 1e6")));
  GenerationOnly.push_back(
      App.add_option("--top-k", O.topK,
                     "Sample among the K most likely of the 256 byte "
                     "tokens (default 0, or 256 and more: all)")
          ->check(wholeNumberIn(0, int64_t(1) << 40)));
  auto *SeedOpt = App.add_option("--seed", O.seed,
                                 "Seed for parameter init, the default "
                                 "token stream, --sample random's windows, "
                                 "dropout masks and --generate's sampling "
                                 "(default: the plan's "
                                 "seed; after --load-checkpoint of a "
                                 "training run, the checkpoint's)")
                      ->check(SeedValue);
  App.add_option("--watchdog", O.watchdog,
                 "End the job (exit status 3) when this rank makes no "
                 "progress for this many seconds, as when a peer died or "
                 "hangs in a collective; 0: wait forever")
      ->check(finiteIn(0.0, 1e9, "from 0 to 1e9"))
      ->default_str("300");
  App.add_flag("--quiet,-q", O.quiet, "Print nothing but warnings and errors");
  App.add_option("--backend", O.backend,
                 "Execution backend: cpu, or cuda (libmegac_cuda.so beside "
                 "megac-run, or the library MEGAC_CUDA_PLUGIN names; "
                 "libmegac_cuda_emu.so runs it on a host emulation of CUDA). "
                 "Knobs of the cuda backend, to compare its choices "
                 "(defaults first): "
                 "MEGAC_CUDA_ATTENTION=auto|cudnn|mma|wmma, "
                 "MEGAC_CUDA_CUDNN_DETERMINISTIC=1|0, "
                 "MEGAC_CUDA_EPILOGUES=timed|1|0, "
                 "MEGAC_CUDA_BGRAD_EPILOGUE=1|0, "
                 "MEGAC_CUDA_BF16_COPIES=0, MEGAC_CUDA_BF16_ONLY=0, "
                 "MEGAC_CUDA_FORWARD_STATS=0, "
                 "MEGAC_CUDA_DQ_ATOMICS=0, MEGAC_CUDA_PARAM_COPIES=0, "
                 "MEGAC_CUDA_GEMM_TUNE=1, MEGAC_CUDA_GEMM_PROBE=1, "
                 "MEGAC_CUDA_WIDE_FORWARD=0, "
                 "MEGAC_CUDA_WIDE_KEY_GRAD=0, MEGAC_CUDA_LT_ALIGN=64, "
                 "MEGAC_CUDA_LT_REDUCTIONS=any, MEGAC_CUDA_LT_LOG=1, "
                 "MEGAC_CUDA_KERNEL_IMAGE=ptx "
                 "(docs/getting-started.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->default_str("cpu");
  App.add_option("--dump-plan", O.dumpPlan,
                 "Print the verified plan (text or json) and exit without "
                 "running it")
      ->check(CLI::IsMember({"text", "json"}))
      ->option_text("text|json");
  App.set_version_flag("--version", std::string("megac-run (") + kMegacRelease +
                                        ", plan format " +
                                        std::to_string(kPlanFormatVersion) +
                                        ")");
  App.footer("Exit status: 0 on success, 1 on any error (reported as one "
             "line \"megac-run: error: ...\" on stderr), 3 when the "
             "watchdog ends the job.");
  // "--steps=" would take the next argument as its value ("--quiet"), or
  // leave a stray one ("--data= --steps 1": "1 not expected"). Only an
  // option's own name before a last "=" counts: a prompt "-1 + 2 =" or
  // "--generate=1+1=" is a value.
  for (int I = 1; I < Argc; ++I) {
    const std::string A = Argv[I];
    if (A == "--")
      break;
    if (A.size() > 2 && A[0] == '-' && A.find('=') == A.size() - 1 &&
        App.get_option_no_throw(A.substr(0, A.size() - 1))) {
      if (WorldRank == 0)
        std::fprintf(stderr,
                     "megac-run: error: %s gives no value: write %sVALUE "
                     "or leave the option out\n",
                     A.c_str(), A.c_str());
      return 1;
    }
  }
  try {
    App.parse(Argc, Argv);
  } catch (const CLI::Success &E) { // --help, --help-all, --version
    std::ostringstream Null;
    return WorldRank == 0 ? App.exit(E) : App.exit(E, Null, Null);
  } catch (const CLI::ParseError &E) {
    if (WorldRank == 0)
      std::fprintf(stderr, "megac-run: error: %s (see --help)\n",
                   oneLine(E.what()).c_str());
    return 1;
  }
  O.haveSeed = SeedOpt->count() > 0;
  O.haveSteps = StepsOpt->count() > 0;
  O.generate = GenOpt->count() > 0;
  // --dump-plan runs nothing: an option for the run would be dropped
  // without a word (a misspelt --weights path too). --backend is let be:
  // the plan is the same for either backend.
  if (!O.dumpPlan.empty())
    for (const CLI::Option *Opt : App.get_options())
      if (Opt->count() && Opt->get_name() != "plan" &&
          Opt->get_name() != "--dump-plan" && Opt->get_name() != "--quiet" &&
          Opt->get_name() != "--backend") {
        if (WorldRank == 0)
          std::fprintf(stderr,
                       "megac-run: error: --dump-plan prints the plan and "
                       "runs nothing: %s would be ignored\n",
                       Opt->get_name().c_str());
        return 1;
      }
  // As megac compile says of options that change nothing.
  if (!O.generate && WorldRank == 0)
    for (const CLI::Option *Opt : GenerationOnly)
      if (Opt->count())
        std::fprintf(stderr,
                     "megac-run: warning: %s has no effect without "
                     "--generate\n",
                     Opt->get_name().c_str());
  if (WeightsOpt->count() && LoadOpt->count()) {
    if (WorldRank == 0)
      std::fprintf(stderr, "megac-run: error: --weights and "
                           "--load-checkpoint exclude each other\n");
    return 1;
  }

  // Phase 1: local work that may fail on bad input, then agreement.
  Setup S;
  std::string Err;
  try {
    prepare(O, S);
  } catch (const RunError &E) {
    Err = E.what();
  } catch (const std::bad_alloc &) {
    Err = "out of memory while preparing rank " + std::to_string(WorldRank);
  } catch (const std::exception &E) {
    Err = std::string("internal error: ") + E.what();
  }
  if (!agree(Err))
    return 1;
  // Only once every rank has accepted the run (its checkpoint, weights and
  // data too), so that a refused run leaves no directory behind.
  try {
    if (O.dumpPlan.empty())
      checkOutputsWritable(O);
    openMetrics(O, S);
  } catch (const RunError &E) {
    Err = E.what();
  } catch (const std::bad_alloc &) {
    Err = "out of memory while opening --metrics on rank " +
          std::to_string(WorldRank);
  } catch (const std::exception &E) {
    Err = std::string("internal error: ") + E.what();
  }
  if (!agree(Err))
    return 1;
  const Program &P = *S.plan.program;

  if (!O.dumpPlan.empty()) {
    // Its write error said here, while errno still holds it.
    if (WorldRank == 0 &&
        (std::fputs(O.dumpPlan == "json" ? dumpPlanJson(S.plan).c_str()
                                         : dumpPlanText(S.plan).c_str(),
                    stdout) == EOF ||
         std::fflush(stdout) != 0)) {
      std::fprintf(stderr,
                   "megac-run: error: cannot write standard output: %s\n",
                   std::strerror(errno));
      return 1;
    }
    return 0;
  }

  // The batch the user compiled (as megac compile's summary says it), not
  // one data-parallel rank's micro-batch.
  info(O, "plan %s: model %s, grid %s (%u %s), global batch %lld x seq %lld",
       O.plan.c_str(), P.model_name() ? P.model_name()->c_str() : "?",
       gridString(P).c_str(), P.world_size(),
       P.world_size() == 1 ? "rank" : "ranks", (long long)S.exec->globalBatch(),
       (long long)P.seq());
  unsigned long long Elems = S.exec->paramElements(), MaxElems = 0;
  MPI_Allreduce(&Elems, &MaxElems, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, World);
  if (!S.resumedFrom.empty()) {
    info(O, "parameters: %s elements per rank (loaded from checkpoint %s)",
         humanCount(MaxElems).c_str(), S.resumedFrom.c_str());
  } else if (O.weights.empty()) {
    info(O, "parameters: %s elements per rank (initialized from seed %llu)",
         humanCount(MaxElems).c_str(), (unsigned long long)S.seed);
  } else {
    size_t Total = S.exec->rankProgram().params()
                       ? S.exec->rankProgram().params()->size()
                       : 0;
    std::string Extra;
    if (S.loaded < Total)
      Extra = "; " + std::to_string(Total - S.loaded) +
              " without a checkpoint name initialized from seed " +
              std::to_string(S.seed);
    info(O, "parameters: %s elements per rank (loaded from %s%s)",
         humanCount(MaxElems).c_str(), O.weights.c_str(), Extra.c_str());
  }

  Watchdog Guard(*S.exec, O.watchdog, WorldRank);
  if (S.mode == Mode::Train)
    return runTraining(O, S);
  if (S.mode == Mode::Generate)
    return runGeneration(O, S);

  if (O.backend == "cuda")
    return runForwardOnDevice(O, S);

  // Phase 2: communication. Inputs are validated, so a failure here is an
  // internal error; abort the whole job rather than leave peers waiting.
  RunStats Stats;
  try {
    MpiCollectives Comm(P, uint32_t(WorldRank), World);
    MPI_Barrier(World);
    if (!O.trace.empty() || !O.profile.empty())
      S.exec->enableTrace(traceLimit(O));
    Stats = S.exec->run(Comm);
  } catch (const std::exception &E) {
    abortJob(E);
  }
  double MaxSec = 0;
  MPI_Allreduce(&Stats.seconds, &MaxSec, 1, MPI_DOUBLE, MPI_MAX, World);
  info(O, "forward step: %zu instructions (%zu collectives) per rank in %.1f ms",
       Stats.instructions, Stats.collectives, MaxSec * 1e3);
  if (!O.trace.empty() && !writeTrace(O, S))
    return 1;
  if (!O.profile.empty() && !writeDeviceOrHostProfile(O, S, nullptr, 1))
    return 1;
  return reportForward(O, S);
}

/// Prints a failure that happened before the ranks could agree on anything.
int failAlone(const std::exception &E) {
  std::fprintf(stderr, "megac-run: error: %s\n", oneLine(E.what()).c_str());
  std::fflush(stderr);
  return 1;
}

} // namespace

int main(int Argc, char **Argv) {
  LaunchedByLauncher = std::getenv("OMPI_COMM_WORLD_SIZE") ||
                       std::getenv("PMI_SIZE") || std::getenv("PMI_RANK") ||
                       std::getenv("PMIX_RANK");
  // A torchrun-style launch: the separately started processes join one MPI
  // world before anything else runs. A rank that cannot join exits at once;
  // the launcher then ends the others, as for any failed rank.
  std::optional<TorchrunLaunch> Torchrun;
  std::unique_ptr<TorchrunWorld> Joined;
  // (--help and --version answer at once, whatever the environment.)
  // (Short flags may come together: -qh.)
  bool JustAsking = false;
  for (int I = 1; I < Argc; ++I) {
    const char *A = Argv[I];
    JustAsking |=
        !std::strcmp(A, "--help") || !std::strcmp(A, "--version") ||
        (A[0] == '-' && std::isalpha(static_cast<unsigned char>(A[1])) &&
         std::strchr(A, 'h') &&
         std::all_of(A + 1, A + std::strlen(A), [](char C) {
           return std::isalpha(static_cast<unsigned char>(C));
         }));
  }
  try {
    if (!JustAsking)
      Torchrun = torchrunLaunch(Argc, Argv);
    if (Torchrun) {
      Joined = std::make_unique<TorchrunWorld>(*Torchrun, &Argc, &Argv);
      World = Joined->world();
      JoinedWorld = true;
      LaunchedByLauncher = true;
    }
  } catch (const RunError &E) {
    std::_Exit(failAlone(E));
  }
  if (!Torchrun)
    MPI_Init(&Argc, &Argv);
  kernels::pinBlasThreads();
  MPI_Comm_rank(World, &WorldRank);
  MPI_Comm_size(World, &WorldSize);
  int Rc;
  try {
    Rc = runMain(Argc, Argv);
  } catch (const std::exception &E) {
    std::fprintf(stderr, "megac-run: error: internal error: %s\n",
                 oneLine(E.what()).c_str());
    endJob();
  }
  // A report nobody received (stdout a full disk, a closed pipe) is a
  // failure too.
  errno = 0;
  if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && Rc == 0) {
    std::fprintf(stderr, "megac-run: error: cannot write standard output: %s\n",
                 std::strerror(errno ? errno : EIO));
    Rc = 1;
  }
  // (The joined world's ranks finish together: rank 0's ompi-server
  // must outlive every rank's MPI_Finalize, and a rank that ends before
  // saying so ends the others.)
  if (Torchrun) {
    MPI_Barrier(World);
    Joined->finish();
  }
  MPI_Finalize();
  Joined.reset();
  return Rc;
}
