//===- cuda_emu.cpp - The host stand-in for CUDA (see cuda_emu.h) ---------===//

#include "cuda_emu.h"
#include "env.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifndef MEGAC_EMU_CXX
#define MEGAC_EMU_CXX "c++"
#endif
#ifndef MEGAC_EMU_SIMT_HEADER
#error "the build names simt.h for run-time compiled kernels"
#endif

namespace megac_emu {
namespace {

//===-- The SIMT scheduler ------------------------------------------------===//
//
// Every thread of a block is a fiber on the calling thread. The scheduler
// runs each ready fiber until it ends or waits at a barrier; when none is
// ready, the barrier opens for all. Blocks run one after another.
//
// A launch makes a fiber per thread, so switches must be cheap: on x86-64
// a switch saves the callee-saved registers and swaps stacks (ucontext's
// swapcontext also saves the signal mask, a system call each time, which
// made the emulated backend ten times slower); elsewhere, ucontext.

constexpr size_t kStackBytes = 256 * 1024;

#if defined(__x86_64__)
extern "C" void megacEmuSwitch(void **SaveSp, void *NewSp);
asm(R"(
  .text
  .globl megacEmuSwitch
  .type megacEmuSwitch, @function
megacEmuSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size megacEmuSwitch, .-megacEmuSwitch
)");

/// A suspended execution: its stack pointer.
struct Context {
  void *Sp = nullptr;
};
inline void switchTo(Context &Save, Context &To) {
  megacEmuSwitch(&Save.Sp, To.Sp);
}
/// A context that starts \p Entry (which never returns) on \p Stack.
inline void makeContext(Context &C, char *Stack, size_t Bytes,
                        void (*Entry)()) {
  auto Top = reinterpret_cast<uintptr_t>(Stack + Bytes) & ~uintptr_t(15);
  auto *Sp = reinterpret_cast<void **>(Top) - 8;
  for (int K = 0; K < 6; ++K) // r15 r14 r13 r12 rbx rbp
    Sp[K] = nullptr;
  Sp[6] = reinterpret_cast<void *>(Entry); // where the first switch returns
  Sp[7] = nullptr; // Entry's return address: it never returns
  C.Sp = Sp;
}
#else
struct Context {
  ucontext_t U;
};
inline void switchTo(Context &Save, Context &To) {
  swapcontext(&Save.U, &To.U);
}
inline void makeContext(Context &C, char *Stack, size_t Bytes,
                        void (*Entry)()) {
  getcontext(&C.U);
  C.U.uc_stack.ss_sp = Stack;
  C.U.uc_stack.ss_size = Bytes;
  C.U.uc_link = nullptr;
  makecontext(&C.U, Entry, 0);
}
#endif

struct Fiber {
  Context Ctx;
  ThreadState State;
  std::unique_ptr<char[]> Stack;
  bool Done = false;
};

struct Scheduler {
  Context Main;
  std::vector<Fiber> Fibers;
  Fiber *Current = nullptr;
  const std::function<void()> *Body = nullptr;
  std::vector<double> Exchange;
  std::vector<unsigned char> Slots; // warpExchange's, kWarpSlotBytes each
  std::vector<char> Shared;
};

Scheduler &scheduler() {
  static Scheduler S;
  return S;
}

ThreadState *currentThread() { return &scheduler().Current->State; }

void syncThreads() {
  Scheduler &S = scheduler();
  switchTo(S.Current->Ctx, S.Main);
}

double shuffleXor(double V, int LaneMask) {
  Scheduler &S = scheduler();
  const unsigned T = S.Current->State.Thread.x;
  S.Exchange[T] = V;
  syncThreads();
  const unsigned Partner = (T & ~31u) | ((T & 31u) ^ unsigned(LaneMask));
  const double R = Partner < S.Exchange.size() ? S.Exchange[Partner] : V;
  syncThreads();
  return R;
}

void *dynamicShared() { return scheduler().Shared.data(); }

const unsigned char *warpExchange(const void *Mine, unsigned Bytes) {
  Scheduler &S = scheduler();
  const unsigned T = S.Current->State.Thread.x;
  if (Bytes > kWarpSlotBytes) {
    std::fprintf(stderr, "cuda emulation: a warp exchange of %u bytes\n",
                 Bytes);
    std::abort();
  }
  std::memcpy(&S.Slots[size_t(T) * kWarpSlotBytes], Mine, Bytes);
  syncThreads();
  return &S.Slots[size_t(T & ~31u) * kWarpSlotBytes];
}

[[noreturn]] void fiberEntry() {
  Scheduler &S = scheduler();
  (*S.Body)();
  S.Current->Done = true;
  switchTo(S.Current->Ctx, S.Main);
  std::abort(); // a finished fiber is never resumed
}

const SimtApi TheApi = {currentThread, syncThreads, shuffleXor, dynamicShared,
                        warpExchange};

struct BindApi {
  BindApi() { simtApi = &TheApi; }
} Binder;

} // namespace

namespace {
/// Ends the process for a knob set to what the emulation cannot play,
/// as the program's own errors read ("megac-run: error: ...").
[[noreturn]] void badKnob(const char *Name, const std::string &Value,
                          const std::string &Expected) {
  std::fprintf(stderr, "%s: error: %s is '%s': expected %s\n",
               program_invocation_short_name, Name, Value.c_str(),
               Expected.c_str());
  std::_Exit(1); // (maybe on a kernel thread's fiber: no unwinding)
}
} // namespace

std::string knob(const char *Name,
                 std::initializer_list<const char *> Choices) {
  const char *E = std::getenv(Name);
  const std::string Value = E && *E ? E : *Choices.begin();
  std::string Expected;
  for (const char *C : Choices) {
    if (Value == C)
      return Value;
    Expected += Expected.empty() ? std::string(C) + " (the default)"
                                 : std::string(" or ") + C;
  }
  badKnob(Name, Value, Expected);
}

long wholeKnob(const char *Name, long Lo, long Hi, long Default) {
  try {
    return megac_rt::envWholeNumber(Name, Lo, Hi).value_or(Default);
  } catch (const std::exception &E) { // (its message names the knob)
    std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name,
                 E.what());
    std::_Exit(1);
  }
}

bool &threadsInReverse() {
  static bool Reverse =
      knob("MEGAC_CUDA_EMU_THREAD_ORDER", {"forward", "reverse"}) == "reverse";
  return Reverse;
}

