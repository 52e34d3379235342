//===- cuda_run.cu - Forward plans on one CUDA device ---------------------===//
//
// The first slice of the CUDA backend (issue #5): one rank's forward plan
// (no collectives, no training ops yet) on one device. Buffers live in one
// device arena laid out by the compiler's memory plan; parameters have
// their own allocations. Products go to cuBLAS in fp32 (no TF32, so results
// stay within 1e-5 of the CPU backend); the fused elementwise kernels are
// the plan's own cubins; every other op is a simple kernel here that
// computes what the CPU kernel computes, in the same precision.
//
// Not yet run on a GPU: see docs/performance.md and issue #5.
//
//===----------------------------------------------------------------------===//

#include "device_run.h"
#include "megac_rt/memory_plan.h"
#include "plan_enums.h"

#include "cuda_api.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using namespace megac::plan;

namespace megac_rt {
namespace {

void check(cudaError_t E, const char *What) {
  if (E != cudaSuccess)
    throw std::runtime_error(std::string(What) + ": " + cudaGetErrorString(E));
}
void check(cublasStatus_t S, const char *What) {
  if (S != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(What) + ": cuBLAS status " +
                             std::to_string(int(S)));
}
void check(CUresult R, const char *What) {
  if (R != CUDA_SUCCESS) {
    const char *Msg = nullptr;
    cuGetErrorString(R, &Msg);
    throw std::runtime_error(std::string(What) + ": " + (Msg ? Msg : "?"));
  }
}

constexpr int kThreads = 256;
unsigned blocksFor(int64_t N) {
  return unsigned(std::min<int64_t>((N + kThreads - 1) / kThreads, 65535));
}

//===-- Kernels: each computes what runtime/src/kernels.cpp computes ------===//

__global__ void embeddingKernel(const float *Table, int64_t Rows, int64_t H,
                                const int32_t *Ids, int64_t N, int64_t Start,
                                float *Y) {
  for (int64_t I = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; I < N * H;
       I += int64_t(gridDim.x) * blockDim.x) {
    const int64_t R = I / H, J = I % H;
    const int64_t Row = int64_t(Ids[R]) - Start;
    Y[I] = Row >= 0 && Row < Rows ? Table[Row * H + J] : 0.0f;
  }
}

__global__ void broadcastKernel(const float *A, int64_t NA, const float *B,
                                int64_t NB, float *Y, int Mul) {
  for (int64_t I = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; I < NA;
       I += int64_t(gridDim.x) * blockDim.x) {
    const float X = A[I], Z = B[I % NB];
    Y[I] = Mul ? X * Z : X + Z;
  }
}

__device__ float geluDev(float V) {
  const float C = 0.7978845608028654f;
  return 0.5f * V * (1.0f + tanhf(C * (V + 0.044715f * V * V * V)));
}

__global__ void geluKernel(const float *X, int64_t N, float *Y) {
  for (int64_t I = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; I < N;
       I += int64_t(gridDim.x) * blockDim.x)
    Y[I] = geluDev(X[I]);
}

/// One block per row; mean and variance accumulated in double, as the CPU.
__global__ void layerNormKernel(const float *X, int64_t Rows, int64_t H,
                                const float *Gamma, const float *Beta,
                                double Eps, float *Y) {
  __shared__ double Part[kThreads];
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const float *Xr = X + R * H;
    double S = 0;
    for (int64_t J = threadIdx.x; J < H; J += blockDim.x)
      S += Xr[J];
    Part[threadIdx.x] = S;
    __syncthreads();
    for (int W = blockDim.x / 2; W > 0; W /= 2) {
      if (int(threadIdx.x) < W)
        Part[threadIdx.x] += Part[threadIdx.x + W];
      __syncthreads();
    }
    const double Mean = Part[0] / double(H);
    __syncthreads();
    double V = 0;
    for (int64_t J = threadIdx.x; J < H; J += blockDim.x)
      V += (Xr[J] - Mean) * (Xr[J] - Mean);
    Part[threadIdx.x] = V;
    __syncthreads();
    for (int W = blockDim.x / 2; W > 0; W /= 2) {
      if (int(threadIdx.x) < W)
        Part[threadIdx.x] += Part[threadIdx.x + W];
      __syncthreads();
    }
    const double Inv = 1.0 / sqrt(Part[0] / double(H) + Eps);
    __syncthreads();
    for (int64_t J = threadIdx.x; J < H; J += blockDim.x)
      Y[R * H + J] = float((Xr[J] - Mean) * Inv) * Gamma[J] + Beta[J];
  }
}

/// Attention of q, k, v [B, S, Hl] with NH heads: one thread per (batch,
/// head, query), scores in double over the keys it may see.
__global__ void attentionKernel(const float *Q, const float *K, const float *V,
                                int64_t B, int64_t S, int64_t Hl, int64_t NH,
                                int Causal, float *Y) {
  const int64_t D = Hl / NH;
  const double Scale = 1.0 / sqrt(double(D));
  for (int64_t T = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       T < B * NH * S; T += int64_t(gridDim.x) * blockDim.x) {
    const int64_t Bi = T / (NH * S), Hh = (T / S) % NH, I = T % S;
    const float *Qi = Q + (Bi * S + I) * Hl + Hh * D;
    const int64_t Last = Causal ? I : S - 1;
    double Max = -INFINITY;
    for (int64_t J = 0; J <= Last; ++J) {
      const float *Kj = K + (Bi * S + J) * Hl + Hh * D;
      double Dot = 0;
      for (int64_t E = 0; E < D; ++E)
        Dot += double(Qi[E]) * double(Kj[E]);
      Max = fmax(Max, Dot * Scale);
    }
    double Sum = 0;
    for (int64_t J = 0; J <= Last; ++J) {
      const float *Kj = K + (Bi * S + J) * Hl + Hh * D;
      double Dot = 0;
      for (int64_t E = 0; E < D; ++E)
        Dot += double(Qi[E]) * double(Kj[E]);
      Sum += exp(Dot * Scale - Max);
    }
    float *Yi = Y + (Bi * S + I) * Hl + Hh * D;
    for (int64_t E = 0; E < D; ++E)
      Yi[E] = 0.0f;
    for (int64_t J = 0; J <= Last; ++J) {
      const float *Kj = K + (Bi * S + J) * Hl + Hh * D;
      double Dot = 0;
      for (int64_t E = 0; E < D; ++E)
        Dot += double(Qi[E]) * double(Kj[E]);
      const double P = exp(Dot * Scale - Max) / Sum;
      const float *Vj = V + (Bi * S + J) * Hl + Hh * D;
      for (int64_t E = 0; E < D; ++E)
        Yi[E] += float(P * double(Vj[E]));
    }
  }
}

/// Per row: logsumexp - logit[label], in double.
__global__ void crossEntropyRows(const float *L, int64_t Rows, int64_t V,
                                 const int32_t *Labels, double *Out) {
  for (int64_t R = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; R < Rows;
       R += int64_t(gridDim.x) * blockDim.x) {
    const float *Lr = L + R * V;
    double Max = -INFINITY;
    for (int64_t J = 0; J < V; ++J)
      Max = fmax(Max, double(Lr[J]));
    double Sum = 0;
    for (int64_t J = 0; J < V; ++J)
      Sum += exp(double(Lr[J]) - Max);
    const int32_t Lab = Labels[R];
    Out[R] = (Lab >= 0 && Lab < V) ? Max + log(Sum) - double(Lr[Lab]) : NAN;
  }
}

/// The rows' losses summed in order (deterministic) over the normalizer.
__global__ void sumRows(const double *Rows, int64_t N, double Normalizer,
                        float *Y) {
  double S = 0;
  for (int64_t R = 0; R < N; ++R)
    S += Rows[R];
  Y[0] = float(S / Normalizer);
}

/// Y = permutation of X (rank <= 8): Y index -> X index through strides.
struct Perm {
  int Rank;
  int64_t OutShape[8], InStride[8];
};
__global__ void transposeKernel(const float *X, float *Y, int64_t N, Perm P) {
  for (int64_t I = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; I < N;
       I += int64_t(gridDim.x) * blockDim.x) {
    int64_t Rem = I, Src = 0;
    for (int D = P.Rank - 1; D >= 0; --D) {
      Src += (Rem % P.OutShape[D]) * P.InStride[D];
      Rem /= P.OutShape[D];
    }
    Y[I] = X[Src];
  }
}

//===-- The run --------------------------------------------------------===//

class CudaRun final : public DeviceRun {
public:
  CudaRun(const Program &P, uint32_t Rank, int Device)
      : P(P), RP(*P.ranks()->Get(Rank)) {
    check(cudaSetDevice(Device), "cudaSetDevice");
    cudaDeviceProp Prop;
    check(cudaGetDeviceProperties(&Prop, Device), "cudaGetDeviceProperties");
    Arch = "sm_" + std::to_string(Prop.major) + std::to_string(Prop.minor);
    Name = std::string(Prop.name) + " (" + Arch + ")";
    Major = Prop.major;
    check(cublasCreate(&Blas), "cublasCreate");
    // Plain fp32 products: no TF32, so results stay close to the CPU's.
    check(cublasSetMathMode(Blas, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    const MemoryPlan Plan = planMemory(P, RP);
    check(cudaMalloc(&Arena, std::max<uint64_t>(Plan.arenaBytes, 64)),
          "cudaMalloc (arena)");
    const uint32_t N = RP.buffers() ? RP.buffers()->size() : 0;
    Ptr.assign(N, nullptr);
    Bytes.assign(N, 0);
    for (uint32_t B = 0; B < N; ++B) {
      size_t Count = 1;
      for (int64_t D : *RP.buffers()->Get(B)->shape())
        Count *= size_t(D);
      Bytes[B] = Count * 4;
      if (Plan.offset[B] >= 0) {
        Ptr[B] = static_cast<char *>(Arena) + Plan.offset[B];
        continue;
      }
      check(cudaMalloc(&Ptr[B], std::max<size_t>(Bytes[B], 4)),
            "cudaMalloc (parameter)");
      Owned.push_back(Ptr[B]);
    }
  }

  ~CudaRun() override {
    for (CUmodule M : Modules)
      if (M)
        cuModuleUnload(M);
    for (void *Q : Owned)
      cudaFree(Q);
    cudaFree(Arena);
    cudaFree(Scratch);
    cublasDestroy(Blas);
  }

  void upload(uint32_t Id, const void *Data, size_t N) override {
    check(cudaMemcpy(Ptr.at(Id), Data, std::min(N, Bytes.at(Id)),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy (upload)");
  }

  void download(uint32_t Id, void *Data, size_t N) override {
    check(cudaMemcpy(Data, Ptr.at(Id), std::min(N, Bytes.at(Id)),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (download)");
  }

  std::string deviceName() const override { return Name; }

  void run(uint32_t End) override {
    const uint32_t N = RP.instrs() ? RP.instrs()->size() : 0;
    for (uint32_t I = 0; I < N && I < End; ++I) {
      const Instr &In = *RP.instrs()->Get(I);
      try {
        exec(In);
        check(cudaGetLastError(), "kernel launch");
      } catch (const std::exception &E) {
        throw std::runtime_error("instruction " + std::to_string(I) + " (" +
                                 (In.loc() ? In.loc()->str() : "") +
                                 "): " + E.what());
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

private:
  std::vector<int64_t> shape(uint32_t B) const {
    const auto *S = RP.buffers()->Get(B)->shape();
    return std::vector<int64_t>(S->begin(), S->end());
  }
  int64_t numel(uint32_t B) const { return int64_t(Bytes[B] / 4); }
  float *f(uint32_t B) { return static_cast<float *>(Ptr[B]); }
  const int32_t *i32(uint32_t B) {
    return static_cast<const int32_t *>(Ptr[B]);
  }

  /// y[M,N] = x[M,K] w (w [K,N], or [N,K] transposed), row-major, through
  /// column-major cuBLAS: y^T = w^T x^T.
  void gemm(const float *X, int64_t M, int64_t K, const float *W, int64_t N,
            bool Transposed, float *Y) {
    const float One = 1.0f, Zero = 0.0f;
    check(cublasSgemm(Blas, Transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                      CUBLAS_OP_N, int(N), int(M), int(K), &One, W,
                      Transposed ? int(K) : int(N), X, int(K), &Zero, Y,
                      int(N)),
          "cublasSgemm");
  }

  CUfunction kernel(uint32_t Index) {
    if (Modules.size() <= Index) {
      Modules.resize(Index + 1, nullptr);
      Functions.resize(Index + 1, nullptr);
    }
    if (Functions[Index])
      return Functions[Index];
    const Kernel &Kn = *P.kernels()->Get(Index);
#ifdef MEGAC_CUDA_EMULATION
    // The host runs the kernel's CUDA source, not its cubins. Fused
    // kernels take (y, x0..xn-1, n, p0..pn-1).
    std::vector<std::string> Types = {"float *"};
    for (unsigned K = 0; K < Kn.inputs(); ++K)
      Types.push_back("const float *");
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
    // A cubin runs on its own architecture and on later minor versions of
    // the same major one (sm_80 on sm_86 and sm_89).
    const KernelBinary *Best = nullptr;
    if (Kn.binaries())
      for (const KernelBinary *B : *Kn.binaries()) {
        const std::string A = B->arch()->str();
        if (A == Arch)
          Best = B;
        else if (!Best && A.size() == 5 && A[3] - '0' == Major &&
                 A.substr(0, 3) == "sm_" && A <= Arch)
          Best = B;
      }
    if (!Best)
      throw std::runtime_error("kernel " + Kn.name()->str() +
                               " has no binary for " + Arch);
    check(cuModuleLoadData(&Modules[Index], Best->cubin()->data()),
          "cuModuleLoadData");
#endif
    check(cuModuleGetFunction(&Functions[Index], Modules[Index],
                              Kn.name()->c_str()),
          "cuModuleGetFunction");
    return Functions[Index];
  }

  void exec(const Instr &In) {
    auto In0 = [&](unsigned K) { return In.inputs()->Get(K); };
    auto Int = [&](unsigned K) { return In.ints()->Get(K); };
    const uint32_t Y = In.outputs() && In.outputs()->size()
                           ? In.outputs()->Get(0)
                           : 0;
    const int64_t NY = numel(Y);
    switch (In.op()) {
    case op::Embedding: {
      auto T = shape(In0(0));
      launch(embeddingKernel, blocksFor(NY), kThreads, 0, 
          f(In0(0)), T[0], T[1], i32(In0(1)), numel(In0(1)), Int(0), f(Y));
      return;
    }
    case op::PositionEmbedding:
    case op::Reshape:
      check(cudaMemcpy(Ptr[Y], Ptr[In0(0)], Bytes[Y], cudaMemcpyDeviceToDevice),
            "cudaMemcpy");
      return;
    case op::Linear:
    case op::LinearBias: {
      auto W = shape(In0(1));
      const bool T = Int(0) != 0;
      const int64_t K = T ? W[1] : W[0], N = T ? W[0] : W[1];
      gemm(f(In0(0)), N ? NY / N : 0, K, f(In0(1)), N, T, f(Y));
      if (In.op() == op::LinearBias) {
        launch(broadcastKernel, blocksFor(NY), kThreads, 0, f(Y), NY, f(In0(2)), N,
                                                     f(Y), 0);
        if (Int(1) != 0)
          launch(geluKernel, blocksFor(NY), kThreads, 0, f(Y), NY, f(Y));
      }
      return;
    }
    case op::Add:
    case op::Mul:
      launch(broadcastKernel, blocksFor(NY), kThreads, 0, 
          f(In0(0)), NY, f(In0(1)), numel(In0(1)), f(Y), In.op() == op::Mul);
      return;
    case op::Gelu:
      launch(geluKernel, blocksFor(NY), kThreads, 0, f(In0(0)), NY, f(Y));
      return;
    case op::LayerNorm: {
      const int64_t H = shape(In0(0)).back();
      launch(layerNormKernel, unsigned(std::min<int64_t>(NY / H, 65535)), kThreads, 0, 
          f(In0(0)), NY / H, H, f(In0(1)), f(In0(2)), In.floats()->Get(0),
          f(Y));
      return;
    }
    case op::Attention: {
      if (In.floats() && In.floats()->size())
        throw std::runtime_error("attention dropout is not on the CUDA "
                                 "backend yet");
      auto S = shape(In0(0));
      launch(attentionKernel, blocksFor(S[0] * Int(0) * S[1]), kThreads, 0, 
          f(In0(0)), f(In0(1)), f(In0(2)), S[0], S[1], S[2], Int(0),
          Int(1) != 0, f(Y));
      return;
    }
    case op::Transpose: {
      auto X = shape(In0(0));
      Perm Pm{};
      Pm.Rank = int(X.size());
      if (Pm.Rank > 8)
        throw std::runtime_error("transpose of rank above 8");
      std::vector<int64_t> Stride(X.size(), 1);
      for (int D = int(X.size()) - 2; D >= 0; --D)
        Stride[size_t(D)] = Stride[size_t(D + 1)] * X[size_t(D + 1)];
      for (int D = 0; D < Pm.Rank; ++D) {
        Pm.OutShape[D] = X[size_t(Int(unsigned(D)))];
        Pm.InStride[D] = Stride[size_t(Int(unsigned(D)))];
      }
      launch(transposeKernel, blocksFor(NY), kThreads, 0, f(In0(0)), f(Y), NY, Pm);
      return;
    }
    case op::CrossEntropy: {
      auto L = shape(In0(0));
      const int64_t V = L.back(), Rows = numel(In0(0)) / V;
      scratch(size_t(Rows) * sizeof(double));
      launch(crossEntropyRows, blocksFor(Rows), kThreads, 0, 
          f(In0(0)), Rows, V, i32(In0(1)), static_cast<double *>(Scratch));
      const double Norm = In.ints() && In.ints()->size() ? double(Int(0))
                                                         : double(Rows);
      launch(sumRows, 1, 1, 0, static_cast<double *>(Scratch), Rows, Norm, f(Y));
      return;
    }
    case op::Fused: {
      CUfunction Fn = kernel(uint32_t(Int(0)));
      const unsigned NIn = In.inputs()->size();
      std::vector<void *> Ptrs(NIn);
      std::vector<long long> Periods(NIn);
      long long NN = NY;
      void *Out = Ptr[Y];
      std::vector<void *> Args = {&Out};
      for (unsigned K = 0; K < NIn; ++K) {
        Ptrs[K] = Ptr[In0(K)];
        Args.push_back(&Ptrs[K]);
      }
      Args.push_back(&NN);
      for (unsigned K = 0; K < NIn; ++K) {
        Periods[K] = std::max<long long>(1, numel(In0(K)));
        Args.push_back(&Periods[K]);
      }
      check(cuLaunchKernel(Fn, blocksFor(NY), 1, 1, kThreads, 1, 1, 0,
                           nullptr, Args.data(), nullptr),
            "cuLaunchKernel");
      return;
    }
    default:
      throw std::runtime_error(
          "opcode " + std::to_string(int(In.op())) +
          " is not on the CUDA backend yet (it runs forward plans of one "
          "rank: embeddings, products, LayerNorm, attention, GeLU, "
          "elementwise and fused kernels, the loss)");
    }
  }

  void scratch(size_t N) {
    if (N <= ScratchBytes)
      return;
    cudaFree(Scratch);
    check(cudaMalloc(&Scratch, N), "cudaMalloc (scratch)");
    ScratchBytes = N;
  }

  const Program &P;
  const RankProgram &RP;
  std::string Arch, Name;
  int Major = 0;
  cublasHandle_t Blas = nullptr;
  void *Arena = nullptr, *Scratch = nullptr;
  size_t ScratchBytes = 0;
  std::vector<void *> Ptr, Owned;
  std::vector<size_t> Bytes;
  std::vector<CUmodule> Modules;
  std::vector<CUfunction> Functions;
};

} // namespace
} // namespace megac_rt

extern "C" megac_rt::DeviceRun *megacCreateCudaRun(const Program *P,
                                                   uint32_t Rank, int Device,
                                                   char *Err, size_t ErrSize) {
  try {
    int Count = 0;
    if (cudaGetDeviceCount(&Count) != cudaSuccess || Count == 0)
      throw std::runtime_error("no CUDA device is visible to this process");
    if (Device < 0 || Device >= Count)
      throw std::runtime_error("device " + std::to_string(Device) +
                               " does not exist (" + std::to_string(Count) +
                               " visible)");
    if (P->world_size() != 1)
      throw std::runtime_error("the CUDA backend runs plans of one rank so "
                               "far (NCCL collectives are not in yet)");
    if (P->train())
      throw std::runtime_error("the CUDA backend runs forward plans so far; "
                               "training steps are not in yet");
    return new megac_rt::CudaRun(*P, Rank, Device);
  } catch (const std::exception &E) {
    std::snprintf(Err, ErrSize, "%s", E.what());
    return nullptr;
  }
}
