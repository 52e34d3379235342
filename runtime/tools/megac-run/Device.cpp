//===- Device.cpp - The CUDA backend session ------------------------------===//
//
// The CUDA backend: its plugin, the device session, the ranks' settings.
//
//===----------------------------------------------------------------------===//

#include "MegacRun.h"

namespace megac_run {

namespace {

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
  const std::string Lib =
      Override && *Override ? std::string(Override) : Dir + "libmegac_cuda.so";
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
  for (const char *Var :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"})
    if (const std::optional<long> Local = envWholeNumber(
            Var, 0, INT_MAX,
            "the launcher's local rank, a whole number (it picks this "
            "rank's device)"))
      return int(*Local);
  return 0;
}

} // namespace

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
  Boot.transfer = [](int Peer, int64_t Tag, void *Data, size_t Bytes, bool Send,
                     void *Ctx) {
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
  DeviceRun *Run = Fn(&P, uint32_t(WorldRank), Device, &Boot, Err, sizeof(Err));
  SettingUpDevice.store(false);
  if (!Run)
    throw RunError(std::string("--backend cuda: ") + Err);
  return std::unique_ptr<DeviceRun>(Run);
}

namespace {

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

} // namespace

std::unique_ptr<DeviceSession> openDevice(Executor &E, Collectives *C) {
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

} // namespace megac_run