namespace {
void launchNow(Dim3 Grid, Dim3 Block, size_t SharedBytes,
               const std::function<void()> &Body) {
  Scheduler &S = scheduler();
  const size_t Threads = size_t(Block.x) * Block.y * Block.z;
  if (S.Fibers.size() < Threads)
    S.Fibers.resize(Threads);
  S.Exchange.assign(Threads, 0.0);
  // Whole warps of slots: a partial last warp reads zeros past its end.
  S.Slots.assign((Threads + 31) / 32 * 32 * kWarpSlotBytes, 0);
  // The launch's dynamic shared memory, then a guard of bytes 0xff (NaN
  // as fp32 and as bf16): a kernel reading past what it asked for reads
  // NaNs, and one writing there is caught after its block.
  constexpr size_t kGuard = 64;
  S.Shared.assign(SharedBytes + kGuard, char(0xff));
  std::fill(S.Shared.begin(), S.Shared.begin() + SharedBytes, char(0));
  auto guardIntact = [&] {
    return std::all_of(S.Shared.begin() + SharedBytes, S.Shared.end(),
                       [](char C) { return C == char(0xff); });
  };
  S.Body = &Body;
  for (unsigned Bz = 0; Bz < Grid.z; ++Bz)
    for (unsigned By = 0; By < Grid.y; ++By)
      for (unsigned Bx = 0; Bx < Grid.x; ++Bx) {
        for (size_t T = 0; T < Threads; ++T) {
          Fiber &F = S.Fibers[T];
          if (!F.Stack)
            F.Stack.reset(new char[kStackBytes]);
          F.Done = false;
          F.State.Block = {Bx, By, Bz};
          F.State.GridSize = Grid;
          F.State.BlockSize = Block;
          F.State.Thread = {unsigned(T % Block.x),
                            unsigned(T / Block.x % Block.y),
                            unsigned(T / (size_t(Block.x) * Block.y))};
          makeContext(F.Ctx, F.Stack.get(), kStackBytes, fiberEntry);
        }
        // Each pass runs every live fiber to its end or to the barrier;
        // a pass that ends some but not all fibers opens the barrier too
        // (threads that returned no longer count, as on Volta and later).
        const bool Reverse = threadsInReverse();
        for (bool Live = true; Live;) {
          Live = false;
          for (size_t K = 0; K < Threads; ++K) {
            Fiber &F = S.Fibers[Reverse ? Threads - 1 - K : K];
            if (F.Done)
              continue;
            S.Current = &F;
            switchTo(S.Main, F.Ctx);
            Live |= !F.Done;
          }
        }
        S.Current = nullptr;
        if (!guardIntact()) {
          std::fprintf(stderr,
                       "cuda emulation: block (%u, %u, %u) of a launch wrote "
                       "past the %zu bytes of dynamic shared memory it asked "
                       "for\n",
                       Bx, By, Bz, SharedBytes);
          std::abort();
        }
      }
}

/// A stream's queued work; an operation returns false while it must wait
/// (for an event not yet reached).
struct StreamQueue {
  bool Eager = false;
  std::deque<std::function<bool()>> Ops;
};
std::vector<StreamQueue *> &streams() {
  static std::vector<StreamQueue *> All;
  return All;
}
StreamQueue *queueOf(cudaStream_t S) {
  return reinterpret_cast<StreamQueue *>(S);
}

/// Runs queued work of every deferred stream until \p Done holds (or all
/// queues are empty when it is null). A wait nothing can satisfy is a
/// deadlock the backend must never make: it aborts.
void drain(const std::function<bool()> &Done) {
  for (;;) {
    if (Done && Done())
      return;
    bool Progress = false, Left = false;
    for (StreamQueue *Q : streams())
      while (!Q->Ops.empty()) {
        if (!Q->Ops.front()())
          break;
        Q->Ops.pop_front();
        Progress = true;
        if (Done && Done())
          return;
      }
    for (StreamQueue *Q : streams())
      Left |= !Q->Ops.empty();
    if (!Left && !Done)
      return;
    if (!Progress) {
      std::fprintf(stderr, "cuda emulation: streams wait for each other "
                           "(deadlock)\n");
      std::abort();
    }
  }
}

/// Runs \p Q's queue to its end; while \p Q waits, the other streams run
/// one operation at a time until it can go on.
void drainStream(StreamQueue *Q) {
  while (!Q->Ops.empty()) {
    if (Q->Ops.front()()) {
      Q->Ops.pop_front();
      continue;
    }
    bool Progress = false;
    for (StreamQueue *Other : streams())
      if (Other != Q && !Other->Ops.empty() && Other->Ops.front()()) {
        Other->Ops.pop_front();
        Progress = true;
        break;
      }
    if (!Progress) {
      std::fprintf(stderr, "cuda emulation: streams wait for each other "
                           "(deadlock)\n");
      std::abort();
    }
  }
}

} // namespace

void submit(cudaStream_t S, std::function<void()> Work) {
  StreamQueue *Q = queueOf(S);
  if (!Q || Q->Eager) {
    Work();
    return;
  }
  Q->Ops.push_back([W = std::move(Work)] {
    W();
    return true;
  });
}

void launch(Dim3 Grid, Dim3 Block, size_t SharedBytes, cudaStream_t S,
            std::function<void()> Body) {
  submit(S, [=] { launchNow(Grid, Block, SharedBytes, Body); });
}

bool tracing() {
  static const bool On = knob("MEGAC_CUDA_EMU_TRACE", {"0", "1"}) == "1";
  return On;
}

void traceLine(const std::string &Line) {
  if (tracing())
    std::fprintf(stderr, "megac-emu: %s\n", Line.c_str());
}

void traceKernel(const void *Fn, Dim3 Grid, Dim3 Block) {
  if (!tracing())
    return;
  std::string Name = "?";
  Dl_info Info{};
  if (::dladdr(Fn, &Info) && Info.dli_sname) {
    int Status = 0;
    char *Plain =
        abi::__cxa_demangle(Info.dli_sname, nullptr, nullptr, &Status);
    Name = Status == 0 && Plain ? Plain : Info.dli_sname;
    std::free(Plain);
    // "void ns::name<T>(params)" -> "name<T>": the parameters start at the
    // first '(' outside template arguments, the name after the last "::"
    // before it, after the return type's space.
    int Depth = 0;
    size_t Open = Name.size();
    for (size_t I = 0; I < Name.size() && Open == Name.size(); ++I) {
      Depth += Name[I] == '<';
      Depth -= Name[I] == '>';
      if (Name[I] == '(' && Depth == 0)
        Open = I;
    }
    Name.resize(Open);
    const size_t Angle = std::min(Name.find('<'), Name.size());
    const size_t Scope = Name.rfind("::", Angle);
    const size_t Space = Name.rfind(' ', Angle);
    const size_t From = Scope != std::string::npos   ? Scope + 2
                        : Space != std::string::npos ? Space + 1
                                                     : 0;
    Name = Name.substr(From);
  }
  traceLine("kernel " + Name + " " + std::to_string(Grid.x * Grid.y * Grid.z) +
            "x" + std::to_string(Block.x * Block.y * Block.z));
}

