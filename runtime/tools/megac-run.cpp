//===- megac-run.cpp - Execute a megac plan on CPUs with MPI --------------===//
//
// Every process loads the same plan, runs its own rank's instruction stream
// with fp32 CPU kernels and talks to its peers through MPI sub-communicators
// (one per grid axis). Rank 0 reports what happened and optionally saves the
// outputs.
//
// Error discipline: all work that can fail on bad input (plan, weights,
// tokens, memory) happens before the first communication, and the ranks then
// agree through one MPI_Allreduce whether everyone succeeded. A failure is
// reported once, as one line, and every rank exits 1, so nothing hangs in a
// collective waiting for a rank that has already given up.
//
//===----------------------------------------------------------------------===//

#include "error.h"
#include "executor.h"
#include "init.h"
#include "mpi_comm.h"
#include "safetensors.h"

#include "megac_rt/plan_file.h"

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <sstream>

using namespace megac_rt;
using namespace megac::plan;

namespace {

struct Options {
  std::string plan, tokens, weights, saveOutputs, dumpPlan;
  uint64_t seed = 0;
  bool haveSeed = false;
  bool quiet = false;
  std::string backend = "cpu";
};

int WorldRank = 0, WorldSize = 1;

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
  MPI_Allreduce(&Mine, &Lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
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

std::string gridString(const Program &P) {
  if (!P.axes() || P.axes()->size() == 0)
    return "single";
  std::string R;
  for (const Axis *A : *P.axes())
    R += (R.empty() ? "" : " x ") + A->name()->str() + "=" +
         std::to_string(A->size());
  return R;
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

/// If the process was started by a launcher MPI cannot see (torchrun), the
/// world-size mismatch deserves a more specific hint.
std::string launcherHint(uint32_t Want) {
  const char *Ws = std::getenv("WORLD_SIZE");
  if (WorldSize == 1 && Ws && std::atoi(Ws) > 1 && !std::getenv("OMPI_COMM_WORLD_SIZE") &&
      !std::getenv("PMI_SIZE") && !std::getenv("PMIX_RANK"))
    return "; WORLD_SIZE=" + std::string(Ws) +
           " is set (torchrun?) but this megac-run communicates through MPI "
           "and sees a single process: launch with mpirun -np " +
           std::to_string(Want);
  return "; launch with mpirun -np " + std::to_string(Want);
}

/// State built in the failure-prone phase.
struct Setup {
  LoadedPlan plan;
  std::unique_ptr<Executor> exec;
  uint64_t seed = 0;
  size_t loaded = 0;
};

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
                   launcherHint(P.world_size()));
  S.seed = O.haveSeed ? O.seed : P.seed();
  S.exec = std::make_unique<Executor>(P, uint32_t(WorldRank));
  S.exec->allocate();
  if (!O.weights.empty()) {
    SafetensorsFile W(O.weights);
    S.loaded = S.exec->loadParams(W, S.seed);
  } else {
    S.exec->initParams(S.seed);
  }
  size_t Need = S.exec->tokensNeeded();
  std::vector<int32_t> Stream =
      O.tokens.empty() ? defaultTokenStream(S.seed, Need, P.vocab_size())
                       : readTokenFile(O.tokens, Need, P.vocab_size());
  S.exec->setInputs(Stream);
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
  if (RP.outputs())
    for (const Output *Out : *RP.outputs())
      Add(outputName(*Out, RP), S.exec->buffer(Out->buffer()));
  if (RP.inputs())
    for (const Input *In : *RP.inputs())
      Add(In->kind()->str(), S.exec->buffer(In->buffer()));
  writeSafetensors(O.saveOutputs, Ts,
                   {{"producer", "megac-run"},
                    {"plan", O.plan},
                    {"seed", std::to_string(S.seed)}});
}

int runMain(int Argc, char **Argv) {
  Options O;
  CLI::App App(
      "Runs one forward step of a megac execution plan (.mgc) on CPUs.\n\n"
      "Each process executes its own rank's instruction stream with fp32 "
      "kernels and exchanges tensors through MPI. Start one process per "
      "rank of the plan's grid:\n"
      "  mpirun -np N megac-run model.mgc      (Open MPI / MPICH)\n"
      "  srun -n N --mpi=pmix megac-run model.mgc   (Slurm)\n"
      "  megac-run model.mgc                   (single-rank plans)\n"
      "torchrun --no-python works only for single-rank plans: this build "
      "communicates through MPI, which cannot see torchrun's process group.\n\n"
      "Parameters are loaded from a HuggingFace safetensors checkpoint "
      "(--weights) or initialized from a seed such that every sharding of a "
      "model starts from the same weights. Inputs are cut from a token "
      "stream (--tokens or a seeded default).",
      "megac-run");
  App.add_option("plan", O.plan, "Plan file written by megac (.mgc)")
      ->required();
  App.add_option("--tokens", O.tokens,
                 "Token file: raw little-endian uint16 (nanoGPT .bin) or an "
                 "llm.c .bin with its 1024-byte header. The first "
                 "batch*seq+1 tokens are used: tokens[b,s] = t[b*seq+s], "
                 "labels[b,s] = t[b*seq+s+1]. Default: a deterministic "
                 "stream derived from the seed")
      ->option_text("FILE");
  App.add_option("--weights", O.weights,
                 "HuggingFace safetensors checkpoint (F32, F16 or BF16). "
                 "Each rank reads its slice of every parameter; names may "
                 "carry a \"transformer.\" prefix. Default: seeded init")
      ->option_text("FILE.safetensors");
  App.add_option("--save-outputs", O.saveOutputs,
                 "Write the plan outputs plus the \"tokens\"/\"labels\" "
                 "inputs (rank 0's copies) as safetensors")
      ->option_text("FILE.safetensors");
  auto *SeedOpt = App.add_option("--seed", O.seed,
                                 "Seed for parameter init and the default "
                                 "token stream (default: the plan's seed)");
  App.add_flag("--quiet,-q", O.quiet, "Print nothing but errors");
  App.add_option("--backend", O.backend, "Execution backend")
      ->check(CLI::IsMember({"cpu"}))
      ->default_str("cpu");
  App.add_option("--dump-plan", O.dumpPlan,
                 "Print the verified plan (text or json) and exit without "
                 "running it")
      ->check(CLI::IsMember({"text", "json"}))
      ->option_text("text|json");
  App.footer("Exit status: 0 on success, 1 on any error (reported as one "
             "line \"megac-run: error: ...\" on stderr).");
  try {
    App.parse(Argc, Argv);
  } catch (const CLI::CallForHelp &E) {
    std::ostringstream Null;
    return WorldRank == 0 ? App.exit(E) : App.exit(E, Null, Null);
  } catch (const CLI::CallForAllHelp &E) {
    std::ostringstream Null;
    return WorldRank == 0 ? App.exit(E) : App.exit(E, Null, Null);
  } catch (const CLI::ParseError &E) {
    if (WorldRank == 0)
      std::fprintf(stderr, "megac-run: error: %s (see --help)\n",
                   oneLine(E.what()).c_str());
    return 1;
  }
  O.haveSeed = SeedOpt->count() > 0;

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
  const Program &P = *S.plan.program;

  if (!O.dumpPlan.empty()) {
    if (WorldRank == 0)
      std::fputs(O.dumpPlan == "json" ? dumpPlanJson(S.plan).c_str()
                                      : dumpPlanText(S.plan).c_str(),
                 stdout);
    return 0;
  }

  info(O, "plan %s: model %s, grid %s (%u %s), batch %lld x seq %lld",
       O.plan.c_str(), P.model_name() ? P.model_name()->c_str() : "?",
       gridString(P).c_str(), P.world_size(),
       P.world_size() == 1 ? "rank" : "ranks", (long long)P.batch(),
       (long long)P.seq());
  unsigned long long Elems = S.exec->paramElements(), MaxElems = 0;
  MPI_Allreduce(&Elems, &MaxElems, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX,
                MPI_COMM_WORLD);
  if (O.weights.empty()) {
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

  // Phase 2: communication. Inputs are validated, so a failure here is an
  // internal error; abort the whole job rather than leave peers waiting.
  RunStats Stats;
  try {
    MpiCollectives Comm(P, uint32_t(WorldRank));
    MPI_Barrier(MPI_COMM_WORLD);
    Stats = S.exec->run(Comm);
  } catch (const std::exception &E) {
    std::fprintf(stderr, "megac-run: error: %s\n", oneLine(E.what()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  double MaxSec = 0;
  MPI_Allreduce(&Stats.seconds, &MaxSec, 1, MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  info(O, "forward step: %zu instructions (%zu collectives) per rank in %.1f ms",
       Stats.instructions, Stats.collectives, MaxSec * 1e3);
  report(O, S);

  if (!O.saveOutputs.empty()) {
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
  }
  return 0;
}

} // namespace

int main(int Argc, char **Argv) {
  MPI_Init(&Argc, &Argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &WorldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &WorldSize);
  int Rc;
  try {
    Rc = runMain(Argc, Argv);
  } catch (const std::exception &E) {
    std::fprintf(stderr, "megac-run: error: internal error: %s\n",
                 oneLine(E.what()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    Rc = 1;
  }
  std::fflush(stdout);
  MPI_Finalize();
  return Rc;
}
