//===- Record.cpp - What a run leaves -------------------------------------===//
//
// What a run leaves: metrics, outputs, checkpoints, traces and profiles.
//
//===----------------------------------------------------------------------===//

#include "MegacRun.h"

namespace megac_run {

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

namespace {

std::string outputName(const Output &O, const RankProgram &RP) {
  if (O.name() && O.name()->size())
    return O.name()->str();
  const Buffer *B = RP.buffers()->Get(O.buffer());
  if (B->name() && B->name()->size())
    return B->name()->str();
  return "output" + std::to_string(O.buffer());
}

} // namespace

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
    double Mean = N ? Sum / double(N) : 0,
           Rms = N ? std::sqrt(Sq / double(N)) : 0;
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
    Ts.push_back(
        {Name, T.isF32() ? "F32" : "I32", T.shape, T.data(), T.bytes()});
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

std::string divergedAdvice(const Setup &S) {
  std::string Advice = "compile the plan with a lower --lr";
  const std::string &Last = S.lastSaved.empty() ? S.resumedFrom : S.lastSaved;
  if (!Last.empty())
    Advice += " and resume from the last checkpoint, " + Last +
              ", or, if it diverges again, from an earlier one";
  return Advice;
}

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
    std::snprintf(Buf, sizeof(Buf), "%lld:%02lld:%02lld", T / 3600, T / 60 % 60,
                  T % 60);
  else
    std::snprintf(Buf, sizeof(Buf), "%lld:%02lld", T / 60, T % 60);
  return Buf;
}

namespace {

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

} // namespace

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
      std::snprintf(
          Buf, sizeof(Buf),
          "%s\n    {\"op\": \"%s\", \"instructions\": %llu, "
          "\"runs\": %llu, \"ms\": %.6f, \"share\": %.6f, "
          "\"flops\": %.6g, \"bytes\": %.6g, \"flops_per_s\": "
          "%.6g, \"bytes_per_s\": %.6g}",
          K ? "," : "", Order[K].first.c_str(), (unsigned long long)Sum.Instrs,
          (unsigned long long)Sum.Runs, Sum.Ms,
          Total > 0 ? Sum.Ms / Total : 0.0, Sum.Flops, Sum.Bytes,
          Sec > 0 ? Sum.Flops / Sec : 0.0, Sec > 0 ? Sum.Bytes / Sec : 0.0);
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

} // namespace megac_run
