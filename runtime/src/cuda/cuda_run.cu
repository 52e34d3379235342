//===- cuda_run.cu - One rank's plan on one CUDA device -------------------===//
//
// The CUDA backend (issue #5): the forward pass and training steps (with
// gradient accumulation, dropout and mixed precision) of plans of one rank,
// on one device. Buffers live in one device arena laid out by the
// compiler's memory plan; parameters and AdamW moments have their own
// allocations. Products go to cuBLAS in fp32 (no TF32, so results stay
// within 1e-5 of the CPU backend); the fused elementwise kernels are the
// plan's own cubins; every other op is a kernel of cuda_kernels.cuh that
// computes what the CPU kernel computes.
//
// CI runs this file on the host emulation of CUDA (cuda_api.h); it has not
// yet run on a GPU: see docs/performance.md and issue #5.
//
//===----------------------------------------------------------------------===//

#include "device_run.h"
#include "megac_rt/kernel_image.h"
#include "megac_rt/memory_plan.h"
#include "megac_rt/plan_file.h"
#include "plan_enums.h"
#include "rng.h"

#include "cuda_api.h"
#include "cuda_kernels.cuh"
#include "growing_buffer.h"
#ifdef MEGAC_HAVE_CUDNN_ATTENTION
#include "cudnn_attention.h"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

using namespace megac::plan;
using namespace megac_rt::cuda;

