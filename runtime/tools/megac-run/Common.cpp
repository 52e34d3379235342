//===- Common.cpp - Ranks, agreement, job end -----------------------------===//
//
// The world of ranks, their agreement on failures, and ending the job.
//
//===----------------------------------------------------------------------===//

#include "MegacRun.h"

namespace megac_run {

std::atomic<DeviceRun *> LiveDevice{nullptr};

std::mutex LiveDeviceMutex;

std::atomic<bool> SettingUpDevice{false};

int WorldRank = 0, WorldSize = 1;

MPI_Comm World = MPI_COMM_WORLD;

bool JoinedWorld = false;

bool LaunchedByLauncher = false;

std::string oneLine(std::string S) {
  for (char &C : S)
    if (C == '\n' || C == '\r')
      C = ' ';
  return S;
}

bool agree(const std::string &Err) {
  int Mine = Err.empty() ? WorldSize : WorldRank, Lowest = WorldSize;
  MPI_Allreduce(&Mine, &Lowest, 1, MPI_INT, MPI_MIN, World);
  if (Lowest == WorldRank)
    std::fprintf(stderr, "megac-run: error: %s\n", oneLine(Err).c_str());
  return Lowest == WorldSize;
}

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

const Output *findOutput(const RankProgram &RP, const std::string &Name) {
  if (RP.outputs())
    for (const Output *O : *RP.outputs())
      if (O->name() && O->name()->str() == Name)
        return O;
  return nullptr;
}

int outputRank(const Program &P, const std::string &Name) {
  for (uint32_t R = 0; R < P.ranks()->size(); ++R)
    if (findOutput(*P.ranks()->Get(R), Name))
      return int(R);
  return -1;
}

int lossRank(const Program &P) { return outputRank(P, "loss"); }

bool updatesParams(const RankProgram &RP) {
  if (RP.instrs())
    for (const Instr *In : *RP.instrs())
      if (In->op() == op::AdamW || In->op() == op::Assign)
        return true;
  return false;
}

[[noreturn]] void endJob() {
  std::fflush(stdout);
  std::fflush(stderr);
  if (!JoinedWorld)
    MPI_Abort(World, 1);
  std::_Exit(1);
}

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

} // namespace megac_run