namespace {

//===-- Modules compiled from source -----------------------------------===//

struct Module {
  void *Handle = nullptr;
  std::string Name;
  void (*Entry)(const SimtApi *, void **) = nullptr;
  /// Parameters (pointers and 64-bit integers: 8 bytes each).
  size_t Params = 0;
};

std::string run(const std::string &Command) {
  std::string Out;
  FILE *Pipe = ::popen((Command + " 2>&1").c_str(), "r");
  if (!Pipe)
    return "cannot start: " + Command;
  char Buf[4096];
  size_t N;
  while ((N = std::fread(Buf, 1, sizeof(Buf), Pipe)) > 0)
    Out.append(Buf, N);
  const int Status = ::pclose(Pipe);
  return Status == 0 ? std::string() : (Out.empty() ? "failed" : Out);
}

} // namespace

CUresult moduleFromSource(CUmodule *M, const std::string &Source,
                          const std::string &Name,
                          const std::vector<std::string> &ParamTypes,
                          std::string &Error) {
  char Dir[] = "/tmp/megac-emu-XXXXXX";
  if (!::mkdtemp(Dir)) {
    Error = "mkdtemp failed";
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const std::string Src = std::string(Dir) + "/kernel.cpp";
  const std::string Lib = std::string(Dir) + "/kernel.so";
  {
    std::ofstream Out(Src);
    Out << "#include \"" MEGAC_EMU_SIMT_HEADER "\"\n" << Source << "\n";
    // The entry the emulator calls: binds the SIMT table, unpacks the
    // arguments as cuLaunchKernel gets them.
    Out << "extern \"C\" void megac_emu_entry(const megac_emu::SimtApi *A, "
           "void **Args) {\n  megac_emu::simtApi = A;\n  "
        << Name << "(";
    for (size_t K = 0; K < ParamTypes.size(); ++K)
      Out << (K ? ", " : "") << "*static_cast<" << ParamTypes[K] << " *>(Args["
          << K << "])";
    Out << ");\n}\n";
  }
  Error = run(std::string(MEGAC_EMU_CXX) +
              " -std=c++17 -O1 -shared -fPIC -w -o " + Lib + " " + Src);
  void *Handle =
      Error.empty() ? ::dlopen(Lib.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (Error.empty() && !Handle)
    Error = ::dlerror();
  ::unlink(Src.c_str());
  ::unlink(Lib.c_str());
  ::rmdir(Dir);
  if (!Handle)
    return CUDA_ERROR_INVALID_IMAGE;
  auto *Mod = new Module{Handle, Name, nullptr, ParamTypes.size()};
  for (const std::string &T : ParamTypes)
    if (T.back() != '*' && T != "long long") {
      Error = "parameter type " + T + " is not 8 bytes";
      delete Mod;
      ::dlclose(Handle);
      return CUDA_ERROR_INVALID_IMAGE;
    }
  Mod->Entry = reinterpret_cast<void (*)(const SimtApi *, void **)>(
      ::dlsym(Handle, "megac_emu_entry"));
  *M = reinterpret_cast<CUmodule>(Mod);
  return CUDA_SUCCESS;
}

} // namespace megac_emu

using namespace megac_emu;

//===-- Runtime API ----------------------------------------------------===//

const char *cudaGetErrorString(cudaError_t E) {
  return E == cudaSuccess ? "no error" : "out of memory (host emulation)";
}
cudaError_t cudaGetDeviceCount(int *Count) {
  // Each rank of a node picks the device of its local rank: the host has
  // as many emulated devices as any launch here uses, unless
  // CUDA_VISIBLE_DEVICES lists some (as CUDA counts them: its entries).
  *Count = 64;
  if (const char *Visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string List = Visible;
    *Count = List.empty() ? 0 : int(std::count(List.begin(), List.end(), ',')) + 1;
  }
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *Prop, int) {
  std::snprintf(Prop->name, sizeof(Prop->name), "host emulation of CUDA");
  // sm_90, or what MEGAC_CUDA_EMU_SM names (75 plays a T4), to test what
  // the backend says of other devices.
  const int Cc = int(megac_emu::wholeKnob("MEGAC_CUDA_EMU_SM", 10, 999, 90));
  Prop->major = Cc / 10;
  Prop->minor = Cc % 10;
  Prop->totalGlobalMem = size_t(1) << 34;
  // An H100's limit; MEGAC_CUDA_EMU_SHARED_OPTIN sets another (an sm_86
  // device's 101376 bytes, say) to test what a smaller device refuses.
  Prop->sharedMemPerBlockOptin = size_t(
      megac_emu::wholeKnob("MEGAC_CUDA_EMU_SHARED_OPTIN", 0, 1L << 30, 232448));
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **Ptr, size_t Bytes) {
  // Device memory is uninitialized: fill it with NaNs' bytes so that a
  // kernel reading what nothing wrote shows in the results.
  *Ptr = std::aligned_alloc(256, (Bytes + 255) / 256 * 256);
  if (!*Ptr)
    return cudaErrorMemoryAllocation;
  std::memset(*Ptr, 0xff, Bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void *Ptr) {
  drain(nullptr); // as CUDA's, it waits for the device
  std::free(Ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *Dst, const void *Src, size_t Bytes,
                       cudaMemcpyKind) {
  std::memmove(Dst, Src, Bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *Ptr, int Value, size_t Bytes) {
  std::memset(Ptr, Value, Bytes);
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }

struct CUevent_st {
  std::chrono::steady_clock::time_point At;
  // Records issued and records that ran: a wait is for the records issued
  // before it, as CUDA's waits for the latest record at the time.
  uint64_t Recorded = 0, Completed = 0;
  bool Timed = true;
};
cudaError_t cudaEventCreate(cudaEvent_t *E) {
  *E = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *E, unsigned Flags) {
  *E = new CUevent_st;
  (*E)->Timed = !(Flags & cudaEventDisableTiming);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t E) {
  delete E;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t E, cudaStream_t S) {
  StreamQueue *Q = queueOf(S);
  ++E->Recorded;
  if (!Q || Q->Eager) {
    E->At = std::chrono::steady_clock::now();
    ++E->Completed;
    return cudaSuccess;
  }
  Q->Ops.push_back([E] {
    E->At = std::chrono::steady_clock::now();
    ++E->Completed;
    return true;
  });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t S, cudaEvent_t E, unsigned) {
  StreamQueue *Q = queueOf(S);
  const uint64_t Target = E->Recorded;
  if (!Q || Q->Eager) {
    // The eager stream goes on only once the event's stream got there.
    drain([E, Target] { return E->Completed >= Target; });
    return cudaSuccess;
  }
  Q->Ops.push_back([E, Target] { return E->Completed >= Target; });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *S, unsigned) {
  auto *Q = new StreamQueue;
  // Normally the first stream (compute) is eager and later ones
  // (collectives) deferred; MEGAC_CUDA_EMU_DEFER=first swaps the roles, to
  // check the hand-over from compute to collectives instead.
  const bool DeferFirst =
      megac_emu::knob("MEGAC_CUDA_EMU_DEFER", {"later", "first"}) == "first";
  const bool First = streams().empty();
  Q->Eager = DeferFirst ? !First : First;
  streams().push_back(Q);
  *S = reinterpret_cast<cudaStream_t>(Q);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t S) {
  drain(nullptr);
  auto &All = streams();
  All.erase(std::remove(All.begin(), All.end(), queueOf(S)), All.end());
  delete queueOf(S);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t S) {
  // An eager stream's work is done; a deferred one runs its queue, and
  // others only as far as it waits for them.
  StreamQueue *Q = queueOf(S);
  if (!Q || Q->Eager)
    return cudaSuccess;
  drainStream(Q);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *Dst, const void *Src, size_t Bytes,
                            cudaMemcpyKind Kind, cudaStream_t S) {
  if (Kind == cudaMemcpyDeviceToDevice)
    megac_emu::traceLine("copy " + std::to_string(Bytes) + " bytes");
  if (Kind == cudaMemcpyHostToDevice) {
    // Pageable host memory is staged before the call returns: the caller
    // may reuse it at once.
    auto Copy = std::make_shared<std::vector<char>>(
        static_cast<const char *>(Src), static_cast<const char *>(Src) + Bytes);
    submit(S, [=] { std::memcpy(Dst, Copy->data(), Bytes); });
    return cudaSuccess;
  }
  submit(S, [=] { std::memmove(Dst, Src, Bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *Ptr, int Value, size_t Bytes,
                            cudaStream_t S) {
  megac_emu::traceLine("fill " + std::to_string(Bytes) + " bytes");
  submit(S, [=] { std::memset(Ptr, Value, Bytes); });
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *Ms, cudaEvent_t Start,
                                 cudaEvent_t End) {
  if (!Start->Timed || !End->Timed)
    return cudaErrorInvalidResourceHandle;
  *Ms = std::chrono::duration<float, std::milli>(End->At - Start->At).count();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  drain(nullptr);
  return cudaSuccess;
}

//===-- Driver API -----------------------------------------------------===//

CUresult cuGetErrorString(CUresult R, const char **Msg) {
  *Msg = R == CUDA_SUCCESS ? "no error" : "kernel did not compile on the host";
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule M) {
  auto *Mod = reinterpret_cast<Module *>(M);
  ::dlclose(Mod->Handle);
  delete Mod;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction *F, CUmodule M, const char *Name) {
  auto *Mod = reinterpret_cast<Module *>(M);
  if (Mod->Name != Name || !Mod->Entry)
    return CUDA_ERROR_INVALID_IMAGE;
  *F = reinterpret_cast<CUfunction>(Mod);
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction F, unsigned GridX, unsigned GridY,
                        unsigned GridZ, unsigned BlockX, unsigned BlockY,
                        unsigned BlockZ, unsigned SharedBytes, CUstream Stream,
                        void **Args, void **) {
  auto *Mod = reinterpret_cast<Module *>(F);
  megac_emu::traceLine("kernel " + Mod->Name + " " +
                       std::to_string(GridX * GridY * GridZ) + "x" +
                       std::to_string(BlockX * BlockY * BlockZ));
  // The argument array points at the caller's variables: copy the values
  // now (as CUDA does), the launch may run later.
  auto Values = std::make_shared<std::vector<uint64_t>>(Mod->Params);
  for (size_t K = 0; K < Mod->Params; ++K)
    std::memcpy(&(*Values)[K], Args[K], 8);
  const Dim3 Grid{GridX, GridY, GridZ}, Block{BlockX, BlockY, BlockZ};
  megac_emu::submit(Stream, [=] {
    std::vector<void *> Ptrs(Values->size());
    for (size_t K = 0; K < Values->size(); ++K)
      Ptrs[K] = &(*Values)[K];
    launchNow(Grid, Block, SharedBytes,
              [&] { Mod->Entry(&TheApi, Ptrs.data()); });
  });
  return CUDA_SUCCESS;
}

//===-- cuBLAS ---------------------------------------------------------===//

struct cublasContext {
  cudaStream_t Stream = nullptr;
};
cublasStatus_t cublasCreate(cublasHandle_t *H) {
  *H = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t H, cudaStream_t S) {
  H->Stream = S;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *Workspace,
                                  size_t Bytes) {
  return Workspace || !Bytes ? CUBLAS_STATUS_SUCCESS
                             : CUBLAS_STATUS_INVALID_VALUE;
}

namespace {
cublasStatus_t gemmNow(cublasHandle_t, cublasOperation_t TransA,
                       cublasOperation_t TransB, int M, int N, int K,
                       const float *Alpha, const float *A, int Lda,
                       long long StrideA, const float *B, int Ldb,
                       long long StrideB, const float *Beta, float *C, int Ldc,
                       long long StrideC, int BatchCount) {
  // cuBLAS checks its leading dimensions; so does the stand-in, since a
  // wrong one is exactly the mistake it is here to catch.
  if (M < 0 || N < 0 || K < 0 ||
      Lda < std::max(1, TransA == CUBLAS_OP_N ? M : K) ||
      Ldb < std::max(1, TransB == CUBLAS_OP_N ? K : N) || Ldc < std::max(1, M))
    return CUBLAS_STATUS_INVALID_VALUE;
  for (int Batch = 0; Batch < BatchCount; ++Batch) {
    const float *Ab = A + Batch * StrideA, *Bb = B + Batch * StrideB;
    float *Cb = C + Batch * StrideC;
    for (int J = 0; J < N; ++J)
      for (int I = 0; I < M; ++I) {
        double S = 0;
        for (int P = 0; P < K; ++P) {
          const float Aip = TransA == CUBLAS_OP_N ? Ab[I + size_t(P) * Lda]
                                                  : Ab[P + size_t(I) * Lda];
          const float Bpj = TransB == CUBLAS_OP_N ? Bb[P + size_t(J) * Ldb]
                                                  : Bb[J + size_t(P) * Ldb];
          S += double(Aip) * double(Bpj);
        }
        float &Cij = Cb[I + size_t(J) * Ldc];
        // beta = 0 ignores C (it may hold NaNs), as cuBLAS does.
        Cij = float(double(*Alpha) * S +
                    (*Beta == 0.0f ? 0.0 : double(*Beta) * double(Cij)));
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

/// The bf16 bits of \p X, rounded to nearest even (a NaN stays one), as
/// cuBLAS converts its fp32 accumulation to a bf16 result.
uint16_t bf16Nearest(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  if ((U & 0x7f800000u) == 0x7f800000u) {
    if (U & 0x007fffffu)
      U |= 0x00400000u;
  } else {
    U += 0x7fffu + ((U >> 16) & 1u);
  }
  return uint16_t(U >> 16);
}

/// An operand widened to fp32 (bf16 is fp32's upper half), for the
/// reference product.
std::vector<float> widenOperand(const void *X, cudaDataType_t T, size_t N) {
  std::vector<float> W(N);
  for (size_t I = 0; I < N; ++I)
    W[I] =
        T == CUDA_R_32F
            ? static_cast<const float *>(X)[I]
            : uintAsFloat(unsigned(static_cast<const uint16_t *>(X)[I]) << 16);
  return W;
}
} // namespace

/// traceLine "product <m>x<n>x<k>[x<batch>] <in>-><out>[ <epilogue>]",
/// column-major as cuBLAS sees it.
void traceProduct(int M, int N, int K, int Batch, cudaDataType_t In,
                  cudaDataType_t Out, const char *Epilogue = "") {
  if (!megac_emu::tracing())
    return;
  auto Type = [](cudaDataType_t T) {
    return T == CUDA_R_16BF ? "bf16" : "fp32";
  };
  megac_emu::traceLine(
      "product " + std::to_string(M) + "x" + std::to_string(N) + "x" +
      std::to_string(K) + (Batch > 1 ? "x" + std::to_string(Batch) : "") + " " +
      Type(In) + "->" + Type(Out) + (*Epilogue ? " " : "") + Epilogue);
}

cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t H, cublasOperation_t TransA, cublasOperation_t TransB, int M,
    int N, int K, const float *Alpha, const float *A, int Lda,
    long long StrideA, const float *B, int Ldb, long long StrideB,
    const float *Beta, float *C, int Ldc, long long StrideC, int BatchCount) {
  // On the handle's stream; alpha and beta are the caller's, read now,
  // and the arguments are checked now, as cuBLAS does.
  const float Al = *Alpha, Be = *Beta;
  // MEGAC_CUDA_EMU_FAIL_GEMM=N: the Nth fp32 product of the process fails,
  // as a device fault would, for the tests of one rank failing mid-step.
  static const long FailAt =
      megac_emu::wholeKnob("MEGAC_CUDA_EMU_FAIL_GEMM", 0, LONG_MAX, 0);
  static long Calls = 0;
  if (FailAt > 0 && ++Calls == FailAt)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (M < 0 || N < 0 || K < 0 ||
      Lda < std::max(1, TransA == CUBLAS_OP_N ? M : K) ||
      Ldb < std::max(1, TransB == CUBLAS_OP_N ? K : N) || Ldc < std::max(1, M))
    return CUBLAS_STATUS_INVALID_VALUE;
  traceProduct(M, N, K, BatchCount, CUDA_R_32F, CUDA_R_32F);
  megac_emu::submit(H->Stream, [=] {
    gemmNow(H, TransA, TransB, M, N, K, &Al, A, Lda, StrideA, B, Ldb, StrideB,
            &Be, C, Ldc, StrideC, BatchCount);
  });
  return CUBLAS_STATUS_SUCCESS;
}

/// MEGAC_CUDA_EMU_SLOW plays a device on which one kind of product is
/// the slower (the emulation's own speeds say nothing of a GPU's): each
/// product of that kind, cuBLASLt's with an epilogue or a C to add
/// (epilogues) or the plain ones (products: cublasGemmEx, and cuBLASLt
/// without either), takes kEmuSlowMs more as the stream runs it. The backend's
/// timed choice between the two (MEGAC_CUDA_EPILOGUES=timed) is tested with it.
/// Far more than the other way's emulated kernels take on a loaded machine:
/// at 4 ms, with lit's workers and two ranks on two cores, a plain way
/// (2-3 ms a shape unloaded) once timed slower and the test failed.
constexpr auto kEmuSlowMs = std::chrono::milliseconds(25);
bool emuSlow(bool Epilogue) {
  const std::string Slow =
      megac_emu::knob("MEGAC_CUDA_EMU_SLOW", {"none", "epilogues", "products"});
  return Slow == (Epilogue ? "epilogues" : "products");
}

cublasStatus_t cublasGemmEx(cublasHandle_t H, cublasOperation_t TransA,
                            cublasOperation_t TransB, int M, int N, int K,
                            const void *Alpha, const void *A,
                            cudaDataType_t TypeA, int Lda, const void *B,
                            cudaDataType_t TypeB, int Ldb, const void *Beta,
                            void *C, cudaDataType_t TypeC, int Ldc,
                            cublasComputeType_t, cublasGemmAlgo_t) {
  // fp32 results, or bf16 ones (rounded to nearest even from the fp32
  // accumulation plus beta C, as cuBLAS converts them).
  if (TypeC != CUDA_R_32F && TypeC != CUDA_R_16BF)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (M < 0 || N < 0 || K < 0 ||
      Lda < std::max(1, TransA == CUBLAS_OP_N ? M : K) ||
      Ldb < std::max(1, TransB == CUBLAS_OP_N ? K : N) || Ldc < std::max(1, M))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float Al = *static_cast<const float *>(Alpha),
              Be = *static_cast<const float *>(Beta);
  const bool Slow = emuSlow(/*Epilogue=*/false);
  traceProduct(M, N, K, 1, TypeA, TypeC, Be != 0.0f ? "c" : "");
  megac_emu::submit(H->Stream, [=] {
    if (Slow)
      std::this_thread::sleep_for(kEmuSlowMs);
    const std::vector<float> Aw = widenOperand(
        A, TypeA, size_t(Lda) * size_t(TransA == CUBLAS_OP_N ? K : M));
    const std::vector<float> Bw = widenOperand(
        B, TypeB, size_t(Ldb) * size_t(TransB == CUBLAS_OP_N ? N : K));
    if (TypeC == CUDA_R_32F) {
      gemmNow(H, TransA, TransB, M, N, K, &Al, Aw.data(), Lda, 0, Bw.data(),
              Ldb, 0, &Be, static_cast<float *>(C), Ldc, 0, 1);
      return;
    }
    // (C's M rows of each column alone: past them a column's leading
    // dimension holds nothing of C's.)
    std::vector<float> Wide(size_t(Ldc) * size_t(N));
    for (int Col = 0; Be != 0.0f && Col < N; ++Col)
      for (int Row = 0; Row < M; ++Row) {
        const size_t At = size_t(Col) * size_t(Ldc) + size_t(Row);
        Wide[At] =
            uintAsFloat(unsigned(static_cast<const uint16_t *>(C)[At]) << 16);
      }
    gemmNow(H, TransA, TransB, M, N, K, &Al, Aw.data(), Lda, 0, Bw.data(), Ldb,
            0, &Be, Wide.data(), Ldc, 0, 1);
    auto *Out = static_cast<uint16_t *>(C);
    for (int Col = 0; Col < N; ++Col)
      for (int Row = 0; Row < M; ++Row) {
        const size_t At = size_t(Col) * size_t(Ldc) + size_t(Row);
        Out[At] = bf16Nearest(Wide[At]);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t H, cublasOperation_t TransA,
                           cublasOperation_t TransB, int M, int N, int K,
                           const float *Alpha, const float *A, int Lda,
                           const float *B, int Ldb, const float *Beta, float *C,
                           int Ldc) {
  return cublasSgemmStridedBatched(H, TransA, TransB, M, N, K, Alpha, A, Lda, 0,
                                   B, Ldb, 0, Beta, C, Ldc, 0, 1);
}

//===-- cuBLASLt ----------------------------------------------------------===//

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque {
  cublasOperation_t TransA = CUBLAS_OP_N, TransB = CUBLAS_OP_N;
  cublasLtEpilogue_t Epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *Bias = nullptr; // of D's element type
  void *Aux = nullptr;        // the GeLU's input, of D's element type
  int64_t AuxLd = 0;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t Type;
  uint64_t Rows, Cols;
  int64_t Ld;
};
struct cublasLtMatmulPreferenceOpaque {
  /// Bytes A, B, C and D are aligned to at least (cuBLASLt's default 256).
  uint32_t MinAlign[4] = {256, 256, 256, 256};
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *H) {
  *H = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t H) {
  delete H;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *D,
                                        cublasComputeType_t Compute,
                                        cudaDataType_t Scale) {
  if (Compute != CUBLAS_COMPUTE_32F || Scale != CUDA_R_32F)
    return CUBLAS_STATUS_INVALID_VALUE;
  *D = new cublasLtMatmulDescOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t D) {
  delete D;
  return CUBLAS_STATUS_SUCCESS;
}
/// An attribute's value as cuBLASLt takes it: \p Bytes must be the size of
/// \p Out's type.
template <class T>
static bool attributeValue(const void *Value, size_t Bytes, T &Out) {
  if (Bytes != sizeof Out)
    return false;
  std::memcpy(&Out, Value, sizeof Out);
  return true;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t D,
                                              cublasLtMatmulDescAttributes_t A,
                                              const void *Value, size_t Bytes) {
  // The sizes cuBLASLt expects: an int32 operation, a uint32 epilogue, a
  // pointer.
  switch (A) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB: {
    int32_t Op;
    if (!attributeValue(Value, Bytes, Op))
      return CUBLAS_STATUS_INVALID_VALUE;
    (A == CUBLASLT_MATMUL_DESC_TRANSA ? D->TransA : D->TransB) =
        cublasOperation_t(Op);
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_EPILOGUE: {
    uint32_t E;
    if (!attributeValue(Value, Bytes, E))
      return CUBLAS_STATUS_INVALID_VALUE;
    D->Epilogue = cublasLtEpilogue_t(E);
    return CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
    return (A == CUBLASLT_MATMUL_DESC_BIAS_POINTER
                ? attributeValue(Value, Bytes, D->Bias)
                : attributeValue(Value, Bytes, D->Aux))
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_INVALID_VALUE;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
    return attributeValue(Value, Bytes, D->AuxLd) ? CUBLAS_STATUS_SUCCESS
                                                  : CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *L,
                                          cudaDataType_t Type, uint64_t Rows,
                                          uint64_t Cols, int64_t Ld) {
  if (Ld < int64_t(std::max<uint64_t>(1, Rows)))
    return CUBLAS_STATUS_INVALID_VALUE;
  *L = new cublasLtMatrixLayoutOpaque{Type, Rows, Cols, Ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t L) {
  delete L;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *P) {
  *P = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t P) {
  delete P;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t P,
                                     cublasLtMatmulPreferenceAttributes_t A,
                                     const void *Value, size_t Bytes) {
  switch (A) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    return Bytes == sizeof(uint64_t) ? CUBLAS_STATUS_SUCCESS
                                     : CUBLAS_STATUS_INVALID_VALUE;
  case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: {
    // The emulation never splits k (scheme NONE, which every mask allows).
    uint32_t Mask;
    if (!attributeValue(Value, Bytes, Mask))
      return CUBLAS_STATUS_INVALID_VALUE;
    return Mask & ~uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK)
               ? CUBLAS_STATUS_INVALID_VALUE
               : CUBLAS_STATUS_SUCCESS;
  }
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
    uint32_t Align;
    if (!attributeValue(Value, Bytes, Align))
      return CUBLAS_STATUS_INVALID_VALUE;
    if (Align == 0 || (Align & (Align - 1)))
      return CUBLAS_STATUS_INVALID_VALUE;
    P->MinAlign[A - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = Align;
    return CUBLAS_STATUS_SUCCESS;
  }
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

namespace {
/// The largest power of two up to 256 that divides \p P's address (256
/// for null), as cuBLASLt reads a pointer's alignment.
uint64_t ltAlignment(const void *P) {
  const auto A = reinterpret_cast<uintptr_t>(P);
  return A ? std::min<uint64_t>(256, A & (~A + 1)) : 256;
}
/// What an emulated algorithm assumes (in cublasLtMatmulAlgo_t's data):
/// the alignments of A, B, C, D, the bias and the auxiliary matrix, and a
/// mark that the heuristic made it.
enum : size_t { kAlgoAlignA = 0, kAlgoAlignBias = 4, kAlgoAlignAux = 5,
                kAlgoIndex = 6, kAlgoMark = 7 };
constexpr uint64_t kAlgoMade = 0x6d65676163; // "megac"

/// The product's M, N and K from the layouts, or false when they do not
/// fit together.
bool ltShape(const cublasLtMatmulDescOpaque &D,
             const cublasLtMatrixLayoutOpaque &A,
             const cublasLtMatrixLayoutOpaque &B,
             const cublasLtMatrixLayoutOpaque &Out, int &M, int &N, int &K) {
  M = int(Out.Rows);
  N = int(Out.Cols);
  K = int(D.TransA == CUBLAS_OP_N ? A.Cols : A.Rows);
  const uint64_t AM = D.TransA == CUBLAS_OP_N ? A.Rows : A.Cols;
  const uint64_t BK = D.TransB == CUBLAS_OP_N ? B.Rows : B.Cols;
  const uint64_t BN = D.TransB == CUBLAS_OP_N ? B.Cols : B.Rows;
  return AM == Out.Rows && BK == uint64_t(K) && BN == Out.Cols;
}

/// The epilogues emulated, and what each needs: a bias (of D's type), a
/// GeLU, an auxiliary matrix (written: the GeLU's input; read: DGELU's),
/// a bias gradient (of D's type, written: op(A)'s rows or op(B)'s columns
/// summed over k).
struct LtEpilogue {
  bool Known = false, Bias = false, Gelu = false, Aux = false, DGelu = false;
  bool BGradA = false, BGradB = false;
};
LtEpilogue ltEpilogue(cublasLtEpilogue_t E) {
  switch (E) {
  case CUBLASLT_EPILOGUE_DEFAULT:
    return {true};
  case CUBLASLT_EPILOGUE_BIAS:
    return {true, true};
  case CUBLASLT_EPILOGUE_GELU:
    return {true, false, true};
  case CUBLASLT_EPILOGUE_GELU_BIAS:
    return {true, true, true};
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    return {true, true, true, true};
  case CUBLASLT_EPILOGUE_DGELU:
    return {true, false, false, true, true};
  case CUBLASLT_EPILOGUE_BGRADA:
    return {true, false, false, false, false, true};
  case CUBLASLT_EPILOGUE_BGRADB:
    return {true, false, false, false, false, false, true};
  }
  return {};
}

/// GeLU (tanh form) and its derivative, in fp32 as an epilogue computes
/// them. (cuBLASLt does not document its formula; on a device the tests
/// compare within bf16's tolerance.)
float ltGelu(float V) {
  const float C = 0.7978845608028654f;
  return 0.5f * V * (1.0f + std::tanh(C * (V + 0.044715f * V * V * V)));
}
float ltGeluGrad(float V) {
  const float C = 0.7978845608028654f, A = 0.044715f;
  const float T = std::tanh(C * (V + A * V * V * V));
  return 0.5f * (1.0f + T) +
         0.5f * V * (1.0f - T * T) * C * (1.0f + 3.0f * A * V * V);
}

/// Element \p I of a matrix of \p T (fp32 or bf16 bits), widened.
float ltLoad(const void *P, cudaDataType_t T, size_t I) {
  return T == CUDA_R_32F
             ? static_cast<const float *>(P)[I]
             : uintAsFloat(unsigned(static_cast<const uint16_t *>(P)[I]) << 16);
}
/// Stores \p V as element \p I of a matrix of \p T (bf16: rounded to
/// nearest even).
void ltStore(void *P, cudaDataType_t T, size_t I, float V) {
  if (T == CUDA_R_32F)
    static_cast<float *>(P)[I] = V;
  else
    static_cast<uint16_t *>(P)[I] = bf16Nearest(V);
}
} // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t, cublasLtMatmulDesc_t D, cublasLtMatrixLayout_t A,
    cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t Dl,
    cublasLtMatmulPreference_t P, int Requested,
    cublasLtMatmulHeuristicResult_t *Results, int *Returned) {
  int M, N, K;
  *Returned = 0;
  if (Requested < 1 || !ltShape(*D, *A, *B, *Dl, M, N, K))
    return CUBLAS_STATUS_INVALID_VALUE;
  // What is emulated: fp32 products, and bf16 ones with an fp32 or bf16
  // result.
  if (!ltEpilogue(D->Epilogue).Known ||
      (Dl->Type != CUDA_R_32F &&
       (A->Type != CUDA_R_16BF || B->Type != CUDA_R_16BF)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // MEGAC_CUDA_EMU_NO_LT_ALGO=1 plays a cuBLASLt that has no algorithm for
  // the problem, to test what the backend does then.
  if (megac_emu::knob("MEGAC_CUDA_EMU_NO_LT_ALGO", {"0", "1"}) == "1")
    return CUBLAS_STATUS_SUCCESS;
  // Up to three "algorithms" (the emulation has one way to compute a
  // product), so that a caller choosing among several has a choice.
  *Returned = std::min(Requested, 3);
  for (int K = 0; K < *Returned; ++K) {
    Results[K] = {};
    Results[K].state = CUBLAS_STATUS_SUCCESS;
    uint64_t *Assumed = Results[K].algo.data;
    for (size_t M = 0; M < 4; ++M)
      Assumed[kAlgoAlignA + M] = P->MinAlign[M];
    Assumed[kAlgoAlignBias] = ltAlignment(D->Bias);
    Assumed[kAlgoAlignAux] = ltAlignment(D->Aux);
    Assumed[kAlgoIndex] = uint64_t(K);
    Assumed[kAlgoMark] = kAlgoMade;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *Algo,
                                     cublasLtMatmulAlgoConfigAttributes_t A,
                                     void *Value, size_t Bytes,
                                     size_t *Written) {
  if (!Algo || !Value)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool Signed =
      A == CUBLASLT_ALGO_CONFIG_ID || A == CUBLASLT_ALGO_CONFIG_SPLITK_NUM;
  if (Bytes != (Signed ? sizeof(int32_t) : sizeof(uint32_t)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const uint32_t V = A == CUBLASLT_ALGO_CONFIG_ID
                         ? uint32_t(Algo->data[kAlgoIndex])
                     : A == CUBLASLT_ALGO_CONFIG_SPLITK_NUM ? 1u
                                                            : 0u;
  std::memcpy(Value, &V, Bytes);
  if (Written)
    *Written = Bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t Desc,
                              const void *Alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *Beta,
                              const void *C, cublasLtMatrixLayout_t Cl, void *D,
                              cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *Algo, void *, size_t,
                              cudaStream_t Stream) {
  int M, N, K;
  // C of D's layout (in place, or the residual the backend adds).
  if (!ltShape(*Desc, *Al, *Bl, *Dl, M, N, K) || Cl->Ld != Dl->Ld ||
      Cl->Rows != Dl->Rows || Cl->Cols != Dl->Cols || Cl->Type != Dl->Type)
    return CUBLAS_STATUS_INVALID_VALUE;
  const cublasLtMatmulDescOpaque Op = *Desc;
  const cublasLtMatrixLayoutOpaque La = *Al, Lb = *Bl, Ld = *Dl;
  const LtEpilogue E = ltEpilogue(Op.Epilogue);
  if (!E.Known)
    return CUBLAS_STATUS_NOT_SUPPORTED; // (no other epilogue is emulated)
  // MEGAC_CUDA_EMU_LT_REFUSE=epilogues plays a cuBLASLt whose heuristic
  // offers an algorithm that the product with an epilogue (or a C to add)
  // then refuses.
  const float Alf = *static_cast<const float *>(Alpha),
              Bet = *static_cast<const float *>(Beta);
  if ((Op.Epilogue != CUBLASLT_EPILOGUE_DEFAULT || Bet != 0.0f) &&
      megac_emu::knob("MEGAC_CUDA_EMU_LT_REFUSE", {"none", "epilogues"}) ==
          "epilogues")
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // As cuBLASLt asks: the pointers an epilogue reads or writes, and an
  // auxiliary leading dimension of at least D's rows, divisible by 8.
  if (((E.Bias || E.BGradA || E.BGradB) && !Op.Bias) ||
      (E.Aux && (!Op.Aux || Op.AuxLd < int64_t(M) || Op.AuxLd % 8)))
    return CUBLAS_STATUS_INVALID_VALUE;
  // A pointer less aligned than the algorithm assumed: refused, as
  // cuBLASLt refuses it (or, for an epilogue's pointer, may fault).
  if (Algo && Algo->data[kAlgoMark] == kAlgoMade) {
    const void *Operands[4] = {A, B, C, D};
    for (size_t M = 0; M < 4; ++M)
      if (ltAlignment(Operands[M]) < Algo->data[kAlgoAlignA + M])
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (((E.Bias || E.BGradA || E.BGradB) &&
         ltAlignment(Op.Bias) < Algo->data[kAlgoAlignBias]) ||
        (E.Aux && ltAlignment(Op.Aux) < Algo->data[kAlgoAlignAux]))
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool Slow =
      emuSlow(Op.Epilogue != CUBLASLT_EPILOGUE_DEFAULT || Bet != 0.0f);
  if (megac_emu::tracing()) {
    std::string Names;
    for (auto [On, Name] : {std::pair{E.Bias, "bias"},
                            {E.Gelu, "gelu"},
                            {E.Aux && !E.DGelu, "aux"},
                            {E.DGelu, "dgelu"},
                            {E.BGradA, "bgrada"},
                            {E.BGradB, "bgradb"},
                            {Bet != 0.0f, "c"}})
      if (On)
        Names += (Names.empty() ? "" : "+") + std::string(Name);
    traceProduct(M, N, K, 1, La.Type, Ld.Type, Names.c_str());
  }
  megac_emu::submit(Stream, [=] {
    if (Slow)
      std::this_thread::sleep_for(kEmuSlowMs);
    const std::vector<float> Aw =
        widenOperand(A, La.Type, size_t(La.Ld) * size_t(La.Cols));
    const std::vector<float> Bw =
        widenOperand(B, Lb.Type, size_t(Lb.Ld) * size_t(Lb.Cols));
    // The fp32 accumulation (and beta C), then the epilogue on each
    // element, then D's type.
    std::vector<float> Acc(size_t(Ld.Ld) * size_t(N));
    for (size_t I = 0; Bet != 0.0f && I < Acc.size(); ++I)
      Acc[I] = ltLoad(C, Ld.Type, I);
    gemmNow(nullptr, Op.TransA, Op.TransB, M, N, K, &Alf, Aw.data(), int(La.Ld),
            0, Bw.data(), int(Lb.Ld), 0, &Bet, Acc.data(), int(Ld.Ld), 0, 1);
    for (int J = 0; J < N; ++J)
      for (int I = 0; I < M; ++I) {
        const size_t At = I + size_t(J) * size_t(Ld.Ld);
        const size_t AuxAt = I + size_t(J) * size_t(Op.AuxLd);
        float V = Acc[At];
        if (E.Bias) // one bias per row of D (per output feature)
          V += ltLoad(Op.Bias, Ld.Type, size_t(I));
        if (E.Aux && !E.DGelu)
          ltStore(Op.Aux, Ld.Type, AuxAt, V);
        if (E.Gelu)
          V = ltGelu(V);
        if (E.DGelu)
          V *= ltGeluGrad(ltLoad(Op.Aux, Ld.Type, AuxAt));
        ltStore(D, Ld.Type, At, V);
      }
    // A bias gradient: op(A)'s rows (D's rows) or op(B)'s columns (D's
    // columns) summed over k in fp32, in order.
    if (E.BGradA || E.BGradB)
      for (int I = 0; I < (E.BGradA ? M : N); ++I) {
        float Sum = 0.0f;
        for (int Kk = 0; Kk < K; ++Kk)
          Sum += E.BGradA ? Aw[Op.TransA == CUBLAS_OP_N
                                   ? size_t(I) + size_t(Kk) * size_t(La.Ld)
                                   : size_t(Kk) + size_t(I) * size_t(La.Ld)]
                          : Bw[Op.TransB == CUBLAS_OP_N
                                   ? size_t(Kk) + size_t(I) * size_t(Lb.Ld)
                                   : size_t(I) + size_t(Kk) * size_t(Lb.Ld)];
        ltStore(const_cast<void *>(Op.Bias), Ld.Type, size_t(I), Sum);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