namespace megac_rt {
namespace {

void check(cudaError_t E, const char *What) {
  if (E != cudaSuccess)
    throw std::runtime_error(std::string(What) + ": " + cudaGetErrorString(E));
}
/// The value of environment knob \p Name: one of \p Choices, the first
/// when it is unset or empty; any other value is refused.
std::string knob(const char *Name,
                 std::initializer_list<const char *> Choices) {
  const char *E = std::getenv(Name);
  const std::string Value = E && *E ? E : *Choices.begin();
  for (const char *C : Choices)
    if (Value == C)
      return Value;
  std::string Expected;
  for (const char *C : Choices)
    Expected += Expected.empty() ? std::string(C) + " (the default)"
                                 : std::string(" or ") + C;
  throw std::runtime_error(std::string(Name) + " is '" + Value +
                           "': expected " + Expected);
}
/// Which attention runs on bf16 values: cuDNN's fused attention where it
/// loads and applies, else the register-resident kernels (auto, the
/// default: on an H100 it made the 350M step 59.7 ms instead of 71.6 ms,
/// docs/performance.md); the register-resident kernels alone (mma); the
/// first tensor-core kernels (wmma); or cuDNN as auto, but saying so where
/// it cannot load (cudnn).
std::string attentionAsked() {
  return knob("MEGAC_CUDA_ATTENTION", {"auto", "mma", "wmma", "cudnn"});
}

#ifndef MEGAC_HAVE_CUDNN_ATTENTION
/// A build without cuDNN's frontend: the knob says why it is not there.
struct SdpaShape {
  int64_t B = 0, S = 0, NH = 0, D = 0;
  bool Causal = false;
  float Scale = 1;
};
struct CudnnAttention {
  static std::unique_ptr<CudnnAttention> open(std::string &Why, bool) {
    Why = "this build has no cuDNN frontend (scripts/setup.sh fetches it)";
    return nullptr;
  }
  std::string forward(const SdpaShape &, const void *, const void *,
                      const void *, void *, float *, cudaStream_t) {
    return "unavailable";
  }
  std::string backward(const SdpaShape &, const void *, const void *,
                       const void *, const void *, const void *, const float *,
                       void *, void *, void *, cudaStream_t) {
    return "unavailable";
  }
};
#endif

/// The bf16 copies of an attention's q, k, v and (its gradient's) dy
/// (null: none; where a buffer is kept in bf16 alone, its fp32 pointer is
/// null and its copy is all there is).
using AttentionCopies = std::array<const uint16_t *, 4>;

/// MEGAC_CUDA_BF16_COPIES=0 turns the bf16 operand copies off (and the
/// buffers kept in bf16 alone with them).
bool bf16CopiesAsked() {
  return knob("MEGAC_CUDA_BF16_COPIES", {"1", "0"}) == "1";
}
/// MEGAC_CUDA_BF16_ONLY=0 keeps every buffer in fp32 (beside its copy).
bool bf16OnlyAsked() { return knob("MEGAC_CUDA_BF16_ONLY", {"1", "0"}) == "1"; }
/// MEGAC_CUDA_FORWARD_STATS=0: attention gradients run the forward again
/// for its row statistics instead of taking those the forward kept.
bool forwardStatsAsked() {
  return knob("MEGAC_CUDA_FORWARD_STATS", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_CUDNN_DETERMINISTIC=0: cuDNN's attention backward pass as
/// cuDNN (and PyTorch) run it by default, not its deterministic plan (the
/// same bits every run): for the benchmark to say what that costs.
bool cudnnDeterministicAsked() {
  return knob("MEGAC_CUDA_CUDNN_DETERMINISTIC", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_DQ_ATOMICS=0: an attention gradient that gives dq, dk and
/// dv together (which = 4) runs dq's own kernel, then dk and dv's, instead
/// of one pass adding dq up with atomics: dq the same bit for bit from run
/// to run, for three more tile products per tile pair.
bool queryGradAtomicsAsked() {
  return knob("MEGAC_CUDA_DQ_ATOMICS", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_WIDE_FORWARD=0: the register-resident attention's forward
/// kernel runs blocks of 64 queries, 16 a warp, instead of 128, 32 a warp
/// (which load each k and v fragment once for twice the queries); the
/// same bits either way.
bool wideForwardAsked() {
  return knob("MEGAC_CUDA_WIDE_FORWARD", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_WIDE_KEY_GRAD=0: the register-resident attention's
/// key-gradient kernel (dk and dv, and dq's sums) runs blocks of 64 keys,
/// 16 a warp, instead of 128, 32 a warp, at head sizes up to 64: dk and dv
/// the same bits either way, dq's sums in another order.
bool wideKeyGradAsked() {
  return knob("MEGAC_CUDA_WIDE_KEY_GRAD", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_PARAM_COPIES=0: each step rounds its parameters at its start
/// (reading them in fp32), instead of taking the bf16 bits the previous
/// step's AdamW wrote as it updated them (parameterCopies).
bool parameterCopiesAsked() {
  return knob("MEGAC_CUDA_PARAM_COPIES", {"1", "0"}) == "1";
}

/// MEGAC_CUDA_KERNEL_IMAGE=ptx: the plan's generated kernels load from
/// their PTX, compiled by the driver, where the device has a cubin too:
/// the path a GPU later than the plan's cubins takes, for a test on this
/// one.
bool ptxKernelsAsked() {
  return knob("MEGAC_CUDA_KERNEL_IMAGE", {"cubin", "ptx"}) == "ptx";
}

/// MEGAC_CUDA_GEMM_TUNE=1: each cuBLASLt product shape, at its first use,
/// times up to kGemmCandidates of the algorithms cuBLASLt's heuristic
/// offers and keeps the fastest (the plain bf16 products go through
/// cuBLASLt too). Off by default: which algorithm wins can change with
/// the timing's noise, and with it the last bits of a sum.
bool gemmTuneAsked() { return knob("MEGAC_CUDA_GEMM_TUNE", {"0", "1"}) == "1"; }

/// MEGAC_CUDA_GEMM_PROBE=1: each bf16 cuBLASLt product shape, at its first
/// use, is also timed in the ways it does not run (probeLt): without its
/// epilogue, with a bf16 result where it writes fp32, and with each other
/// pair of its operands' storage orders; one line each on stderr. For the
/// benchmark (runner megac-probe) to tell what makes a shape slow; the
/// run's results are those of a run without it.
bool gemmProbeAsked() {
  return knob("MEGAC_CUDA_GEMM_PROBE", {"0", "1"}) == "1";
}

/// The alignment, in bytes, that cuBLASLt's heuristic is told every
/// pointer has: the arena's (kArenaAlign, 256: cuBLASLt's own assumption,
/// which its fastest Hopper kernels keep to), or
/// MEGAC_CUDA_LT_ALIGN=64, what the backend told it while the arena was
/// 64-byte aligned (for the benchmark to compare the two).
uint32_t ltAlignAsked() {
  return knob("MEGAC_CUDA_LT_ALIGN", {"256", "64"}) == "64"
             ? 64u
             : uint32_t(megac_rt::kArenaAlign);
}

/// MEGAC_CUDA_LT_REDUCTIONS=any: cuBLASLt's heuristic may offer algorithms
/// that split k with any reduction (its own default), not only those with
/// fp32 partial sums reduced apart in a fixed order (fixed, the default:
/// ltColPlan), and the plain bf16 products (cuBLAS) may reduce in reduced
/// precision, as PyTorch lets them by default. For the benchmark to say
/// whether those restrictions keep faster kernels out.
bool ltAnyReductionAsked() {
  return knob("MEGAC_CUDA_LT_REDUCTIONS", {"fixed", "any"}) == "any";
}

/// MEGAC_CUDA_LT_LOG=1: one line on stderr for each cuBLASLt product shape,
/// naming the algorithm its heuristic chose (bench/gpu_step.py's profiled
/// runs print them).
bool ltLogAsked() { return knob("MEGAC_CUDA_LT_LOG", {"0", "1"}) == "1"; }

/// A cuBLASLt epilogue's name, for the log.
const char *ltEpilogueName(uint32_t Epi) {
  switch (Epi) {
  case CUBLASLT_EPILOGUE_DEFAULT:
    return "none";
  case CUBLASLT_EPILOGUE_BIAS:
    return "bias";
  case CUBLASLT_EPILOGUE_GELU_BIAS:
    return "gelu_bias";
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    return "gelu_aux_bias";
  case CUBLASLT_EPILOGUE_DGELU:
    return "dgelu";
  case CUBLASLT_EPILOGUE_BGRADA:
    return "bgrada";
  case CUBLASLT_EPILOGUE_BGRADB:
    return "bgradb";
  }
  return "other";
}

/// MEGAC_CUDA_BGRAD_EPILOGUE=0: bias gradients from megac's column-sum
/// kernels instead of their weight gradient's product (cuBLASLt's BGRADA
/// and BGRADB epilogues), the other epilogues kept; for the benchmark to
/// tell the two apart (MEGAC_CUDA_EPILOGUES=0 turns off both).
bool biasGradEpilogueAsked() {
  return knob("MEGAC_CUDA_BGRAD_EPILOGUE", {"1", "0"}) == "1";
}

/// How a bf16 plan's GEMM groups use cuBLASLt's bf16 epilogues (bias,
/// GeLU, DGELU, BGRAD) where it has an algorithm for them.
enum class EpilogueUse {
  /// Each product shape, at its first use, runs both ways (the epilogue
  /// product; the plain product, then megac's kernels) and keeps the
  /// faster: on an H100 the epilogue products ran at 0.40-0.74 of the GEMM
  /// ceiling where the plain ones ran at 0.85-0.95 (docs/performance.md),
  /// and which way wins depends on the shape and the library.
  Timed,
  /// The epilogue wherever cuBLASLt takes it.
  Always,
  /// Never: the product, then megac's epilogue kernel.
  Off,
};
/// MEGAC_CUDA_EPILOGUES: timed (the default), 1 (always), 0 (off).
EpilogueUse epiloguesAsked() {
  const std::string V = knob("MEGAC_CUDA_EPILOGUES", {"timed", "1", "0"});
  return V == "timed" ? EpilogueUse::Timed
         : V == "1"   ? EpilogueUse::Always
                      : EpilogueUse::Off;
}

void check(cublasStatus_t S, const char *What) {
  if (S != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(What) + ": cuBLAS status " +
                             std::to_string(int(S)));
}
void check(ncclResult_t R, const char *What) {
  if (R != ncclSuccess)
    throw std::runtime_error(std::string(What) + ": " + ncclGetErrorString(R));
}

void check(CUresult R, const char *What) {
  if (R != CUDA_SUCCESS) {
    const char *Msg = nullptr;
    cuGetErrorString(R, &Msg);
    throw std::runtime_error(std::string(What) + ": " + (Msg ? Msg : "?"));
  }
}

//===-- The run --------------------------------------------------------===//

class CudaRun final : public DeviceRun {
public:
  CudaRun(const Program &P, uint32_t Rank, int Device,
          const DeviceBootstrap *Boot)
      : P(P), RP(*P.ranks()->Get(Rank)), Seed(P.seed()),
        Progress(Boot ? Boot->progress : nullptr),
        TransferFn(Boot ? Boot->transfer : nullptr),
        ProgressCtx(Boot ? Boot->Ctx : nullptr) {
    // A set-up that throws (memory, a bad MEGAC_CUDA_* value, a kernel
    // that does not load) leaves no destructor to run: release what it
    // made before passing the error on.
    try {
      setUp(Device);
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaRun() override { release(); }

private:
  /// The constructor's work: the device, its streams and handles, the
  /// arena and the plan's kernels.
  void setUp(int Device) {
    check(cudaSetDevice(Device), "cudaSetDevice");
    cudaDeviceProp Prop;
    check(cudaGetDeviceProperties(&Prop, Device), "cudaGetDeviceProperties");
    Arch = "sm_" + std::to_string(Prop.major) + std::to_string(Prop.minor);
    Name = std::string(Prop.name) + " (" + Arch + ")";
    Major = Prop.major;
    Minor = Prop.minor;
    SharedOptin = Prop.sharedMemPerBlockOptin;
    TimeEpilogues = Epilogues == EpilogueUse::Timed && !replicatedAcrossRanks();
    TuneGemms = TuneGemmsAsked && !replicatedAcrossRanks();
    // (Read where cuDNN is not asked for too: a bad value is an error.)
    const bool CudnnDeterministic = cudnnDeterministicAsked();
    if (AttentionKind == "cudnn" || AttentionKind == "auto") {
      std::string Why;
      Cudnn = CudnnAttention::open(Why, CudnnDeterministic);
      // Asked for by name, its absence is news; by default it is not (a
      // build without the frontend, a machine without libcudnn.so.9).
      if (!Cudnn && AttentionKind == "cudnn")
        std::fprintf(stderr,
                     "megac-run: warning: cuDNN attention unavailable "
                     "(%s); the "
                     "register-resident kernels run instead\n",
                     Why.c_str());
    }
    // The compute stream first (the emulation runs the first stream's
    // work at once and defers the others'), then the collectives'.
    check(cudaStreamCreateWithFlags(&Compute, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    check(cudaStreamCreateWithFlags(&Comm, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    // The communicators come last, joined by the factory once every rank
    // has set up (joinCommunicators): a failure here on one rank (memory, a
    // bad MEGAC_CUDA_* value) is then agreed on before any rank waits in
    // NCCL's setup for it.
    check(cublasCreate(&Blas), "cublasCreate");
    // Plain fp32 products: no TF32, so results stay close to the CPU's.
    check(cublasSetMathMode(Blas, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    // Products of bf16 values: tensor cores, fp32 accumulation, and no
    // reductions in reduced precision: a bf16 result (a rounded product)
    // is then the fp32 sum rounded once, as round_bf16 rounds it, not
    // split-K partial sums added in bf16. MEGAC_CUDA_LT_REDUCTIONS=any
    // lifts that too, as PyTorch's default (reduced-precision reductions
    // allowed) does: for the benchmark to say whether it keeps cuBLAS's
    // faster kernels out.
    check(cublasCreate(&BlasBf16), "cublasCreate");
    check(cublasSetMathMode(
              BlasBf16,
              cublasMath_t(
                  CUBLAS_DEFAULT_MATH |
                  (LtAnyReduction
                       ? 0
                       : CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION))),
          "cublasSetMathMode");
    check(cublasSetStream(Blas, Compute), "cublasSetStream");
    check(cublasSetStream(BlasBf16, Compute), "cublasSetStream");
    check(cublasLtCreate(&Lt), "cublasLtCreate");
    // cuBLAS's recommended workspace (32 MiB on Hopper, 4 MiB before), as
    // PyTorch gives it: its fastest kernels need it. The two handles share
    // it with the cuBLASLt products, since all run on one stream.
    const size_t BlasBytes = size_t(Major >= 9 ? 32 : 4) << 20;
    void *Ws = BlasWorkspace.atLeast(BlasBytes, "cuBLAS workspace");
    check(cublasSetWorkspace(Blas, Ws, BlasBytes), "cublasSetWorkspace");
    check(cublasSetWorkspace(BlasBf16, Ws, BlasBytes), "cublasSetWorkspace");
    findBf16Values();
    // With the copies off their memory stays planned (as before them).
    // (The knob is read, and so checked, whether or not copies are on.)
    const bool OnlyAsked = bf16OnlyAsked();
    const MemoryPlan Plan = planMemory(
        P, RP,
        CopiesOn && OnlyAsked ? Bf16Storage::Bf16Only : Bf16Storage::Copies,
        [this](const Instr &In) {
          return tensorCoreAttention(In) && !WmmaAttention;
        });
    Bf16Only = Plan.bf16Only;
    GradientOutputOf = Plan.attentionOutputOf;
    if (forwardStatsAsked())
      for (int64_t Y : GradientOutputOf)
        if (Y >= 0)
          ForwardStats[uint32_t(Y)];
    if (RP.instrs())
      for (const Instr *In : *RP.instrs())
        if (In->op() == op::LayerNormGainGrad && In->inputs() &&
            In->inputs()->size() > 0)
          RowStats[In->inputs()->Get(0)];
    Arena = allocate(std::max<uint64_t>(Plan.arenaBytes, 64), "arena");
    const uint32_t N = RP.buffers() ? RP.buffers()->size() : 0;
    Ptr.assign(N, nullptr);
    Bytes.assign(N, 0);
    // A pipeline rank keeps a copy of a micro-batch's buffers per
    // micro-batch in flight: slot s at slotBase + s * slotBytes.
    SlotPtrs.assign(Plan.slots, {});
    char *Base = static_cast<char *>(Arena);
    for (uint32_t B = 0; B < N; ++B) {
      size_t Count = 1;
      for (int64_t D : *RP.buffers()->Get(B)->shape())
        Count *= size_t(D);
      Bytes[B] = Count * 4;
      if (Bf16Only[B])
        continue; // its copy, below, is all there is of it
      if (Plan.offset[B] >= 0 && Plan.perMicro[B]) {
        PerMicro.push_back(B);
        for (uint32_t Sl = 0; Sl < Plan.slots; ++Sl)
          SlotPtrs[Sl].push_back(Base + Plan.slotBase + Sl * Plan.slotBytes +
                                 Plan.offset[B]);
        Ptr[B] = SlotPtrs[0].back();
        continue;
      }
      Ptr[B] = Plan.offset[B] >= 0
                   ? Base + Plan.offset[B]
                   : allocate(std::max<size_t>(Bytes[B], 4), "parameter");
    }
    // bf16 copies: planned beside the buffers, written by their rounding
    // writer (the first instruction of their lifetime).
    Copy.assign(N, nullptr);
    CopyFirst = Plan.copyFirst;
    CopyLast = Plan.copyLast;
    for (uint32_t B = 0; B < N; ++B)
      if (Plan.copyOffset[B] >= 0)
        Copy[B] = reinterpret_cast<uint16_t *>(Base + Plan.copyOffset[B]);
    // The parameter roundings whose bits AdamW writes for the next step.
    CopyByUpdate.assign(RP.instrs() ? RP.instrs()->size() : 0, N);
    CopyCurrent.assign(N, false);
    IsParam.assign(N, false);
    if (RP.params())
      for (const Param *Pa : *RP.params())
        IsParam[Pa->buffer()] = true;
    ParamCopy.assign(N, false);
    for (uint32_t B = 0; B < N; ++B)
      if (const int64_t A = Plan.parameterCopyUpdate[B]; A >= 0) {
        ParamCopy[B] = true;
        if (ParamCopiesOn)
          CopyByUpdate[size_t(A)] = B;
      }
    // Faults the kernels flag (out-of-range ids and labels, products of
    // values that are not bf16), checked after each run.
    Faults = static_cast<int *>(allocate(sizeof(int) * kFaultKinds, "flags"));
    // AdamW moments start at zero, as the CPU backend's.
    const uint32_t NI = RP.instrs() ? RP.instrs()->size() : 0;
    MomentM.assign(NI, nullptr);
    MomentV.assign(NI, nullptr);
    for (uint32_t I = 0; I < NI; ++I) {
      const Instr &In = *RP.instrs()->Get(I);
      if (In.op() != op::AdamW)
        continue;
      const size_t B = Bytes[In.outputs()->Get(0)];
      MomentM[I] = allocate(std::max<size_t>(B, 4), "AdamW moments");
      MomentV[I] = allocate(std::max<size_t>(B, 4), "AdamW moments");
      check(cudaMemsetAsync(MomentM[I], 0, B, Compute), "cudaMemsetAsync");
      check(cudaMemsetAsync(MomentV[I], 0, B, Compute), "cudaMemsetAsync");
    }
    // The plan's kernels now rather than at their first launch: loading a
    // module may synchronize the context, which mid-step would wait behind
    // collectives that wait for peers.
    for (uint32_t K = 0; P.kernels() && K < P.kernels()->size(); ++K)
      kernel(K);
  }

  /// Everything setUp made, whatever part of it it got to.
  void release() {
    // After a failure peers may be gone: abort first, or the sync below
    // could wait forever for a collective they will never join.
    if (Failed)
      abort();
    cudaDeviceSynchronize();
    for (cudaEvent_t E : Events)
      cudaEventDestroy(E);
    for (cudaEvent_t E : AllEvents)
      cudaEventDestroy(E);
    if (Ready)
      cudaEventDestroy(Ready);
    // (Taking the flag: a watchdog's abort() coming now finds it taken
    // and leaves the communicators alone.)
    if (!Aborted.exchange(true))
      for (ncclComm_t C : Comms)
        if (C)
          ncclCommDestroy(C);
    for (CUmodule M : Modules)
      if (M)
        cuModuleUnload(M);
    for (void *Q : Owned)
      cudaFree(Q);
    if (Blas)
      cublasDestroy(Blas);
    if (BlasBf16)
      cublasDestroy(BlasBf16);
    for (auto &KV : LtPlans)
      KV.second.destroy();
    if (Lt)
      cublasLtDestroy(Lt);
    if (Comm)
      cudaStreamDestroy(Comm);
    if (Compute)
      cudaStreamDestroy(Compute);
  }

public:
  // Host copies go through the compute stream: a plain cudaMemcpy runs on
  // the legacy stream, which a non-blocking stream does not wait for, and
  // from pageable memory it may return before the data has landed. An
  // asynchronous copy from pageable memory is staged before it returns,
  // so the host buffer is free at once.
  void toDevice(void *Dst, const void *Src, size_t N) {
    check(cudaMemcpyAsync(Dst, Src, N, cudaMemcpyHostToDevice, Compute),
          "cudaMemcpyAsync (to the device)");
  }
  void toHost(void *Dst, const void *Src, size_t N) {
    check(cudaMemcpyAsync(Dst, Src, N, cudaMemcpyDeviceToHost, Compute),
          "cudaMemcpyAsync (to the host)");
    check(cudaStreamSynchronize(Compute), "cudaStreamSynchronize");
  }

  void upload(uint32_t Id, const void *Data, size_t N) override {
    forgetAll();
    if (IsParam.at(Id)) // the bits AdamW wrote are not this parameter's
      CopyCurrent.assign(CopyCurrent.size(), false);
    if (!Ptr.at(Id)) // (the memory plan keeps what the host writes in fp32)
      throw std::logic_error("upload to buffer " + std::to_string(Id) +
                             ", which is kept in bf16 alone");
    toDevice(Ptr.at(Id), Data, std::min(N, Bytes.at(Id)));
  }

  /// An output kept in bf16 alone (the logits of a bf16 plan) is widened
  /// on the device first: the host gets fp32, as from any buffer.
  void download(uint32_t Id, void *Data, size_t N) override {
    const void *From = Ptr.at(Id);
    if (!From) {
      const int64_t Count = int64_t(Bytes.at(Id) / sizeof(float));
      float *Wide = static_cast<float *>(scratch(Bytes.at(Id)));
      launchOn(Compute, widenBf16Kernel, wideBlocks(Count), kThreads, 0,
               static_cast<const uint16_t *>(Copy.at(Id)), Count, Wide);
      From = Wide;
    }
    toHost(Data, From, std::min(N, Bytes.at(Id)));
  }

  void setStep(int64_t S, double L, uint64_t Sd) override {
    Step = S;
    Lr = L;
    Seed = Sd;
  }

  void setInference(bool On) override { Inference = On; }

  uint32_t slots() const override { return uint32_t(SlotPtrs.size()); }

  void activateSlot(uint32_t Slot) override {
    forgetAll();
    if (Slot >= SlotPtrs.size())
      throw std::runtime_error("no buffer slot " + std::to_string(Slot));
    for (size_t J = 0; J < PerMicro.size(); ++J)
      Ptr[PerMicro[J]] = SlotPtrs[Slot][J];
  }

  void moments(uint32_t I, float *M, float *V, size_t N,
               bool ToDevice) override {
    if (I >= MomentM.size() || !MomentM[I])
      throw std::runtime_error("instruction " + std::to_string(I) +
                               " is not an adam_w");
    const size_t B =
        std::min(N * 4, Bytes[RP.instrs()->Get(I)->outputs()->Get(0)]);
    if (ToDevice) {
      toDevice(MomentM[I], M, B);
      toDevice(MomentV[I], V, B);
    } else {
      toHost(M, MomentM[I], B);
      toHost(V, MomentV[I], B);
    }
  }

  std::string deviceName() const override { return Name; }

  std::string attentionKernels() const override {
    return Cudnn ? "cuDNN" : "megac's kernels";
  }

  std::string runNotes() const override {
    std::string Notes;
    // "Part of All what", where anything was counted.
    auto Count = [&Notes](uint64_t Part, uint64_t All, const char *What) {
      if (All)
        Notes += (Notes.empty() ? "" : "; ") + std::to_string(Part) + " of " +
                 std::to_string(All) + What;
    };
    Count(ForwardTaken, ForwardTaken + ForwardRecomputed,
          " attention gradients took their forward's row statistics (the "
          "rest ran the forward again)");
    Count(RowStatsTaken, RowStatsTaken + RowStatsRecomputed,
          " LayerNorm gain gradients took their forward's row statistics "
          "(the rest read x again for them)");
    Count(WideForwards, MmaForwards,
          " register-resident attention forwards in blocks of 128 queries "
          "(the rest 64: MEGAC_CUDA_WIDE_FORWARD=0, or dropout at head size "
          "128)");
    Count(WideKeyGrads, MmaKeyGrads,
          " register-resident attention key-gradient passes in blocks of 128 "
          "keys (the rest 64: head size 128, or MEGAC_CUDA_WIDE_KEY_GRAD=0)");
    Count(AllGradPasses, AllGradSteps,
          " attention gradients of q, k and v in one pass (dq summed with "
          "atomics; the rest dq's kernel, then dk and dv's, or three steps)");
    if (TimedSteps) {
      char Buf[160];
      std::snprintf(Buf, sizeof Buf,
                    "after the first step the host issued a step's "
                    "instructions in %.2f ms, then waited %.2f ms for the "
                    "device",
                    HostIssueMs / double(TimedSteps),
                    HostWaitMs / double(TimedSteps));
      Notes += (Notes.empty() ? "" : "; ") + std::string(Buf);
    }
    Count(ParamRoundingsFromUpdates, ParamRoundings,
          " parameter roundings came from the previous step's AdamW (the "
          "rest read the fp32 parameter)");
    Count(BiasGradEpilogues, BiasGradGroups,
          " bias gradients came from their weight gradient's product "
          "(cuBLASLt's BGRAD epilogue; the rest from column-sum kernels)");
    if (PtxModules)
      Notes += (Notes.empty() ? "" : "; ") + std::to_string(PtxModules) +
               " generated kernels loaded from the plan's " + PtxLoadedFor +
               " PTX, compiled by the driver for " + Arch +
               (PtxByKnob == PtxModules
                    ? " (MEGAC_CUDA_KERNEL_IMAGE=ptx)"
                    : " (the plan has no cubin that runs there)") +
#ifdef MEGAC_CUDA_EMULATION
               " [the emulation chose them as such a device would, and ran "
               "their source]" +
#endif
               "";
    if (CubinsDespiteKnob)
      Notes += (Notes.empty() ? "" : "; ") + std::to_string(CubinsDespiteKnob) +
               " generated kernels loaded from their cubins although "
               "MEGAC_CUDA_KERNEL_IMAGE=ptx asked for PTX (the plan has no "
               "PTX that runs on " +
               Arch + ")";
    if (TuneGemmsAsked && !TuneGemms)
      Notes += std::string(Notes.empty() ? "" : "; ") +
               "cuBLASLt product shapes left untuned (MEGAC_CUDA_GEMM_TUNE=1 "
               "tunes them on grids of data and pipeline parallel axes "
               "alone: ranks of another axis compute replicated values, and "
               "tuned apart could choose apart)";
    if (TuneGemms) { // (said even where no shape had two algorithms to time)
      char Buf[200];
      std::snprintf(Buf, sizeof Buf,
                    "%llu cuBLASLt product shapes tuned: %llu took another "
                    "algorithm than the heuristic's first, %.3f ms a call "
                    "faster in all",
                    static_cast<unsigned long long>(TunedShapes),
                    static_cast<unsigned long long>(TunedOther), TunedSavedMs);
      Notes += (Notes.empty() ? "" : "; ") + std::string(Buf);
    }
    Count(EpilogueProducts, RoundedGroups,
          " bf16 GEMM groups ran on cuBLASLt's epilogues (the rest as a "
          "product and an epilogue kernel)");
    if (Epilogues == EpilogueUse::Timed && !TimeEpilogues)
      Notes += std::string(Notes.empty() ? "" : "; ") +
               "cuBLASLt's epilogues taken untimed (MEGAC_CUDA_EPILOGUES="
               "timed times them on grids of data and pipeline parallel "
               "axes alone: ranks of another axis compute replicated "
               "values, and timed apart could choose apart)";
    if (EpiloguesTimed) {
      char Buf[240];
      std::snprintf(Buf, sizeof Buf,
                    "%llu of %llu product shapes timed at their first use "
                    "kept cuBLASLt's epilogue (the rest the plain product "
                    "and megac's kernels; MEGAC_CUDA_EPILOGUES=timed): a "
                    "call of each, summed, %.3f ms with epilogues, %.3f ms "
                    "plain",
                    static_cast<unsigned long long>(EpiloguesKept),
                    static_cast<unsigned long long>(EpiloguesTimed),
                    EpilogueTimedMs, PlainTimedMs);
      Notes += (Notes.empty() ? "" : "; ") + std::string(Buf);
    }
    return Notes;
  }

  std::string notes() const override {
    return std::to_string(Bf16Products) + " of " + std::to_string(Products) +
           " products and " + std::to_string(Bf16Attentions) + " of " +
           std::to_string(Attentions) +
           " attention steps on bf16 values (tensor cores, fp32 "
           "accumulation" +
           (Cudnn ? std::string(", attention on cuDNN where it applies")
                  : std::string()) +
           "), the rest in fp32; " + copyNote() + memoryNote();
  }

  /// How the tensor-core operands come: copies their writers made, or
  /// packed before use.
  std::string copyNote() const {
    const auto [Reads, Operands] = copyReads();
    if (!Operands)
      return "";
    const auto Alone = std::count(Bf16Only.begin(), Bf16Only.end(), true);
    return std::to_string(Reads) + " of " + std::to_string(Operands) +
           " tensor-core operands from bf16 copies their writers made" +
           (CopiesOn ? "" : " (MEGAC_CUDA_BF16_COPIES=0)") + "; " +
           std::to_string(Alone) + " buffers kept in bf16 alone; ";
  }

  /// The device memory taken at the start, as `megac compile
  /// --memory-report` accounts for it (the arena as the memory plan sizes
  /// it); scratch for products and attention comes on top as they run.
  std::string memoryNote() const {
    auto MiB = [](size_t N) {
      char Buf[32];
      std::snprintf(Buf, sizeof Buf, "%.2f MiB", double(N) / (1 << 20));
      return std::string(Buf);
    };
    auto Of = [&](const char *What) {
      const auto It = Allocated.find(What);
      return It == Allocated.end() ? size_t(0) : It->second;
    };
    size_t Total = 0;
    for (const auto &[What, N] : Allocated)
      Total += N;
    return "device memory " + MiB(Total) + " = parameters " +
           MiB(Of("parameter")) + " + AdamW moments " +
           MiB(Of("AdamW moments")) + " + arena " + MiB(Of("arena"));
  }

  void run(uint32_t Begin, uint32_t End, int64_t Micro,
           bool Training) override {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point Started = Clock::now();
    if (FirstStep < 0)
      FirstStep = Step;
    CurMicro = Micro;
    CurTraining = Training;
    forgetAll();
#ifdef MEGAC_CUDA_EMULATION
    // (What the run issues before its first instruction is the run's.)
    if (megac_emu::tracing())
      megac_emu::traceLine("run step " + std::to_string(Step) + " micro " +
                           std::to_string(Micro));
#endif
    check(cudaMemsetAsync(Faults, 0, sizeof(int) * kFaultKinds, Compute),
          "cudaMemsetAsync");
    const uint32_t N = RP.instrs() ? RP.instrs()->size() : 0;
    for (uint32_t I = Begin; I < N && I < End; ++I) {
      const Instr &In = *RP.instrs()->Get(I);
      if (Training && In.generation_only())
        continue;
      if (Progress)
        Progress(I, false, ProgressCtx);
      uint32_t RunEnd = I + 1;
      try {
        const bool Coll = isCollective(In.op());
        // A run of AdamW, round_bf16 or sum_squares instructions goes in
        // one launch (the profile times it as its first instruction).
        RunEnd = runEnd(I, std::min(N, End), Training);
#ifdef MEGAC_CUDA_EMULATION
        if (megac_emu::tracing())
          megac_emu::traceLine(
              "instr " + std::to_string(I) + " " + opcodeName(In.op()) +
              (RunEnd > I + 1 ? " x" + std::to_string(RunEnd - I) : "") +
              " step " + std::to_string(Step) + " micro " +
              std::to_string(Micro) + " " + (In.loc() ? In.loc()->str() : ""));
#endif
        for (uint32_t K = I; K < RunEnd && !Coll; ++K)
          // their memory must be free of collectives in flight
          waitForCollectives(rangesOf(K, *RP.instrs()->Get(K)));
        if (Profiling && !Coll) // collectives time themselves
          check(cudaEventRecord(event(2 * Timed.size()), Compute),
                "cudaEventRecord");
        for (uint32_t K = I; K < RunEnd; ++K)
          if (const Instr &Kn = *RP.instrs()->Get(K); Kn.outputs())
            for (uint32_t Y : *Kn.outputs())
              forgetWritten(K, Y);
        if (RunEnd > I + 1) {
          for (uint32_t K = I; K < RunEnd; ++K)
            checkUnaliased(*RP.instrs()->Get(K));
          execMany(I, RunEnd);
        } else {
          execUnaliased(I, In);
        }
        check(cudaGetLastError(), "kernel launch");
        if (Profiling && !Coll) {
          check(cudaEventRecord(event(2 * Timed.size() + 1), Compute),
                "cudaEventRecord");
          Timed.push_back({I, RunEnd});
        }
      } catch (const std::exception &E) {
        Failed = true;
        CopyCurrent.assign(CopyCurrent.size(), false);
        throw std::runtime_error("instruction " + std::to_string(I) + " (" +
                                 (In.loc() ? In.loc()->str() : "") +
                                 "): " + E.what());
      }
      I = RunEnd - 1;
    }
    // The host now waits for the device: for the oldest collective in
    // flight, as far as the watchdog can tell, else the last instruction.
    const uint32_t Last = End > 0 ? std::min(End, N) - 1 : 0;
    const uint32_t Oldest = Pending.empty() ? Last : Pending.front().Instr;
    const Clock::time_point Issued = Clock::now();
    waitForAllCollectives();
    if (Progress)
      Progress(Oldest, true, ProgressCtx);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (Step != FirstStep) { // the first loads kernels, plans products, grows
      using Ms = std::chrono::duration<double, std::milli>;
      HostIssueMs += Ms(Issued - Started).count();
      HostWaitMs += Ms(Clock::now() - Issued).count();
      if (Step != LastTimedStep)
        ++TimedSteps;
      LastTimedStep = Step;
    }
    if (Progress)
      Progress(UINT32_MAX, false, ProgressCtx);
    checkFaults();
    // The first step's times apart from the others' (profile()).
    ProfileSums &Sums = Profiled[Step == FirstStep ? 0 : 1];
    if (Profiling && Step != Sums.LastStep) {
      Sums.LastStep = Step;
      ++Sums.Steps;
    }
    for (size_t K = 0; K < Timed.size(); ++K) {
      float Ms = 0;
      check(cudaEventElapsedTime(&Ms, Events[2 * K], Events[2 * K + 1]),
            "cudaEventElapsedTime");
      // A run in one launch: its time is its first instruction's, and
      // each of its instructions ran once.
      Sums.Ms[Timed[K].first] += Ms;
      for (uint32_t J = Timed[K].first; J < Timed[K].second; ++J)
        Sums.Runs[J] += 1;
    }
    Timed.clear();
  }

  /// The kernels' fault flags of the run that just ended (one small copy
  /// after the synchronization the run ends with anyway).
  void checkFaults() {
    int Flags[kFaultKinds] = {};
    toHost(Flags, Faults, sizeof(Flags));
    if (Flags[kFaultBadToken] || Flags[kFaultNotBf16])
      Failed = true;
    if (Flags[kFaultBadToken])
      throw std::runtime_error("a token id or label is outside the "
                               "vocabulary (the CPU backend names it)");
    if (Flags[kFaultNotBf16])
      throw std::runtime_error("a product's or an attention's operands were "
                               "taken for bf16 values but are not (megac "
                               "bug)");
  }

  /// Peers failed: the destructor aborts the communicators.
  void markFailed() { Failed = true; }

  void enableProfiling() override {
    Profiling = true;
    const size_t N = RP.instrs() ? RP.instrs()->size() : 0;
    for (ProfileSums &Sums : Profiled) {
      Sums.Ms.assign(N, 0.0);
      Sums.Runs.assign(N, 0);
    }
  }

  ProfiledSteps profile(std::vector<double> &Ms,
                        std::vector<uint64_t> &Runs) const override {
    const bool Later = Profiled[1].Steps > 0;
    const ProfileSums &Sums = Profiled[Later ? 1 : 0];
    Ms = Sums.Ms;
    Runs = Sums.Runs;
    return {Sums.Steps, Later};
  }

  void abort() override {
    if (Aborted.exchange(true))
      return;
    for (ncclComm_t C : Comms)
      if (C)
        ncclCommAbort(C);
  }

  /// One NCCL communicator per grid axis, over this rank's group along it;
  /// the group's first member makes the id, the launcher hands it round.
  /// Collective over the world: every rank calls it (after all set up) and
  /// every rank gathers once per axis, a failed id travelling as such, so
  /// that all throw together rather than leave a peer in a gather.
  void joinCommunicators(uint32_t Rank, const DeviceBootstrap *Boot) {
    const uint32_t NA = P.axes() ? P.axes()->size() : 0;
    Comms.assign(NA, nullptr);
    if (P.world_size() <= 1)
      return;
    if (!Boot || !Boot->allGather)
      throw std::runtime_error("a plan of several ranks needs the "
                               "launcher's bootstrap");
    struct SharedId {
      char Ok;
      ncclUniqueId Id;
    };
    std::vector<SharedId> All(P.world_size());
    std::string Error;       // this rank's first failure
    bool PeerFailed = false; // a failure another rank flagged in All
    for (uint32_t A = 0; A < NA; ++A) {
      // (Every rank is in one group of every axis: the plan verifier
      // checks that the groups partition the world.)
      const Group *Mine = nullptr;
      for (const Group *G : *P.axes()->Get(A)->groups())
        for (uint32_t R : *G->ranks())
          if (R == Rank)
            Mine = G;
      const uint32_t Leader = Mine ? Mine->ranks()->Get(0) : Rank;
      int Index = 0;
      for (uint32_t K = 0; Mine && K < Mine->ranks()->size(); ++K)
        if (Mine->ranks()->Get(K) == Rank)
          Index = int(K);
      SharedId Own{0, {}};
      if (Error.empty() && !Mine)
        Error = "rank " + std::to_string(Rank) + " is in no group of axis " +
                P.axes()->Get(A)->name()->str();
      if (Error.empty() && Rank == Leader)
        if (ncclResult_t R = ncclGetUniqueId(&Own.Id); R != ncclSuccess)
          Error = std::string("ncclGetUniqueId: ") + ncclGetErrorString(R);
      Own.Ok = Error.empty();
      // Every rank gathers once per axis, failed or not, so that none is
      // left in a gather; after a failure, wherever, no rank joins more.
      if (!Boot->allGather(&Own, sizeof(Own), All.data(), Boot->Ctx))
        throw std::runtime_error("the launcher could not share NCCL ids");
      for (uint32_t R = 0; R < P.world_size(); ++R)
        PeerFailed |= !All[R].Ok;
      if (Error.empty() && !PeerFailed)
        if (ncclResult_t R = ncclCommInitRank(
                &Comms[A], int(Mine->ranks()->size()), All[Leader].Id, Index);
            R != ncclSuccess)
          Error = std::string("ncclCommInitRank: ") + ncclGetErrorString(R);
    }
    if (!Error.empty())
      throw std::runtime_error(Error);
    // (The factory's agreement gives this rank the failed one's reason.)
    if (PeerFailed)
      throw PeerJoinFailure{};
  }

  /// Thrown by joinCommunicators on a rank that failed only because a peer
  /// did.
  struct PeerJoinFailure {};

private:
  ncclComm_t comm(const Instr &In) const {
    // After the watchdog's abort the communicators are gone: no NCCL call
    // may use them (it ends the process a moment later).
    if (Aborted.load())
      throw std::runtime_error("the collectives were aborted");
    if (In.axis() < 0 || size_t(In.axis()) >= Comms.size() ||
        !Comms[size_t(In.axis())])
      throw std::runtime_error("collective on an axis without a "
                               "communicator");
    return Comms[size_t(In.axis())];
  }

  /// A tensor viewed as [Outer, dim D, Inner] (the chunked dimension D).
  static bool isCollective(OpCode Op) {
    return Op == op::AllReduce || Op == op::AllGather ||
           Op == op::ReduceScatter;
  }

  static void around(const std::vector<int64_t> &Shape, int64_t D,
                     int64_t &Outer, int64_t &Inner) {
    Outer = Inner = 1;
    for (int64_t K = 0; K < D; ++K)
      Outer *= Shape[size_t(K)];
    for (size_t K = size_t(D) + 1; K < Shape.size(); ++K)
      Inner *= Shape[K];
  }

  /// Event \p K of the profiling pool (created on first use: a run
  /// records two per instruction).
  cudaEvent_t event(size_t K) {
    while (Events.size() <= K) {
      cudaEvent_t E;
      check(cudaEventCreate(&E), "cudaEventCreate");
      Events.push_back(E);
    }
    return Events[K];
  }

  void *allocate(size_t N, const char *What) {
    void *Q = nullptr;
    check(cudaMalloc(&Q, N),
          (std::string("cudaMalloc (") + What + ")").c_str());
    Owned.push_back(Q);
    Allocated[What] += N;
    return Q;
  }

  std::vector<int64_t> shape(uint32_t B) const {
    const auto *S = RP.buffers()->Get(B)->shape();
    return std::vector<int64_t>(S->begin(), S->end());
  }
  int64_t numel(uint32_t B) const { return int64_t(Bytes[B] / 4); }
  float *f(uint32_t B) { return static_cast<float *>(Ptr[B]); }
  const int32_t *i32(uint32_t B) {
    return static_cast<const int32_t *>(Ptr[B]);
  }

  /// Only adam_w (and an in-place all-reduce) may write one of its
  /// inputs: the plan verifier refuses anything else, and the kernels here
  /// assume unaliased arguments.
  void execUnaliased(uint32_t I, const Instr &In) {
    checkUnaliased(In);
    RoundedAsWritten = false;
    exec(I, In);
    // An output rounded as it is written (Instr.round_bf16): where the
    // op's kernel did not (RoundedAsWritten), a pass rounds it in place
    // and writes its bf16 copy.
    if (In.round_bf16() && !RoundedAsWritten)
      for (uint32_t Y : *In.outputs())
        roundInPlace(Y, I);
  }
  /// Stores \p N fp32 values \p From into \p Out as \p Store says
  /// (rounded, with its copy; \p Out null where kept in bf16 alone).
  void storeFrom(const float *From, int64_t N, float *Out,
                 const OutputStore &Store) {
    if (Store.Round)
      launchOn(Compute, roundBf16Kernel, wideBlocks(N), kThreads, 0, From, N,
               Out, Store.Bits);
    else if (Out)
      check(cudaMemcpyAsync(Out, From, size_t(N) * sizeof(float),
                            cudaMemcpyDeviceToDevice, Compute),
            "cudaMemcpyAsync");
  }
  /// A pass rounding output \p Y of instruction \p I to bf16 in place,
  /// writing its bf16 copy where it has one.
  void roundInPlace(uint32_t Y, uint32_t I) {
    launchOn(Compute, roundBf16Kernel, wideBlocks(numel(Y)), kThreads, 0,
             static_cast<const float *>(f(Y)), numel(Y), f(Y), writeCopy(Y, I));
  }
  /// Refuses \p In where it writes one of its inputs other than as
  /// updatesInPlace allows (AdamW its parameter, an all-reduce its buffer,
  /// the embedding's gradient the gradient it adds).
  static void checkUnaliased(const Instr &In) {
    if (!In.inputs() || !In.outputs())
      return;
    for (uint32_t O = 0; O < In.outputs()->size(); ++O)
      for (uint32_t K = 0; K < In.inputs()->size(); ++K)
        if (In.inputs()->Get(K) == In.outputs()->Get(O) &&
            !updatesInPlace(In.op(), K, O))
          throw std::runtime_error("writes its input buffer " +
                                   std::to_string(In.outputs()->Get(O)) +
                                   " in place");
  }
  /// Set by an op whose kernel rounded its output (and wrote its bf16
  /// copy) as Instr.round_bf16 asks.
  bool RoundedAsWritten = false;
  /// How a kernel that can round as it stores writes \p In's output \p Y:
  /// rounded, with its bf16 copy, where the plan asks (and so noted).
  OutputStore outputStore(const Instr &In, uint32_t Y, uint32_t I) {
    const OutputStore Store = roundingStore(In, Y, I);
    RoundedAsWritten = Store.Round;
    return Store;
  }
  /// The same, for a kernel that may or may not use it (it sets
  /// RoundedAsWritten where it does).
  OutputStore roundingStore(const Instr &In, uint32_t Y, uint32_t I) const {
    return In.round_bf16() ? OutputStore{1, writeCopy(Y, I)} : OutputStore{};
  }

  /// Which buffers hold bf16 values in fp32 (bf16Values), the bf16
  /// copies the rounding writers make of them (bf16CopyLifetimes), and how
  /// many products and attentions read only such values. (The kernels
  /// check: a value with more bits raises the not-bf16 fault.)
  void findBf16Values() {
    Bf16 = bf16Values(P, RP);
    if (!RP.instrs())
      return;
    for (uint32_t I = 0; I < RP.instrs()->size(); ++I) {
      const Instr *In = RP.instrs()->Get(I);
      if (In->op() == op::Linear || In->op() == op::LinearBias ||
          In->op() == op::LinearGeluGrad || In->op() == op::LinearWeightGrad) {
        ++Products;
        Bf16Products += bf16Operands(*In);
      }
      if (In->op() == op::Attention || In->op() == op::AttentionGrad) {
        // dk and dv together (which = 3) are two steps.
        const unsigned Steps = In->outputs()->size();
        Attentions += Steps;
        Bf16Attentions += tensorCoreAttention(*In) ? Steps : 0;
        if (In->op() == op::AttentionGrad && In->ints()->size() > 2 &&
            (In->ints()->Get(2) == 1 || In->ints()->Get(2) == 2))
          SeparateKeyValueSteps = true;
        if (In->op() == op::AttentionGrad && In->ints()->size() > 2 &&
            In->ints()->Get(2) == 4)
          AllGradsTogether = true;
      }
    }
  }
  /// How many tensor-core operands read a bf16 copy rather than pack one,
  /// of how many (static: the copies are planned with the plan's memory).
  std::pair<unsigned, unsigned> copyReads() const {
    unsigned Reads = 0, Operands = 0;
    if (!RP.instrs())
      return {0, 0};
    for (uint32_t I = 0; I < RP.instrs()->size(); ++I) {
      const Instr &In = *RP.instrs()->Get(I);
      const bool Attention = In.op() == op::Attention;
      if (Attention && (!tensorCoreAttention(In) || WmmaAttention))
        continue; // the fp32 and wmma kernels read no copies
      for (uint32_t X : tensorCoreOperands(In, Bf16)) {
        ++Operands;
        Reads += readCopy(X, I) != nullptr;
      }
    }
    return {Reads, Operands};
  }
  /// The bf16 copy of buffer \p B that instruction \p I may read (null:
  /// none, the reader packs one).
  const uint16_t *readCopy(uint32_t B, uint32_t I) const {
    return CopiesOn && Copy[B] && CopyFirst[B] < int64_t(I) &&
                   int64_t(I) <= CopyLast[B]
               ? Copy[B]
               : nullptr;
  }
  /// Calls \p Launch with input \p X of instruction \p I as a kernel
  /// templated over its element type reads it: its bf16 copy where \p I
  /// may read one (half the bytes; all there is of a buffer kept in bf16
  /// alone), else its fp32 buffer.
  template <class LaunchFn>
  void withInput(uint32_t X, uint32_t I, LaunchFn Launch) {
    if (const uint16_t *C = readCopy(X, I))
      Launch(C);
    else
      Launch(static_cast<const float *>(f(X)));
  }
  template <class PointerT>
  using Elem = std::remove_cv_t<std::remove_pointer_t<PointerT>>;
  /// Where instruction \p I writes the bf16 copy of its output \p Y (null:
  /// it makes none).
  uint16_t *writeCopy(uint32_t Y, uint32_t I) const {
    return CopiesOn && Copy[Y] && CopyFirst[Y] == int64_t(I) ? Copy[Y]
                                                             : nullptr;
  }
  bool bf16Operands(const Instr &In) const {
    return Bf16[In.inputs()->Get(0)] && Bf16[In.inputs()->Get(1)];
  }
  /// An attention (or its gradient) for the tensor cores: its q, k and v
  /// hold bf16 values, its head size takes the flash kernels, and their
  /// shared memory fits the device (104 KB at head size 128, 113 KB for
  /// the wmma kernels: more than an sm_86 or sm_89 block may have).
  bool tensorCoreAttention(const Instr &In) const {
    const int64_t D = bf16AttentionHeadSize(RP, In, Bf16);
    return D && flashTcShared(D) && flashTcShared(D) <= SharedOptin;
  }
  /// The most dynamic shared memory the tensor-core attention kernels of
  /// head size \p D take (0: none for that size).
  size_t flashTcShared(int64_t D) const {
    if (WmmaAttention)
      return D == 32    ? TcShared<32>::Forward
             : D == 64  ? TcShared<64>::Forward
             : D == 128 ? TcShared<128>::Forward
                        : 0;
    return D == 32    ? MmaShared<32>::Most
           : D == 64  ? MmaShared<64>::Most
           : D == 128 ? MmaShared<128>::Most
                      : 0;
  }

  /// Column-major C = A op B + beta C as cuBLAS takes it; A and B are
  /// whole buffers (leading dimension = their rows). \p Bf16: both hold
  /// bf16 values, so they go to the tensor cores as bf16, exactly, and
  /// accumulate in fp32; \p CopyA and \p CopyB, where not null, are their
  /// bf16 copies (else they are packed).
  void colGemm(cublasOperation_t TA, cublasOperation_t TB, int64_t M, int64_t N,
               int64_t K, const float *A, int64_t Lda, const float *B,
               int64_t Ldb, float Beta, float *C, int64_t Ldc, bool Bf16Values,
               const uint16_t *CopyA = nullptr, const uint16_t *CopyB = nullptr,
               uint16_t *C16 = nullptr) {
    const float One = 1.0f;
    if (!Bf16Values) {
      check(cublasSgemm(Blas, TA, TB, int(M), int(N), int(K), &One, A, int(Lda),
                        B, int(Ldb), &Beta, C, int(Ldc)),
            "cublasSgemm");
      return;
    }
    const auto [Pa, Pb] =
        packOperands(A, Lda * (TA == CUBLAS_OP_N ? K : M), CopyA, B,
                     Ldb * (TB == CUBLAS_OP_N ? N : K), CopyB);
    // Tuned: the same product on cuBLASLt (beta 1 as C = D, in place).
    if (TuneGemms && Ldc == M && (Beta == 0.0f || (Beta == 1.0f && !C16))) {
      LtPlan &Pl = ltColPlan(TA, TB, M, N, K, Lda, Ldb, true, C16 != nullptr,
                             CUBLASLT_EPILOGUE_DEFAULT);
      void *D = C16 ? static_cast<void *>(C16) : static_cast<void *>(C);
      if (Pl.Ok && ltMatmul(Pl, Pa, Pb, Beta != 0.0f ? D : nullptr, D))
        return;
    }
    // A bf16 result (C16, beta 0) is the fp32 accumulation rounded to
    // nearest even, as round_bf16 rounds.
    check(cublasGemmEx(BlasBf16, TA, TB, int(M), int(N), int(K), &One, Pa,
                       CUDA_R_16BF, int(Lda), Pb, CUDA_R_16BF, int(Ldb), &Beta,
                       C16 ? static_cast<void *>(C16) : static_cast<void *>(C),
                       C16 ? CUDA_R_16BF : CUDA_R_32F, int(Ldc),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
  }

  /// bf16 copies of two product operands of bf16 values (\p NA and \p NB
  /// elements), 16-byte aligned as cuBLAS's fast kernels want: \p CopyA
  /// and \p CopyB where their writers made them, else packed ones.
  std::pair<const uint16_t *, const uint16_t *>
  packOperands(const float *A, int64_t NA, const uint16_t *CopyA,
               const float *B, int64_t NB, const uint16_t *CopyB) {
    const PackedOperand *Pa = CopyA ? nullptr : &packed(A, NA, nullptr);
    return {CopyA ? CopyA : Pa->bits(),
            CopyB ? CopyB : packed(B, NB, Pa).bits()};
  }

  /// The bf16 copy of a product operand. The last few are kept (until an
  /// instruction writes their source) since products share operands: q, k
  /// and v read one input, and a weight's gradient reads the output
  /// gradient its input's gradient has just read; a kept copy is not packed
  /// again. \p Keep: a copy the caller still needs (not reused for this one).
  struct PackedOperand {
    const float *Src = nullptr;
    int64_t N = 0;
    uint64_t LastUse = 0;
    GrowingBuffer Memory;
    uint16_t *bits() const { return static_cast<uint16_t *>(Memory.Ptr); }
  };
  static constexpr int kPackedOperands = 4;
  PackedOperand &packed(const float *Src, int64_t N,
                        const PackedOperand *Keep) {
    ++PackUses;
    PackedOperand *Slot = nullptr;
    for (PackedOperand &P : Packed)
      if (P.Src == Src && P.N == N) {
        P.LastUse = PackUses;
        return P;
      }
    // The least recently used copy whose memory fits, else the least
    // recently used: memory grows only where no copy fits (each growth
    // frees and allocates, which waits for the device), and a large
    // operand (the logits' gradient) takes one copy's memory, not all.
    const size_t Bytes = size_t(N) * 2;
    for (bool Fit : {true, false}) {
      for (PackedOperand &P : Packed)
        if (&P != Keep && (!Fit || P.Memory.Bytes >= Bytes) &&
            (!Slot || P.LastUse < Slot->LastUse))
          Slot = &P;
      if (Slot)
        break;
    }
    Slot->Src = nullptr; // if the allocation fails, it holds nothing
    Slot->Memory.atLeast(Bytes, "bf16 operands");
    packBf16(Src, N, Slot->bits(), /*Exact=*/true);
    Slot->Src = Src;
    Slot->N = N;
    Slot->LastUse = PackUses;
    return *Slot;
  }
  PackedOperand Packed[kPackedOperands];
  uint64_t PackUses = 0;

  /// What the backend keeps between instructions (an attention's state,
  /// bf16 copies of operands) is forgotten when an instruction writes its
  /// sources, and wholesale where the host changes memory (uploads, buffer
  /// slots) or a run starts.
  void forgetWritten(uint32_t I, uint32_t Buffer) {
    std::vector<Range> Written = {rangeOf(Buffer)};
    if (const uint16_t *C = writeCopy(Buffer, I)) // the kept state may
      Written.push_back({reinterpret_cast<const char *>(C), // have read
                         reinterpret_cast<const char *>(C + numel(Buffer))});
    if (Kept.Valid && overlaps(Written, Kept.Inputs))
      Kept.Valid = false;
    for (auto &[Y, F] : ForwardStats)
      if (F.Valid && overlaps(Written, F.Inputs))
        F.Valid = false;
    for (auto &[X, K] : RowStats)
      if (K.Valid && overlaps(Written, K.Inputs))
        K.Valid = false;
    if (Loss.Valid && overlaps(Written, Loss.Inputs))
      Loss.Valid = false;
    for (PackedOperand &P : Packed)
      if (P.Src &&
          overlaps(Written,
                   {Range{reinterpret_cast<const char *>(P.Src),
                          reinterpret_cast<const char *>(P.Src + P.N)}}))
        P.Src = nullptr;
  }
  void forgetAll() {
    Kept.Valid = false;
    for (auto &[Y, F] : ForwardStats)
      F.Valid = false;
    for (auto &[X, K] : RowStats)
      K.Valid = false;
    Loss.Valid = false;
    for (PackedOperand &P : Packed)
      P.Src = nullptr;
  }

  /// A cuBLASLt product of one shape and epilogue: its descriptors and the
  /// algorithm the heuristic chose (none: Ok false), made once per shape.
  struct LtPlan {
    bool Ok = false;
    uint32_t Epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulDesc_t Desc = nullptr;
    /// The epilogue's pointers as ltPointer last set them.
    const void *Bias = nullptr, *Aux = nullptr;
    cublasLtMatrixLayout_t A = nullptr, B = nullptr, D = nullptr;
    cublasLtMatmulAlgo_t Algo{};
    size_t Workspace = 0;
    /// With MEGAC_CUDA_GEMM_TUNE=1: the heuristic's algorithms, best
    /// first, until the first call times them (then empty).
    std::vector<cublasLtMatmulHeuristicResult_t> Candidates;
    /// EpilogueUse::Timed: whether the shape's groups run the epilogue
    /// product or the plain product and megac's kernels, once timed:
    /// apart for groups without and with a C to add (a residual), whose
    /// two ways cost differently.
    enum class Way : uint8_t { Untimed, Epilogue, Plain };
    Way Chosen[2] = {Way::Untimed, Way::Untimed};
    /// Its product, for the log: column-major rows x cols x k, the
    /// operands' ops and the types (probeLt remakes it in other ways).
    int64_t Rows = 0, Cols = 0, K = 0;
    cublasOperation_t TA = CUBLAS_OP_N, TB = CUBLAS_OP_N;
    bool Bf16 = false, Out16 = false;
    /// MEGAC_CUDA_GEMM_PROBE=1: whether probeLt timed it.
    bool Probed = false;
    void destroy() {
      if (Desc)
        cublasLtMatmulDescDestroy(Desc);
      for (cublasLtMatrixLayout_t L : {A, B, D})
        if (L)
          cublasLtMatrixLayoutDestroy(L);
    }
  };

  /// Whether epilogue \p Epi reads or writes an auxiliary matrix (the
  /// GeLU's input).
  static bool ltAux(uint32_t Epi) {
    return Epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           Epi == CUBLASLT_EPILOGUE_DGELU;
  }
  /// Whether epilogue \p Epi reads a bias or writes a bias gradient.
  static bool ltBias(uint32_t Epi) {
    return Epi == CUBLASLT_EPILOGUE_BIAS || Epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
           Epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           Epi == CUBLASLT_EPILOGUE_BGRADA || Epi == CUBLASLT_EPILOGUE_BGRADB;
  }
  /// The alignment every pointer this backend gives cuBLASLt has, and
  /// tells it: the arena's buffers and copies (kArenaAlign), cudaMalloc's
  /// memory and the scratch parts (256). cuBLASLt assumes 256 unless told,
  /// and refuses a less aligned pointer at the launch of an algorithm that
  /// assumed it.
  const uint32_t LtAlign = ltAlignAsked();
  bool ltAligned(const void *P) const {
    return reinterpret_cast<uintptr_t>(P) % LtAlign == 0;
  }
  /// The plan of row-major y[M,N] = x[M,K] w with epilogue \p Epi, bf16
  /// (\p Bf16) or fp32 operands and a bf16 (\p Out16) or fp32 y, as
  /// column-major y^T = op(w^T) x^T. The epilogue's bias and auxiliary
  /// matrix (leading dimension N, as y's) are of y's type. \p AddsC: a
  /// plan of its own for a "c" group's product, which adds a C and no
  /// epilogue (so that cuBLASLt refusing it, or its timed choice, leaves
  /// the plain products of the shape alone).
  LtPlan &ltPlan(int64_t M, int64_t K, int64_t N, bool Transposed, bool Bf16,
                 bool Out16, uint32_t Epi, bool AddsC = false) {
    // w^T is [N, K]: stored [K, N] row-major (column-major N x K, ld N), or
    // [N, K] row-major when transposed (column-major K x N, ld K).
    return ltColPlan(Transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M,
                     K, Transposed ? K : N, K, Bf16, Out16, Epi, AddsC);
  }
  /// The plan of column-major D[m,n] = op(A) op(B) over k, A and B whole
  /// matrices of leading dimensions \p Lda and \p Ldb (their rows, as
  /// stored), D's m; the types and epilogue as ltPlan's. Made once per
  /// shape and epilogue (probeLt's own plans, made while Probing, apart).
  LtPlan &ltColPlan(cublasOperation_t TA, cublasOperation_t TB, int64_t Rows,
                    int64_t Cols, int64_t K, int64_t Lda, int64_t Ldb,
                    bool Bf16, bool Out16, uint32_t Epi, bool AddsC = false) {
    LtPlan &Pl = LtPlans[{int64_t(TA), int64_t(TB), Rows, Cols, K, Lda, Ldb,
                          Bf16, Out16, int64_t(Epi), AddsC, Probing}];
    if (Pl.Desc)
      return Pl;
    Pl.Epilogue = Epi;
    Pl.Rows = Rows;
    Pl.Cols = Cols;
    Pl.K = K;
    Pl.TA = TA;
    Pl.TB = TB;
    Pl.Bf16 = Bf16;
    Pl.Out16 = Out16;
    const cudaDataType_t In = Bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t Out = Out16 ? CUDA_R_16BF : CUDA_R_32F;
    const int32_t OpA = TA, OpB = TB;
    check(cublasLtMatmulDescCreate(&Pl.Desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    for (auto [Attr, Op] : {std::pair{CUBLASLT_MATMUL_DESC_TRANSA, &OpA},
                            std::pair{CUBLASLT_MATMUL_DESC_TRANSB, &OpB}})
      if (*Op != CUBLAS_OP_N)
        check(cublasLtMatmulDescSetAttribute(Pl.Desc, Attr, Op, sizeof *Op),
              "cublasLtMatmulDescSetAttribute");
    check(cublasLtMatmulDescSetAttribute(Pl.Desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                         &Epi, sizeof Epi),
          "cublasLtMatmulDescSetAttribute");
    if (ltAux(Epi)) {
      const int64_t AuxLd = Rows;
      check(cublasLtMatmulDescSetAttribute(Pl.Desc,
                                           CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                           &AuxLd, sizeof AuxLd),
            "cublasLtMatmulDescSetAttribute");
    }
    // As stored: op(A) is Rows x K, op(B) K x Cols.
    check(cublasLtMatrixLayoutCreate(&Pl.A, In, TA == CUBLAS_OP_N ? Rows : K,
                                     TA == CUBLAS_OP_N ? K : Rows, Lda),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&Pl.B, In, TB == CUBLAS_OP_N ? K : Cols,
                                     TB == CUBLAS_OP_N ? Cols : K, Ldb),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&Pl.D, Out, Rows, Cols, Rows),
          "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t Pref;
    check(cublasLtMatmulPreferenceCreate(&Pref),
          "cublasLtMatmulPreferenceCreate");
    const uint64_t MaxWorkspace = BlasWorkspace.Bytes; // cuBLAS's, shared
    check(cublasLtMatmulPreferenceSetAttribute(
              Pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &MaxWorkspace,
              sizeof MaxWorkspace),
          "cublasLtMatmulPreferenceSetAttribute");
    // Split k only with fp32 partial sums reduced in a separate step: not
    // in the output's type (a bf16 result is the fp32 sum rounded once, as
    // cuBLAS's products with reduced-precision reductions disallowed), nor
    // in place with atomics (in no fixed order: the runs' bits would vary).
    const uint32_t Reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (!LtAnyReduction)
      check(cublasLtMatmulPreferenceSetAttribute(
                Pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &Reductions,
                sizeof Reductions),
            "cublasLtMatmulPreferenceSetAttribute");
    for (auto Attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(Pref, Attr, &LtAlign,
                                                 sizeof LtAlign),
            "cublasLtMatmulPreferenceSetAttribute");
    // The heuristic reads the epilogue's pointers for their alignment
    // alone: stand-ins of the alignment the real ones will have.
    const void *Stand = reinterpret_cast<const void *>(uintptr_t(LtAlign));
    if (ltBias(Epi))
      ltPointer(Pl, CUBLASLT_MATMUL_DESC_BIAS_POINTER, Stand);
    if (ltAux(Epi))
      ltPointer(Pl, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, Stand);
    std::vector<cublasLtMatmulHeuristicResult_t> Found(
        TuneGemms ? kGemmCandidates : 1);
    int Count = 0;
    // No algorithm (or an error) leaves Ok false: the caller falls back.
    if (cublasLtMatmulAlgoGetHeuristic(Lt, Pl.Desc, Pl.A, Pl.B, Pl.D, Pl.D,
                                       Pref, int(Found.size()), Found.data(),
                                       &Count) == CUBLAS_STATUS_SUCCESS &&
        Count > 0) {
      Pl.Ok = true;
      Pl.Algo = Found[0].algo;
      Pl.Workspace = Found[0].workspaceSize;
      if (LtLog && !Probing)
        logLtChoice(TA, TB, Rows, Cols, K, Bf16, Out16, Epi, Found[0]);
      if (Count > 1)
        Pl.Candidates.assign(Found.begin(), Found.begin() + Count);
    }
    cublasLtMatmulPreferenceDestroy(Pref);
    return Pl;
  }

  /// MEGAC_CUDA_LT_LOG=1: the algorithm cuBLASLt's heuristic chose for the
  /// column-major product D[Rows, Cols] = op(A) op(B) over \p K, as its
  /// configuration attributes say (tile and stages are cublasLtMatmulTile_t
  /// and cublasLtMatmulStages_t values).
  static void logLtChoice(cublasOperation_t TA, cublasOperation_t TB,
                          int64_t Rows, int64_t Cols, int64_t K, bool Bf16,
                          bool Out16, uint32_t Epi,
                          const cublasLtMatmulHeuristicResult_t &R) {
    // (-1, printed as such, where cuBLASLt does not say.)
    auto Get = [&R](cublasLtMatmulAlgoConfigAttributes_t A) {
      uint32_t V = 0;
      size_t Written = 0;
      return cublasLtMatmulAlgoConfigGetAttribute(&R.algo, A, &V, sizeof V,
                                                  &Written) ==
                     CUBLAS_STATUS_SUCCESS
                 ? int64_t(V)
                 : int64_t(-1);
    };
    std::fprintf(
        stderr,
        "megac-run: cuBLASLt %lldx%lldx%lld %c%c %s->%s %s: algo %lld tile "
        "%lld stages %lld split-k %lld reduction %lld swizzle %lld custom "
        "%lld waves %.2f workspace %zu\n",
        static_cast<long long>(Rows), static_cast<long long>(Cols),
        static_cast<long long>(K), TA == CUBLAS_OP_N ? 'N' : 'T',
        TB == CUBLAS_OP_N ? 'N' : 'T', Bf16 ? "bf16" : "fp32",
        Out16 ? "bf16" : "fp32", ltEpilogueName(Epi),
        // (ID and SPLITK_NUM are int32_t: read as uint32_t, a negative
        // one comes back as its two's complement, cast back here.)
        static_cast<long long>(int32_t(Get(CUBLASLT_ALGO_CONFIG_ID))),
        static_cast<long long>(Get(CUBLASLT_ALGO_CONFIG_TILE_ID)),
        static_cast<long long>(Get(CUBLASLT_ALGO_CONFIG_STAGES_ID)),
        static_cast<long long>(int32_t(Get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM))),
        static_cast<long long>(Get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)),
        static_cast<long long>(Get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)),
        static_cast<long long>(Get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)),
        double(R.wavesCount),
        R.workspaceSize);
  }

  /// Points \p Pl's epilogue attribute \p Attr (its bias or auxiliary
  /// matrix) at \p Ptr.
  void ltPointer(LtPlan &Pl, cublasLtMatmulDescAttributes_t Attr,
                 const void *Ptr) {
    check(cublasLtMatmulDescSetAttribute(Pl.Desc, Attr, &Ptr, sizeof Ptr),
          "cublasLtMatmulDescSetAttribute");
    (Attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? Pl.Bias : Pl.Aux) = Ptr;
  }
  /// Runs \p Pl (ltPlan) on operands \p W and \p X into \p D, adding \p C
  /// (where not null: a residual of D's layout) with beta = 1. False where
  /// cuBLASLt refuses the algorithm its heuristic offered (it returns the
  /// status as it launches): the plan is marked so that later calls fall
  /// back at once, the caller falls back now, and the backend says so
  /// once on stderr (the epilogues have no other check of their own on a
  /// GPU before one runs them).
  bool ltMatmul(LtPlan &Pl, const void *W, const void *X, const void *C,
                void *D) {
    // A pointer less aligned than the plan told cuBLASLt (none is, by
    // LtAlign's account): this call falls back, the plan stays.
    if (!ltAligned(W) || !ltAligned(X) || !ltAligned(C) || !ltAligned(D) ||
        (ltBias(Pl.Epilogue) && !ltAligned(Pl.Bias)) ||
        (ltAux(Pl.Epilogue) && !ltAligned(Pl.Aux))) {
      if (!LtUnaligned++)
        std::fprintf(stderr, "megac-run: warning: a cuBLASLt product's "
                             "operand is not %u-byte aligned; such products "
                             "run as a plain product and megac's kernels\n",
                     unsigned(LtAlign));
      return false;
    }
    if (!Pl.Candidates.empty() && C != D) // (a sum in place: not repeatable)
      tuneLt(Pl, W, X, C, D);
    if (ProbeGemms && !Pl.Probed && C != D)
      probeLt(Pl, W, X, C, D);
    const cublasStatus_t S = ltLaunch(Pl, Pl.Algo, Pl.Workspace, W, X, C, D);
    if (S == CUBLAS_STATUS_SUCCESS)
      return true;
    Pl.Ok = false;
    if (!LtRefused++)
      std::fprintf(stderr,
                   "megac-run: warning: cuBLASLt refused a product its "
                   "heuristic had an algorithm for (status %d); that "
                   "product, and any other refused, runs as a plain "
                   "product and megac's kernels\n",
                   int(S));
    return false;
  }

  /// One launch of \p Pl's product with algorithm \p Algo (which needs
  /// \p Workspace bytes) on \p W and \p X into \p D, adding \p C with
  /// beta = 1 where not null.
  cublasStatus_t ltLaunch(const LtPlan &Pl, const cublasLtMatmulAlgo_t &Algo,
                          size_t Workspace, const void *W, const void *X,
                          const void *C, void *D) {
    const float One = 1.0f, Zero = 0.0f;
    return cublasLtMatmul(Lt, Pl.Desc, &One, W, Pl.A, X, Pl.B, C ? &One : &Zero,
                          C ? C : D, Pl.D, D, Pl.D, &Algo,
                          Workspace ? BlasWorkspace.Ptr : nullptr, Workspace,
                          Compute);
  }

  /// MEGAC_CUDA_GEMM_PROBE=1: times \p Pl as it runs (into \p D, adding
  /// \p C where not null, its epilogue's outputs rewritten with the same
  /// values, as tuneLt's runs) and in the ways it does not run, each into
  /// a buffer of its own (ProbeOut) with no C: the same product without
  /// its epilogue; with a bf16 result, where it writes fp32; with each
  /// other pair of storage orders of its operands (the same bytes read as
  /// the transposed matrix: a product of the same shape and cost, other
  /// values). Says the milliseconds a call of each on stderr ("-" where
  /// cuBLASLt has no algorithm or refuses it).
  void probeLt(LtPlan &Pl, const void *W, const void *X, const void *C,
               void *D) {
    Pl.Probed = true;
    if (!Pl.Bf16)
      return; // (fp32 products are full fp32: not what the probe asks)
    struct Way {
      std::string Name;
      cublasOperation_t TA, TB;
      bool Out16;
    };
    std::vector<Way> Ways = {{"plain", Pl.TA, Pl.TB, Pl.Out16}};
    if (!Pl.Out16)
      Ways.push_back({"bf16-out", Pl.TA, Pl.TB, true});
    for (cublasOperation_t TA : {CUBLAS_OP_N, CUBLAS_OP_T})
      for (cublasOperation_t TB : {CUBLAS_OP_N, CUBLAS_OP_T})
        if (TA != Pl.TA || TB != Pl.TB)
          Ways.push_back(
              {std::string(1, opLetter(TA)) + opLetter(TB), TA, TB, Pl.Out16});
    const float Planned = msPerRun([&] {
      return ltLaunch(Pl, Pl.Algo, Pl.Workspace, W, X, C, D) ==
             CUBLAS_STATUS_SUCCESS;
    });
    std::string Line = "planned " + probeMs(Planned);
    void *Out = ProbeOut.atLeast(size_t(Pl.Rows * Pl.Cols) * 4,
                                 "the GEMM probe's results");
    for (const Way &V : Ways) {
      // Whole matrices of the way's storage orders (ltColPlan's leading
      // dimensions: their rows as stored).
      Probing = true;
      LtPlan &Alt = ltColPlan(V.TA, V.TB, Pl.Rows, Pl.Cols, Pl.K,
                              V.TA == CUBLAS_OP_N ? Pl.Rows : Pl.K,
                              V.TB == CUBLAS_OP_N ? Pl.K : Pl.Cols, true,
                              V.Out16, CUBLASLT_EPILOGUE_DEFAULT);
      Probing = false;
      const float Ms = Alt.Ok ? msPerRun([&] {
        return ltLaunch(Alt, Alt.Algo, Alt.Workspace, W, X, nullptr, Out) ==
               CUBLAS_STATUS_SUCCESS;
      })
                              : -1.0f;
      Line += ", " + V.Name + " " + probeMs(Ms);
    }
    std::fprintf(
        stderr, "megac-run: gemm probe %lldx%lldx%lld %c%c %s->%s %s%s: %s\n",
        static_cast<long long>(Pl.Rows), static_cast<long long>(Pl.Cols),
        static_cast<long long>(Pl.K), opLetter(Pl.TA), opLetter(Pl.TB), "bf16",
        Pl.Out16 ? "bf16" : "fp32", ltEpilogueName(Pl.Epilogue), C ? "+c" : "",
        Line.c_str());
  }
  static char opLetter(cublasOperation_t Op) {
    return Op == CUBLAS_OP_N ? 'N' : 'T';
  }
  static std::string probeMs(float Ms) {
    if (Ms < 0)
      return "-";
    char Buf[32];
    std::snprintf(Buf, sizeof Buf, "%.4f", double(Ms));
    return Buf;
  }

  /// The device milliseconds a call of \p Run takes (Run returns whether
  /// it ran): a call to warm up, then kTimedRuns between events on the
  /// compute stream. Negative where a call did not run. Waits for the
  /// device: the first step pays for what it times.
  template <class RunFn> float msPerRun(RunFn &&Run) {
    if (!Run())
      return -1.0f;
    cudaEvent_t Begin, End;
    check(cudaEventCreate(&Begin), "cudaEventCreate");
    check(cudaEventCreate(&End), "cudaEventCreate");
    check(cudaEventRecord(Begin, Compute), "cudaEventRecord");
    bool Ran = true;
    for (int T = 0; T < kTimedRuns && Ran; ++T)
      Ran = Run();
    check(cudaEventRecord(End, Compute), "cudaEventRecord");
    check(cudaStreamSynchronize(Compute), "cudaStreamSynchronize");
    float Ms = 0;
    check(cudaEventElapsedTime(&Ms, Begin, End), "cudaEventElapsedTime");
    cudaEventDestroy(Begin);
    cudaEventDestroy(End);
    return Ran ? Ms / kTimedRuns : -1.0f;
  }
  static constexpr int kTimedRuns = 3;

  /// Times each of \p Pl's candidate algorithms on these operands
  /// (msPerRun: each run writes D and the epilogue's outputs anew, the
  /// same values, so the call that follows is unaffected) and keeps the
  /// fastest; an algorithm that refuses to run drops out.
  void tuneLt(LtPlan &Pl, const void *W, const void *X, const void *C,
              void *D) {
    std::vector<cublasLtMatmulHeuristicResult_t> Candidates;
    std::swap(Candidates, Pl.Candidates);
    float Best = -1.0f, First = -1.0f;
    size_t Chosen = 0;
    for (size_t K = 0; K < Candidates.size(); ++K) {
      const cublasLtMatmulHeuristicResult_t &R = Candidates[K];
      if (R.workspaceSize > BlasWorkspace.Bytes)
        continue;
      auto Run = [&] {
        return ltLaunch(Pl, R.algo, R.workspaceSize, W, X, C, D) ==
               CUBLAS_STATUS_SUCCESS;
      };
      const float Ms = msPerRun(Run);
      if (Ms < 0)
        continue;
      if (K == 0)
        First = Ms;
      if (Best < 0 || Ms < Best) {
        Best = Ms;
        Chosen = K;
      }
    }
    if (Best < 0)
      return; // none ran: the heuristic's first stays, and will say why
    Pl.Algo = Candidates[Chosen].algo;
    Pl.Workspace = Candidates[Chosen].workspaceSize;
    ++TunedShapes;
    if (Chosen != 0) {
      ++TunedOther;
      if (First >= 0)
        TunedSavedMs += First - Best;
    }
  }

  /// Whether instruction \p Idx, a GEMM group on plan \p Pl, runs its
  /// cuBLASLt epilogue product (\p Epilogue, false where cuBLASLt refuses
  /// it) rather than the plain product and megac's kernels (\p Plain):
  /// two ways of writing the same outputs from the same inputs. Timed
  /// (EpilogueUse::Timed), the shape's first group that reads none of the
  /// memory it writes runs each way once to warm up, then kTimedRuns
  /// times, and the shape keeps the faster; the epilogue, unless the plain
  /// way is faster by more than kPlainMargin (timings a few percent apart
  /// are noise, and the epilogue moves fewer bytes; msPerRun times each
  /// way). The caller then runs
  /// the chosen way once more: the first step pays for the timing. A
  /// group that reads what it writes (a residual summed in place) is not
  /// repeatable: it takes the epilogue untimed, as the next of its shape
  /// may be timed. \p WithC: the group adds a C (its residual). Where
  /// ranks of a tensor-parallel axis compute the same replicated values
  /// (TimeEpilogues false) the epilogue is taken untimed: timed apart,
  /// they could choose apart, and the two ways differ in their last bits.
  template <class EpilogueFn, class PlainFn>
  bool epilogueChosen(LtPlan &Pl, uint32_t Idx, bool WithC,
                      EpilogueFn &&Epilogue, PlainFn &&Plain) {
    using Way = LtPlan::Way;
    Way &Chosen = Pl.Chosen[WithC];
    if (!TimeEpilogues || Chosen != Way::Untimed)
      return Chosen != Way::Plain;
    const Instr &In = *RP.instrs()->Get(Idx);
    if (overlaps(liveMemoryOf(*In.inputs(), Idx, false),
                 liveMemoryOf(*In.outputs(), Idx, true)))
      return true;
    // The counts the runs below would add: the chosen way's run counts.
    const uint64_t Counts[] = {EpilogueProducts, BiasGradEpilogues};
    auto restoreCounts = [&] {
      EpilogueProducts = Counts[0];
      BiasGradEpilogues = Counts[1];
    };
    // Declined (cuBLASLt refused, Pl.Ok now false; or a pointer less
    // aligned than it was told, the shape left untimed): the caller runs
    // the plain way.
    const float EpiMs = msPerRun(Epilogue);
    if (EpiMs < 0) {
      restoreCounts();
      return false;
    }
    const float PlainMs = msPerRun([&] {
      Plain();
      return true;
    });
    restoreCounts();
    Chosen =
        PlainMs < EpiMs * (1.0f - kPlainMargin) ? Way::Plain : Way::Epilogue;
    ++EpiloguesTimed;
    EpiloguesKept += Chosen == Way::Epilogue;
    EpilogueTimedMs += EpiMs;
    PlainTimedMs += PlainMs;
    if (LtLog)
      std::fprintf(stderr,
                   "megac-run: epilogue timed %lldx%lldx%lld %s%s: epilogue "
                   "%.4f ms, plain %.4f ms: %s\n",
                   static_cast<long long>(Pl.Rows),
                   static_cast<long long>(Pl.Cols),
                   static_cast<long long>(Pl.K), ltEpilogueName(Pl.Epilogue),
                   WithC ? "+c" : "", double(EpiMs), double(PlainMs),
                   Chosen == Way::Epilogue ? "epilogue" : "plain");
    return Chosen == Way::Epilogue;
  }
  static constexpr float kPlainMargin = 0.05f;
  /// Whether ranks may compute replicated values that nothing reduces
  /// after: a grid axis of more than one rank that is neither data
  /// parallel (whose gradients are summed over it) nor pipeline parallel
  /// (whose ranks hold other layers). Tensor parallel ranks compute the
  /// row-parallel products' bias gradients each from the same dy.
  bool replicatedAcrossRanks() const {
    if (!P.axes())
      return false;
    for (const auto *Axis : *P.axes()) {
      const std::string Name = Axis->name() ? Axis->name()->str() : "";
      if (Axis->size() > 1 && Name != "dp" && Name != "pp")
        return true;
    }
    return false;
  }

  /// Row-major y[M,N] = x[M,K] w + bias in fp32, with one cuBLASLt
  /// product whose epilogue adds the bias as it writes y: no pass over y
  /// for it after the product. A GeLU after stays megac's kernel: the CPU
  /// matches it within 1e-5, and cuBLASLt does not say how exactly its
  /// GeLU epilogue computes. Operands of bf16 values (\p Bf16) go to the
  /// tensor cores as bf16; fp32 products are full fp32 (no TF32), as the
  /// cuBLAS ones.
  /// False where cuBLASLt has no algorithm for the shape (or a pointer is
  /// not LtAlign-aligned: ltMatmul): the caller then runs the product and
  /// the epilogue kernel itself.
  bool linearEpilogue(const float *X, int64_t M, int64_t K, const float *W,
                      int64_t N, bool Transposed, const float *Bias, bool Bf16,
                      float *Y, const uint16_t *CopyX, const uint16_t *CopyW,
                      const float *Residual) {
    if (M == 0 || N == 0 || K == 0)
      return false;
    LtPlan &Pl =
        ltPlan(M, K, N, Transposed, Bf16, false, CUBLASLT_EPILOGUE_BIAS);
    if (!Pl.Ok)
      return false;
    ltPointer(Pl, CUBLASLT_MATMUL_DESC_BIAS_POINTER, Bias);
    const void *Wa = W, *Xa = X;
    if (Bf16)
      std::tie(Wa, Xa) = packOperands(W, K * N, CopyW, X, M * K, CopyX);
    return ltMatmul(Pl, Wa, Xa, Residual, Y);
  }

  /// linear_bias (a GEMM group): t = x w + b (+ the residual r, where the
  /// plan adds one); y = GeLU(t) or t; the GeLU's input t, where the plan
  /// keeps it, as a second output. Rounded (a bf16 plan's group), one
  /// cuBLASLt product of bf16 operands computes it all in its epilogue,
  /// bias and residual in bf16, and writes both in bf16, rounded once from
  /// fp32, where cuBLASLt takes it and epilogueChosen says so; else the
  /// product, then one epilogue kernel.
  void linearBias(const Instr &In, uint32_t Idx, int64_t M, int64_t K,
                  int64_t N, bool T) {
    const uint32_t X = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   Bias = In.inputs()->Get(2);
    const uint16_t *CopyX = readCopy(X, Idx), *CopyW = readCopy(W, Idx);
    if (M * N == 0)
      return;
    const bool Round = In.round_bf16();
    RoundedGroups += Round;
    if (Round && bf16Operands(In) && Bf16[Bias] &&
        roundedLinearBias(In, Idx, M, K, N, T, CopyX, CopyW))
      return;
    plainLinearBias(In, Idx, M, K, N, T, CopyX, CopyW);
  }

  /// linearBias without cuBLASLt's bf16 epilogues. A rounded bias alone:
  /// biasAsC. fp32: cuBLASLt adds the bias as it writes t (into the kept
  /// input of the GeLU, else y); or the product, then the epilogue kernel.
  /// With the buffers kept in bf16 alone, a rounded group's product goes
  /// to scratch and the kernel writes the copies.
  void plainLinearBias(const Instr &In, uint32_t Idx, int64_t M, int64_t K,
                       int64_t N, bool T, const uint16_t *CopyX,
                       const uint16_t *CopyW) {
    const uint32_t X = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   Bias = In.inputs()->Get(2), Y = In.outputs()->Get(0);
    const bool Keep = In.outputs()->size() == 2;
    const uint32_t Pre = Keep ? In.outputs()->Get(1) : Y;
    const bool Gelu = In.ints()->Get(1) != 0, Round = In.round_bf16();
    const bool Residual = In.inputs()->size() == 4;
    const uint32_t Res = Residual ? In.inputs()->Get(3) : X;
    const int64_t NY = M * N;
    if (Round && !Gelu && !Keep && !Residual && K > 0 && bf16Operands(In) &&
        Bf16[Bias]) {
      biasAsC(In, Idx, M, K, N, T, CopyX, CopyW);
      return;
    }
    const bool Fp32Out = f(Y) && (!Keep || f(Pre));
    float *Out = Fp32Out ? f(Keep ? Pre : Y)
                         : static_cast<float *>(scratch(size_t(NY) * 4));
    if (Fp32Out && !Round && f(Bias) && (!Residual || f(Res)) &&
        linearEpilogue(f(X), M, K, f(W), N, T, f(Bias), bf16Operands(In), Out,
                       CopyX, CopyW, Residual ? f(Res) : nullptr)) {
      if (Gelu)
        launchOn(Compute, geluKernel, blocksFor(NY), kThreads, 0, Out, NY,
                 f(Y));
      return;
    }
    if (K == 0)
      check(cudaMemsetAsync(Out, 0, size_t(NY) * 4, Compute),
            "cudaMemsetAsync");
    else
      colGemm(T ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, f(W),
              T ? K : N, f(X), K, 0.0f, Out, N, bf16Operands(In), CopyW, CopyX);
    // The bias and the residual each in fp32 or as bf16 bits (a rounded
    // bias may be kept in bf16 alone).
    auto epilogue = [&](auto *B, auto *R) {
      launchOn(
          Compute, linearEpilogueKernel<Elem<decltype(R)>, Elem<decltype(B)>>,
          N % 4 ? blocksFor(NY) : wideBlocks(NY), kThreads, 0,
          static_cast<const float *>(Out), NY, B, N, int(Gelu), int(Round),
          f(Y), Round ? writeCopy(Y, Idx) : nullptr, Keep ? f(Pre) : nullptr,
          Round && Keep ? writeCopy(Pre, Idx) : nullptr, R);
    };
    withInput(Bias, Idx, [&](auto *B) {
      if (Residual)
        withInput(Res, Idx, [&](auto *R) { epilogue(B, R); });
      else
        epilogue(B, static_cast<const float *>(nullptr));
    });
    RoundedAsWritten = Round;
  }

  /// For instruction \p Idx: the bf16 bits of its input \p In (\p NIn
  /// bf16 values), from its copy, else packed into scratch; and where it
  /// writes those of its output \p Out (\p NOut elements): its copy, else
  /// scratch.
  std::pair<const uint16_t *, uint16_t *> bitsInOut(uint32_t In, int64_t NIn,
                                                    uint32_t Out, int64_t NOut,
                                                    uint32_t Idx) {
    const uint16_t *In16 = readCopy(In, Idx);
    uint16_t *Out16 = writeCopy(Out, Idx);
    const auto [InPart, OutPart] = scratchParts<2>(
        {In16 ? 0 : size_t(NIn) * 2, Out16 ? 0 : size_t(NOut) * 2});
    if (!In16) {
      packBf16(f(In), NIn, InPart, /*Exact=*/true);
      In16 = InPart;
    }
    return {In16, Out16 ? Out16 : OutPart};
  }
  /// Output \p Y written rounded as the \p N bf16 bits \p Y16 (its copy,
  /// or scratch): widened into its fp32 storage where it has one.
  void roundedInBits(uint32_t Y, const uint16_t *Y16, int64_t N) {
    if (!Bf16Only[Y]) // else the bf16 result is all of y
      launchOn(Compute, widenBf16Kernel, wideBlocks(N), kThreads, 0, Y16, N,
               f(Y));
    RoundedAsWritten = true;
  }

  /// plainLinearBias of a rounded group with a bias alone, of bf16 values
  /// throughout: the bias's bits broadcast into y's, then cuBLAS adds the
  /// product to them (the bias its C, beta = 1) and rounds the fp32 sum
  /// once, as cuBLASLt's bias epilogue does: 4 bytes an element more than
  /// the epilogue product moves (the broadcast written, then read as C),
  /// where an fp32 product and the epilogue kernel move 8 more (q, k and
  /// v's products, half of a GPT layer's forward products).
  void biasAsC(const Instr &In, uint32_t Idx, int64_t M, int64_t K, int64_t N,
               bool T, const uint16_t *CopyX, const uint16_t *CopyW) {
    const uint32_t X = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   Bias = In.inputs()->Get(2), Y = In.outputs()->Get(0);
    const int64_t NY = M * N;
    const auto [Bias16, Y16] = bitsInOut(Bias, N, Y, NY, Idx);
    launchOn(Compute, broadcastRowKernel, wideBlocks(NY), kThreads, 0, Bias16,
             N, NY, Y16);
    colGemm(T ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, f(W),
            T ? K : N, f(X), K, 1.0f, f(Y), N, true, CopyW, CopyX, Y16);
    roundedInBits(Y, Y16, NY);
  }

  /// linear_gelu_grad: dx = GeLU's gradient at the kept input x, with the
  /// product dy w as the output gradient. Rounded (a bf16 plan), with bf16
  /// operands and x of bf16 values: one cuBLASLt product whose DGELU
  /// epilogue reads x's bf16 copy (packed where it has none) as its
  /// auxiliary input and writes dx in bf16, rounded once (where
  /// epilogueChosen says so); else the product into fp32, then the
  /// epilogue kernel.
  void linearGeluGrad(const Instr &In, uint32_t Idx, int64_t M, int64_t K,
                      int64_t N, bool T) {
    const uint32_t Dy = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   Kept = In.inputs()->Get(2), Y = In.outputs()->Get(0);
    const bool Round = In.round_bf16();
    const int64_t NY = M * N;
    if (NY == 0)
      return;
    const uint16_t *CopyDy = readCopy(Dy, Idx), *CopyW = readCopy(W, Idx);
    RoundedGroups += Round;
    // The product into fp32, then the epilogue kernel.
    auto Plain = [&] {
      float *Out = f(Y) ? f(Y) : static_cast<float *>(scratch(size_t(NY) * 4));
      if (K == 0)
        check(cudaMemsetAsync(Out, 0, size_t(NY) * 4, Compute),
              "cudaMemsetAsync");
      else
        colGemm(T ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, f(W),
                T ? K : N, f(Dy), K, 0.0f, Out, N, bf16Operands(In), CopyW,
                CopyDy);
      withInput(Kept, Idx, [&](auto *X) {
        launchOn(Compute, geluGradEpilogueKernel<Elem<decltype(X)>>,
                 wideBlocks(NY), kThreads, 0, X,
                 static_cast<const float *>(Out), NY, int(Round), f(Y),
                 Round ? writeCopy(Y, Idx) : nullptr);
      });
      RoundedAsWritten = Round;
    };
    if (Round && bf16Operands(In) && Bf16[Kept] && K > 0 && N % 8 == 0 &&
        !EpiloguesOff) {
      LtPlan &Pl = ltPlan(M, K, N, T, true, true, CUBLASLT_EPILOGUE_DGELU);
      auto Epilogue = [&] {
        // Scratch only for what has no copy: x's bf16 bits, dx's.
        const auto [Kept16, Y16] = bitsInOut(Kept, NY, Y, NY, Idx);
        ltPointer(Pl, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, Kept16);
        const auto [Wa, Dya] =
            packOperands(f(W), K * N, CopyW, f(Dy), M * K, CopyDy);
        if (!ltMatmul(Pl, Wa, Dya, nullptr, Y16))
          return false;
        roundedInBits(Y, Y16, NY);
        ++EpilogueProducts;
        return true;
      };
      if (Pl.Ok && epilogueChosen(Pl, Idx, false, Epilogue, Plain) &&
          Epilogue())
        return;
    }
    Plain();
  }

  /// linear with a third input c (format 15, a "c" group): y = x w + c,
  /// c cuBLAS's C with beta = 1. Rounded (a bf16 plan) with bf16 operands
  /// and c of bf16 values: one cuBLASLt product reads c's bf16 bits and
  /// writes y's, the fp32 sum rounded once (where cuBLASLt has no
  /// algorithm, MEGAC_CUDA_EPILOGUES=0 keeps products off it, or the
  /// timed choice finds it slower, c's bits are copied into y's and cuBLAS
  /// adds the product to them in place);
  /// else c goes into y's fp32 storage and the product adds to it
  /// (rounded after, where the plan rounds).
  void linearInto(const Instr &In, uint32_t Idx, int64_t M, int64_t K,
                  int64_t N, bool T) {
    const uint32_t X = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   C = In.inputs()->Get(2), Y = In.outputs()->Get(0);
    const int64_t NY = M * N;
    if (NY == 0)
      return;
    const uint16_t *CopyX = readCopy(X, Idx), *CopyW = readCopy(W, Idx);
    const cublasOperation_t TW = T ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (In.round_bf16() && bf16Operands(In) && Bf16[C] && K > 0) {
      // (Named apart, not structured bindings: the lambdas below capture
      // them, which C++17 does not allow of bindings.)
      const auto Bits = bitsInOut(C, NY, Y, NY, Idx);
      const uint16_t *C16 = Bits.first;
      uint16_t *Y16 = Bits.second;
      const auto Operands =
          packOperands(f(W), K * N, CopyW, f(X), M * K, CopyX);
      const uint16_t *Wa = Operands.first, *Xa = Operands.second;
      // C's bits copied into y's, the product added to them in place.
      auto Plain = [&] {
        check(cudaMemcpyAsync(Y16, C16, size_t(NY) * 2,
                              cudaMemcpyDeviceToDevice, Compute),
              "cudaMemcpyAsync");
        colGemm(TW, CUBLAS_OP_N, N, M, K, f(W), T ? K : N, f(X), K, 1.0f, f(Y),
                N, true, CopyW, CopyX, Y16);
      };
      LtPlan *Pl = EpiloguesOff
                       ? nullptr
                       : &ltPlan(M, K, N, T, true, true,
                                 CUBLASLT_EPILOGUE_DEFAULT, /*AddsC=*/true);
      auto Epilogue = [&] { return ltMatmul(*Pl, Wa, Xa, C16, Y16); };
      if (!Pl || !Pl->Ok ||
          !(epilogueChosen(*Pl, Idx, /*WithC=*/true, Epilogue, Plain) &&
            Epilogue()))
        Plain();
      roundedInBits(Y, Y16, NY);
      return;
    }
    withInput(C, Idx, [&](auto *From) {
      if constexpr (std::is_same_v<Elem<decltype(From)>, uint16_t>)
        launchOn(Compute, widenBf16Kernel, wideBlocks(NY), kThreads, 0, From,
                 NY, f(Y));
      else
        check(cudaMemcpyAsync(f(Y), From, size_t(NY) * 4,
                              cudaMemcpyDeviceToDevice, Compute),
              "cudaMemcpyAsync");
    });
    if (K > 0) // (an empty product adds nothing)
      colGemm(TW, CUBLAS_OP_N, N, M, K, f(W), T ? K : N, f(X), K, 1.0f, f(Y), N,
              bf16Operands(In), CopyW, CopyX);
  }

  /// DT [Rows, H] = Into (where not null) + the embedding's gradient: the
  /// sum of dy (buffer \p Dy, as instruction \p Idx reads it) over the
  /// tokens (buffer \p Ids) of each row's id, Start the id of row 0, in
  /// token order, as the CPU sums them (embeddingGradRowsKernel).
  void embeddingGrad(uint32_t Ids, uint32_t Dy, uint32_t Idx, int64_t Rows,
                     int64_t H, int64_t Start, const float *Into, float *DT) {
    if (Rows == 0 || H == 0)
      return;
    const int64_t N = numel(Ids);
    const auto Parts = scratchParts<4>(
        {size_t(N) * 4, size_t(Rows) * 4, size_t(Rows) * 4, size_t(N) * 4});
    int32_t *Rank = reinterpret_cast<int32_t *>(Parts[0]),
            *Counts = reinterpret_cast<int32_t *>(Parts[1]),
            *Offsets = reinterpret_cast<int32_t *>(Parts[2]),
            *Tokens = reinterpret_cast<int32_t *>(Parts[3]);
    check(cudaMemsetAsync(Counts, 0, size_t(Rows) * 4, Compute),
          "cudaMemsetAsync");
    if (N > 0) {
      launchOn(Compute, tokenRanksKernel, blocksFor(N), kThreads, 0, i32(Ids),
               N, Start, Rows, Rank, Counts);
    }
    launchOn(Compute, rowOffsetsKernel, 1, kThreads, 0,
             static_cast<const int32_t *>(Counts), Rows, Offsets);
    if (N > 0)
      launchOn(Compute, placeTokensKernel, blocksFor(N), kThreads, 0, i32(Ids),
               N, Start, static_cast<const int32_t *>(Rank),
               static_cast<const int32_t *>(Offsets), Tokens);
    withInput(Dy, Idx, [&](auto *D) {
      launchOn(Compute, embeddingGradRowsKernel<Elem<decltype(D)>>,
               rowBlocks(Rows), kThreads, 0, D, Rows, H,
               static_cast<const int32_t *>(Counts),
               static_cast<const int32_t *>(Offsets),
               static_cast<const int32_t *>(Tokens), Into, DT, int(Into == DT));
    });
  }

  /// linear_weight_grad with the bias gradient (a "w" group) as one
  /// cuBLASLt product of bf16 operands: the weight gradient as colGemm
  /// computes it, and dy's column sums from the BGRADA epilogue (dy is A,
  /// dw^T = dy^T x) or BGRADB (dy is B, the transposed dw^T = x^T dy),
  /// summed in fp32 as the product reads dy. False where the operands are
  /// not bf16 values (an fp32 plan keeps its exact sums), epilogues are
  /// off, cuBLASLt has no algorithm, or epilogueChosen chose \p Plain (the
  /// column-sum kernels and the product): the caller then runs that.
  template <class PlainFn>
  bool weightBiasEpilogue(const Instr &In, uint32_t Idx, int64_t Rows,
                          int64_t K, int64_t N, bool T, PlainFn &&Plain) {
    const uint32_t X = In.inputs()->Get(0), Dy = In.inputs()->Get(1);
    float *Bias = f(In.outputs()->Get(1));
    if (!bf16Operands(In) || EpiloguesOff || !BiasGradEpilogue)
      return false;
    LtPlan &Pl =
        ltColPlan(CUBLAS_OP_N, CUBLAS_OP_T, T ? K : N, T ? N : K, Rows,
                  T ? K : N, T ? N : K, /*Bf16=*/true, /*Out16=*/false,
                  T ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA);
    if (!Pl.Ok)
      return false;
    auto Epilogue = [&] {
      ltPointer(Pl, CUBLASLT_MATMUL_DESC_BIAS_POINTER, Bias);
      const auto [X16, Dy16] = packOperands(f(X), Rows * K, readCopy(X, Idx),
                                            f(Dy), Rows * N, readCopy(Dy, Idx));
      if (!ltMatmul(Pl, T ? X16 : Dy16, T ? Dy16 : X16, nullptr,
                    f(In.outputs()->Get(0))))
        return false;
      ++BiasGradEpilogues;
      return true;
    };
    return epilogueChosen(Pl, Idx, false, Epilogue, Plain) && Epilogue();
  }

  /// A bf16 plan's GEMM group on cuBLASLt alone: bf16 operands, bias and
  /// results (into the outputs' copies, else scratch widened into their
  /// fp32 storage). False where cuBLASLt has no algorithm, or the shape or
  /// alignment is not what its epilogues take (N a multiple of 8).
  bool roundedLinearBias(const Instr &In, uint32_t Idx, int64_t M, int64_t K,
                         int64_t N, bool T, const uint16_t *CopyX,
                         const uint16_t *CopyW) {
    const uint32_t X = In.inputs()->Get(0), W = In.inputs()->Get(1),
                   Bias = In.inputs()->Get(2), Y = In.outputs()->Get(0);
    const bool Keep = In.outputs()->size() == 2;
    const uint32_t Pre = Keep ? In.outputs()->Get(1) : Y;
    const bool Gelu = In.ints()->Get(1) != 0;
    const bool Residual = In.inputs()->size() == 4;
    const uint32_t Res = Residual ? In.inputs()->Get(3) : X;
    const uint32_t Epi = !Gelu  ? CUBLASLT_EPILOGUE_BIAS
                         : Keep ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                : CUBLASLT_EPILOGUE_GELU_BIAS;
    // A residual is C, of D's type: bf16 values only.
    if (K == 0 || N % 8 || EpiloguesOff || (Residual && !Bf16[Res]))
      return false;
    LtPlan &Pl = ltPlan(M, K, N, T, true, true, Epi);
    if (!Pl.Ok)
      return false;
    auto Epilogue = [&] {
      // Scratch only for what has no copy: the bias's bf16 bits, y's, the
      // kept input's, the residual's.
      const int64_t NY = M * N;
      const uint16_t *Bias16 = readCopy(Bias, Idx),
                     *Res16 = Residual ? readCopy(Res, Idx) : nullptr;
      uint16_t *Y16 = writeCopy(Y, Idx),
               *Pre16 = Keep ? writeCopy(Pre, Idx) : nullptr;
      const auto [BiasPart, YPart, PrePart, ResPart] =
          scratchParts<4>({Bias16 ? 0 : size_t(N) * 2, Y16 ? 0 : size_t(NY) * 2,
                           !Keep || Pre16 ? 0 : size_t(NY) * 2,
                           !Residual || Res16 ? 0 : size_t(NY) * 2});
      if (!Bias16) {
        packBf16(f(Bias), N, BiasPart, /*Exact=*/true);
        Bias16 = BiasPart;
      }
      if (Residual && !Res16) {
        packBf16(f(Res), NY, ResPart, /*Exact=*/true);
        Res16 = ResPart;
      }
      if (!Y16)
        Y16 = YPart;
      if (Keep && !Pre16)
        Pre16 = PrePart;
      ltPointer(Pl, CUBLASLT_MATMUL_DESC_BIAS_POINTER, Bias16);
      if (Keep)
        ltPointer(Pl, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, Pre16);
      const auto [Wa, Xa] =
          packOperands(f(W), K * N, CopyW, f(X), M * K, CopyX);
      if (!ltMatmul(Pl, Wa, Xa, Res16, Y16)) // Res16: null without residual
        return false;
      for (auto [Out, Bits] : {std::pair{Y, Y16}, std::pair{Pre, Pre16}})
        if (Bits && f(Out) && (Out == Y || Keep))
          launchOn(Compute, widenBf16Kernel, wideBlocks(NY), kThreads, 0,
                   static_cast<const uint16_t *>(Bits), NY, f(Out));
      RoundedAsWritten = true;
      ++EpilogueProducts;
      return true;
    };
    return epilogueChosen(
               Pl, Idx, Residual, Epilogue,
               [&] { plainLinearBias(In, Idx, M, K, N, T, CopyX, CopyW); }) &&
           Epilogue();
  }

  /// Row-major y[M,N] = x[M,K] w (w [K,N], or [N,K] read transposed),
  /// through column-major cuBLAS: y^T = w^T x^T.
  void gemm(const float *X, int64_t M, int64_t K, const float *W, int64_t N,
            bool Transposed, float *Y, bool Bf16Values,
            const uint16_t *CopyX = nullptr, const uint16_t *CopyW = nullptr,
            uint16_t *Y16 = nullptr) {
    if (M == 0 || N == 0)
      return;
    if (K == 0) { // an empty sum (cuBLAS refuses a leading dimension of 0)
      check(cudaMemsetAsync(Y, 0, size_t(M * N) * 4, Compute),
            "cudaMemsetAsync");
      return;
    }
    colGemm(Transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, W,
            Transposed ? K : N, X, K, 0.0f, Y, N, Bf16Values, CopyW, CopyX,
            Y16);
  }

  /// Ids and labels must lie in the model's vocabulary (the CPU checks
  /// the same); a plan without one is checked against \p Local.
  int64_t vocabSize(int64_t Local) const {
    return P.vocab_size() > 0 ? int64_t(P.vocab_size()) : Local;
  }

  /// The dropout key of a stream for the current step and micro-batch, as
  /// the CPU backend draws it (executor.cpp, dropoutStep).
  uint64_t dropoutKeyOf(int64_t Stream) const {
    const uint64_t M = uint64_t(std::max<int64_t>(1, P.micro_batches()));
    return dropoutKey(Seed, uint64_t(Stream),
                      uint64_t(Step - 1) * M + uint64_t(CurMicro) + 1);
  }

  /// Attention probability dropout of \p In, its ints from \p First:
  /// [stream, global batch, global heads, batch offset, head offset].
  AttnDropout attnDropout(const Instr &In, unsigned First) const {
    AttnDropout Dr;
    if (Inference || !In.floats() || In.floats()->size() != 1 || !In.ints() ||
        In.ints()->size() != First + 5)
      return Dr;
    Dr.Rate = In.floats()->Get(0);
    Dr.Key = dropoutKeyOf(In.ints()->Get(First));
    Dr.GlobalHeads = In.ints()->Get(First + 2);
    Dr.BatchOffset = In.ints()->Get(First + 3);
    Dr.HeadOffset = In.ints()->Get(First + 4);
    return Dr;
  }

  /// The binary of \p Kn this device loads (pickKernelImage); an error
  /// naming what the plan has where none runs here. \p ByKnob: the PTX
  /// only because MEGAC_CUDA_KERNEL_IMAGE=ptx asked for it.
  const KernelBinary &kernelImage(const Kernel &Kn, bool &ByKnob) const {
    std::vector<std::string> Archs;
    if (Kn.binaries())
      for (const KernelBinary *B : *Kn.binaries())
        Archs.push_back(B->arch() ? B->arch()->str() : "");
    const int Pick = pickKernelImage(Archs, Major, Minor, PtxKernels);
    ByKnob = PtxKernels && Pick != pickKernelImage(Archs, Major, Minor);
    const KernelBinary *Bin =
        Pick >= 0 ? Kn.binaries()->Get(uint32_t(Pick)) : nullptr;
    if (!Bin || !Bin->cubin() || Bin->cubin()->size() == 0) {
      std::string Have;
      for (const std::string &A : Archs)
        Have += (Have.empty() ? "" : ", ") + A;
      throw std::runtime_error(
          "kernel " + Kn.name()->str() + " has no binary for " + Arch +
          " (the plan has " + (Have.empty() ? "none" : Have) +
          "; megac compile --cuda-arch names the architectures, and its "
          "default, sm_80,sm_90,compute_90, runs on sm_80 and later)");
    }
    return *Bin;
  }

  CUfunction kernel(uint32_t Index) {
    if (Modules.size() <= Index) {
      Modules.resize(Index + 1, nullptr);
      Functions.resize(Index + 1, nullptr);
    }
    if (Functions[Index])
      return Functions[Index];
    const Kernel &Kn = *P.kernels()->Get(Index);
    // The device's cubin, or PTX the driver compiles for it
    // (kernel_image.h). The emulation chooses too, as a device of its
    // MEGAC_CUDA_EMU_SM would, then runs the kernel's CUDA source (a plan
    // written without NVRTC has no binaries: the source alone).
    const KernelBinary *Bin = nullptr;
    bool ByKnob = false;
#ifdef MEGAC_CUDA_EMULATION
    if (Kn.binaries() && Kn.binaries()->size())
      Bin = &kernelImage(Kn, ByKnob);
#else
    Bin = &kernelImage(Kn, ByKnob);
#endif
    const std::string BinArch = Bin ? Bin->arch()->str() : "";
    const bool FromPtx = Bin && parseArch(BinArch).Ptx;
#ifdef MEGAC_CUDA_EMULATION
    // Fused kernels take (y, y16, x0..xn-1, h0..hn-1, n, p0..pn-1).
    std::vector<std::string> Types = {"float *", "unsigned short *"};
    for (unsigned K = 0; K < Kn.inputs(); ++K)
      Types.push_back("const float *");
    for (unsigned K = 0; K < Kn.inputs(); ++K)
      Types.push_back("const unsigned short *");
    Types.push_back("long long");
    for (unsigned K = 0; K < Kn.inputs(); ++K)
      Types.push_back("long long");
    std::string Error;
    if (megac_emu::moduleFromSource(&Modules[Index], Kn.source()->str(),
                                    Kn.name()->str(), Types,
                                    Error) != CUDA_SUCCESS)
      throw std::runtime_error("kernel " + Kn.name()->str() +
                               " does not compile on the host: " + Error);
#else
    // The plan's bytes are only 4-byte aligned; the loader gets 8. PTX
    // must end in a NUL (megac's does; a plan's may not: one is added).
    const size_t Size = Bin->cubin()->size();
    std::vector<uint64_t> Image((Size + 1 + 7) / 8, 0);
    std::memcpy(Image.data(), Bin->cubin()->data(), Size);
    // The driver's JIT says why PTX does not compile in its error log.
    char JitLog[2048] = {0};
    CUjit_option JitOpts[2] = {CU_JIT_ERROR_LOG_BUFFER,
                               CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *JitValues[2] = {JitLog,
                          reinterpret_cast<void *>(uintptr_t(sizeof(JitLog)))};
    if (CUresult R = cuModuleLoadDataEx(&Modules[Index], Image.data(), 2,
                                        JitOpts, JitValues);
        R != CUDA_SUCCESS) {
      const char *Msg = nullptr;
      cuGetErrorString(R, &Msg);
      std::string Log(JitLog, strnlen(JitLog, sizeof(JitLog)));
      for (char &C : Log)
        if (C == '\n' || C == '\r')
          C = ' ';
      while (!Log.empty() && Log.back() == ' ')
        Log.pop_back();
      throw std::runtime_error(
          "cuModuleLoadDataEx: kernel " + Kn.name()->str() + " (" + BinArch +
          (FromPtx ? " PTX" : " cubin") + ") does not load on " + Arch + ": " +
          (Msg ? Msg : "unknown error") +
          (Log.empty() ? std::string() : " (the JIT's log: " + Log + ")") +
          (FromPtx ? " (the driver may be older than the CUDA toolkit that "
                     "compiled the plan)"
                   : ""));
    }
#endif
    if (FromPtx && PtxLoadedFor.empty())
      PtxLoadedFor = BinArch;
    PtxModules += FromPtx;
    PtxByKnob += ByKnob;
    CubinsDespiteKnob += PtxKernels && Bin && !FromPtx;
    check(cuModuleGetFunction(&Functions[Index], Modules[Index],
                              Kn.name()->c_str()),
          "cuModuleGetFunction");
    return Functions[Index];
  }

  /// Generated kernel \p Idx over \p Y's elements; one that rounds also
  /// writes the bf16 copy of Y (when it has one; Y itself may have no fp32
  /// storage). Inputs with a bf16 copy that \p Idx may read are read from
  /// it: half the bytes.
  void launchFused(uint32_t Idx, const Instr &In, uint32_t Y) {
    CUfunction Fn = kernel(uint32_t(In.ints()->Get(0)));
    const unsigned NIn = In.inputs()->size();
    std::vector<const void *> Ptrs(2 * NIn);
    std::vector<long long> Periods(NIn);
    long long NN = numel(Y);
    void *Out = Ptr[Y], *Out16 = writeCopy(Y, Idx);
    std::vector<void *> Args = {&Out, &Out16};
    for (unsigned K = 0; K < NIn; ++K) {
      const uint32_t X = In.inputs()->Get(K);
      Ptrs[NIn + K] = readCopy(X, Idx);
      Ptrs[K] = Ptrs[NIn + K] ? nullptr : Ptr[X];
    }
    for (const void *&Q : Ptrs)
      Args.push_back(&Q);
    Args.push_back(&NN);
    for (unsigned K = 0; K < NIn; ++K) {
      Periods[K] = std::max<long long>(1, numel(In.inputs()->Get(K)));
      Args.push_back(&Periods[K]);
    }
    // Four elements a thread where the kernel can (its wide loop: every
    // period a multiple of 4; the arena and allocations are aligned).
    bool Wide = NN % 4 == 0;
    for (long long Period : Periods)
      Wide &= Period % 4 == 0;
    check(cuLaunchKernel(Fn, Wide ? wideBlocks(NN) : blocksFor(NN), 1, 1,
                         kThreads, 1, 1, 0, Compute, Args.data(), nullptr),
          "cuLaunchKernel");
  }

  void copy(uint32_t Y, uint32_t X) {
    check(cudaMemcpyAsync(Ptr[Y], Ptr[X], std::min(Bytes[Y], Bytes[X]),
                          cudaMemcpyDeviceToDevice, Compute),
          "cudaMemcpyAsync");
  }

  void exec(uint32_t Idx, const Instr &In) {
    auto X = [&](unsigned K) { return In.inputs()->Get(K); };
    auto Int = [&](unsigned K) { return In.ints()->Get(K); };
    auto NumInts = [&]() { return In.ints() ? In.ints()->size() : 0u; };
    auto Flt = [&](unsigned K) { return In.floats()->Get(K); };
    const uint32_t Y =
        In.outputs() && In.outputs()->size() ? In.outputs()->Get(0) : 0;
    const int64_t NY = numel(Y);
    if (In.op() == op::Send || In.op() == op::Recv) { // recv has no input
      transfer(In);
      return;
    }
    if (In.op() == op::Fill) { // the only compute opcode without inputs
      launchOn(Compute, fillKernel, blocksFor(NY), kThreads, 0, f(Y), NY,
               float(Flt(0)));
      return;
    }
    const std::vector<int64_t> A = shape(X(0));
    const int64_t Last = A.empty() ? 1 : A.back();
    const int64_t Rows = Last ? numel(X(0)) / Last : 0;
    // A micro-batch after the first adds to the sums it accumulates.
    const bool Accumulating = CurMicro > 0;
    switch (In.op()) {
    case op::Embedding:
      withInput(X(0), Idx, [&](auto *Table) {
        launchOn(Compute, embeddingKernel<Elem<decltype(Table)>>, blocksFor(NY),
                 kThreads, 0, Table, A[0], A[1], i32(X(1)), numel(X(1)), Int(0),
                 vocabSize(Int(0) + A[0]), f(Y), Faults + kFaultBadToken,
                 outputStore(In, Y, Idx));
      });
      return;
    case op::PositionEmbedding: // rows 0..S-1 of the table: contiguous
    case op::Reshape:
    case op::Assign:
      copy(Y, X(0));
      return;
    case op::LinearBias:
    case op::LinearGeluGrad: {
      auto W = shape(X(1));
      const bool T = Int(0) != 0;
      const int64_t K = T ? W[1] : W[0], N = T ? W[0] : W[1];
      if (In.op() == op::LinearBias)
        linearBias(In, Idx, N ? NY / N : 0, K, N, T);
      else
        linearGeluGrad(In, Idx, N ? NY / N : 0, K, N, T);
      return;
    }
    case op::Linear: {
      auto W = shape(X(1));
      const bool T = Int(0) != 0;
      const int64_t K = T ? W[1] : W[0], N = T ? W[0] : W[1];
      if (In.inputs()->size() == 3) { // a C to add (format 15)
        linearInto(In, Idx, N ? NY / N : 0, K, N, T);
        return;
      }
      const uint16_t *CopyX = readCopy(X(0), Idx), *CopyW = readCopy(X(1), Idx);
      // A rounded product of bf16 values (Instr.round_bf16): cuBLAS writes
      // the bf16 result into y's copy (or scratch), widened into y: no fp32
      // result to read back and round.
      uint16_t *Y16 = nullptr;
      if (In.round_bf16() && bf16Operands(In) && NY > 0 && K > 0) {
        Y16 = writeCopy(Y, Idx);
        if (!Y16)
          Y16 = static_cast<uint16_t *>(scratch(size_t(NY) * 2));
      }
      gemm(f(X(0)), N ? NY / N : 0, K, f(X(1)), N, T, f(Y), bf16Operands(In),
           CopyX, CopyW, Y16);
      if (Y16)
        roundedInBits(Y, Y16, NY);
      return;
    }
    case op::MatMul: {
      const size_t R = A.size();
      const int64_t M = A[R - 2], K = A[R - 1], N = shape(X(1))[R - 1];
      if (M * N == 0)
        return;
      if (K == 0) {
        check(cudaMemsetAsync(Ptr[Y], 0, Bytes[Y], Compute), "cudaMemsetAsync");
        return;
      }
      const float One = 1.0f, Zero = 0.0f;
      // Row-major y = a b per batch is column-major y^T = b^T a^T.
      check(cublasSgemmStridedBatched(Blas, CUBLAS_OP_N, CUBLAS_OP_N, int(N),
                                      int(M), int(K), &One, f(X(1)), int(N),
                                      K * N, f(X(0)), int(K), M * K, &Zero,
                                      f(Y), int(N), M * N, int(NY / (M * N))),
            "cublasSgemmStridedBatched");
      return;
    }
    case op::LinearWeightGrad: {
      // dw [K,N] = x^T dy, or [N,K] = dy^T x when the weight was used
      // transposed; a micro-batch sum adds (beta = 1) after the first. A
      // second output (format 13): the bias gradient, dy's column sums.
      const int64_t N = shape(X(1)).back();
      const float Beta =
          NumInts() > 1 && Int(1) != 0 && Accumulating ? 1.0f : 0.0f;
      const bool T = Int(0) != 0;
      const bool BiasGrad = In.outputs()->size() == 2;
      if (N == 0)
        return;
      BiasGradGroups += BiasGrad;
      // The bias gradient from column sums, then the product.
      auto Plain = [&] {
        if (BiasGrad)
          columnSums(X(1), Idx, N, f(In.outputs()->Get(1)), /*Add=*/false);
        if (Last == 0)
          return;
        if (Rows == 0) {
          if (Beta == 0.0f)
            check(cudaMemsetAsync(Ptr[Y], 0, Bytes[Y], Compute),
                  "cudaMemsetAsync");
          return;
        }
        // Column-major views: dw^T [N,K] = dy^T x (not transposed), dw^T
        // [K,N] = x^T dy (transposed); both "A * B^T" over the rows.
        const uint16_t *Copy0 = readCopy(X(0), Idx),
                       *Copy1 = readCopy(X(1), Idx);
        colGemm(CUBLAS_OP_N, CUBLAS_OP_T, T ? Last : N, T ? N : Last, Rows,
                T ? f(X(0)) : f(X(1)), T ? Last : N, T ? f(X(1)) : f(X(0)),
                T ? N : Last, Beta, f(Y), T ? Last : N, bf16Operands(In),
                T ? Copy0 : Copy1, T ? Copy1 : Copy0);
      };
      // (The epilogue writes dw with beta 0: not into a micro-batch sum,
      // which the compiler does not group with a bias gradient.)
      if (BiasGrad && Last > 0 && Rows > 0 && Beta == 0.0f &&
          weightBiasEpilogue(In, Idx, Rows, Last, N, T, Plain))
        return;
      Plain();
      return;
    }
    case op::Add:
    case op::Mul:
      withInput(X(0), Idx, [&](auto *A) {
        withInput(X(1), Idx, [&](auto *B) {
          launchOn(Compute,
                   broadcastKernel<Elem<decltype(A)>, Elem<decltype(B)>>,
                   blocksFor(NY), kThreads, 0, A, NY, B, numel(X(1)), f(Y),
                   In.op() == op::Mul);
        });
      });
      return;
    case op::Gelu:
      launchOn(Compute, geluKernel, blocksFor(NY), kThreads, 0, f(X(0)), NY,
               f(Y));
      return;
    case op::GeluGrad:
      launchOn(Compute, geluGradKernel, blocksFor(NY), kThreads, 0, f(X(0)),
               f(X(1)), NY, f(Y));
      return;
    case op::RoundBf16:
    case op::AdamW:
      execMany(Idx, Idx + 1);
      return;
    case op::LayerNorm:
      if (Last)
        withInput(X(0), Idx, [&](auto *Xs) {
          launchOn(Compute, layerNormKernel<Elem<decltype(Xs)>>,
                   warpRowBlocks(Rows), kThreads, 0, Xs, Rows, Last,
                   static_cast<const float *>(f(X(1))),
                   static_cast<const float *>(f(X(2))), Flt(0), f(Y),
                   outputStore(In, Y, Idx),
                   rowStatsToKeep(X(0), Xs, sizeof(*Xs), Rows, Last, Flt(0)));
        });
      return;
    case op::LayerNormGrad: {
      // x, dy and the residual gradient (format 11, where there is one)
      // each fp32 or bf16 bits; the rows' statistics the forward kept,
      // where they hold.
      auto launch = [&](auto *Xs, auto *Dy, auto *Res) {
        launchOn(Compute,
                 layerNormGradKernel<Elem<decltype(Xs)>, Elem<decltype(Dy)>,
                                     Elem<decltype(Res)>>,
                 warpRowBlocks(Rows), kThreads, 0, Xs, Rows, Last,
                 static_cast<const float *>(f(X(1))), Dy, Flt(0), f(Y),
                 outputStore(In, Y, Idx), Res,
                 keptRowStats(X(0), Xs, Rows, Last, Flt(0)));
      };
      if (Last)
        withInput(X(0), Idx, [&](auto *Xs) {
          withInput(X(2), Idx, [&](auto *Dy) {
            if (In.inputs()->size() == 4)
              withInput(X(3), Idx, [&](auto *Res) { launch(Xs, Dy, Res); });
            else
              launch(Xs, Dy, static_cast<const float *>(nullptr));
          });
        });
      return;
    }
    case op::Normalize:
      if (Last)
        withInput(X(0), Idx, [&](auto *Xs) {
          launchOn(Compute, layerNormKernel<Elem<decltype(Xs)>>,
                   warpRowBlocks(Rows), kThreads, 0, Xs, Rows, Last,
                   static_cast<const float *>(nullptr),
                   static_cast<const float *>(nullptr), Flt(0), f(Y),
                   OutputStore{}, static_cast<double *>(nullptr));
        });
      return;
    case op::Softmax:
      if (Last)
        launchOn(Compute, softmaxKernel, rowBlocks(Rows), kThreads, 0, f(X(0)),
                 Rows, Last, f(Y));
      return;
    case op::SoftmaxGrad:
      if (Last)
        launchOn(Compute, softmaxGradKernel, rowBlocks(Rows), kThreads, 0,
                 f(X(0)), f(X(1)), Rows, Last, f(Y));
      return;
    case op::Attention:
    case op::AttentionGrad: {
      if (A.size() != 3 || numel(X(0)) == 0)
        return;
      const int Which =
          In.op() == op::AttentionGrad ? int(Int(2)) : -1; // forward: -1
      // which = 3 (format 11): dk and dv; 4 (format 12): dq, dk and dv.
      // The register-resident kernels write all from one pass; the others
      // run the steps one after the other (dk, then dv from what dk's step
      // kept), each output rounded as the plan asks. With
      // MEGAC_CUDA_DQ_ATOMICS=0, dq's kernel runs, then dk and dv's.
      const AttentionGradSteps Steps = attentionGradSteps(Which);
      auto Output = [&](int K) {
        return K < int(In.outputs()->size()) ? In.outputs()->Get(K) : Y;
      };
      const bool Together = keyValueTogether(In);
      AllGradSteps += Which == 4;
      if (Steps.Count > 1 && (!Together || (Which == 4 && !QueryGradAtomics))) {
        for (int K = 0; K < Steps.Count;) {
          const int Step = Steps.First + K;
          const bool Pair = Together && Step == 1; // dk and dv in one pass
          RoundedAsWritten = false;
          attentionStep(Idx, In, Pair ? 3 : Step,
                        {Output(K), Output(Pair ? K + 1 : K), Output(K)});
          if (In.round_bf16() && !RoundedAsWritten)
            for (int J = K; J <= K + Pair; ++J)
              roundInPlace(Output(J), Idx);
          K += Pair ? 2 : 1;
        }
        RoundedAsWritten = true;
        return;
      }
      attentionStep(Idx, In, Which, {Y, Output(1), Output(2)});
      return;
    }
    case op::Transpose: {
      Perm Pm{};
      Pm.Rank = int(A.size());
      if (Pm.Rank > 8)
        throw std::runtime_error("transpose of rank above 8");
      std::vector<int64_t> Stride(A.size(), 1);
      for (int D = int(A.size()) - 2; D >= 0; --D)
        Stride[size_t(D)] = Stride[size_t(D + 1)] * A[size_t(D + 1)];
      for (int D = 0; D < Pm.Rank; ++D) {
        Pm.OutShape[D] = A[size_t(Int(unsigned(D)))];
        Pm.InStride[D] = Stride[size_t(Int(unsigned(D)))];
      }
      launchOn(Compute, transposeKernel, blocksFor(NY), kThreads, 0, f(X(0)),
               f(Y), NY, Pm);
      return;
    }
    case op::CrossEntropy: {
      if (Rows == 0 || Last == 0) { // the CPU's loss of no tokens
        check(cudaMemsetAsync(Ptr[Y], 0, Bytes[Y], Compute), "cudaMemsetAsync");
        return;
      }
      double *Out =
          static_cast<double *>(scratch(size_t(Rows) * sizeof(double)));
      // A padded vocabulary's classes (format 14): the first C logits.
      const int64_t C =
          classesInBlock(0, Last, NumInts() > 1 ? Int(1) : 0);
      withInput(X(0), Idx, [&](auto *L) {
        launchOn(Compute, crossEntropyRowsKernel<Elem<decltype(L)>>,
                 rowBlocks(Rows), kThreads, 0, L, Rows, Last, C, i32(X(1)),
                 Out, keepLossStats(X(0), L, Rows, Last),
                 Faults + kFaultBadToken);
      });
      const double Norm =
          NumInts() && Int(0) > 0 ? double(Int(0)) : double(Rows);
      launchOn(Compute, sumRowsKernel, 1, kThreads, 0,
               static_cast<const double *>(Out), Rows, Norm, f(Y));
      return;
    }
    case op::CrossEntropyStats:
      launchOn(Compute, crossEntropyStatsKernel,
               rowBlocks(Rows * (shape(Y).back() / 3)), kThreads, 0, f(X(0)),
               Rows, Last, i32(X(1)), Int(0), vocabSize(Int(0) + Last),
               shape(Y).back() / 3, NumInts() > 1 ? Int(1) : int64_t(0), f(Y),
               Faults + kFaultBadToken);
      return;
    case op::CrossEntropyFromStats: {
      if (Rows == 0 || Last == 0) {
        check(cudaMemsetAsync(Ptr[Y], 0, Bytes[Y], Compute), "cudaMemsetAsync");
        return;
      }
      double *Out =
          static_cast<double *>(scratch(size_t(Rows) * sizeof(double)));
      launchOn(Compute, crossEntropyFromStatsKernel, blocksFor(Rows), kThreads,
               0, static_cast<const float *>(f(X(0))), Rows, Last / 3, Out);
      const double Norm =
          NumInts() && Int(0) > 0 ? double(Int(0)) : double(Rows);
      launchOn(Compute, sumRowsKernel, 1, kThreads, 0,
               static_cast<const double *>(Out), Rows, Norm, f(Y));
      return;
    }
    case op::CrossEntropyGrad: {
      const double Norm = NumInts() && Int(0) > 0
                              ? double(Int(0))
                              : double(std::max<int64_t>(Rows, 1));
      const int64_t Classes = NumInts() > 2 ? Int(2) : 0;
      if (In.inputs()->size() == 4) { // one vocabulary block, with stats
        const int64_t Blocks = shape(X(3)).back() / 3;
        double *Lse =
            static_cast<double *>(scratch(size_t(Rows) * sizeof(double)));
        launchOn(Compute, logSumExpOfBlocksKernel, blocksFor(Rows), kThreads, 0,
                 static_cast<const float *>(f(X(3))), Rows, Blocks, Lse);
        launchOn(Compute, crossEntropyGradFromStatsKernel, blocksFor(NY),
                 kThreads, 0, f(X(0)), Rows, Last, i32(X(1)),
                 static_cast<const double *>(Lse), Int(1),
                 classesInBlock(Int(1), Last, Classes),
                 static_cast<const float *>(f(X(2))), Norm, f(Y));
        return;
      }
      if (Rows == 0 || Last == 0)
        return;
      const int64_t C = classesInBlock(0, Last, Classes);
      withInput(X(0), Idx, [&](auto *L) {
        const double *Stats = keptLossStats(X(0), Rows, Last);
        if (!Stats) { // not kept from the loss: one more pass for them
          double *Out =
              static_cast<double *>(scratch(size_t(Rows) * sizeof(double)));
          double *New = keepLossStats(X(0), L, Rows, Last);
          launchOn(Compute, crossEntropyRowsKernel<Elem<decltype(L)>>,
                   rowBlocks(Rows), kThreads, 0, L, Rows, Last, C, i32(X(1)),
                   Out, New, Faults + kFaultBadToken);
          Stats = New;
        }
        launchOn(Compute, crossEntropyGradKernel<Elem<decltype(L)>>,
                 rowBlocks(Rows), kThreads, 0, L, Rows, Last, C, i32(X(1)), Stats,
                 static_cast<const float *>(f(X(2))), Norm, f(Y),
                 outputStore(In, Y, Idx), Faults + kFaultBadToken);
      });
      return;
    }
    case op::EmbeddingGrad:
      // The table (input 0) gives only its shape; a fourth input (format
      // 13): a gradient of the table added as each row is written, in
      // place where it is the output.
      embeddingGrad(X(1), X(2), Idx, A[0], A[1], Int(0),
                    In.inputs()->size() == 4 ? f(X(3)) : nullptr, f(Y));
      return;
    case op::PositionEmbeddingGrad:
      // Rows below S are dy, the rest zero.
      check(cudaMemsetAsync(Ptr[Y], 0, Bytes[Y], Compute), "cudaMemsetAsync");
      copy(Y, X(1));
      return;
    case op::SumLeading:
      if (NY)
        columnSums(X(0), Idx, NY, f(Y),
                   NumInts() > 0 && Int(0) != 0 && Accumulating);
      return;
    case op::LayerNormGainGrad: {
      if (NY == 0)
        return;
      const bool Add = NumInts() > 0 && Int(0) != 0 && Accumulating;
      // As columnSums, with each row's statistics first: the gain's
      // gradient sums dy * x-hat. Its second output (format 11): the bias
      // gradient, dy's sums from the same pass, in sum_leading's parts and
      // order.
      const bool Bias = In.outputs()->size() == 2;
      const ColumnChunks C = columnChunks(numel(X(0)), NY);
      double *Parts = static_cast<double *>(
          scratch(size_t(C.Chunks * NY * (Bias ? 2 : 1) + 2 * C.Outer) *
                  sizeof(double)));
      double *BiasParts = Bias ? Parts + C.Chunks * NY : nullptr;
      double *Stats = Parts + C.Chunks * NY * (Bias ? 2 : 1);
      withInput(X(0), Idx, [&](auto *Xs) {
        using TX = Elem<decltype(Xs)>;
        // The rows' statistics the forward kept, else a pass over x.
        const double *FromForward = keptRowStats(X(0), Xs, C.Outer, NY, Flt(0));
        if (C.Outer > 0) {
          ++(FromForward ? RowStatsTaken : RowStatsRecomputed);
          if (!FromForward)
            launchOn(Compute, rowStatsKernel<TX>, warpRowBlocks(C.Outer),
                     kThreads, 0, Xs, C.Outer, NY, Flt(0), Stats);
        }
        const double *RowStatsOf = FromForward ? FromForward : Stats;
        withInput(X(1), Idx, [&](auto *Dy) {
          launchOn(Compute, layerNormGainPartsKernel<TX, Elem<decltype(Dy)>>,
                   C.Blocks, kThreads, 0, Xs, Dy, RowStatsOf, C.Outer, NY,
                   kColumnRowsPer, C.Chunks, Parts, BiasParts);
        });
      });
      // The gain's and the bias's totals in one launch (BiasParts follow
      // Parts).
      launchOn(Compute, sumLeadingTotalKernel, totalBlocks(NY, Bias ? 2 : 1),
               kThreads, 0, static_cast<const double *>(Parts), C.Chunks, NY,
               f(Y), int(Add), Bias ? f(In.outputs()->Get(1)) : nullptr);
      return;
    }
    case op::SumSquares:
      execMany(Idx, Idx + 1);
      return;
    case op::ClipCoefficient:
      launchOn(Compute, clipCoefficientKernel, 1, 1, 0, f(X(0)), Flt(0), f(Y));
      return;
    case op::Accumulate:
      launchOn(Compute, accumulateKernel, blocksFor(NY), kThreads, 0, f(X(0)),
               NY, f(Y), int(Accumulating));
      return;
    case op::StackMicroBatches: {
      // Micro-batch k's rows (generation, a forward alone, is micro-batch 0).
      const size_t Rows = Bytes[X(0)];
      if (size_t(CurMicro + 1) * Rows > Bytes[Y])
        throw std::runtime_error("stack_micro_batches of micro-batch " +
                                 std::to_string(CurMicro) + " past its output");
      check(
          cudaMemcpyAsync(static_cast<char *>(Ptr[Y]) + size_t(CurMicro) * Rows,
                          Ptr[X(0)], Rows, cudaMemcpyDeviceToDevice, Compute),
          "cudaMemcpyAsync");
      return;
    }
    case op::Dropout: {
      // ints [stream, r, global shape (r), offset (r)], floats [rate].
      Block Bl{};
      Bl.Rank = int(Int(1));
      if (Bl.Rank > 8 || size_t(Bl.Rank) != A.size())
        throw std::runtime_error("dropout of rank above 8");
      for (int D = 0; D < Bl.Rank; ++D) {
        Bl.Local[D] = A[size_t(D)];
        Bl.Global[D] = Int(unsigned(2 + D));
        Bl.Offset[D] = Int(unsigned(2 + Bl.Rank + D));
      }
      if (Inference || !(Flt(0) > 0)) { // the identity
        copy(Y, X(0));
        return;
      }
      launchOn(Compute, dropoutKernel, blocksFor(NY), kThreads, 0, f(X(0)), NY,
               Bl, dropoutKeyOf(Int(0)), double(Flt(0)), f(Y));
      return;
    }
    case op::Fused:
      launchFused(Idx, In, Y);
      return;

    case op::AllReduce:
    case op::AllGather:
    case op::ReduceScatter:
      collective(Idx, In);
      return;
    case op::SliceShard: {
      const int64_t D = Int(0);
      int64_t Outer, Inner;
      around(A, D, Outer, Inner);
      launchOn(Compute, sliceChunkKernel, blocksFor(NY), kThreads, 0, f(X(0)),
               Outer, shape(Y)[size_t(D)] * Inner,
               int64_t(P.axes()->Get(In.axis())->size()),
               int64_t(RP.coords()->Get(In.axis())), f(Y));
      return;
    }
    default:
      throw std::runtime_error("opcode " + std::to_string(int(In.op())) +
                               " is not on the CUDA backend yet");
    }
  }

  //===-- Collectives on their own stream ----------------------------===//
  //
  // A collective waits (on the device) for the compute stream to reach it,
  // then runs on the communication stream while compute goes on. The
  // compute stream waits for it only before an instruction that touches
  // its memory: reads what it writes, or writes what it reads or writes.
  // Memory, not buffer ids: the arena reuses a dead buffer's bytes.

  struct Range {
    const char *Begin, *End;
  };
  struct InFlight {
    cudaEvent_t Done;
    std::vector<Range> Ranges;
    uint32_t Instr;
  };

  Range rangeOf(uint32_t B) const {
    if (Bf16Only[B]) {
      const char *P0 = reinterpret_cast<const char *>(Copy[B]);
      return {P0, P0 + Bytes[B] / 2};
    }
    const char *P0 = static_cast<const char *>(Ptr[B]);
    return {P0, P0 + Bytes[B]};
  }
  /// The memory instruction \p I reads (\p Written false) or writes of
  /// buffers \p Buffers: their storage and the bf16 copies it reads or
  /// writes.
  std::vector<Range> liveMemoryOf(const flatbuffers::Vector<uint32_t> &Buffers,
                                  uint32_t I, bool Written) const {
    std::vector<Range> R;
    for (uint32_t B : Buffers) {
      R.push_back(rangeOf(B));
      if (const uint16_t *C = Written ? writeCopy(B, I) : readCopy(B, I))
        R.push_back({reinterpret_cast<const char *>(C),
                     reinterpret_cast<const char *>(C + numel(B))});
    }
    return R;
  }
  static bool overlaps(const std::vector<Range> &A,
                       const std::vector<Range> &B) {
    for (const Range &X : A)
      for (const Range &Y : B)
        if (X.Begin < Y.End && Y.Begin < X.End)
          return true;
    return false;
  }
  /// Makes the compute stream wait for every collective in flight that
  /// touches \p Touched.
  void waitForCollectives(const std::vector<Range> &Touched) {
    for (size_t K = 0; K < Pending.size();) {
      if (!overlaps(Pending[K].Ranges, Touched)) {
        ++K;
        continue;
      }
      waitingFor(Pending[K].Instr);
      check(cudaStreamWaitEvent(Compute, Pending[K].Done, 0),
            "cudaStreamWaitEvent");
      FreeEvents.push_back(Pending[K].Done);
      Pending.erase(Pending.begin() + long(K));
    }
  }
  /// Tells the watchdog which collective the device now waits for (the
  /// host may wait in it too: the emulation does, a GPU at the end).
  void waitingFor(uint32_t Instr) {
    if (Progress)
      Progress(Instr, true, ProgressCtx);
  }
  void waitForAllCollectives() {
    for (InFlight &F : Pending) {
      waitingFor(F.Instr);
      check(cudaStreamWaitEvent(Compute, F.Done, 0), "cudaStreamWaitEvent");
      FreeEvents.push_back(F.Done);
    }
    Pending.clear();
  }
  cudaEvent_t freeEvent() {
    if (FreeEvents.empty()) {
      cudaEvent_t E; // (ordering alone: no timestamps to take)
      check(cudaEventCreateWithFlags(&E, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
      AllEvents.push_back(E);
      return E;
    }
    cudaEvent_t E = FreeEvents.back();
    FreeEvents.pop_back();
    return E;
  }
  /// The memory instruction \p I reads and writes: its buffers, and the
  /// bf16 copies it writes (a collective still reading bytes the arena
  /// has since given to a copy must finish before the copy is written).
  std::vector<Range> rangesOf(uint32_t I, const Instr &In) const {
    std::vector<Range> R;
    if (In.inputs())
      for (uint32_t B : *In.inputs())
        R.push_back(rangeOf(B));
    if (In.outputs())
      for (uint32_t B : *In.outputs()) {
        R.push_back(rangeOf(B));
        if (const uint16_t *C = writeCopy(B, I))
          R.push_back({reinterpret_cast<const char *>(C),
                       reinterpret_cast<const char *>(C + numel(B))});
      }
    return R;
  }

  /// The communication stream's staging memory (bucket packing, chunk
  /// layouts), at least \p N bytes; compute writes it only after the
  /// collectives that use it are done.
  char *commScratch(size_t N) {
    if (N > CommScratch.Bytes) { // the collectives may still read it
      waitForAllCollectives();
      check(cudaStreamSynchronize(Comm), "cudaStreamSynchronize");
    }
    char *Staging =
        static_cast<char *>(CommScratch.atLeast(N, "collective staging"));
    waitForCollectives({{Staging, Staging + N}});
    return Staging;
  }

  void collective(uint32_t Idx, const Instr &In) {
    auto X = [&](unsigned K) { return In.inputs()->Get(K); };
    const uint32_t Y = In.outputs()->Get(0);
    const int64_t NY = numel(Y);
    const std::vector<int64_t> A = shape(X(0));
    std::vector<Range> Touched = rangesOf(Idx, In);
    // Compute-side preparation (a copy, packing or laying out chunks into
    // the staging memory), then the hand-over.
    const char *Staged = nullptr;
    size_t StagedBytes = 0;
    std::function<void()> Issue;
    const int64_t G =
        In.op() == op::AllReduce ? 1 : P.axes()->Get(In.axis())->size();
    int64_t Outer = 1, Inner = 1;
    if (In.op() != op::AllReduce)
      around(A, In.ints()->Get(0), Outer, Inner);
    ncclComm_t C = comm(In);
    // The compute-side preparation below reads and writes this memory.
    waitForCollectives(Touched);
    if (In.op() == op::AllReduce && In.inputs()->size() == 1) {
      if (Y != X(0))
        copy(Y, X(0));
      Issue = [=] {
        check(
            ncclAllReduce(f(Y), f(Y), size_t(NY), ncclFloat, ncclSum, C, Comm),
            "ncclAllReduce");
      };
    } else if (In.op() == op::AllReduce) {
      // A bucket: one collective over the inputs laid end to end.
      size_t Total = 0;
      for (uint32_t K = 0; K < In.inputs()->size(); ++K)
        Total += Bytes[X(K)];
      char *Packed = commScratch(Total);
      Staged = Packed;
      StagedBytes = Total;
      size_t At = 0;
      for (uint32_t K = 0; K < In.inputs()->size(); ++K) {
        check(cudaMemcpyAsync(Packed + At, Ptr[X(K)], Bytes[X(K)],
                              cudaMemcpyDeviceToDevice, Compute),
              "cudaMemcpyAsync");
        At += Bytes[X(K)];
      }
      Issue = [=, &In] {
        check(ncclAllReduce(Packed, Packed, Total / 4, ncclFloat, ncclSum, C,
                            Comm),
              "ncclAllReduce");
        size_t Off = 0;
        for (uint32_t K = 0; K < In.outputs()->size(); ++K) {
          const uint32_t Out = In.outputs()->Get(K);
          check(cudaMemcpyAsync(Ptr[Out], Packed + Off, Bytes[Out],
                                cudaMemcpyDeviceToDevice, Comm),
                "cudaMemcpyAsync");
          Off += Bytes[Out];
        }
      };
    } else if (In.op() == op::AllGather) {
      // The gather lays the members' tensors one after another; unless
      // the dimension is the outermost they are then put in place.
      const int64_t NX = numel(X(0));
      if (Outer == 1) {
        Issue = [=] {
          check(ncclAllGather(f(X(0)), f(Y), size_t(NX), ncclFloat, C, Comm),
                "ncclAllGather");
        };
      } else {
        float *Chunks =
            reinterpret_cast<float *>(commScratch(size_t(NX * G) * 4));
        Staged = reinterpret_cast<const char *>(Chunks);
        StagedBytes = size_t(NX * G) * 4;
        const int64_t Row = A[size_t(In.ints()->Get(0))] * Inner;
        Issue = [=] {
          check(ncclAllGather(f(X(0)), Chunks, size_t(NX), ncclFloat, C, Comm),
                "ncclAllGather");
          launchOn(Comm, concatChunksKernel, blocksFor(NY), kThreads, 0,
                   static_cast<const float *>(Chunks), Outer, Row, G, f(Y));
        };
      }
    } else {
      // Reduce-scatter: member k receives chunk k of the sum; unless the
      // dimension is the outermost the chunks are first laid in order.
      const float *Send = f(X(0));
      if (Outer != 1) {
        float *Laid =
            reinterpret_cast<float *>(commScratch(size_t(numel(X(0))) * 4));
        Staged = reinterpret_cast<const char *>(Laid);
        StagedBytes = size_t(numel(X(0))) * 4;
        const int64_t Row = shape(Y)[size_t(In.ints()->Get(0))] * Inner;
        for (int64_t K = 0; K < G; ++K)
          launchOn(Compute, sliceChunkKernel, blocksFor(NY), kThreads, 0,
                   f(X(0)), Outer, Row, G, K, Laid + K * NY);
        Send = Laid;
      }
      Issue = [=] {
        check(ncclReduceScatter(Send, f(Y), size_t(NY), ncclFloat, ncclSum, C,
                                Comm),
              "ncclReduceScatter");
      };
    }
    // Hand-over: the communication stream starts once compute got here.
    // (One event serves every hand-over: a wait holds the state the event
    // had when it was issued.)
    if (!Ready)
      check(cudaEventCreateWithFlags(&Ready, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
    check(cudaEventRecord(Ready, Compute), "cudaEventRecord");
    check(cudaStreamWaitEvent(Comm, Ready, 0), "cudaStreamWaitEvent");
    if (Profiling)
      check(cudaEventRecord(event(2 * Timed.size()), Comm), "cudaEventRecord");
    Issue();
    if (Profiling) {
      check(cudaEventRecord(event(2 * Timed.size() + 1), Comm),
            "cudaEventRecord");
      Timed.push_back({Idx, Idx + 1});
    }
    if (Staged)
      Touched.push_back({Staged, Staged + StagedBytes});
    InFlight F{freeEvent(), std::move(Touched), Idx};
    check(cudaEventRecord(F.Done, Comm), "cudaEventRecord");
    Pending.push_back(std::move(F));
  }

  /// A pipeline transfer, through the launcher's host messages (keyed by
  /// transfer and micro-batch, as the CPU backend's): the value comes to
  /// the host once compute has written it, or goes to the device before
  /// compute reads it.
  void transfer(const Instr &In) {
    if (!TransferFn)
      throw std::runtime_error("the launcher does not carry pipeline "
                               "transfers");
    const int Peer = int(In.ints()->Get(0));
    const int64_t M = std::max<int64_t>(1, P.micro_batches());
    const int64_t Tag = In.ints()->Get(1) * M + CurMicro;
    const bool Send = In.op() == op::Send;
    const uint32_t B = Send ? In.inputs()->Get(0) : In.outputs()->Get(0);
    Staging.resize(Bytes[B]);
    if (Send)
      toHost(Staging.data(), Ptr[B], Bytes[B]); // after compute wrote it
#ifdef MEGAC_CUDA_EMULATION
    // Emulated collectives progress only when something waits for them
    // (a GPU's progress by themselves): finish them before this rank
    // blocks in a host message a peer may send only after them.
    check(cudaStreamSynchronize(Comm), "cudaStreamSynchronize");
#endif
    if (!TransferFn(Peer, Tag, Staging.data(), Bytes[B], Send, ProgressCtx))
      throw std::runtime_error(std::string(Send ? "send to" : "receive from") +
                               " rank " + std::to_string(Peer) + " failed");
    if (!Send)
      toDevice(Ptr[B], Staging.data(), Bytes[B]); // before compute reads it
  }

  /// Where an attention step writes its output (fp32; null where it is
  /// kept in bf16 alone) and how (rounded, its bf16 copy); for several
  /// gradients together (which = 3: dk and dv; 4: dq, dk and dv), the
  /// others' in the order of the instruction's outputs.
  struct AttnOut {
    float *Out;
    OutputStore Store;
    float *Out2 = nullptr;
    OutputStore Store2;
    float *Out3 = nullptr;
    OutputStore Store3;
  };

  /// Whether an attention gradient's dk and dv (which = 3), or dq, dk
  /// and dv (4), come from one pass of the register-resident kernels (not
  /// cuDNN's, which keeps all three gradients anyway, nor the wmma or fp32
  /// ones).
  bool keyValueTogether(const Instr &In) const {
    const int64_t D = bf16AttentionHeadSize(RP, In, Bf16);
    return flashHeadSize(D) && tensorCoreAttention(In) && !WmmaAttention;
  }

  /// One attention step: the forward (\p Which -1) into Ys[0], or the
  /// gradient of q, k or v (0, 1, 2) into Ys[0], or dk and dv (3) into
  /// Ys[0] and Ys[1], or dq, dk and dv (4) into all three (3 and 4: the
  /// register-resident kernels only).
  void attentionStep(uint32_t Idx, const Instr &In, int Which,
                     std::array<uint32_t, 3> Ys) {
    const uint32_t Y = Ys[0];
    const int Outs = Which >= 3 ? attentionGradSteps(Which).Count : 1;
    auto X = [&](unsigned K) { return In.inputs()->Get(K); };
    auto Int = [&](unsigned K) { return In.ints()->Get(K); };
    const std::vector<int64_t> A = shape(X(0));
    const int64_t B = A[0], S = A[1], Hl = A[2], NH = Int(0);
    const int Causal = Int(1) != 0;
    const int64_t Threads = B * NH * S;
    const bool Grad = In.op() == op::AttentionGrad;
    const AttnDropout Dr = attnDropout(In, Grad ? 3 : 2);
    const int64_t D = NH ? Hl / NH : 0;
    if (flashHeadSize(D)) {
      const float *Qp = f(X(0)), *Kp = f(X(1)), *Vp = f(X(2));
      const float *Dy = Grad ? f(X(3)) : nullptr;
      const bool Tc = tensorCoreAttention(In);
      const AttentionCopies Copies = {readCopy(X(0), Idx), readCopy(X(1), Idx),
                                      readCopy(X(2), Idx),
                                      Grad ? readCopy(X(3), Idx) : nullptr};
      auto OutK = [&](int K) { return K < Outs ? f(Ys[K]) : nullptr; };
      auto StoreK = [&](int K) {
        return K < Outs ? roundingStore(In, Ys[K], Idx) : OutputStore{};
      };
      const AttnOut Out = {OutK(0),   StoreK(0), OutK(1),
                           StoreK(1), OutK(2),   StoreK(2)};
      AttentionOutput = Grad                    ? GradientOutputOf[Idx]
                        : ForwardStats.count(Y) ? int64_t(Y)
                                                : -1;
      if (D == 32)
        flash<32>(Qp, Kp, Vp, Dy, B, S, Hl, NH, Causal, Which, Dr, Tc, Copies,
                  Out);
      else if (D == 64)
        flash<64>(Qp, Kp, Vp, Dy, B, S, Hl, NH, Causal, Which, Dr, Tc, Copies,
                  Out);
      else
        flash<128>(Qp, Kp, Vp, Dy, B, S, Hl, NH, Causal, Which, Dr, Tc, Copies,
                   Out);
      return;
    }
    // Other head sizes: the simple kernels. Scratch: the rows' (max,
    // sum), then the backward pass's deltas.
    double *Stats =
        static_cast<double *>(scratch(size_t(Threads) * 3 * sizeof(double)));
    double *Delta = Stats + 2 * Threads;
    launchOn(Compute, attentionRowStatsKernel, blocksFor(Threads), kThreads, 0,
             f(X(0)), f(X(1)), B, S, Hl, NH, Causal, Stats);
    if (!Grad) {
      launchOn(Compute, attentionForwardKernel, blocksFor(Threads), kThreads, 0,
               f(X(0)), f(X(1)), f(X(2)), B, S, Hl, NH, Causal,
               static_cast<const double *>(Stats), Dr, f(Y));
      return;
    }
    if (Which != 2)
      launchOn(Compute, attentionDeltaKernel, blocksFor(Threads), kThreads, 0,
               f(X(0)), f(X(1)), f(X(2)), f(X(3)), B, S, Hl, NH, Causal,
               static_cast<const double *>(Stats), Dr, Delta);
    launchOn(Compute, attentionGradKernel, blocksFor(Threads), kThreads, 0,
             f(X(0)), f(X(1)), f(X(2)), f(X(3)), B, S, Hl, NH, Causal, Which,
             static_cast<const double *>(Stats),
             static_cast<const double *>(Delta), Dr, f(Y));
  }

  /// Attention (\p Which < 0) or the gradient of its input \p Which (0 q,
  /// 1 k, 2 v) by the flash kernels for head size \p D.
  /// \p Tc: q, k and v hold bf16 values, so the products go to the
  /// tensor cores (flash_tc.cuh); \p Copies: bf16 copies of q, k and v
  /// their writers made (null: none), which the forward pass reads.
  template <int D>
  void flash(const float *Q, const float *K, const float *V, const float *DY,
             int64_t B, int64_t S, int64_t Hl, int64_t NH, int Causal,
             int Which, const AttnDropout &Dr, bool Tc,
             const AttentionCopies &Copies, const AttnOut &O) {
    float *Out = O.Out;
    const unsigned Blocks = headBlocks(B, NH, S, kFlashRows);
    // Buffers kept in bf16 alone (no fp32 pointer) reach only the
    // register-resident kernels (planMemory asks tensorCoreAttention).
    if ((!Tc || WmmaAttention) &&
        (!Q || !K || !V || (Which >= 0 && !DY) || !Out))
      throw std::logic_error("an attention buffer kept in bf16 alone reaches "
                             "the fp32 or wmma kernels");
    // The scale as the CPU's attention computes it.
    const float Scale = float(1.0 / std::sqrt(double(D)));
    if (Tc) {
      flashTc<D>(Q, K, V, DY, B, S, Hl, NH, Causal, Which, Dr, Blocks, Scale,
                 Copies, O);
      return;
    }
    if (Which < 0) {
      launchOn(Compute, flashForwardKernel<D>, Blocks, kFlashRows, 0, Q, K, V,
               S, Hl, NH, Causal, Scale, Dr, Out,
               static_cast<float *>(nullptr));
      return;
    }
    // Scratch: each row's max and 1 / sum, then its delta.
    float *Stats = static_cast<float *>(scratch(size_t(B * NH * S) * 12));
    float *Delta = Stats + 2 * B * NH * S;
    launchOn(Compute, flashForwardKernel<D>, Blocks, kFlashRows, 0, Q, K, V, S,
             Hl, NH, Causal, Scale, Dr, static_cast<float *>(nullptr), Stats);
    if (Which == 0) {
      launchOn(Compute, flashQueryGradKernel<D>, Blocks, kFlashRows, 0, Q, K, V,
               DY, S, Hl, NH, Causal, Scale, Dr,
               static_cast<const float *>(Stats), Delta, Out);
      return;
    }
    if (Which == 1)
      launchOn(Compute, flashQueryGradKernel<D>, Blocks, kFlashRows, 0, Q, K, V,
               DY, S, Hl, NH, Causal, Scale, Dr,
               static_cast<const float *>(Stats), Delta,
               static_cast<float *>(nullptr));
    launchOn(Compute, flashKeyGradKernel<D>, Blocks, kFlashRows, 0, Q, K, V, DY,
             S, Hl, NH, Causal, Scale, Which, Dr,
             static_cast<const float *>(Stats),
             static_cast<const float *>(Delta), Out);
  }

  /// flash() on the tensor cores. The backward pass recomputes the
  /// forward's output and row statistics (into scratch), then each row's
  /// delta = dy . y, then the one gradient asked for.
  template <int D>
  void flashTc(const float *Q, const float *K, const float *V, const float *DY,
               int64_t B, int64_t S, int64_t Hl, int64_t NH, int Causal,
               int Which, const AttnDropout &Dr, unsigned Blocks, float Scale,
               const AttentionCopies &Copies, const AttnOut &O) {
    if (!WmmaAttention) {
      flashMma<D>(Q, K, V, DY, B, S, Hl, NH, Causal, Which, Dr, Blocks, Scale,
                  Copies, O);
      return;
    }
    float *Out = O.Out;
    using Sh = TcShared<D>;
    int *Inexact = Faults + kFaultNotBf16;
    if (!TcReady[tcSlot<D>()]) { // above the default 48 KiB per block
      setSharedLimit(flashForwardTcKernel<D>, Sh::Forward);
      setSharedLimit(flashQueryGradTcKernel<D>, Sh::Grad);
      setSharedLimit(flashKeyGradTcKernel<D>, Sh::Grad);
      TcReady[tcSlot<D>()] = true;
    }
    if (Which < 0) {
      launchOn(Compute, flashForwardTcKernel<D>, Blocks, kTcThreads,
               Sh::Forward, Q, K, V, S, Hl, NH, Causal, Scale, Dr, Out,
               static_cast<float *>(nullptr), Inexact);
      return;
    }
    const KeptAttention &Kp = keptAttention<D>(
        Q, K, V, DY, B, S, Hl, NH, Causal, Dr, Blocks, Scale, Copies);
    const float *Stats = Kp.Stats, *Delta = Kp.Delta;
    if (Which == 0)
      launchOn(Compute, flashQueryGradTcKernel<D>, Blocks, kTcThreads, Sh::Grad,
               Q, K, V, DY, S, Hl, NH, Causal, Scale, Dr, Stats, Delta, Out,
               Inexact);
    else
      launchOn(Compute, flashKeyGradTcKernel<D>, Blocks, kTcThreads, Sh::Grad,
               Q, K, V, DY, S, Hl, NH, Causal, Scale, Which, Dr, Stats, Delta,
               Out, Inexact);
  }
  /// flash() on the register-resident tensor-core kernels (flash_mma.cuh).
  /// The forward pass reads the bf16 copies of q, k and v their writers
  /// made, and packs those without one in scratch. The backward
  /// pass shares one kept state per attention (keptAttention): the first
  /// gradient step of k or v computes both, and the other step copies the
  /// kept one.
  template <int D>
  void flashMma(const float *Q, const float *K, const float *V, const float *DY,
                int64_t B, int64_t S, int64_t Hl, int64_t NH, int Causal,
                int Which, const AttnDropout &Dr, unsigned Blocks, float Scale,
                const AttentionCopies &Copies, const AttnOut &O) {
    const OutputStore Store = O.Store;
    float *Out = O.Out;
    // cuDNN's (where it applies) keeps all three gradients: dk and dv
    // (which = 3), or dq, dk and dv (4), are two or three of its steps.
    if (Cudnn) {
      const AttentionGradSteps Steps = attentionGradSteps(Which);
      const int First = Which < 0 ? Which : Steps.First;
      const std::array<std::pair<float *, OutputStore>, 3> Outs = {
          std::pair{Out, Store}, {O.Out2, O.Store2}, {O.Out3, O.Store3}};
      const CudnnInto Into =
          Steps.Count == 3 ? cudnnGradsInto(Q, K, V, DY, B, S, Hl, NH, Causal,
                                            Dr, Scale, Copies, Outs)
                           : CudnnInto::NotHere;
      if (Into == CudnnInto::Done)
        return;
      if (Into == CudnnInto::NotHere &&
          cudnnAttention(Q, K, V, DY, B, S, Hl, NH, Causal, First, Dr, Scale,
                         Copies, Store, Out)) {
        for (int J = 1; J < Steps.Count; ++J)
          if (!cudnnAttention(Q, K, V, DY, B, S, Hl, NH, Causal, First + J, Dr,
                              Scale, Copies, Outs[J].second, Outs[J].first))
            throw std::logic_error("cuDNN's attention took one gradient step "
                                   "but not the next");
        return;
      }
    }
    using Sh = MmaShared<D>;
    if (!MmaReady[tcSlot<D>()]) { // above the default 48 KiB per block
      setSharedLimit(flashForwardMmaKernel<D>, Sh::Forward);
      setSharedLimit(flashForwardMmaKernel<D, 2, wideForwardDropout<D>()>,
                     Sh::WideForward);
      setSharedLimit(flashQueryGradMmaKernel<D>, Sh::QueryGrad);
      setSharedLimit(flashKeyGradMmaKernel<D>, Sh::KeyGrad);
      setSharedLimit(flashKeyGradMmaKernel<D, true>, Sh::AllGrads);
      if constexpr (D <= 64) {
        setSharedLimit(flashKeyGradMmaKernel<D, false, 2>, Sh::WideKeyGrad);
        setSharedLimit(flashKeyGradMmaKernel<D, true, 2>, Sh::WideAllGrads);
      }
      MmaReady[tcSlot<D>()] = true;
    }
    const int64_t N = B * S * Hl;
    if (Which < 0) {
      std::array<const uint16_t *, 4> In16 = Copies;
      packMissing(In16, {Q, K, V, nullptr}, N, [&] {
        return static_cast<uint16_t *>(
            scratch(size_t(3 * N) * sizeof(uint16_t)));
      });
      ForwardKept *F = forwardToKeep(2 * B * NH * S); // [max, 1 / sum]
      forwardMma<D>(In16[0], In16[1], In16[2], B, S, Hl, NH, Causal, Scale, Dr,
                    Out, F ? F->stats() : nullptr, nullptr, nullptr, Store);
      if (F)
        keepForward(*F, Q, K, V, B, S, Hl, NH, Causal, D, Dr, Copies, Out,
                    Store.Bits, 0);
      RoundedAsWritten = Store.Round;
      return;
    }
    KeptAttention &Kp = keptAttention<D>(Q, K, V, DY, B, S, Hl, NH, Causal, Dr,
                                         Blocks, Scale, Copies);
    if (Which == 0) {
      launchOn(Compute, flashQueryGradMmaKernel<D>, Blocks, kMmaThreads,
               Sh::QueryGrad, Kp.Q16, Kp.K16, Kp.V16, Kp.DY16, S, Hl, NH,
               Causal, Scale, Dr, Kp.Stats, Kp.Delta, Out, Store);
      RoundedAsWritten = Store.Round;
      return;
    }
    if (Which == 3) { // dk and dv, each stored as the plan asks
      keyGradMma<D, false>(Kp, B, S, Hl, NH, Causal, Scale, Dr, Out, O.Out2,
                           Store, O.Store2, nullptr);
      RoundedAsWritten = Store.Round;
      return;
    }
    if (Which == 4) { // dq summed with atomics, then stored; dk and dv
      if (!Kp.QuerySums)
        throw std::logic_error("an attention gradient of q, k and v together "
                               "without room for dq's sums");
      check(
          cudaMemsetAsync(Kp.QuerySums, 0, size_t(N) * sizeof(float), Compute),
          "cudaMemsetAsync");
      keyGradMma<D, true>(Kp, B, S, Hl, NH, Causal, Scale, Dr, O.Out2, O.Out3,
                          O.Store2, O.Store3, Kp.QuerySums);
      storeFrom(Kp.QuerySums, N, Out, Store);
      RoundedAsWritten = Store.Round;
      ++AllGradPasses;
      return;
    }
    if (Kp.GradOf == Which) { // computed beside the other one
      storeFrom(Kp.Grad, N, Out, Store);
      RoundedAsWritten = Store.Round;
      return;
    }
    // The asked gradient is stored as the plan asks (rounded, with its
    // copy); the kept one as computed: its own step rounds it, or not.
    keyGradMma<D, false>(Kp, B, S, Hl, NH, Causal, Scale, Dr,
                         Which == 1 ? Out : Kp.Grad, Which == 2 ? Out : Kp.Grad,
                         Which == 1 ? Store : OutputStore{},
                         Which == 2 ? Store : OutputStore{}, nullptr);
    RoundedAsWritten = Store.Round;
    Kp.GradOf = 3 - Which;
  }

  /// Packs each of q, k, v and dy (\p Fp32; dy null in a forward pass)
  /// that has no bf16 copy in \p In16 into slot J (input J) of the room
  /// \p Room() gives (4 x \p N bf16 values; asked for only if one is
  /// missing), and points \p In16 at it: q, k and v exactly (they must
  /// hold bf16 values), dy rounded.
  template <class RoomFn>
  void packMissing(std::array<const uint16_t *, 4> &In16,
                   const std::array<const float *, 4> &Fp32, int64_t N,
                   RoomFn Room) {
    uint16_t *To = nullptr;
    for (size_t J = 0; J < 4; ++J)
      if (!In16[J] && Fp32[J]) {
        if (!To)
          To = Room();
        packBf16(Fp32[J], N, To + J * N, /*Exact=*/J < 3);
        In16[J] = To + J * N;
      }
  }

  /// An attention step on cuDNN (MEGAC_CUDA_ATTENTION=cudnn): the forward
  /// pass writes y in bf16 (its copy, widened into the fp32 buffer where
  /// there is one); the first gradient step of an attention runs cuDNN's
  /// forward (for y and the rows' log-sum-exp) and backward passes for
  /// all three gradients, kept (keptCudnn) for the other two steps.
  /// False where cuDNN does not apply (dropout, whose masks are the
  /// CPU's; an output the plan does not round to bf16, which cuDNN's
  /// bf16 result would not match) or declines the shape: the
  /// register-resident kernels run instead.
  bool cudnnAttention(const float *Q, const float *K, const float *V,
                      const float *DY, int64_t B, int64_t S, int64_t Hl,
                      int64_t NH, int Causal, int Which, const AttnDropout &Dr,
                      float Scale, const AttentionCopies &Copies,
                      OutputStore Store, float *Out) {
    if (Dr.Rate > 0 || !Store.Round)
      return false;
    const SdpaShape Sh = sdpaShape(B, S, Hl, NH, Causal, Scale);
    const int64_t N = B * S * Hl;
    const uint16_t *Result = nullptr;
    if (Which < 0) {
      // Scratch: y where it has no copy, then packed inputs (4 slots).
      const bool Missing = !Copies[0] || !Copies[1] || !Copies[2];
      uint16_t *Room =
          Missing || !Store.Bits
              ? static_cast<uint16_t *>(
                    scratch(size_t((Missing ? 5 : 1) * N) * sizeof(uint16_t)))
              : nullptr;
      std::array<const uint16_t *, 4> In16 = Copies;
      packMissing(In16, {Q, K, V, nullptr}, N, [&] { return Room + N; });
      uint16_t *Y16 = Store.Bits ? Store.Bits : Room;
      ForwardKept *F = forwardToKeep(B * NH * S); // log-sum-exp
      if (!cudnnDid(Cudnn->forward(Sh, In16[0], In16[1], In16[2], Y16,
                                   F ? F->stats() : nullptr, Compute)))
        return false;
      if (F)
        keepForward(*F, Q, K, V, B, S, Hl, NH, Causal, Sh.D, Dr, Copies, Out,
                    Store.Bits, 2);
      Result = Y16;
    } else {
      const KeptAttention *Kp = keptCudnn(Sh, Q, K, V, DY, Causal, Dr, Copies);
      if (!Kp)
        return false;
      Result = Kp->Grad16[Which];
      if (Store.Bits)
        check(cudaMemcpyAsync(Store.Bits, Result, size_t(N) * 2,
                              cudaMemcpyDeviceToDevice, Compute),
              "cudaMemcpyAsync");
    }
    if (Out)
      launchOn(Compute, widenBf16Kernel, wideBlocks(N), kThreads, 0, Result, N,
               Out);
    RoundedAsWritten = true;
    cudnnRan();
    return true;
  }
  /// The shape of an attention of \p NH heads over [B, S, Hl] for cuDNN.
  static SdpaShape sdpaShape(int64_t B, int64_t S, int64_t Hl, int64_t NH,
                             int Causal, float Scale) {
    SdpaShape Sh;
    Sh.B = B;
    Sh.S = S;
    Sh.NH = NH;
    Sh.D = Hl / NH;
    Sh.Causal = Causal != 0;
    Sh.Scale = Scale;
    return Sh;
  }
  /// Counts an attention step run on cuDNN, saying so at the first.
  void cudnnRan() {
    if (CudnnSteps++ == 0)
      std::fprintf(stderr,
                   "megac-run: attention steps run on cuDNN "
                   "(MEGAC_CUDA_ATTENTION=%s; mma: megac's own kernels)\n",
                   AttentionKind.c_str());
  }
  /// What cudnnGradsInto did: all three gradients; nothing, since an
  /// output has no bits to write or cuDNN does not apply (the steps then
  /// go to cudnnAttention one by one); or nothing, cuDNN having declined
  /// the shape (megac's kernels then run, without asking cuDNN again).
  enum class CudnnInto { Done, NotHere, Declined };
  /// dq, dk and dv of one attention (which = 4) on cuDNN, its backward
  /// writing them straight into the outputs' bf16 bits (widened into their
  /// fp32 buffers where they have them): no copy out of the kept state,
  /// three reads and writes of q's size saved per attention.
  CudnnInto
  cudnnGradsInto(const float *Q, const float *K, const float *V,
                 const float *DY, int64_t B, int64_t S, int64_t Hl, int64_t NH,
                 int Causal, const AttnDropout &Dr, float Scale,
                 const AttentionCopies &Copies,
                 const std::array<std::pair<float *, OutputStore>, 3> &Outs) {
    std::array<uint16_t *, 3> Into{};
    for (int J = 0; J < 3; ++J) {
      if (!Outs[J].second.Round || !Outs[J].second.Bits)
        return CudnnInto::NotHere;
      Into[J] = Outs[J].second.Bits;
    }
    if (Dr.Rate > 0)
      return CudnnInto::NotHere;
    const SdpaShape Sh = sdpaShape(B, S, Hl, NH, Causal, Scale);
    if (!keptCudnn(Sh, Q, K, V, DY, Causal, Dr, Copies, &Into))
      return CudnnInto::Declined;
    const int64_t N = B * S * Hl;
    for (int J = 0; J < 3; ++J)
      if (Outs[J].first)
        launchOn(Compute, widenBf16Kernel, wideBlocks(N), kThreads, 0,
                 static_cast<const uint16_t *>(Into[J]), N, Outs[J].first);
    RoundedAsWritten = true;
    cudnnRan();
    return CudnnInto::Done;
  }

  /// Whether cuDNN did what was asked (\p Why empty); says each new
  /// reason it gives for not doing it once.
  bool cudnnDid(const std::string &Why) {
    if (Why.empty())
      return true;
    if (std::find(CudnnDeclined.begin(), CudnnDeclined.end(), Why) ==
        CudnnDeclined.end()) {
      CudnnDeclined.push_back(Why);
      std::fprintf(stderr,
                   "megac-run: cuDNN declined an attention (%s); the "
                   "register-resident kernels run it\n",
                   Why.c_str());
    }
    return false;
  }

  /// Whether instructions [\p I, \p J) are one multi-tensor launch's
  /// worth: the same op (AdamW, round_bf16, sum_squares), and none writing what
  /// another reads or writes (each reads and writes its own buffers; the
  /// clipping coefficient all of AdamW's read is read alone).
  bool oneLaunch(uint32_t I, uint32_t J) const {
    const OpCode Op = RP.instrs()->Get(I)->op();
    std::vector<std::vector<Range>> Written, All;
    for (uint32_t K = I; K < J; ++K) {
      const Instr &In = *RP.instrs()->Get(K);
      if (In.op() != Op || In.round_bf16() || !In.outputs() ||
          In.outputs()->size() != 1)
        return false;
      const uint32_t Y = In.outputs()->Get(0);
      Written.push_back({rangeOf(Y)});
      if (const uint16_t *C = writeCopy(Y, K))
        Written.back().push_back(
            {reinterpret_cast<const char *>(C),
             reinterpret_cast<const char *>(C + numel(Y))});
      All.push_back(rangesOf(K, In));
    }
    for (size_t A = 0; A < Written.size(); ++A)
      for (size_t B = 0; B < All.size(); ++B)
        if (A != B && overlaps(Written[A], All[B]))
          return false;
    return true;
  }
  /// The end of the run of instructions from \p I (before \p End) that
  /// one launch does (I + 1 where it is I alone), worked out once per
  /// instruction, micro-batch and kind of run (the buffers' places do not
  /// change).
  uint32_t runEnd(uint32_t I, uint32_t End, bool Training) {
    const OpCode Op = RP.instrs()->Get(I)->op();
    if (Op != op::AdamW && Op != op::RoundBf16 && Op != op::SumSquares)
      return I + 1;
    const auto Key = std::make_tuple(I, CurMicro, Training);
    if (auto It = RunEnds.find(Key); It != RunEnds.end())
      return std::min(It->second, End);
    uint32_t J = I + 1;
    while (J < End && RP.instrs()->Get(J)->op() == Op &&
           !(Training && RP.instrs()->Get(J)->generation_only()))
      ++J;
    // Shorten the run until it is one launch's worth (nearly always at
    // once: a plan's runs read and write buffers of their own).
    while (J > I + 1 && !oneLaunch(I, J))
      J = I + 1 + (J - I - 1) / 2;
    RunEnds[Key] = J;
    return J;
  }
  std::map<std::tuple<uint32_t, int64_t, bool>, uint32_t> RunEnds;

  /// Instructions [\p I, \p J) (runEnd's run: AdamW, round_bf16 or
  /// sum_squares) in one launch over a table of their tensors (two for
  /// the sums: their parts, then each one's total).
  void execMany(uint32_t I, uint32_t J) {
    const OpCode Op = RP.instrs()->Get(I)->op();
    if (Op == op::SumSquares) {
      std::vector<SumSquaresSpan> Table;
      int64_t Parts = 0;
      for (uint32_t K = I; K < J; ++K) {
        const Instr &In = *RP.instrs()->Get(K);
        SumSquaresSpan E;
        E.X = f(In.inputs()->Get(0));
        E.Y = f(In.outputs()->Get(0));
        E.Span.N = numel(In.inputs()->Get(0));
        E.Span.Groups = aligned16(E.X) ? E.Span.N / 4 : 0;
        // As many parts as one launch of its own would have: a parameter
        // can have 10^8 elements.
        E.Blocks = reductionBlocks(E.Span.N);
        E.Span.FirstBlock = Parts;
        Parts += E.Blocks;
        Table.push_back(E);
      }
      double *Sums = static_cast<double *>(scratch(size_t(Parts) * 8));
      const SumSquaresSpan *Dev = upload(Table);
      launchOn(Compute, sumSquaresPartsManyKernel, unsigned(Parts), kThreads, 0,
               Dev, int(Table.size()), Sums);
      launchOn(Compute, sumSquaresTotalsKernel, unsigned(Table.size()),
               kThreads, 0, Dev, static_cast<const double *>(Sums));
      return;
    }
    if (Op == op::AdamW) {
      std::vector<AdamWSpan> Table;
      for (uint32_t K = I; K < J; ++K)
        Table.push_back(adamSpan(K, *RP.instrs()->Get(K)));
      launchMany(adamwManyKernel, Table);
      // What they wrote is the next step's rounding of each parameter.
      for (uint32_t K = I; K < J; ++K)
        if (const uint32_t B = CopyByUpdate[K]; B < CopyCurrent.size())
          CopyCurrent[B] = true;
      return;
    }
    // A parameter's rounding whose bits the last step's AdamW wrote, and
    // that nothing has changed since, has nothing left to do.
    std::vector<RoundSpan> Table;
    for (uint32_t K = I; K < J; ++K) {
      const Instr &In = *RP.instrs()->Get(K);
      const uint32_t Y = In.outputs()->Get(0);
      ParamRoundings += ParamCopy[Y];
      if (CopyCurrent[Y]) {
        ++ParamRoundingsFromUpdates;
        continue;
      }
      Table.push_back(roundSpan(K, In));
    }
    if (!Table.empty())
      launchMany(roundBf16ManyKernel, Table);
  }
  /// AdamW instruction \p Idx's tensor (its inputs: the parameter, its
  /// gradient, the clipping coefficient; floats: beta1, beta2, eps, weight
  /// decay; the moments are the backend's).
  AdamWSpan adamSpan(uint32_t Idx, const Instr &In) {
    const uint32_t Y = In.outputs()->Get(0);
    AdamWSpan E;
    E.Param = f(Y);
    E.Grad = f(In.inputs()->Get(1));
    E.Coef = f(In.inputs()->Get(2));
    E.M = static_cast<float *>(MomentM[Idx]);
    E.V = static_cast<float *>(MomentV[Idx]);
    const double Beta1 = In.floats()->Get(0), Beta2 = In.floats()->Get(1);
    // (The clipping coefficient, 0 here, is the kernel's to read.)
    E.Step = megac_adamw_constants(
        0.0, Lr, Beta1, Beta2, In.floats()->Get(2), In.floats()->Get(3),
        std::pow(Beta1, double(Step)), std::pow(Beta2, double(Step)));
    E.Bits =
        CopyByUpdate[Idx] < Copy.size() ? Copy[CopyByUpdate[Idx]] : nullptr;
    E.Span.N = numel(Y);
    const bool Wide = aligned16(E.Param) && aligned16(E.Grad) &&
                      aligned16(E.M) && aligned16(E.V) &&
                      (!E.Bits || aligned16(E.Bits));
    E.Span.Groups = Wide ? E.Span.N / 4 : 0;
    return E;
  }
  /// round_bf16 instruction \p Idx's tensor: fp32 in, fp32 out (null: kept
  /// in bf16 alone) and its bf16 copy (null: none).
  RoundSpan roundSpan(uint32_t Idx, const Instr &In) {
    const uint32_t Y = In.outputs()->Get(0);
    RoundSpan E;
    E.X = f(In.inputs()->Get(0));
    E.Y = f(Y);
    E.Bits = writeCopy(Y, Idx);
    E.Span.N = numel(Y);
    const bool Wide = aligned16(E.X) && (!E.Y || aligned16(E.Y)) &&
                      (!E.Bits || aligned16(E.Bits));
    E.Span.Groups = Wide ? E.Span.N / 4 : 0;
    return E;
  }
  /// Launches \p Kernel over \p Table (entries with their Spans' N and
  /// Groups), the table copied to the device on the compute stream.
  template <class Entry>
  void launchMany(void (*Kernel)(const Entry *, int),
                  std::vector<Entry> &Table) {
    const int64_t Blocks = layOutSpans(Table);
    if (Blocks == 0)
      return;
    launchOn(Compute, Kernel, unsigned(Blocks), kThreads, 0, upload(Table),
             int(Table.size()));
  }
  /// \p Table in device memory, copied on the compute stream (so the
  /// launches before it have read the previous table).
  template <class Entry> const Entry *upload(const std::vector<Entry> &Table) {
    const size_t Bytes = Table.size() * sizeof(Entry);
    void *Dev = ManyTable.atLeast(Bytes, "tensor table");
    check(cudaMemcpyAsync(Dev, Table.data(), Bytes, cudaMemcpyHostToDevice,
                          Compute),
          "cudaMemcpyAsync");
    return static_cast<const Entry *>(Dev);
  }
  GrowingBuffer ManyTable;

  template <class KernelFn> void setSharedLimit(KernelFn *Fn, size_t Bytes) {
    check(cudaFuncSetAttribute(Fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Bytes)),
          "cudaFuncSetAttribute");
  }

  /// \p To = the bf16 bits of \p N values: exact ones (flagging any that
  /// is not bf16), or rounded.
  void packBf16(const float *X, int64_t N, uint16_t *To, bool Exact) {
    launchOn(Compute, packBf16Kernel, wideBlocks(N), kThreads, 0, X, N, To,
             Exact ? Faults + kFaultNotBf16 : nullptr);
  }

  /// The rows' softmax statistics [max, sum] of the last cross-entropy,
  /// for its gradient to read instead of a pass of its own over the logits
  /// (a vocabulary a row): kept as long as nothing writes the logits read.
  struct KeptLoss {
    bool Valid = false;
    uint32_t Logits = 0; // the buffer (read in fp32 or from its copy)
    int64_t Rows = 0, Vocab = 0;
    std::vector<Range> Inputs;
    GrowingBuffer Memory;
  } Loss;

  /// Where the cross-entropy of \p Rows rows of \p Vocab logits (buffer
  /// \p B, read at \p L: fp32 or its copy) writes its statistics, which
  /// then count as kept.
  template <class T>
  double *keepLossStats(uint32_t B, const T *L, int64_t Rows, int64_t Vocab) {
    double *Stats = static_cast<double *>(Loss.Memory.atLeast(
        size_t(2 * Rows) * sizeof(double), "cross-entropy statistics"));
    const char *P0 = reinterpret_cast<const char *>(L);
    Loss.Inputs = {rangeOf(B), {P0, P0 + size_t(Rows * Vocab) * sizeof(T)}};
    Loss.Logits = B;
    Loss.Rows = Rows;
    Loss.Vocab = Vocab;
    Loss.Valid = true;
    return Stats;
  }
  /// The statistics kept for those logits (null: none).
  const double *keptLossStats(uint32_t B, int64_t Rows, int64_t Vocab) const {
    return Loss.Valid && Loss.Logits == B && Loss.Rows == Rows &&
                   Loss.Vocab == Vocab
               ? static_cast<const double *>(Loss.Memory.Ptr)
               : nullptr;
  }

  /// What the gradient steps of one attention share, in device memory of
  /// its own: each query row's max and 1 / sum of the attention of (Q, K,
  /// V) and its delta = dy . y, recomputed for the first of the three
  /// steps and kept for the other two as long as nothing writes their
  /// inputs in between (run() forgets them when an instruction does).
  /// The register-resident kernels also keep bf16 copies of q, k, v and
  /// dy, and the gradient of k or v (\p GradOf) that the other's step
  /// computed beside its own; cuDNN's, its three gradients (Grad16).
  struct KeptAttention {
    bool Valid = false;
    std::vector<int64_t> Key;
    std::vector<Range> Inputs;
    GrowingBuffer Memory;
    float *Stats = nullptr, *Delta = nullptr, *Grad = nullptr;
    /// dq's fp32 sums (which = 4 with MEGAC_CUDA_DQ_ATOMICS on; else null).
    float *QuerySums = nullptr;
    const uint16_t *Q16 = nullptr, *K16 = nullptr, *V16 = nullptr,
                   *DY16 = nullptr;
    int GradOf = -1;
    uint16_t *Grad16[3] = {nullptr, nullptr, nullptr}; // cuDNN's dq, dk, dv
  } Kept;

  /// A training step's forward attentions keep their rows' statistics for
  /// their gradient steps (attentionOutputsOfGradients; the memory plan
  /// keeps y alive until them): [max, 1 / sum] per row from the
  /// register-resident kernels, the log-sum-exp from cuDNN's. The first
  /// gradient step then takes each row's delta from y and dy (or hands y
  /// to cuDNN) instead of running the forward again. They hold for the
  /// micro-batch and run that made them, as long as nothing writes q, k,
  /// v or y.
  struct ForwardKept {
    bool Valid = false;
    int64_t Micro = -1;
    std::vector<int64_t> Key;      // forwardKey
    std::vector<Range> Inputs;     // q, k, v and y: fp32, else the copy
    const float *Y = nullptr;      // y in fp32 (null: kept in bf16 alone)
    const uint16_t *Y16 = nullptr; // then its bits
    GrowingBuffer Memory;          // the statistics
    float *stats() const { return static_cast<float *>(Memory.Ptr); }
  };
  /// By y's buffer, the forward attentions a gradient step reads.
  std::map<uint32_t, ForwardKept> ForwardStats;
  /// A training step's LayerNorm keeps its rows' statistics (mean and 1 /
  /// sqrt(var + eps), rowStatsKernel's bits) for its gradients, which read
  /// the same x: the gain's then skips its own pass over x for them, the
  /// input's two passes over each row (layerNormGradKernel).
  /// They hold for the run that made them, as long as nothing writes x,
  /// and only for the same x, read the same way (fp32 or its copy).
  struct KeptRowStats {
    bool Valid = false;
    const void *X = nullptr; // x as the forward read it
    int64_t Rows = 0, H = 0;
    double Eps = 0;
    std::vector<Range> Inputs; // x's bytes
    GrowingBuffer Memory;      // [2 Rows] doubles
    double *stats() const { return static_cast<double *>(Memory.Ptr); }
  };
  /// By x's buffer, the LayerNorms whose gain gradient a step computes.
  /// (No knob turns it off: the statistics are the same bits either way,
  /// LayerNormGainEmuTest's ForwardKeepsTheRowStatsBitForBit.)
  std::map<uint32_t, KeptRowStats> RowStats;
  /// LayerNorm gain gradients that took their forward's statistics, and
  /// that computed them again (runNotes).
  uint64_t RowStatsTaken = 0, RowStatsRecomputed = 0;
  /// Where the LayerNorm of \p X (read at \p Xs, \p Rows x \p H) writes
  /// its rows' statistics for its gradients (null: nowhere), marked valid
  /// as of this launch.
  double *rowStatsToKeep(uint32_t X, const void *Xs, size_t ElemBytes,
                         int64_t Rows, int64_t H, double Eps) {
    auto It = RowStats.find(X);
    if (!CurTraining || It == RowStats.end() || Rows == 0)
      return nullptr;
    KeptRowStats &K = It->second;
    K.Memory.atLeast(size_t(2 * Rows) * sizeof(double), "LayerNorm statistics");
    const char *P = static_cast<const char *>(Xs);
    K.Inputs = {Range{P, P + size_t(Rows * H) * ElemBytes}};
    K.X = Xs;
    K.Rows = Rows;
    K.H = H;
    K.Eps = Eps;
    K.Valid = true;
    return K.stats();
  }
  /// The statistics the LayerNorm of \p X kept, where they hold for a
  /// gradient reading it at \p Xs (null: compute them).
  const double *keptRowStats(uint32_t X, const void *Xs, int64_t Rows,
                             int64_t H, double Eps) const {
    auto It = RowStats.find(X);
    const bool Holds = It != RowStats.end() && It->second.Valid &&
                       It->second.X == Xs && It->second.Rows == Rows &&
                       It->second.H == H && It->second.Eps == Eps;
    return Holds ? It->second.stats() : nullptr;
  }
  /// Per instruction: the forward output its attention gradient reads, or
  /// -1 (attentionOutputsOfGradients).
  std::vector<int64_t> GradientOutputOf;
  /// The attention instruction running: its y buffer (a forward whose
  /// statistics a gradient step takes), the forward's (a gradient step),
  /// or -1.
  int64_t AttentionOutput = -1;
  bool CurTraining = false;
  /// Attention gradients on bf16 kernels that took a forward's statistics,
  /// and that ran the forward again (runNotes).
  uint64_t ForwardTaken = 0, ForwardRecomputed = 0;

  /// What identifies a forward's q, k and v: keptKey without dy, each
  /// input by its fp32 buffer, or by its copy where it is kept in bf16
  /// alone (the copy a gradient step reads may differ: packed, or none).
  std::vector<int64_t> forwardKey(const float *Q, const float *K,
                                  const float *V, int64_t B, int64_t S,
                                  int64_t Hl, int64_t NH, int Causal, int64_t D,
                                  const AttnDropout &Dr,
                                  const AttentionCopies &Copies,
                                  int Kernels) const {
    const AttentionCopies Alone = {Q ? nullptr : Copies[0],
                                   K ? nullptr : Copies[1],
                                   V ? nullptr : Copies[2], nullptr};
    return keptKey(Q, K, V, nullptr, B, S, Hl, NH, Causal, D, Dr, Alone,
                   Kernels);
  }
  /// The record a forward attention writes its \p Floats statistics into
  /// (null: no gradient step will read them, or not a training run).
  ForwardKept *forwardToKeep(int64_t Floats) {
    if (AttentionOutput < 0 || !CurTraining)
      return nullptr;
    auto It = ForwardStats.find(uint32_t(AttentionOutput));
    if (It == ForwardStats.end())
      return nullptr;
    It->second.Memory.atLeast(size_t(Floats) * sizeof(float),
                              "attention statistics");
    return &It->second;
  }
  /// Marks \p F as made now by kernels \p Kernels from q, k, v, with
  /// output y (\p Y, or its bits \p Y16 where kept in bf16 alone).
  void keepForward(ForwardKept &F, const float *Q, const float *K,
                   const float *V, int64_t B, int64_t S, int64_t Hl, int64_t NH,
                   int Causal, int64_t D, const AttnDropout &Dr,
                   const AttentionCopies &Copies, const float *Y,
                   const uint16_t *Y16, int Kernels) {
    const size_t N = size_t(B * S * Hl);
    F.Key = forwardKey(Q, K, V, B, S, Hl, NH, Causal, D, Dr, Copies, Kernels);
    F.Inputs.clear();
    const float *Fp32[4] = {Q, K, V, Y};
    const uint16_t *Bits[4] = {Copies[0], Copies[1], Copies[2], Y16};
    for (int J = 0; J < 4; ++J) {
      if (const char *P = reinterpret_cast<const char *>(Fp32[J]))
        F.Inputs.push_back({P, P + N * sizeof(float)});
      else if (const char *C = reinterpret_cast<const char *>(Bits[J]))
        F.Inputs.push_back({C, C + N * sizeof(uint16_t)});
    }
    F.Y = Y;
    F.Y16 = Y ? nullptr : Y16;
    F.Micro = CurMicro;
    F.Valid = Y || Y16;
  }
  /// The statistics the forward of the attention whose gradient step runs
  /// kept (null: none that hold).
  const ForwardKept *keptForward(const float *Q, const float *K, const float *V,
                                 int64_t B, int64_t S, int64_t Hl, int64_t NH,
                                 int Causal, int64_t D, const AttnDropout &Dr,
                                 const AttentionCopies &Copies, int Kernels) {
    auto It = AttentionOutput < 0
                  ? ForwardStats.end()
                  : ForwardStats.find(uint32_t(AttentionOutput));
    if (It == ForwardStats.end() || !It->second.Valid ||
        It->second.Micro != CurMicro ||
        It->second.Key !=
            forwardKey(Q, K, V, B, S, Hl, NH, Causal, D, Dr, Copies, Kernels)) {
      ++ForwardRecomputed;
      return nullptr;
    }
    ++ForwardTaken;
    return &It->second;
  }

  /// What identifies one attention's kept state: its shape, dropout, the
  /// kernels that made it (\p Kernels: 0 register-resident, 1 wmma, 2
  /// cuDNN; one attention's steps may take different ones), and each
  /// input by its fp32 buffer (null where it is kept in bf16 alone) and
  /// the bf16 copy read (null: packed).
  std::vector<int64_t> keptKey(const float *Q, const float *K, const float *V,
                               const float *DY, int64_t B, int64_t S,
                               int64_t Hl, int64_t NH, int Causal, int64_t D,
                               const AttnDropout &Dr,
                               const AttentionCopies &Copies,
                               int Kernels) const {
    const float *Fp32[4] = {Q, K, V, DY};
    std::vector<int64_t> Key = {B,
                                S,
                                Hl,
                                NH,
                                Causal,
                                D,
                                int64_t(Dr.Key),
                                int64_t(Dr.Rate * 1e9),
                                Dr.GlobalHeads,
                                Dr.BatchOffset,
                                Dr.HeadOffset,
                                Kernels};
    for (int J = 0; J < 4; ++J)
      Key.insert(Key.end(),
                 {int64_t(reinterpret_cast<intptr_t>(Fp32[J])),
                  int64_t(reinterpret_cast<intptr_t>(Copies[size_t(J)]))});
    return Key;
  }
  /// Marks the kept state valid for \p Key, made from the fp32 buffers
  /// \p Fp32 and the copies read (a copy's bytes may go to another
  /// buffer while the fp32 one lives on): run() forgets it when an
  /// instruction writes any of them.
  void keepAttentionInputs(const std::array<const float *, 4> &Fp32,
                           const AttentionCopies &Copies, int64_t N,
                           const std::vector<int64_t> &Key) {
    Kept.Inputs.clear();
    for (size_t J = 0; J < 4; ++J) {
      if (const char *F = reinterpret_cast<const char *>(Fp32[J]))
        Kept.Inputs.push_back({F, F + size_t(N) * sizeof(float)});
      if (const char *C = reinterpret_cast<const char *>(Copies[J]))
        Kept.Inputs.push_back({C, C + size_t(N) * 2});
    }
    Kept.Key = Key;
    Kept.Valid = true;
  }

  /// The kept state of one attention's gradient steps on cuDNN: q, k, v
  /// and dy in bf16 (copies, or packed), the forward's y and rows'
  /// log-sum-exp, and the three gradients (null: cuDNN declined). With
  /// \p Into, the gradients go there instead, once, and nothing is kept
  /// (cudnnGradsInto: every step of the attention is in the one call).
  const KeptAttention *
  keptCudnn(const SdpaShape &Sh, const float *Q, const float *K, const float *V,
            const float *DY, int Causal, const AttnDropout &Dr,
            const AttentionCopies &Copies,
            const std::array<uint16_t *, 3> *Into = nullptr) {
    const int64_t Rows = Sh.B * Sh.NH * Sh.S, N = Sh.B * Sh.S * Sh.NH * Sh.D;
    const std::vector<int64_t> Key =
        keptKey(Q, K, V, DY, Sh.B, Sh.S, Sh.NH * Sh.D, Sh.NH, Causal, Sh.D, Dr,
                Copies, 2);
    if (!Into && Kept.Valid && Kept.Key == Key)
      return &Kept;
    Kept.Valid = false;
    // Stats, then 4 inputs, y and 3 gradients in bf16 (16-byte aligned).
    const size_t StatsBytes = (size_t(Rows) * sizeof(float) + 15) / 16 * 16;
    char *Base = static_cast<char *>(Kept.Memory.atLeast(
        StatsBytes + size_t(8 * N) * sizeof(uint16_t), "attention state"));
    Kept.Stats = reinterpret_cast<float *>(Base);
    uint16_t *Bf16 = reinterpret_cast<uint16_t *>(Base + StatsBytes);
    std::array<const uint16_t *, 4> In16 = Copies;
    packMissing(In16, {Q, K, V, DY}, N, [&] { return Bf16; });
    uint16_t *Y16 = Bf16 + 4 * N;
    for (int J = 0; J < 3; ++J)
      Kept.Grad16[J] = Into ? (*Into)[size_t(J)] : Bf16 + (5 + J) * N;
    const uint16_t *Y = Y16;
    if (const ForwardKept *F =
            keptForward(Q, K, V, Sh.B, Sh.S, Sh.NH * Sh.D, Sh.NH, Causal, Sh.D,
                        Dr, Copies, 2)) {
      // The forward's log-sum-exp and y (its bits: exact, y is rounded).
      check(cudaMemcpyAsync(Kept.Stats, F->stats(),
                            size_t(Rows) * sizeof(float),
                            cudaMemcpyDeviceToDevice, Compute),
            "cudaMemcpyAsync");
      if (F->Y)
        packBf16(F->Y, N, Y16, /*Exact=*/true);
      else
        Y = F->Y16;
    } else if (!cudnnDid(Cudnn->forward(Sh, In16[0], In16[1], In16[2], Y16,
                                        Kept.Stats, Compute))) {
      return nullptr;
    }
    if (!cudnnDid(Cudnn->backward(Sh, In16[0], In16[1], In16[2], Y, In16[3],
                                  Kept.Stats, Kept.Grad16[0], Kept.Grad16[1],
                                  Kept.Grad16[2], Compute)))
      return nullptr;
    if (Into) // the gradients are the outputs': nothing to keep
      return &Kept;
    keepAttentionInputs({Q, K, V, DY}, Copies, N, Key);
    return &Kept;
  }

  template <int D>
  KeptAttention &keptAttention(const float *Q, const float *K, const float *V,
                               const float *DY, int64_t B, int64_t S,
                               int64_t Hl, int64_t NH, int Causal,
                               const AttnDropout &Dr, unsigned Blocks,
                               float Scale, const AttentionCopies &Copies) {
    const int64_t Rows = B * NH * S, N = B * S * Hl;
    const std::vector<int64_t> Key =
        keptKey(Q, K, V, DY, B, S, Hl, NH, Causal, D, Dr, Copies,
                WmmaAttention ? 1 : 0);
    if (Kept.Valid && Kept.Key == Key)
      return Kept;
    Kept.Valid = false;
    // [max, 1 / sum] per row, deltas, then (register-resident kernels)
    // q, k, v and dy in bf16 (room for all four where one has no copy to
    // read: packMissing), one fp32 gradient where the plan has k's or v's
    // step alone, and dq's fp32 sums where it has all three steps in one;
    // 16-byte aligned parts.
    auto Align = [](size_t X) { return (X + 15) / 16 * 16; };
    const size_t StatsBytes = Align(size_t(3 * Rows) * sizeof(float));
    const bool Packs =
        std::find(Copies.begin(), Copies.end(), nullptr) != Copies.end();
    const size_t Bf16Bytes = Packs ? size_t(4 * N) * sizeof(uint16_t) : 0;
    const size_t GradBytes =
        SeparateKeyValueSteps ? size_t(N) * sizeof(float) : 0;
    const size_t SumBytes =
        AllGradsTogether && QueryGradAtomics ? size_t(N) * sizeof(float) : 0;
    char *Base = static_cast<char *>(Kept.Memory.atLeast(
        WmmaAttention ? StatsBytes
                      : StatsBytes + Bf16Bytes + GradBytes + SumBytes,
        "attention state"));
    Kept.Stats = reinterpret_cast<float *>(Base);
    Kept.Delta = Kept.Stats + 2 * Rows;
    Kept.GradOf = -1;
    if (WmmaAttention) {
      float *Y =
          static_cast<float *>(scratch(size_t(B * S * Hl) * sizeof(float)));
      launchOn(Compute, flashForwardTcKernel<D>, Blocks, kTcThreads,
               TcShared<D>::Forward, Q, K, V, S, Hl, NH, Causal, Scale, Dr, Y,
               Kept.Stats, Faults + kFaultNotBf16);
      launchOn(Compute, attentionRowDotKernel, blocksFor(Rows), kThreads, 0, DY,
               static_cast<const float *>(Y), B, S, Hl, NH, int64_t(D),
               Kept.Delta);
    } else {
      // q, k and v in bf16 (checked: they must hold bf16 values) and dy
      // rounded: their copies where their writers made them, else packed.
      std::array<const uint16_t *, 4> In16 = Copies;
      packMissing(In16, {Q, K, V, DY}, N, [&] {
        return reinterpret_cast<uint16_t *>(Base + StatsBytes);
      });
      Kept.Q16 = In16[0];
      Kept.K16 = In16[1];
      Kept.V16 = In16[2];
      Kept.DY16 = In16[3];
      Kept.Grad = SeparateKeyValueSteps
                      ? reinterpret_cast<float *>(Base + StatsBytes + Bf16Bytes)
                      : nullptr;
      Kept.QuerySums = SumBytes ? reinterpret_cast<float *>(
                                      Base + StatsBytes + Bf16Bytes + GradBytes)
                                : nullptr;
      if (const ForwardKept *F =
              keptForward(Q, K, V, B, S, Hl, NH, Causal, D, Dr, Copies, 0)) {
        // The forward's statistics, and the deltas from its output.
        check(cudaMemcpyAsync(Kept.Stats, F->stats(),
                              size_t(2 * Rows) * sizeof(float),
                              cudaMemcpyDeviceToDevice, Compute),
              "cudaMemcpyAsync");
        const unsigned DeltaBlocks = blocksFor(Rows * 32);
        if (F->Y)
          launchOn(Compute, attentionDeltaFromOutputKernel<float>, DeltaBlocks,
                   kThreads, 0, Kept.DY16, F->Y, B, S, Hl, NH, int64_t(D),
                   Kept.Delta);
        else
          launchOn(Compute, attentionDeltaFromOutputKernel<uint16_t>,
                   DeltaBlocks, kThreads, 0, Kept.DY16, F->Y16, B, S, Hl, NH,
                   int64_t(D), Kept.Delta);
      } else {
        forwardMma<D>(Kept.Q16, Kept.K16, Kept.V16, B, S, Hl, NH, Causal, Scale,
                      Dr, nullptr, Kept.Stats, Kept.DY16, Kept.Delta,
                      OutputStore{});
      }
    }
    keepAttentionInputs({Q, K, V, DY}, Copies, N, Key);
    return Kept;
  }

  /// The register-resident forward kernel over bf16 q, k and v: y (or
  /// its bits, as \p Store stores), and where given each row's statistics
  /// and delta = dy . y. Blocks of 128 queries unless
  /// MEGAC_CUDA_WIDE_FORWARD=0 asked for 64 (wideForwardAsked), or the
  /// attention has dropout at head size 128 (wideForwardDropout).
  template <int D>
  void forwardMma(const uint16_t *Q, const uint16_t *K, const uint16_t *V,
                  int64_t B, int64_t S, int64_t Hl, int64_t NH, int Causal,
                  float Scale, const AttnDropout &Dr, float *Y, float *Stats,
                  const uint16_t *DY, float *Delta, OutputStore Store) {
    using Sh = MmaShared<D>;
    const bool Wide = WideForward && (Dr.Rate == 0 || wideForwardDropout<D>());
    ++MmaForwards;
    WideForwards += Wide;
    launchOn(Compute,
             Wide ? flashForwardMmaKernel<D, 2, wideForwardDropout<D>()>
                  : flashForwardMmaKernel<D>,
             headBlocks(B, NH, S, Wide ? 2 * kMmaRows : kMmaRows), kMmaThreads,
             Wide ? Sh::WideForward : Sh::Forward, Q, K, V, S, Hl, NH, Causal,
             Scale, Dr, Y, Stats, DY, Delta, Store);
  }

  /// The register-resident key-gradient kernel over an attention's kept
  /// state: dk and dv as \p StoreK and \p StoreV store them, and with \p
  /// WithQuery dq's sums into \p DQSum. Blocks of 128 keys, 32 a warp, at
  /// head sizes up to 64 unless MEGAC_CUDA_WIDE_KEY_GRAD=0 asked for 64
  /// (wideKeyGradAsked); at 128 a thread has no registers for two slices'
  /// dk and dv.
  template <int D, bool WithQuery>
  void keyGradMma(const KeptAttention &Kp, int64_t B, int64_t S, int64_t Hl,
                  int64_t NH, int Causal, float Scale, const AttnDropout &Dr,
                  float *DK, float *DV, OutputStore StoreK, OutputStore StoreV,
                  float *DQSum) {
    using Sh = MmaShared<D>;
    auto Kernel = flashKeyGradMmaKernel<D, WithQuery>;
    size_t Shared = WithQuery ? Sh::AllGrads : Sh::KeyGrad;
    int64_t Rows = kMmaRows;
    if constexpr (D <= 64) // (no wide instance at 128)
      if (WideKeyGrad) {
        Kernel = flashKeyGradMmaKernel<D, WithQuery, 2>;
        Shared = WithQuery ? Sh::WideAllGrads : Sh::WideKeyGrad;
        Rows = 2 * kMmaRows;
        ++WideKeyGrads;
      }
    ++MmaKeyGrads;
    launchOn(Compute, Kernel, headBlocks(B, NH, S, Rows), kMmaThreads, Shared,
             Kp.Q16, Kp.K16, Kp.V16, Kp.DY16, S, Hl, NH, Causal, Scale, Dr,
             static_cast<const float *>(Kp.Stats),
             static_cast<const float *>(Kp.Delta), DK, DV, StoreK, StoreV,
             DQSum);
  }

  /// Blocks of \p Rows rows over each of the B x NH heads' S rows, as
  /// flashBlock counts them.
  static unsigned headBlocks(int64_t B, int64_t NH, int64_t S, int64_t Rows) {
    return unsigned(B * NH * ((S + Rows - 1) / Rows));
  }

  /// Whether the forward kernel with two row slices a warp keeps the
  /// dropout mask's generator: at head sizes up to 64 (245 registers at
  /// 64); at 128 the two slices' scores and outputs leave it no room, and
  /// attentions with dropout run blocks of 64 queries.
  template <int D> static constexpr bool wideForwardDropout() {
    return D <= 64;
  }

  template <int D> static constexpr int tcSlot() {
    return D == 32 ? 0 : D == 64 ? 1 : 2;
  }
  bool TcReady[3] = {false, false, false}, MmaReady[3] = {false, false, false};
  /// MEGAC_CUDA_ATTENTION (attentionAsked); wmma: the first tensor-core
  /// attention kernels (flash_tc.cuh) instead of the register-resident
  /// ones, to compare the two on a device.
  const std::string AttentionKind = attentionAsked();
  const bool WmmaAttention = AttentionKind == "wmma";
  /// MEGAC_CUDA_EPILOGUES=0 (epiloguesAsked), and how many GEMM groups a
  /// run gave cuBLASLt's bf16 epilogues (runNotes).
  const EpilogueUse Epilogues = epiloguesAsked();
  const bool EpiloguesOff = Epilogues == EpilogueUse::Off;
  /// EpilogueUse::Timed (epilogueChosen): product shapes timed both ways,
  /// those that kept the epilogue, and a call of each way summed over the
  /// shapes (runNotes).
  uint64_t EpiloguesTimed = 0, EpiloguesKept = 0;
  double EpilogueTimedMs = 0, PlainTimedMs = 0;
  /// Epilogues timed: EpilogueUse::Timed on a grid whose axes of more
  /// than one rank are data or pipeline parallel (set with the device).
  bool TimeEpilogues = false;
  /// MEGAC_CUDA_BGRAD_EPILOGUE (biasGradEpilogueAsked).
  const bool BiasGradEpilogue = biasGradEpilogueAsked();
  /// MEGAC_CUDA_DQ_ATOMICS (queryGradAtomicsAsked), and how many
  /// attention gradients of q, k and v a run had and gave from one pass
  /// (runNotes).
  const bool QueryGradAtomics = queryGradAtomicsAsked();
  /// MEGAC_CUDA_WIDE_FORWARD (wideForwardAsked), and how many
  /// register-resident forward launches a run had and ran wide (runNotes).
  const bool WideForward = wideForwardAsked();
  uint64_t MmaForwards = 0, WideForwards = 0;
  /// MEGAC_CUDA_WIDE_KEY_GRAD (wideKeyGradAsked), and how many
  /// register-resident key-gradient launches a run had and ran wide.
  const bool WideKeyGrad = wideKeyGradAsked();
  uint64_t MmaKeyGrads = 0, WideKeyGrads = 0;
  uint64_t AllGradSteps = 0, AllGradPasses = 0;
  /// Host time of the runs after the first step (runNotes): issuing the
  /// instructions, then waiting for the device. A host that issues far
  /// faster than the device runs leaves CUDA graphs little to take.
  double HostIssueMs = 0, HostWaitMs = 0;
  int64_t TimedSteps = 0, LastTimedStep = 0;
  uint64_t EpilogueProducts = 0, RoundedGroups = 0;
  /// "w" groups (linear_weight_grad with the bias gradient), and those
  /// whose bias gradient came from cuBLASLt's BGRAD epilogue.
  uint64_t BiasGradGroups = 0, BiasGradEpilogues = 0;
  /// cuBLASLt products refused as they launched (ltMatmul).
  uint64_t LtRefused = 0, LtUnaligned = 0;
  /// MEGAC_CUDA_GEMM_TUNE=1 (tuneLt): product shapes timed, those that
  /// chose another algorithm than the heuristic's first, and the
  /// milliseconds a call that saved them, summed over the shapes.
  /// Tuned where asked on a grid whose axes of more than one rank are data
  /// or pipeline parallel (set with the device): ranks of another axis
  /// compute replicated values, and timed apart they could choose
  /// algorithms apart, which differ in the last bits of a sum.
  const bool TuneGemmsAsked = gemmTuneAsked();
  bool TuneGemms = false;
  /// MEGAC_CUDA_GEMM_PROBE=1 (probeLt); Probing while it makes its own
  /// plans (which the log leaves out).
  const bool ProbeGemms = gemmProbeAsked();
  bool Probing = false;
  /// MEGAC_CUDA_LT_REDUCTIONS=any (ltAnyReductionAsked), MEGAC_CUDA_LT_LOG=1
  /// (ltLogAsked).
  const bool LtAnyReduction = ltAnyReductionAsked(), LtLog = ltLogAsked();
  static constexpr int kGemmCandidates = 8;
  uint64_t TunedShapes = 0, TunedOther = 0;
  double TunedSavedMs = 0;
  /// MEGAC_CUDA_ATTENTION=cudnn: cuDNN's fused attention (opened with the
  /// device; null where it is not asked for or cannot load), and the
  /// reasons it declined a step, each said once.
  std::unique_ptr<CudnnAttention> Cudnn;
  std::vector<std::string> CudnnDeclined;
  unsigned CudnnSteps = 0;

  /// Column sums (bias gradients) run in two passes: chunks of
  /// kColumnRowsPer rows summed in parallel, in double, then the chunks'
  /// sums in order (a bias gradient has few columns and many rows).
  /// Chunks of 32 rows: a LayerNorm of 8192 rows of 1024 makes 65536
  /// threads of four columns (two blocks an SM on an H100), whose parts
  /// (2 MiB of doubles) are a sixteenth of what they read.
  static constexpr int64_t kColumnRowsPer = 32;
  struct ColumnChunks {
    int64_t Outer, Chunks;
    unsigned Blocks;
  };
  ColumnChunks columnChunks(int64_t Numel, int64_t Columns) const {
    const int64_t Outer = Numel / Columns;
    const int64_t Chunks =
        std::max<int64_t>(1, (Outer + kColumnRowsPer - 1) / kColumnRowsPer);
    return {Outer, Chunks,
            Columns % 4 == 0 ? wideBlocks(Chunks * Columns)
                             : blocksFor(Chunks * Columns)};
  }
  /// Out[j] (+)= the sum of column j of buffer \p X (read as instruction
  /// \p Idx reads it: its bf16 copy where it has one), \p Columns wide.
  void columnSums(uint32_t X, uint32_t Idx, int64_t Columns, float *Out,
                  bool Add) {
    const ColumnChunks C = columnChunks(numel(X), Columns);
    double *Parts = static_cast<double *>(
        scratch(size_t(C.Chunks * Columns) * sizeof(double)));
    withInput(X, Idx, [&](auto *Xs) {
      launchOn(Compute, sumLeadingPartsKernel<Elem<decltype(Xs)>>, C.Blocks,
               kThreads, 0, Xs, C.Outer, Columns, kColumnRowsPer, C.Chunks,
               Parts);
    });
    launchOn(Compute, sumLeadingTotalKernel, totalBlocks(Columns), kThreads, 0,
             static_cast<const double *>(Parts), C.Chunks, Columns, Out,
             int(Add), static_cast<float *>(nullptr));
  }
  /// Device scratch of at least \p N bytes (its contents do not persist
  /// across instructions).
  void *scratch(size_t N) { return Scratch.atLeast(N, "scratch"); }
  /// One scratch region cut into parts of \p Bytes each, 256-byte aligned
  /// for cuBLASLt (a part of 0 bytes is null and takes none): the bf16
  /// buffers one instruction needs at once.
  template <size_t Parts>
  std::array<uint16_t *, Parts> scratchParts(std::array<size_t, Parts> Bytes) {
    auto Aligned = [](size_t B) { return (B + 255) / 256 * 256; };
    size_t Total = 0;
    for (size_t B : Bytes)
      Total += Aligned(B);
    char *At = Total ? static_cast<char *>(scratch(Total)) : nullptr;
    std::array<uint16_t *, Parts> Out{};
    for (size_t K = 0; K < Parts; ++K) {
      Out[K] = Bytes[K] ? reinterpret_cast<uint16_t *>(At) : nullptr;
      At += Aligned(Bytes[K]);
    }
    return Out;
  }

  const Program &P;
  const RankProgram &RP;
  std::string Arch, Name;
  int Major = 0, Minor = 0;
  /// MEGAC_CUDA_KERNEL_IMAGE=ptx (ptxKernelsAsked); the generated kernels
  /// loaded from PTX, and the first one's architecture (runNotes).
  const bool PtxKernels = ptxKernelsAsked();
  unsigned PtxModules = 0, PtxByKnob = 0;
  /// Kernels loaded from a cubin although the knob asked for PTX (none in
  /// the plan runs here), said in runNotes rather than passed over.
  unsigned CubinsDespiteKnob = 0;
  std::string PtxLoadedFor;
  std::map<std::string, size_t> Allocated; // bytes allocate() took, by use
  size_t SharedOptin = 0; // dynamic shared memory a block may opt in to
  cublasHandle_t Blas = nullptr, BlasBf16 = nullptr;
  /// Per buffer: holds bf16 values (see findBf16Values).
  std::vector<bool> Bf16;
  /// Per buffer: its bf16 copy in the arena (null: none) and the last
  /// instruction that may read it; the first is the copy's one writer.
  std::vector<uint16_t *> Copy;
  std::vector<int64_t> CopyFirst, CopyLast;
  /// MEGAC_CUDA_BF16_COPIES=0: writers make no copies and readers pack, as
  /// before the copies (their memory stays planned), to compare the two.
  const bool CopiesOn = bf16CopiesAsked();
  /// Parameter roundings kept from one step to the next
  /// (MemoryPlan::parameterCopyUpdate): per buffer, whether it is one
  /// (ParamCopy) and whether its bits are the parameter's as it is now
  /// (CopyCurrent: AdamW wrote them, and no upload or failure came
  /// since); per AdamW instruction, the buffer whose bits it writes (the
  /// buffer count: none; none at all with MEGAC_CUDA_PARAM_COPIES=0).
  const bool ParamCopiesOn = parameterCopiesAsked();
  std::vector<bool> ParamCopy, CopyCurrent, IsParam;
  std::vector<uint32_t> CopyByUpdate;
  uint64_t ParamRoundings = 0, ParamRoundingsFromUpdates = 0;
  /// Per buffer: kept in bf16 alone (MemoryPlan::bf16Only): no fp32
  /// storage (Ptr null), its copy is the buffer.
  std::vector<bool> Bf16Only;
  unsigned Products = 0, Bf16Products = 0, Attentions = 0, Bf16Attentions = 0;
  /// Whether the plan has attention gradient steps of k or v alone (not
  /// which = 3): the register-resident kernels then keep the other one's
  /// gradient in fp32 beside the attention state.
  bool SeparateKeyValueSteps = false;
  /// Whether it has attention gradients of q, k and v in one (which = 4):
  /// the register-resident kernels then sum dq in fp32 beside the
  /// attention state (with MEGAC_CUDA_DQ_ATOMICS on).
  bool AllGradsTogether = false;
  GrowingBuffer Scratch, BlasWorkspace, ProbeOut;
  cublasLtHandle_t Lt = nullptr;
  std::map<std::array<int64_t, 12>, LtPlan> LtPlans;
  void *Arena = nullptr;
  std::vector<void *> Ptr, Owned;
  std::vector<size_t> Bytes;
  /// Per adam_w instruction (null elsewhere): its moments on the device.
  std::vector<void *> MomentM, MomentV;
  std::vector<CUmodule> Modules;
  std::vector<CUfunction> Functions;
  /// Per grid axis: the communicator of this rank's group along it.
  std::vector<ncclComm_t> Comms;
  /// Kernels, copies and products go to Compute; collectives to Comm.
  cudaStream_t Compute = nullptr, Comm = nullptr;
  /// Collectives in flight, and the events to mark them.
  std::vector<InFlight> Pending;
  std::vector<cudaEvent_t> FreeEvents, AllEvents;
  cudaEvent_t Ready = nullptr;
  GrowingBuffer CommScratch;
  int64_t Step = 1, CurMicro = 0;
  bool Inference = false;
  double Lr = 0;
  uint64_t Seed;
  std::atomic<bool> Aborted{false};
  /// A run failed: the communicators are aborted, not destroyed.
  bool Failed = false;
  /// Device flags, one per kFault* kind.
  int *Faults = nullptr;
  /// Profiling: the event pool, the instructions timed in this run, and
  /// the sums per instruction, of the first step and of the later ones.
  bool Profiling = false;
  std::vector<cudaEvent_t> Events;
  std::vector<std::pair<uint32_t, uint32_t>> Timed; // [first, end) a launch
  struct ProfileSums {
    std::vector<double> Ms;
    std::vector<uint64_t> Runs;
    int64_t Steps = 0, LastStep = -1;
  } Profiled[2];
  /// The step of the first run() (-1: none yet): it loads kernels, plans
  /// and times products and grows scratch, so the host's times and the
  /// profile leave it out.
  int64_t FirstStep = -1;
  void (*Progress)(uint32_t, bool, void *);
  bool (*TransferFn)(int, int64_t, void *, size_t, bool, void *);
  /// Pipelines: the buffers kept per micro-batch in flight, their address
  /// in each slot, and the host copy of a transfer.
  std::vector<uint32_t> PerMicro;
  std::vector<std::vector<char *>> SlotPtrs;
  std::vector<char> Staging;
  void *ProgressCtx;
};

} // namespace
} // namespace megac_rt

namespace {
/// Every rank learns whether all succeeded so far (\p Why empty); a rank
/// that did, with a peer that did not, gets "rank R <\p PeerFailed>: <R's
/// reason>", so that whichever rank the launcher lets speak names the
/// cause. Collective over the world when the plan has several ranks.
void agreeOnSuccess(const Program &P, const DeviceBootstrap *Boot,
                    std::string &Why, const char *PeerFailed) {
  if (P.world_size() <= 1 || !Boot || !Boot->allGather)
    return;
  // Each rank's reason, cut to a fixed size (empty: it succeeded).
  constexpr size_t kReasonBytes = 256;
  char Mine[kReasonBytes] = {};
  std::snprintf(Mine, sizeof(Mine), "%s", Why.c_str());
  std::vector<char> All(P.world_size() * kReasonBytes);
  if (!Boot->allGather(Mine, kReasonBytes, All.data(), Boot->Ctx) &&
      Why.empty())
    Why = "the launcher could not share device status";
  for (uint32_t R = 0; R < P.world_size() && Why.empty(); ++R)
    if (const char *Reason = &All[R * kReasonBytes]; *Reason)
      Why = "rank " + std::to_string(R) + " " + PeerFailed + ": " +
            std::string(Reason, strnlen(Reason, kReasonBytes));
}
} // namespace

extern "C" megac_rt::DeviceRun *megacCreateCudaRun(const Program *P,
                                                   uint32_t Rank, int Device,
                                                   const DeviceBootstrap *Boot,
                                                   char *Err, size_t ErrSize) {
  // Every rank finds out whether all can go on before any joins a
  // communicator, so that one rank's missing device does not leave the
  // others waiting in NCCL.
  std::string Why;
  int Count = 0;
  const bool Counted = cudaGetDeviceCount(&Count) == cudaSuccess;
  // A launcher that gives each process a device of its own (Slurm's
  // --gpus-per-task=1, or a CUDA_VISIBLE_DEVICES per rank) leaves it one
  // visible: that one, whatever the local rank.
  if (Counted && Count == 1 && std::getenv("CUDA_VISIBLE_DEVICES"))
    Device = 0;
  if (!Counted || Count == 0)
    Why = "no CUDA device is visible to this process";
  else if (Device < 0 || Device >= Count)
    Why = "device " + std::to_string(Device) + " does not exist (" +
          std::to_string(Count) + " visible)";
  else if (cudaDeviceProp Prop;
           cudaGetDeviceProperties(&Prop, Device) == cudaSuccess &&
           Prop.major < 8)
    // The plugin and the plans' kernels are built for sm_80 and sm_90
    // (bf16 tensor cores): nothing older can run them.
    Why = std::string(Prop.name) + " (sm_" + std::to_string(Prop.major) +
          std::to_string(Prop.minor) +
          ") is too old: the CUDA backend needs compute capability 8.0 "
          "(sm_80) or newer";
#ifdef MEGAC_NO_NCCL
  else if (P->world_size() > 1)
    Why = "this libmegac_cuda.so was built without NCCL: plans of one rank "
          "only";
#endif

  agreeOnSuccess(*P, Boot, Why, "has no usable device");
  std::unique_ptr<megac_rt::CudaRun> Run;
  try {
    if (!Why.empty())
      throw std::runtime_error(Why);
    Run = std::make_unique<megac_rt::CudaRun>(*P, Rank, Device, Boot);
  } catch (const std::exception &E) {
    Why = E.what();
  }
  // Setting up can fail on one rank only (memory, a MEGAC_CUDA_* value set
  // on one rank): all agree before any joins a communicator the failed one
  // would never join.
  agreeOnSuccess(*P, Boot, Why, "could not set up its device");
  if (Why.empty() && !Run) // (an exception with an empty message)
    Why = "could not set up its device";
  if (Why.empty()) {
    bool PeerFailed = false;
    try {
      Run->joinCommunicators(Rank, Boot);
    } catch (const megac_rt::CudaRun::PeerJoinFailure &) {
      PeerFailed = true;
    } catch (const std::exception &E) {
      Why = E.what();
    }
    agreeOnSuccess(*P, Boot, Why, "could not join the communicators");
    if (PeerFailed && Why.empty()) // (agreeOnSuccess names the peer)
      Why = "a peer could not join the communicators";
  }
  if (!Why.empty() && Run)
    Run->markFailed(); // peers may be gone: abort, do not wait for them
  if (!Why.empty()) {
    std::snprintf(Err, ErrSize, "%s", Why.c_str());
    return nullptr;
  }
  return Run.release();
}
