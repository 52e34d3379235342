//===- Prepare.cpp - Checks before the run --------------------------------===//
//
// The failure-prone phase before the ranks agree: the plan, the options
// for its mode, the outputs' paths, the weights or checkpoint, the data.
//
//===----------------------------------------------------------------------===//

#include "MegacRun.h"

namespace megac_run {

namespace {

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
  // Each input and output so far: what the message calls it, its path,
  // and what writing over it would do.
  struct Taken {
    std::string What, Path, Harm;
  };
  const std::string Destroy = "writing it would destroy that";
  std::vector<Taken> Seen = {{"the plan " + O.plan, O.plan, Destroy}};
  // The path given and the files read for it. A Megatron prefix names no
  // file: one written there would be read as tokens next time, in the
  // dataset's place.
  auto addInputs = [&](const std::string &Flag, const std::string &Given,
                       const std::vector<std::string> &Files) {
    const bool Prefix =
        std::find(Files.begin(), Files.end(), Given) == Files.end() &&
        ::access(Given.c_str(), F_OK) != 0;
    Seen.push_back({Flag + " " + Given, Given,
                    Prefix ? "a file there would be read as tokens next "
                             "time, not the dataset it names"
                           : Destroy});
    for (const std::string &File : Files)
      if (File != Given)
        Seen.push_back(
            {File + ", which " + Flag + " " + Given + " reads", File, Destroy});
  };
  if (!O.weights.empty())
    addInputs("--weights", O.weights, WeightFiles::filesOf(O.weights));
  if (!O.tokens.empty())
    addInputs("--data/--tokens", O.tokens, tokenInputFiles(O.tokens));
  std::vector<std::string> Ids;
  for (const Taken &T : Seen)
    Ids.push_back(fileIdentity(T.Path));
  for (const auto &[Flag, Path] : Outputs) {
    if (Path->empty())
      continue;
    const std::string Id = fileIdentity(*Path);
    for (size_t I = 0; I < Seen.size() && !Id.empty(); ++I)
      if (Ids[I] == Id)
        throw RunError(Flag + " " + *Path + " is the same file as " +
                       Seen[I].What + ": " + Seen[I].Harm +
                       "; name another file");
    for (const std::string *Dir : {&O.loadCheckpoint, &O.saveCheckpoint})
      if (!Dir->empty() && isCheckpointFile(*Path, *Dir))
        throw RunError(
            Flag + " " + *Path + " is a file of the checkpoint " + *Dir +
            " (its latest, its lock, a step directory or a file in one): "
            "writing it would destroy that, or keep the step "
            "from being saved; name another file");
    Seen.push_back({Flag + " " + *Path, *Path, Destroy});
    Ids.push_back(Id);
  }
}

} // namespace

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

namespace {

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

} // namespace

size_t traceLimit(const Options &O) {
  const long Default = O.trace.empty() ? 4000000 : 1000000;
  return size_t(
      envWholeNumber("MEGAC_TRACE_LIMIT", 1, 1L << 40).value_or(Default));
}

namespace {

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
      throw RunError(Plan +
                     ": --generate uses byte-level tokens and needs a "
                     "vocabulary of at least 256 (the plan has " +
                     std::to_string(P.vocab_size()) + ")");
    // On a pipeline the last stage's ranks hold the logits.
    const int Owner = outputRank(P, "logits");
    const Output *L =
        Owner < 0 ? nullptr
                  : findOutput(*P.ranks()->Get(uint32_t(Owner)), "logits");
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

} // namespace

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

namespace {

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

} // namespace

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
  S.mode = O.generate  ? Mode::Generate
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
    throw RunError(O.tokens + ": holds " + std::to_string(S.stream.length()) +
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

} // namespace megac_run
