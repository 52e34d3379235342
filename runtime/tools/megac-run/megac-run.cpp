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

#include "MegacRun.h"

using namespace megac_run;

namespace {

/// Ends the job when this rank makes no progress for a while: a peer that
/// died or hangs leaves this rank waiting in a collective or a pipeline
/// receive forever. The launcher then stops the other ranks, since this
/// one exits non-zero. The message names the instruction it waited in.
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
      if (std::chrono::duration<double>(Clock::now() - Since).count() < Seconds)
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

// Option checks with messages a user can act on (CLI11's own ranges let
// NaN through, print a 300-digit bound, and say "not in range" of "abc").

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
        return std::string("'-', which would be a file or directory named "
                           "'-' here (standard output carries the run's "
                           "log): name another path");
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
    // The first write error is said, with its errno kept. (The JSON goes
    // out a rank at a time, as megac inspect writes it; a failed write
    // stops it.)
    int WriteErrno = 0;
    auto Put = [&WriteErrno](std::string_view Text) {
      if (std::fwrite(Text.data(), 1, Text.size(), stdout) != Text.size())
        WriteErrno = errno ? errno : EIO;
      return WriteErrno == 0;
    };
    bool Whole = true;
    if (WorldRank == 0) {
      Whole = O.dumpPlan == "json" ? writePlanJson(S.plan, -1, Put)
                                   : writePlanText(S.plan, -1, Put);
      if (!WriteErrno && std::fflush(stdout) != 0)
        WriteErrno = errno ? errno : EIO;
    }
    if (WriteErrno) {
      std::fprintf(stderr,
                   "megac-run: error: cannot write standard output: %s\n",
                   std::strerror(WriteErrno));
      return 1;
    }
    if (!Whole) {
      std::fprintf(stderr,
                   "megac-run: error: %s: the plan's JSON was cut "
                   "short (out of memory?)\n",
                   O.plan.c_str());
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
  info(O,
       "forward step: %zu instructions (%zu collectives) per rank in %.1f ms",
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
