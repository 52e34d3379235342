//===- Train.cpp - Training and forward runs ------------------------------===//
//
// Training steps and forward runs, on the CPU or the device.
//
//===----------------------------------------------------------------------===//

#include "MegacRun.h"

namespace megac_run {

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
  info(O,
       "training steps %lld..%lld on %s: global batch %lld x seq %lld "
       "(%llu tokens per step), lr %.3g -> %.3g (warmup %lld, cosine to "
       "step %lld)",
       (long long)First, (long long)Last,
       O.tokens.empty()
           ? "the seeded token stream"
           : (O.tokens + " (" + std::to_string(S.stream.length()) + " tokens)")
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
      Loss = LossRoot < 0 || LossRoot == WorldRank ? E.buffer(S.lossBuf).f[0]
                                                   : 0.0f;
      // A pipeline's loss lives on its last stage; every rank reports it.
      if (LossRoot >= 0)
        MPI_Bcast(&Loss, 1, MPI_FLOAT, LossRoot, World);
    } catch (const std::exception &Ex) {
      abortJob(Ex);
    }
    E.note();
    S.dataPos = nextDataPosition(S.dataPos, Stride, S.stream.length());
    double Sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - T0)
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
      const double PerStep =
          Done > 1 ? (TotalSec - FirstSec) / double(Done - 1) : TotalSec;
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

} // namespace megac_run
