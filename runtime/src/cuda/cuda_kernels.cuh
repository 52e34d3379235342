//===- cuda_kernels.cuh - The CUDA backend's own kernels -------*- CUDA -*-===//
//
// Each kernel computes what its CPU counterpart in runtime/src/kernels.cpp
// computes, with sums in double where the CPU sums in double, so that the
// two backends agree within 1e-5 in fp32. They favour being obviously right
// over being fast: the fast paths (fused epilogues, flash attention) come
// after a GPU has checked these.
//
// Included by cuda_run.cu only; builds with nvcc and with the host
// emulation (cuda_api.h).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_KERNELS_CUH
#define MEGAC_RT_CUDA_KERNELS_CUH

#include "cuda_api.h"
#include "elementwise.cuh"
#include "../vocab_classes.h"

#include <cstdint>
#include <vector>

namespace megac_rt {
namespace cuda {

constexpr int kThreads = 256;

/// Faults kernels flag for the host to report after a run (an int each).
constexpr int kFaultBadToken = 0; // an id or label outside the vocabulary
constexpr int kFaultNotBf16 = 1;  // a bf16 product's (or attention's)
                                  // operand is not bf16
constexpr int kFaultKinds = 2;

/// Blocks for a grid-stride loop over \p N elements.
inline unsigned blocksFor(int64_t N) {
  const int64_t B = (N + kThreads - 1) / kThreads;
  return unsigned(B < 1 ? 1 : (B > 65535 ? 65535 : B));
}
/// Blocks for one-block-per-row kernels.
inline unsigned rowBlocks(int64_t Rows) {
  return unsigned(Rows < 1 ? 1 : (Rows > 65535 ? 65535 : Rows));
}

#define MEGAC_GRID_LOOP(I, N)                                                  \
  for (int64_t I = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; I < (N);    \
       I += int64_t(gridDim.x) * blockDim.x)

//===-- Block reductions (every thread of the block calls them) ---------===//

/// The sum of the warp's lanes' \p V, every lane the same bits (a
/// butterfly: each step adds the same two values on both sides).
__device__ inline double warpSum(double V) {
  for (int Lanes = 16; Lanes > 0; Lanes /= 2)
    V += __shfl_xor_sync(0xffffffffu, V, Lanes);
  return V;
}

/// The sum of every thread's \p V, in double, returned to all threads. In
/// blocks of whole warps (every launch here: kThreads), each warp sums by
/// shuffles, then every thread sums the warps' sums in warp order: two
/// barriers instead of a shared-memory tree's ten (the row kernels that
/// take a block a row, a softmax's or the loss's, run two or three of
/// these per row). The butterfly leaves every lane with the same bits (each
/// step adds the same two values on both sides), and the order is fixed: the
/// same bits every run.
__device__ inline double blockSum(double V, double *Part) {
  if (blockDim.x % 32 == 0) {
    V = warpSum(V);
    if (threadIdx.x % 32 == 0)
      Part[threadIdx.x / 32] = V;
    __syncthreads();
    double R = 0;
    for (unsigned W = 0; W < blockDim.x / 32; ++W)
      R += Part[W];
    __syncthreads();
    return R;
  }
  Part[threadIdx.x] = V;
  __syncthreads();
  for (unsigned W = blockDim.x / 2; W > 0; W /= 2) {
    if (threadIdx.x < W)
      Part[threadIdx.x] += Part[threadIdx.x + W];
    __syncthreads();
  }
  const double R = Part[0];
  __syncthreads();
  return R;
}

/// The largest of every thread's \p V (as blockSum: shuffles, then the
/// warps' maxima).
__device__ inline double blockMax(double V, double *Part) {
  if (blockDim.x % 32 == 0) {
    for (int Lanes = 16; Lanes > 0; Lanes /= 2)
      V = fmax(V, __shfl_xor_sync(0xffffffffu, V, Lanes));
    if (threadIdx.x % 32 == 0)
      Part[threadIdx.x / 32] = V;
    __syncthreads();
    double R = Part[0];
    for (unsigned W = 1; W < blockDim.x / 32; ++W)
      R = fmax(R, Part[W]);
    __syncthreads();
    return R;
  }
  Part[threadIdx.x] = V;
  __syncthreads();
  for (unsigned W = blockDim.x / 2; W > 0; W /= 2) {
    if (threadIdx.x < W)
      Part[threadIdx.x] = fmax(Part[threadIdx.x], Part[threadIdx.x + W]);
    __syncthreads();
  }
  const double R = Part[0];
  __syncthreads();
  return R;
}

//===-- Random numbers (runtime/src/rng.h, on the device) -----------------===//

__device__ inline uint64_t splitmix64Dev(uint64_t X) {
  uint64_t Z = X + 0x9e3779b97f4a7c15ull;
  Z = (Z ^ (Z >> 30)) * 0xbf58476d1ce4e5b9ull;
  Z = (Z ^ (Z >> 27)) * 0x94d049bb133111ebull;
  return Z ^ (Z >> 31);
}
/// Dropout's multiplier of element \p G under \p Key: 0 or 1 / (1 - rate).
__device__ inline double dropoutScaleDev(uint64_t Key, uint64_t G,
                                         double Rate) {
  const double U = double(splitmix64Dev(Key + G) >> 11) * 0x1.0p-53;
  return U >= Rate ? 1.0 / (1.0 - Rate) : 0.0;
}

//===-- Elementwise -------------------------------------------------------===//
// (megac_gelu and the others: elementwise.cuh, included above, outside the
// namespace, as the CPU kernels include it.)

__global__ void fillKernel(float *Y, int64_t N, float V) {
  MEGAC_GRID_LOOP(I, N) Y[I] = V;
}

/// y = a + b or a * b, b repeating with period NB (a trailing broadcast).
/// An element of a tensor as fp32: an fp32 buffer's own, or the value of
/// the bf16 bits in a copy (a buffer kept in bf16 alone): kernels that
/// read either are templates over the element type.
__device__ __forceinline__ float valueOf(float X) { return X; }
__device__ __forceinline__ float valueOf(uint16_t Bits) {
  return megac_bf16_value(Bits);
}

template <class TA, class TB>
__global__ void broadcastKernel(const TA *A, int64_t NA, const TB *B,
                                int64_t NB, float *Y, int Mul) {
  MEGAC_GRID_LOOP(I, NA) {
    const float X = valueOf(A[I]), Z = valueOf(B[I % NB]);
    Y[I] = Mul ? X * Z : X + Z;
  }
}

__global__ void geluKernel(const float *X, int64_t N, float *Y) {
  MEGAC_GRID_LOOP(I, N) Y[I] = megac_gelu(X[I]);
}

/// Four values of T in one aligned access.
template <class T> struct alignas(4 * sizeof(T)) Vec4 { T V[4]; };

/// Calls \p Take(Src[I]) for I = First, First + Step, ... below End, in
/// that order, loading Batch of them at once before taking them. Where a
/// thread adds what it loads into one sum (a fixed order: the same bits
/// every run, and the CPU's), the chain of adds holds each next load back
/// (in-order issue): one memory latency a value, where a batch pays one
/// for Batch values. The order of the takes is that of one at a time.
template <int Batch, class T, class TakeFn>
__device__ __forceinline__ void takeInBatches(const T *Src, int64_t First,
                                              int64_t End, int64_t Step,
                                              TakeFn &&Take) {
  int64_t I = First;
  for (; I + (Batch - 1) * Step < End; I += Batch * Step) {
    T In[Batch];
#pragma unroll
    for (int B = 0; B < Batch; ++B)
      In[B] = Src[I + B * Step];
#pragma unroll
    for (int B = 0; B < Batch; ++B)
      Take(In[B]);
  }
  for (; I < End; I += Step)
    Take(Src[I]);
}

/// Whether each of \p P may be read (or written) four values at a time.
template <class... T>
__host__ __device__ inline bool vec4Aligned(const T *...P) {
  return ((reinterpret_cast<uintptr_t>(P) % sizeof(Vec4<T>) == 0) && ...);
}

/// I % Cols, in 32 bits where \p Small (every index below 2^32): a 64-bit
/// remainder is a long instruction sequence on a GPU, once per element.
__device__ __forceinline__ int64_t columnOf(int64_t I, int64_t Cols,
                                            bool Small) {
  return Small ? int64_t(uint32_t(I) % uint32_t(Cols)) : I % Cols;
}

/// Y [N / Cols rows of Cols] = \p Row (bf16 bits) in every row: a bias
/// broadcast into a product's result, which the product then adds itself
/// to as its C (beta = 1). Four elements a thread where the rows and
/// pointers allow; launch with wideBlocks(N).
__global__ void broadcastRowKernel(const uint16_t *Row, int64_t Cols, int64_t N,
                                   uint16_t *Y) {
  const bool Small = N <= int64_t(UINT32_MAX);
  const int64_t Groups = Cols % 4 == 0 && vec4Aligned(Row, Y) ? N / 4 : 0;
  MEGAC_GRID_LOOP(G, Groups) {
    reinterpret_cast<Vec4<uint16_t> *>(Y)[G] =
        *reinterpret_cast<const Vec4<uint16_t> *>(Row +
                                                  columnOf(4 * G, Cols, Small));
  }
  MEGAC_GRID_LOOP(I, N - 4 * Groups) {
    const int64_t At = 4 * Groups + I;
    Y[At] = Row[columnOf(At, Cols, Small)];
  }
}

/// linear_bias's epilogue where cuBLASLt applies none, over the fp32
/// product T of \p N elements in rows of \p Cols: s = t + bias (fp32, or
/// bf16 bits) (+ the residual \p Res, fp32 or bf16 bits, where not null);
/// the GeLU's input pre = s; y = GeLU(s) (\p Gelu) or s; each rounded to
/// bf16 when \p Round (from the fp32 s, as the epilogue rounds), stored in
/// fp32 (Y, Pre) and as bf16 bits (Y16, Pre16) where not null. T may be Y
/// or Pre. Four elements a thread where the rows and pointers allow (a
/// pass over memory: wide accesses keep it at the copy bandwidth); launch
/// with wideBlocks(N).
template <class ResT, class BiasT = float>
__global__ void
linearEpilogueKernel(const float *T, int64_t N, const BiasT *Bias, int64_t Cols,
                     int Gelu, int Round, float *Y, uint16_t *Y16, float *Pre,
                     uint16_t *Pre16, const ResT *Res) {
  const bool Small = N <= int64_t(UINT32_MAX);
  // One element: the GeLU's input P and the result R, as stored.
  auto Value = [&](float S, float &P, float &R) {
    P = Round ? megac_round_bf16(S) : S;
    const float V = Gelu ? megac_gelu(S) : S;
    R = Round ? megac_round_bf16(V) : V;
  };
  auto Bits = [](float V) { return uint16_t(__float_as_uint(V) >> 16); };
  const bool Wide = Cols % 4 == 0 && vec4Aligned(T, Y, Pre) &&
                    vec4Aligned(Y16, Pre16) && vec4Aligned(Bias) &&
                    vec4Aligned(Res);
  const int64_t Groups = Wide ? N / 4 : 0;
  MEGAC_GRID_LOOP(G, Groups) {
    const int64_t I = 4 * G;
    const Vec4<float> Tv = reinterpret_cast<const Vec4<float> *>(T)[G];
    const Vec4<BiasT> Bv =
        *reinterpret_cast<const Vec4<BiasT> *>(Bias + columnOf(I, Cols, Small));
    Vec4<ResT> Rv{};
    if (Res)
      Rv = reinterpret_cast<const Vec4<ResT> *>(Res)[G];
    Vec4<float> Pv, Yv;
    Vec4<uint16_t> P16, R16;
    for (int K = 0; K < 4; ++K) {
      float S = Tv.V[K] + valueOf(Bv.V[K]);
      if (Res)
        S += valueOf(Rv.V[K]);
      Value(S, Pv.V[K], Yv.V[K]);
      P16.V[K] = Bits(Pv.V[K]);
      R16.V[K] = Bits(Yv.V[K]);
    }
    if (Pre)
      reinterpret_cast<Vec4<float> *>(Pre)[G] = Pv;
    if (Pre16)
      reinterpret_cast<Vec4<uint16_t> *>(Pre16)[G] = P16;
    if (Y)
      reinterpret_cast<Vec4<float> *>(Y)[G] = Yv;
    if (Y16)
      reinterpret_cast<Vec4<uint16_t> *>(Y16)[G] = R16;
  }
  MEGAC_GRID_LOOP(J, N - 4 * Groups) {
    const int64_t I = 4 * Groups + J;
    float S = T[I] + valueOf(Bias[columnOf(I, Cols, Small)]);
    if (Res)
      S += valueOf(Res[I]);
    float P, R;
    Value(S, P, R);
    if (Pre)
      Pre[I] = P;
    if (Pre16)
      Pre16[I] = Bits(P);
    if (Y)
      Y[I] = R;
    if (Y16)
      Y16[I] = Bits(R);
  }
}

/// linear_gelu_grad's epilogue where cuBLASLt applies none: GeLU's
/// gradient at the kept input \p X (fp32, or bf16 bits) with the fp32
/// product \p DY as the output gradient, rounded to bf16 when \p Round,
/// stored in fp32 (Y) and as bf16 bits (Y16) where not null. DY may be Y.
/// Four elements a thread where the pointers allow; launch with
/// wideBlocks(N).
template <class T>
__global__ void geluGradEpilogueKernel(const T *X, const float *DY, int64_t N,
                                       int Round, float *Y, uint16_t *Y16) {
  auto Grad = [&](T Xv, float Dv) {
    const float V = megac_gelu_grad(valueOf(Xv), Dv);
    return Round ? megac_round_bf16(V) : V;
  };
  auto Bits = [](float V) { return uint16_t(__float_as_uint(V) >> 16); };
  const bool Wide = vec4Aligned(X) && vec4Aligned(DY, Y) && vec4Aligned(Y16);
  const int64_t Groups = Wide ? N / 4 : 0;
  MEGAC_GRID_LOOP(G, Groups) {
    const Vec4<T> Xv = reinterpret_cast<const Vec4<T> *>(X)[G];
    const Vec4<float> Dv = reinterpret_cast<const Vec4<float> *>(DY)[G];
    Vec4<float> Rv;
    Vec4<uint16_t> R16;
    for (int K = 0; K < 4; ++K) {
      Rv.V[K] = Grad(Xv.V[K], Dv.V[K]);
      R16.V[K] = Bits(Rv.V[K]);
    }
    if (Y)
      reinterpret_cast<Vec4<float> *>(Y)[G] = Rv;
    if (Y16)
      reinterpret_cast<Vec4<uint16_t> *>(Y16)[G] = R16;
  }
  MEGAC_GRID_LOOP(J, N - 4 * Groups) {
    const int64_t I = 4 * Groups + J;
    const float R = Grad(X[I], DY[I]);
    if (Y)
      Y[I] = R;
    if (Y16)
      Y16[I] = Bits(R);
  }
}

__global__ void geluGradKernel(const float *X, const float *DY, int64_t N,
                               float *DX) {
  MEGAC_GRID_LOOP(I, N) DX[I] = megac_gelu_grad(X[I], DY[I]);
}

/// Y[i] = F(X[i]) over N elements, four at a time where X and Y are
/// aligned for it: these kernels are passes over memory, and wide
/// accesses keep them at the copy bandwidth. Launch with wideBlocks(N).
template <class From, class To, class Fn>
__device__ __forceinline__ void mapWide(const From *X, int64_t N, To *Y, Fn F) {
  const bool Wide = vec4Aligned(X, Y);
  const int64_t Groups = Wide ? N / 4 : 0;
  MEGAC_GRID_LOOP(G, Groups) {
    const Vec4<From> In = reinterpret_cast<const Vec4<From> *>(X)[G];
    Vec4<To> Out;
    for (int K = 0; K < 4; ++K)
      Out.V[K] = F(In.V[K]);
    reinterpret_cast<Vec4<To> *>(Y)[G] = Out;
  }
  MEGAC_GRID_LOOP(I, N - 4 * Groups) {
    Y[4 * Groups + I] = F(X[4 * Groups + I]);
  }
}
inline unsigned wideBlocks(int64_t N) { return blocksFor((N + 3) / 4); }

/// How a kernel stores its output: as computed, or (an output rounded as
/// it is written, Instr.round_bf16) rounded to bf16, its bits also going
/// to the output's bf16 copy \p Bits when there is one.
struct OutputStore {
  int Round = 0;
  uint16_t *Bits = nullptr;
  __device__ __forceinline__ void operator()(float *Y, int64_t I,
                                             float V) const {
    if (Round) {
      V = megac_round_bf16(V);
      if (Bits)
        Bits[I] = uint16_t(__float_as_uint(V) >> 16);
    }
    if (Y) // null: the output is kept in bf16 alone
      Y[I] = V;
  }
  /// Whether store4 may write from \p Y (and Bits) at multiples of 4.
  __host__ __device__ bool alignedFor4(const float *Y) const {
    return vec4Aligned(Y, Bits);
  }
  /// Outputs I..I+3 in one access each (I a multiple of 4; alignedFor4).
  __device__ __forceinline__ void store4(float *Y, int64_t I,
                                         Vec4<float> V) const {
    if (Round) {
      Vec4<uint16_t> B;
      for (int K = 0; K < 4; ++K) {
        V.V[K] = megac_round_bf16(V.V[K]);
        B.V[K] = uint16_t(__float_as_uint(V.V[K]) >> 16);
      }
      if (Bits)
        *reinterpret_cast<Vec4<uint16_t> *>(Bits + I) = B;
    }
    if (Y)
      *reinterpret_cast<Vec4<float> *>(Y + I) = V;
  }
};

/// \p X rounded to bf16 as round_bf16 rounds it: its 16 bits.
__device__ inline uint16_t bf16BitsOf(float X) {
  return uint16_t(__float_as_uint(megac_round_bf16(X)) >> 16);
}

/// Y = round_bf16(X) and, unless \p Bits is null, Bits = the bf16 bits of
/// Y (its upper halves, exactly): the copy products read instead of
/// packing Y again. Y is null where the bits are all that is kept of it.
/// Launch with wideBlocks(N).
__global__ void roundBf16Kernel(const float *X, int64_t N, float *Y,
                                uint16_t *Bits) {
  if (!Bits) {
    mapWide(X, N, Y, [](float V) { return megac_round_bf16(V); });
    return;
  }
  const bool Wide = vec4Aligned(X, Y, Bits);
  const int64_t Groups = Wide ? N / 4 : 0;
  MEGAC_GRID_LOOP(G, Groups) {
    const Vec4<float> In = reinterpret_cast<const Vec4<float> *>(X)[G];
    Vec4<float> Out;
    Vec4<uint16_t> B;
    for (int K = 0; K < 4; ++K) {
      Out.V[K] = megac_round_bf16(In.V[K]);
      B.V[K] = bf16BitsOf(In.V[K]);
    }
    if (Y)
      reinterpret_cast<Vec4<float> *>(Y)[G] = Out;
    reinterpret_cast<Vec4<uint16_t> *>(Bits)[G] = B;
  }
  MEGAC_GRID_LOOP(I, N - 4 * Groups) {
    const float V = megac_round_bf16(X[4 * Groups + I]);
    if (Y)
      Y[4 * Groups + I] = V;
    Bits[4 * Groups + I] = uint16_t(__float_as_uint(V) >> 16);
  }
}

/// The bf16 bits of a value that is bf16 already (a plan's rounded
/// tensors): fp32's upper half, exactly. Sets *Inexact if it had more bits
/// (the backend's analysis of the plan was wrong). Without \p Inexact,
/// rounds to nearest even instead (values the plan need not round, like
/// an attention's dy).
__device__ inline uint16_t bf16Bits(float X, int *Inexact) {
  if (!Inexact)
    return uint16_t(__float_as_uint(megac_round_bf16(X)) >> 16);
  const unsigned U = __float_as_uint(X);
  if (U & 0xffffu)
    *Inexact = 1;
  return uint16_t(U >> 16);
}

/// Y = bf16Bits(X) over N elements. Launch with wideBlocks(N).
__global__ void packBf16Kernel(const float *X, int64_t N, uint16_t *Y,
                               int *Inexact) {
  mapWide(X, N, Y, [=](float V) { return bf16Bits(V, Inexact); });
}

/// Y = the values of bf16 bits X (fp32's upper half). Launch with
/// wideBlocks(N).
__global__ void widenBf16Kernel(const uint16_t *X, int64_t N, float *Y) {
  mapWide(X, N, Y,
          [](uint16_t B) { return __uint_as_float(unsigned(B) << 16); });
}

/// acc = x (first micro-batch) or acc += x.
__global__ void accumulateKernel(const float *X, int64_t N, float *Acc,
                                 int Add) {
  MEGAC_GRID_LOOP(I, N) Acc[I] = Add ? Acc[I] + X[I] : X[I];
}

/// Shapes of a tensor and of the whole it is a block of (rank <= 8).
struct Block {
  int Rank;
  int64_t Local[8], Global[8], Offset[8];
};

/// Dropout of a block of a global tensor: element masks depend on the
/// global row-major index only (plan.fbs, Dropout).
__global__ void dropoutKernel(const float *X, int64_t N, Block Bl, uint64_t Key,
                              double Rate, float *Y) {
  MEGAC_GRID_LOOP(I, N) {
    int64_t Rem = I, G = 0, Stride = 1;
    for (int D = Bl.Rank - 1; D >= 0; --D) {
      G += (Rem % Bl.Local[D] + Bl.Offset[D]) * Stride;
      Rem /= Bl.Local[D];
      Stride *= Bl.Global[D];
    }
    const double S = dropoutScaleDev(Key, uint64_t(G), Rate);
    Y[I] = S == 0.0 ? 0.0f : float(double(X[I]) * S);
  }
}

//===-- Many tensors a launch --------------------------------------------===//
//
// Ops a training step runs once per parameter (AdamW, the roundings of the
// parameters at its start) come in runs of hundreds, most over small
// tensors: each run is one launch over a table of its tensors. Each tensor
// takes the blocks its units need (groups of four elements where its
// arrays are 16-byte aligned, then single elements, one a thread), and
// every element is computed exactly as it would be alone.

/// Where one tensor's units lie in a multi-tensor launch.
struct TensorSpan {
  int64_t N = 0, Groups = 0; // elements; groups of four (0: unaligned)
  int64_t FirstBlock = 0;
  __host__ __device__ int64_t units() const { return Groups + N - 4 * Groups; }
};

inline bool aligned16(const void *X) {
  return reinterpret_cast<uintptr_t>(X) % 16 == 0;
}

/// Gives each entry of \p Table (its Span's N and Groups set) its first
/// block; returns how many blocks of kThreads the launch takes.
template <class Entry> int64_t layOutSpans(std::vector<Entry> &Table) {
  int64_t Blocks = 0;
  for (Entry &E : Table) {
    E.Span.FirstBlock = Blocks;
    Blocks += (E.Span.units() + kThreads - 1) / kThreads;
  }
  return Blocks;
}

/// The entry whose blocks hold this block: the last with FirstBlock at or
/// before it (a tensor of no elements has none). Then forThisUnit calls
/// \p F(entry, index, whether a group of four) for this thread's unit, if
/// it has one.
template <class Entry>
__device__ __forceinline__ const Entry &entryOfBlock(const Entry *Table,
                                                     int Count) {
  int Lo = 0, Hi = Count - 1;
  while (Lo < Hi) {
    const int Mid = (Lo + Hi + 1) / 2;
    if (Table[Mid].Span.FirstBlock <= int64_t(blockIdx.x))
      Lo = Mid;
    else
      Hi = Mid - 1;
  }
  return Table[Lo];
}
template <class Entry, class Fn>
__device__ __forceinline__ void forThisUnit(const Entry *Table, int Count,
                                            Fn F) {
  const Entry &E = entryOfBlock(Table, Count);
  const int64_t U =
      (int64_t(blockIdx.x) - E.Span.FirstBlock) * blockDim.x + threadIdx.x;
  if (U < E.Span.Groups)
    F(E, U, true);
  else if (U < E.Span.units())
    F(E, 4 * E.Span.Groups + (U - E.Span.Groups), false);
}

/// One tensor's AdamW update (megac_adamw, the CPU's formula; decoupled
/// weight decay, the moments kept on the device) in a multi-tensor launch; Bits
/// (null: none) gets the updated parameter's bf16 bits, rounded as round_bf16
/// rounds: the next step's rounding of the parameter, made here while the value
/// is at hand (parameterCopies).
struct AdamWSpan {
  float *Param, *M, *V;
  const float *Grad, *Coef;
  uint16_t *Bits;
  /// The step's constants, but the clipping coefficient (*Coef, computed
  /// on the device).
  megac_adamw_step Step;
  TensorSpan Span;
};
__global__ void adamwManyKernel(const AdamWSpan *Table, int Count) {
  forThisUnit(Table, Count, [](const AdamWSpan &E, int64_t U, bool Group) {
    megac_adamw_step S = E.Step;
    S.c = double(E.Coef[0]);
    auto Step = [&S](float &P, float G, float &M, float &V) {
      megac_adamw(S, P, G, M, V);
    };
    if (!Group) {
      Step(E.Param[U], E.Grad[U], E.M[U], E.V[U]);
      if (E.Bits)
        E.Bits[U] = bf16BitsOf(E.Param[U]);
      return;
    }
    Vec4<float> P = reinterpret_cast<const Vec4<float> *>(E.Param)[U];
    const Vec4<float> Gr = reinterpret_cast<const Vec4<float> *>(E.Grad)[U];
    Vec4<float> Mv = reinterpret_cast<const Vec4<float> *>(E.M)[U];
    Vec4<float> Vv = reinterpret_cast<const Vec4<float> *>(E.V)[U];
    Vec4<uint16_t> B;
    for (int K = 0; K < 4; ++K) {
      Step(P.V[K], Gr.V[K], Mv.V[K], Vv.V[K]);
      B.V[K] = bf16BitsOf(P.V[K]);
    }
    reinterpret_cast<Vec4<float> *>(E.Param)[U] = P;
    reinterpret_cast<Vec4<float> *>(E.M)[U] = Mv;
    reinterpret_cast<Vec4<float> *>(E.V)[U] = Vv;
    if (E.Bits)
      reinterpret_cast<Vec4<uint16_t> *>(E.Bits)[U] = B;
  });
}

/// One tensor's round_bf16 in a multi-tensor launch: Y = round_bf16(X)
/// (Y null: kept in bf16 alone) and its bits into Bits (null: no copy).
struct RoundSpan {
  const float *X;
  float *Y;
  uint16_t *Bits;
  TensorSpan Span;
};
__global__ void roundBf16ManyKernel(const RoundSpan *Table, int Count) {
  forThisUnit(Table, Count, [](const RoundSpan &E, int64_t U, bool Group) {
    if (!Group) {
      const float Out = megac_round_bf16(E.X[U]);
      if (E.Y)
        E.Y[U] = Out;
      if (E.Bits)
        E.Bits[U] = bf16BitsOf(E.X[U]);
      return;
    }
    const Vec4<float> In = reinterpret_cast<const Vec4<float> *>(E.X)[U];
    Vec4<float> Out;
    Vec4<uint16_t> B;
    for (int K = 0; K < 4; ++K) {
      Out.V[K] = megac_round_bf16(In.V[K]);
      B.V[K] = bf16BitsOf(In.V[K]);
    }
    if (E.Y)
      reinterpret_cast<Vec4<float> *>(E.Y)[U] = Out;
    if (E.Bits)
      reinterpret_cast<Vec4<uint16_t> *>(E.Bits)[U] = B;
  });
}

/// Y = permutation of X (rank <= 8): Y index -> X index through strides.
struct Perm {
  int Rank;
  int64_t OutShape[8], InStride[8];
};
__global__ void transposeKernel(const float *X, float *Y, int64_t N, Perm P) {
  MEGAC_GRID_LOOP(I, N) {
    int64_t Rem = I, Src = 0;
    for (int D = P.Rank - 1; D >= 0; --D) {
      Src += (Rem % P.OutShape[D]) * P.InStride[D];
      Rem /= P.OutShape[D];
    }
    Y[I] = X[Src];
  }
}

//===-- Chunks of a dimension (collectives' layouts) -------------------===//
//
// A tensor viewed as [Outer, Parts * Len, Inner] has Parts chunks along
// its middle dimension, each Outer rows of Row = Len * Inner elements.

/// y = chunk Index: y[o, r] = x[o * Parts + Index, r].
__global__ void sliceChunkKernel(const float *X, int64_t Outer, int64_t Row,
                                 int64_t Parts, int64_t Index, float *Y) {
  MEGAC_GRID_LOOP(I, Outer * Row) {
    const int64_t O = I / Row, R = I % Row;
    Y[I] = X[(O * Parts + Index) * Row + R];
  }
}

/// The chunks laid one after another (as a gather delivers them) put in
/// place: y[o * Parts + p, r] = chunks[p][o, r].
__global__ void concatChunksKernel(const float *Chunks, int64_t Outer,
                                   int64_t Row, int64_t Parts, float *Y) {
  MEGAC_GRID_LOOP(I, Parts * Outer * Row) {
    const int64_t P = I / (Outer * Row), O = I / Row % Outer, R = I % Row;
    Y[(O * Parts + P) * Row + R] = Chunks[I];
  }
}

//===-- Embeddings --------------------------------------------------------===//

/// Rows of this rank's block of the table (ids outside it: zeros), ids
/// outside [0, Vocab) flagged in *Bad.
template <class T>
__global__ void embeddingKernel(const T *Table, int64_t Rows, int64_t H,
                                const int32_t *Ids, int64_t N, int64_t Start,
                                int64_t Vocab, float *Y, int *Bad,
                                OutputStore Store) {
  MEGAC_GRID_LOOP(I, N * H) {
    const int64_t R = I / H, J = I % H;
    if (J == 0 && (Ids[R] < 0 || Ids[R] >= Vocab))
      *Bad = 1;
    const int64_t Row = int64_t(Ids[R]) - Start;
    Store(Y, I, Row >= 0 && Row < Rows ? valueOf(Table[Row * H + J]) : 0.0f);
  }
}

//===-- The embedding's gradient, in a fixed order ----------------------===//
//
// dtable[id - start] = the sum of dy over the tokens of that id, for the
// ids of this rank's rows: each row's tokens summed in token order from
// zero, as the CPU's embeddingGrad sums them (the same bits), with no
// atomics on the values (whose order a GPU does not fix). Four kernels:
// each token's rank among the earlier tokens of its id and its id's count,
// the rows' offsets (an exclusive scan of the counts), the tokens placed
// by id in token order, then one block a row summing its tokens.

/// Rank[i] = #{j < i: ids[j] == ids[i]} and Counts[row] = #{j: ids[j] ==
/// ids[i]} for each token i of a row of this rank (every token of the id
/// writes the same count); Counts zeroed first, Rank -1 for other ids.
/// Every token against every other (8192 tokens: 67 M compares), the ids
/// streamed through shared memory a block's width at a time.
__global__ void tokenRanksKernel(const int32_t *Ids, int64_t N, int64_t Start,
                                 int64_t Rows, int32_t *Rank, int32_t *Counts) {
  __shared__ int32_t Tile[kThreads];
  const int64_t Stride = int64_t(gridDim.x) * blockDim.x;
  // (Every thread of a block takes the same turns: the barriers below.)
  for (int64_t Base = int64_t(blockIdx.x) * blockDim.x; Base < N;
       Base += Stride) {
    const int64_t I = Base + threadIdx.x;
    const int32_t Id = I < N ? Ids[I] : 0;
    const int64_t Row = int64_t(Id) - Start;
    const bool Mine = I < N && Row >= 0 && Row < Rows;
    int32_t Before = 0, All = 0;
    for (int64_t J0 = 0; J0 < N; J0 += blockDim.x) {
      __syncthreads(); // the last tile is read
      if (J0 + threadIdx.x < N)
        Tile[threadIdx.x] = Ids[J0 + threadIdx.x];
      __syncthreads();
      const int64_t Width = N - J0 < blockDim.x ? N - J0 : blockDim.x;
      for (int64_t K = 0; K < Width; ++K)
        if (Tile[K] == Id) {
          Before += J0 + K < I;
          ++All;
        }
    }
    if (I < N)
      Rank[I] = Mine ? Before : -1;
    if (Mine)
      Counts[Row] = All;
  }
}

/// Offsets[r] = Counts[0] + .. + Counts[r - 1]: one block, each thread a
/// contiguous run of rows, the runs' totals scanned in shared memory.
__global__ void rowOffsetsKernel(const int32_t *Counts, int64_t Rows,
                                 int32_t *Offsets) {
  __shared__ double Part[kThreads]; // (exact: at most 2^31 tokens)
  const int64_t Per = (Rows + blockDim.x - 1) / blockDim.x;
  const int64_t Lo = threadIdx.x * Per, Hi = Lo + Per < Rows ? Lo + Per : Rows;
  double Own = 0;
  for (int64_t R = Lo; R < Hi; ++R)
    Own += Counts[R];
  Part[threadIdx.x] = Own;
  __syncthreads();
  for (unsigned W = 1; W < blockDim.x; W *= 2) { // inclusive scan
    const double Add = threadIdx.x >= W ? Part[threadIdx.x - W] : 0.0;
    __syncthreads();
    Part[threadIdx.x] += Add;
    __syncthreads();
  }
  int32_t At = int32_t(Part[threadIdx.x] - Own);
  for (int64_t R = Lo; R < Hi; ++R) {
    Offsets[R] = At;
    At += Counts[R];
  }
}

/// Tokens[Offsets[row] + Rank[i]] = i: each row's tokens in token order.
__global__ void placeTokensKernel(const int32_t *Ids, int64_t N, int64_t Start,
                                  const int32_t *Rank, const int32_t *Offsets,
                                  int32_t *Tokens) {
  MEGAC_GRID_LOOP(I, N) {
    if (Rank[I] >= 0)
      Tokens[Offsets[int64_t(Ids[I]) - Start] + Rank[I]] = int32_t(I);
  }
}

/// DT[row] = Into[row] + the sum of dy over the row's tokens in token
/// order (from zero), Into null: nothing added. Blocks over rows, threads
/// over columns. With \p SkipUntouched (DT is Into, updated in place) a
/// row without tokens is left as it is.
template <class T>
__global__ void
embeddingGradRowsKernel(const T *DY, int64_t Rows, int64_t H,
                        const int32_t *Counts, const int32_t *Offsets,
                        const int32_t *Tokens, const float *Into, float *DT,
                        int SkipUntouched) {
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const int32_t Count = Counts[R], First = Offsets[R];
    if (Count == 0 && SkipUntouched)
      continue;
    for (int64_t J = threadIdx.x; J < H; J += blockDim.x) {
      float Sum = 0.0f;
      for (int32_t K = 0; K < Count; ++K)
        Sum += valueOf(DY[int64_t(Tokens[First + K]) * H + J]);
      DT[R * H + J] = Into ? Into[R * H + J] + Sum : Sum;
    }
  }
}

//===-- Row kernels ----------------------------------------------------===//

/// The LayerNorm kernels take a row a warp (kThreads / 32 rows a block):
/// their reductions are shuffles alone (warpSum), with no barrier, and a
/// block holds 8 rows in flight where a block a row held 1 behind its
/// barriers (the H100 ran those at 0.41-0.50 of its copy bandwidth).
/// Launch warpRowBlocks(rows) blocks of kThreads.
inline unsigned warpRowBlocks(int64_t Rows) { return blocksFor(Rows * 32); }
#define MEGAC_WARP_ROWS(R, Rows)                                               \
  for (int64_t R = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;      \
       R < (Rows); R += int64_t(gridDim.x) * blockDim.x / 32)

/// \p W values of row \p Row from column 0 (W = 4: one vector load).
template <int W, class T>
__device__ inline void loadColumns(const T *Row, float (&V)[W]) {
  if constexpr (W == 4) {
    const Vec4<T> L = *reinterpret_cast<const Vec4<T> *>(Row);
#pragma unroll
    for (int K = 0; K < 4; ++K)
      V[K] = valueOf(L.V[K]);
  } else {
#pragma unroll
    for (int K = 0; K < W; ++K)
      V[K] = valueOf(Row[K]);
  }
}

/// Whether a row kernel over \p Rows of \p H reads \p P four columns at
/// a time (W = 4 below): each lane then loads 8 or 16 bytes at once, four
/// times the bytes in flight of a lane's one value.
template <class... T>
__host__ __device__ inline bool rowsVec4(int64_t H, const T *...P) {
  return H % 4 == 0 && vec4Aligned(P...);
}
/// Calls F(j, x[j]) (F(j, x[j], dy[j]) with \p Dr) for the columns j of
/// row \p Xr that this lane of a warp takes, in order: j = W l, ...,
/// W l + W - 1, then the same 32 W further on, for lane l (W = 4: one
/// vector load a row each time).
template <int W, class TX, class Fn>
__device__ inline void forLaneColumns(const TX *Xr, int64_t H, Fn F) {
  for (int64_t J = int64_t(threadIdx.x % 32) * W; J < H; J += 32 * W) {
    float Xv[W];
    loadColumns<W>(Xr + J, Xv);
#pragma unroll
    for (int K = 0; K < W; ++K)
      F(J + K, Xv[K]);
  }
}
template <int W, class TX, class TD, class Fn>
__device__ inline void forLaneColumns(const TX *Xr, const TD *Dr, int64_t H,
                                      Fn F) {
  for (int64_t J = int64_t(threadIdx.x % 32) * W; J < H; J += 32 * W) {
    float Xv[W], Dv[W];
    loadColumns<W>(Xr + J, Xv);
    loadColumns<W>(Dr + J, Dv);
#pragma unroll
    for (int K = 0; K < W; ++K)
      F(J + K, Xv[K], Dv[K]);
  }
}

/// Mean and 1 / sqrt(var + eps) of a row, in double (as the CPU's
/// rowStats), by one warp, each lane summing its columns (forLaneColumns)
/// in order, then the lanes' sums by warpSum.
template <int W, class T>
__device__ inline void rowStatsWarp(const T *Xr, int64_t H, double Eps,
                                    double &Mean, double &Inv) {
  double S = 0;
  forLaneColumns<W>(Xr, H, [&](int64_t, float V) { S += V; });
  Mean = warpSum(S) / double(H);
  const double M = Mean;
  double Q = 0;
  forLaneColumns<W>(Xr, H, [&](int64_t, float V) { Q += (V - M) * (V - M); });
  Inv = 1.0 / sqrt(warpSum(Q) / double(H) + Eps);
}

/// layerNormKernel's rows, W columns a lane at a time.
template <int W, class TX>
__device__ inline void layerNormRows(const TX *X, int64_t Rows, int64_t H,
                                     const float *Gamma, const float *Beta,
                                     double Eps, float *Y,
                                     const OutputStore &Store, double *Stats) {
  MEGAC_WARP_ROWS(R, Rows) {
    double Mean, Inv;
    rowStatsWarp<W>(X + R * H, H, Eps, Mean, Inv);
    if (Stats && threadIdx.x % 32 == 0) { // as rowStatsKernel writes them
      Stats[2 * R] = Mean;
      Stats[2 * R + 1] = Inv;
    }
    forLaneColumns<W>(X + R * H, H, [&](int64_t J, float V) {
      const float N = float((V - Mean) * Inv);
      Store(Y, R * H + J, Gamma ? N * Gamma[J] + Beta[J] : N);
    });
  }
}

/// y = (x - mean) / sqrt(var + eps) * gamma + beta per row; without
/// \p Gamma (null) the normalized rows alone (the normalize op). With
/// \p Stats (not null), each row's mean and 1 / sqrt(var + eps) there too,
/// as rowStatsKernel computes them (the same W, so the same bits): kept
/// for the gain's gradient.
template <class TX>
__global__ void layerNormKernel(const TX *X, int64_t Rows, int64_t H,
                                const float *Gamma, const float *Beta,
                                double Eps, float *Y, OutputStore Store,
                                double *Stats) {
  if (rowsVec4(H, X))
    layerNormRows<4>(X, Rows, H, Gamma, Beta, Eps, Y, Store, Stats);
  else
    layerNormRows<1>(X, Rows, H, Gamma, Beta, Eps, Y, Store, Stats);
}

/// layerNormGradKernel's rows, W columns a lane at a time.
template <int W, class TX, class TD, class TR>
__device__ inline void
layerNormGradRows(const TX *X, int64_t Rows, int64_t H, const float *Gamma,
                  const TD *DY, double Eps, float *DX, const OutputStore &Store,
                  const TR *Res, const double *Stats) {
  MEGAC_WARP_ROWS(R, Rows) {
    const TX *Xr = X + R * H;
    const TD *Dr = DY + R * H;
    double Mean, Inv;
    if (Stats) {
      Mean = Stats[2 * R];
      Inv = Stats[2 * R + 1];
    } else {
      rowStatsWarp<W>(Xr, H, Eps, Mean, Inv);
    }
    double SG = 0, SGX = 0;
    forLaneColumns<W>(Xr, Dr, H, [&](int64_t J, float Xv, float Dv) {
      const double G = double(Dv) * Gamma[J];
      SG += G;
      SGX += G * (Xv - Mean) * Inv;
    });
    const double SumG = warpSum(SG) / double(H);
    const double SumGX = warpSum(SGX) / double(H);
    forLaneColumns<W>(Xr, Dr, H, [&](int64_t J, float Xv, float Dv) {
      const double G = double(Dv) * Gamma[J];
      const double Xh = (Xv - Mean) * Inv;
      float V = float(Inv * (G - SumG - Xh * SumGX));
      if (Res)
        V += valueOf(Res[R * H + J]);
      Store(DX, R * H + J, V);
    });
  }
}

/// dx = LayerNorm's gradient per row, plus \p Res (the residual stream's
/// gradient, fp32 or bf16 bits) where not null, added in fp32 before dx
/// is stored (and rounded). With \p Stats (not null: what the forward's
/// layerNormKernel kept), each row's mean and 1 / sqrt(var + eps) from
/// there instead of two passes over the row, where this kernel would read
/// x as that one did (the same W: the same bits).
template <class TX, class TD, class TR>
__global__ void layerNormGradKernel(const TX *X, int64_t Rows, int64_t H,
                                    const float *Gamma, const TD *DY,
                                    double Eps, float *DX, OutputStore Store,
                                    const TR *Res, const double *Stats) {
  const bool Wide = rowsVec4(H, X, DY);
  const double *Kept = Wide == rowsVec4(H, X) ? Stats : nullptr;
  if (Wide)
    layerNormGradRows<4>(X, Rows, H, Gamma, DY, Eps, DX, Store, Res, Kept);
  else
    layerNormGradRows<1>(X, Rows, H, Gamma, DY, Eps, DX, Store, Res, Kept);
}

/// Softmax over the last dimension: max in float, sum in double.
__global__ void softmaxKernel(const float *X, int64_t Rows, int64_t C,
                              float *Y) {
  __shared__ double Part[kThreads];
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const float *Xr = X + R * C;
    double M = -INFINITY;
    for (int64_t J = threadIdx.x; J < C; J += blockDim.x)
      M = fmax(M, double(Xr[J]));
    const float Max = float(blockMax(M, Part));
    double S = 0;
    for (int64_t J = threadIdx.x; J < C; J += blockDim.x)
      S += double(expf(Xr[J] - Max));
    const float Inv = float(1.0 / blockSum(S, Part));
    for (int64_t J = threadIdx.x; J < C; J += blockDim.x)
      Y[R * C + J] = expf(Xr[J] - Max) * Inv;
  }
}

/// dx = y * (dy - sum(dy * y)).
__global__ void softmaxGradKernel(const float *Y, const float *DY, int64_t Rows,
                                  int64_t C, float *DX) {
  __shared__ double Part[kThreads];
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const float *Yr = Y + R * C, *Dr = DY + R * C;
    double D = 0;
    for (int64_t J = threadIdx.x; J < C; J += blockDim.x)
      D += double(Yr[J]) * Dr[J];
    const double Dot = blockSum(D, Part);
    for (int64_t J = threadIdx.x; J < C; J += blockDim.x)
      DX[R * C + J] = float(double(Yr[J]) * (double(Dr[J]) - Dot));
  }
}

/// Per row of logits (fp32, or the bf16 bits of a copy: T = uint16_t):
/// the max and the sum of exp(logit - max); the loss's and its gradient's
/// common softmax. One pass over the row (a row of logits is a vocabulary
/// wide, and these kernels are bound by reading it), four logits at a time
/// where the row is aligned for it: each thread keeps its running max and
/// its sum scaled to it, rescaling the sum when the max grows; the block
/// then scales every thread's sum to the row's max. Each term's exp is an
/// fp32 one (a double exp per logit would cost the H100 more than reading
/// the logit), the sums and the rescalings are in double.
struct RowSoftmaxAcc {
  float M = -INFINITY;
  double S = 0;
  __device__ __forceinline__ void grow(float NewMax) {
    if (NewMax > M) { // (S * 0 while M is -inf; a NaN sum stays NaN)
      S *= exp(double(M) - double(NewMax));
      M = NewMax;
    }
  }
  __device__ __forceinline__ void add(float X) {
    if (X != -INFINITY) // (adds 0; a NaN logit makes the sum NaN)
      S += double(expf(X - M));
  }
};

/// A row of \p V elements of T from \p Row, as four-wide loads take it:
/// the first Head elements one at a time (up to the first one aligned for
/// Vec4<T>: a row of an odd-width matrix starts anywhere), then Groups
/// groups of four, then the rest one at a time. All one at a time where
/// the storage is not even T-aligned.
struct RowSpans {
  int64_t Head, Groups;
};
template <class T>
__host__ __device__ inline RowSpans rowSpans(const T *Row, int64_t V) {
  const uintptr_t At = reinterpret_cast<uintptr_t>(Row);
  if (At % sizeof(T))
    return {V, 0};
  const int64_t ToAligned = int64_t((4 - (At / sizeof(T)) % 4) % 4);
  const int64_t Head = ToAligned < V ? ToAligned : V;
  return {Head, (V - Head) / 4};
}

template <class T>
__device__ inline void rowSoftmaxDev(const T *Lr, int64_t V, double *Part,
                                     double &Max, double &Sum) {
  RowSoftmaxAcc A;
  const RowSpans Sp = rowSpans(Lr, V);
  const Vec4<T> *Body = reinterpret_cast<const Vec4<T> *>(Lr + Sp.Head);
  auto Take = [&A](const Vec4<T> &In) {
    float X[4];
    for (int K = 0; K < 4; ++K)
      X[K] = valueOf(In.V[K]);
    A.grow(fmaxf(fmaxf(X[0], X[1]), fmaxf(X[2], X[3])));
    for (int K = 0; K < 4; ++K)
      A.add(X[K]);
  };
  // (Four groups' loads in flight a thread: a row of 50304 is 49 groups
  // a thread.)
  takeInBatches<4>(Body, threadIdx.x, Sp.Groups, blockDim.x, Take);
  // The head and the tail, one at a time.
  const int64_t Loose = V - 4 * Sp.Groups;
  for (int64_t E = threadIdx.x; E < Loose; E += blockDim.x) {
    const int64_t J = E < Sp.Head ? E : E + 4 * Sp.Groups;
    const float X = valueOf(Lr[J]);
    A.grow(X);
    A.add(X);
  }
  Max = blockMax(A.M, Part);
  Sum = blockSum(A.M == -INFINITY ? 0.0 : A.S * exp(double(A.M) - Max), Part);
}

/// Flags a label outside [0, V) in *Bad (the CPU refuses it).
__device__ __forceinline__ bool labelInVocabulary(int64_t Lab, int64_t V,
                                                  int *Bad) {
  if (Lab >= 0 && Lab < V)
    return true;
  if (threadIdx.x == 0)
    *Bad = 1;
  return false;
}

/// Per row of V logits, of which the first C are classes (C < V: a padded
/// vocabulary): logsumexp - logit[label] into Out (a label outside [0, C):
/// NaN, and flagged in *Bad), and the row's softmax statistics [max, sum]
/// into Stats, for the gradient to read instead of a second pass.
template <class T>
__global__ void crossEntropyRowsKernel(const T *L, int64_t Rows, int64_t V,
                                       int64_t C, const int32_t *Labels,
                                       double *Out, double *Stats, int *Bad) {
  __shared__ double Part[kThreads];
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const T *Lr = L + R * V;
    double Max, Sum;
    rowSoftmaxDev(Lr, C, Part, Max, Sum);
    const int32_t Lab = Labels[R];
    const bool Ok = labelInVocabulary(Lab, C, Bad);
    if (threadIdx.x == 0) {
      Out[R] = Ok ? Max + log(Sum) - double(valueOf(Lr[Lab])) : NAN;
      Stats[2 * R] = Max;
      Stats[2 * R + 1] = Sum;
    }
  }
}

/// The rows' losses summed in order (deterministic, as the CPU sums them)
/// over the normalizer, by one block: its threads load kSumRowsTile rows
/// at a time into shared memory, then its first thread adds them in order.
/// (One thread reading them from memory itself waited a memory latency
/// for nearly every row, the next load held back by the chain of adds:
/// 8192 rows, a step's tokens, at hundreds of nanoseconds each.)
constexpr int kSumRowsTile = 2048;
__global__ void sumRowsKernel(const double *Rows, int64_t N, double Normalizer,
                              float *Y) {
  __shared__ double Tile[kSumRowsTile];
  double S = 0;
  for (int64_t First = 0; First < N; First += kSumRowsTile) {
    const int64_t Count =
        N - First < kSumRowsTile ? N - First : int64_t(kSumRowsTile);
    for (int64_t I = threadIdx.x; I < Count; I += blockDim.x)
      Tile[I] = Rows[First + I];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t I = 0; I < Count; ++I)
        S += Tile[I];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    Y[0] = float(S / Normalizer);
}

/// dlogits = (softmax - onehot(label)) * dloss / normalizer, the softmax
/// from the rows' [max, sum] (crossEntropyRowsKernel's): one pass that
/// reads the logits and writes their gradient, four at a time where
/// aligned; logits from column C on (padding) get 0.
template <class T>
__global__ void crossEntropyGradKernel(const T *L, int64_t Rows, int64_t V,
                                       int64_t C, const int32_t *Labels,
                                       const double *Stats, const float *DLoss,
                                       double Normalizer, float *D,
                                       OutputStore Store, int *Bad) {
  const double Scale = double(DLoss[0]) / Normalizer;
  // Rows of the logits and of their gradient start at the same element
  // (R V): where the three are aligned for four, so are their rows' bodies.
  const bool Wide = vec4Aligned(L) && Store.alignedFor4(D);
  for (int64_t R = blockIdx.x; R < Rows; R += gridDim.x) {
    const T *Lr = L + R * V;
    const RowSpans Sp = Wide ? rowSpans(Lr, V) : RowSpans{V, 0};
    const float Max = float(Stats[2 * R]);
    const double Inv = 1.0 / Stats[2 * R + 1];
    const int64_t Lab = Labels[R];
    labelInVocabulary(Lab, C, Bad);
    auto Grad = [&](float X, int64_t J) {
      if (J >= C)
        return 0.0f;
      const double P = double(expf(X - Max)) * Inv;
      return float((P - (J == Lab ? 1.0 : 0.0)) * Scale);
    };
    for (int64_t G = threadIdx.x; G < Sp.Groups; G += blockDim.x) {
      const int64_t J = Sp.Head + 4 * G;
      const Vec4<T> In = *reinterpret_cast<const Vec4<T> *>(Lr + J);
      Vec4<float> Out;
      for (int K = 0; K < 4; ++K)
        Out.V[K] = Grad(valueOf(In.V[K]), J + K);
      Store.store4(D, R * V + J, Out);
    }
    const int64_t Loose = V - 4 * Sp.Groups;
    for (int64_t E = threadIdx.x; E < Loose; E += blockDim.x) {
      const int64_t J = E < Sp.Head ? E : E + 4 * Sp.Groups;
      Store(D, R * V + J, Grad(valueOf(Lr[J]), J));
    }
  }
}

//===-- The vocabulary-parallel loss (plan.fbs, CrossEntropyStats) -----===//

/// Per (row, block of Width logits): the block's max logit, its sum of
/// exp(logit - max), and the label's logit if the label falls in it. Ids
/// from Classes on (if > 0) are padding: a block of padding alone yields
/// (-infinity, 0, 0).
__global__ void crossEntropyStatsKernel(const float *L, int64_t Rows, int64_t V,
                                        const int32_t *Labels,
                                        int64_t VocabStart, int64_t Vocab,
                                        int64_t Blocks, int64_t Classes,
                                        float *Stats, int *Bad) {
  __shared__ double Part[kThreads];
  const int64_t Width = V / Blocks;
  if (Classes > 0 && Classes < Vocab)
    Vocab = Classes;
  for (int64_t T = blockIdx.x; T < Rows * Blocks; T += gridDim.x) {
    const int64_t R = T / Blocks, K = T % Blocks;
    const float *Lb = L + R * V + K * Width;
    // (The same for the whole block: its barriers are reached by all.)
    const int64_t Valid =
        classesInBlock(VocabStart + K * Width, Width, Classes);
    double Max = -INFINITY, Sum = 0;
    if (Valid > 0)
      rowSoftmaxDev(Lb, Valid, Part, Max, Sum);
    if (threadIdx.x == 0) {
      if (Labels[R] < 0 || Labels[R] >= Vocab)
        *Bad = 1;
      const int64_t Local = int64_t(Labels[R]) - VocabStart - K * Width;
      float *St = Stats + T * 3;
      St[0] = float(Max);
      St[1] = float(Sum);
      St[2] = Local >= 0 && Local < Width ? Lb[Local] : 0.0f;
    }
  }
}

/// log sum_v exp(logit_v) of one token from its blocks' statistics.
__device__ inline double logSumExpOfBlocksDev(const float *St, int64_t Blocks) {
  float Max = St[0];
  for (int64_t K = 1; K < Blocks; ++K)
    Max = St[3 * K] > Max ? St[3 * K] : Max;
  double Sum = 0;
  for (int64_t K = 0; K < Blocks; ++K)
    Sum += double(St[3 * K + 1]) * exp(double(St[3 * K]) - Max);
  return log(Sum) + Max;
}

/// Per row: logsumexp over all blocks - the label's logit.
__global__ void crossEntropyFromStatsKernel(const float *Stats, int64_t Rows,
                                            int64_t Blocks, double *Out) {
  MEGAC_GRID_LOOP(R, Rows) {
    const float *St = Stats + R * Blocks * 3;
    double Target = 0;
    for (int64_t K = 0; K < Blocks; ++K)
      Target += St[3 * K + 2];
    Out[R] = logSumExpOfBlocksDev(St, Blocks) - Target;
  }
}

/// Per row: log sum_v exp(logit_v) over all blocks, from the statistics.
__global__ void logSumExpOfBlocksKernel(const float *Stats, int64_t Rows,
                                        int64_t Blocks, double *Lse) {
  MEGAC_GRID_LOOP(R, Rows)
  Lse[R] = logSumExpOfBlocksDev(Stats + R * Blocks * 3, Blocks);
}

/// The gradient of one vocabulary block of logits, the softmax's
/// normalizer each row's log-sum-exp over all blocks.
__global__ void
crossEntropyGradFromStatsKernel(const float *L, int64_t Rows, int64_t V,
                                const int32_t *Labels, const double *Lse,
                                int64_t VocabStart, int64_t Valid,
                                const float *DLoss, double Normalizer,
                                float *D) {
  const double Scale = double(DLoss[0]) / Normalizer;
  MEGAC_GRID_LOOP(I, Rows * V) {
    const int64_t R = I / V, J = I % V;
    if (J >= Valid) { // padding
      D[I] = 0.0f;
      continue;
    }
    const int64_t Local = int64_t(Labels[R]) - VocabStart;
    const double P = exp(double(L[I]) - Lse[R]);
    D[I] = float((P - (J == Local ? 1.0 : 0.0)) * Scale);
  }
}

//===-- Reductions over rows ------------------------------------------===//

/// The column-sum kernels below give a thread a chunk of rows of four
/// columns and load kRowBatch rows of it before summing them: loads in
/// flight together, where a thread that loaded one row at a time, with as
/// many threads as chunks times columns (32768 for a LayerNorm of 8192 rows
/// of 1024), left the H100 at 0.16-0.20 of its copy bandwidth. The sums
/// keep their order, row by row.
constexpr int kRowBatch = 8;

/// Pass 1 of y[j] (+)= sum over i of x[i, j]: chunk c of RowsPer rows
/// summed (in double) into Parts[c, j]; threads run along j (coalesced).
/// X is fp32, or the bf16 copy of a tensor of bf16 values (T = uint16_t:
/// half the bytes, the same sums).
/// sumLeadingPartsKernel's work, \p W columns a thread (every array
/// index a constant once unrolled: registers, not local memory).
template <int W, class T>
__device__ inline void sumLeadingParts(const T *X, int64_t Outer, int64_t Inner,
                                       int64_t RowsPer, int64_t Chunks,
                                       double *Parts) {
  const int64_t Groups = Inner / W;
  MEGAC_GRID_LOOP(G, Chunks * Groups) {
    const int64_t C = G / Groups, J = (G % Groups) * W;
    const int64_t End = (C + 1) * RowsPer < Outer ? (C + 1) * RowsPer : Outer;
    double S[W] = {};
    for (int64_t I0 = C * RowsPer; I0 < End; I0 += kRowBatch) {
      const int Count = End - I0 < kRowBatch ? int(End - I0) : kRowBatch;
      float V[kRowBatch][W];
#pragma unroll
      for (int B = 0; B < kRowBatch; ++B)
        if (B < Count)
          loadColumns<W>(X + (I0 + B) * Inner + J, V[B]);
#pragma unroll
      for (int B = 0; B < kRowBatch; ++B)
        if (B < Count) {
#pragma unroll
          for (int K = 0; K < W; ++K)
            S[K] += V[B][K];
        }
    }
#pragma unroll
    for (int K = 0; K < W; ++K)
      Parts[C * Inner + J + K] = S[K];
  }
}

template <class T>
__global__ void sumLeadingPartsKernel(const T *X, int64_t Outer, int64_t Inner,
                                      int64_t RowsPer, int64_t Chunks,
                                      double *Parts) {
  // Four columns a thread where rows split into aligned groups of four;
  // each column sums its rows in the same order either way.
  if (rowsVec4(Inner, X))
    sumLeadingParts<4>(X, Outer, Inner, RowsPer, Chunks, Parts);
  else
    sumLeadingParts<1>(X, Outer, Inner, RowsPer, Chunks, Parts);
}

/// Pass 0 of a LayerNorm gain's gradient: each row's mean and 1 /
/// sqrt(var + eps) into Stats[2 r], Stats[2 r + 1], a warp a row
/// (warpRowBlocks), as layerNormKernel computes them (the normalize op's
/// x-hat, bit for bit).
template <class TX>
__global__ void rowStatsKernel(const TX *X, int64_t Rows, int64_t H, double Eps,
                               double *Stats) {
  const bool Wide = rowsVec4(H, X); // as layerNormKernel reads X
  MEGAC_WARP_ROWS(R, Rows) {
    double Mean, Inv;
    if (Wide)
      rowStatsWarp<4>(X + R * H, H, Eps, Mean, Inv);
    else
      rowStatsWarp<1>(X + R * H, H, Eps, Mean, Inv);
    if (threadIdx.x % 32 == 0) {
      Stats[2 * R] = Mean;
      Stats[2 * R + 1] = Inv;
    }
  }
}

/// Pass 1 of dgamma[j] = sum over rows i of dy[i, j] * xhat[i, j]: what
/// sumLeadingPartsKernel makes of the normalize op's x-hat times dy (the
/// same f32 products, the same chunks and order), with neither stored.
/// With \p BiasParts (not null), dy's own chunk sums too, as
/// sumLeadingPartsKernel makes them of dy (the bias gradient's parts).
/// layerNormGainPartsKernel's work, \p W columns a thread.
template <int W, class TX, class TD>
__device__ inline void
layerNormGainParts(const TX *X, const TD *DY, const double *Stats, int64_t Rows,
                   int64_t H, int64_t RowsPer, int64_t Chunks, double *Parts,
                   double *BiasParts) {
  const int64_t Groups = H / W;
  MEGAC_GRID_LOOP(G, Chunks * Groups) {
    const int64_t C = G / Groups, J = (G % Groups) * W;
    const int64_t End = (C + 1) * RowsPer < Rows ? (C + 1) * RowsPer : Rows;
    double S[W] = {}, B[W] = {};
    for (int64_t I0 = C * RowsPer; I0 < End; I0 += kRowBatch) {
      const int Count = End - I0 < kRowBatch ? int(End - I0) : kRowBatch;
      float Xv[kRowBatch][W], Dv[kRowBatch][W];
#pragma unroll
      for (int R = 0; R < kRowBatch; ++R)
        if (R < Count) {
          loadColumns<W>(X + (I0 + R) * H + J, Xv[R]);
          loadColumns<W>(DY + (I0 + R) * H + J, Dv[R]);
        }
#pragma unroll
      for (int R = 0; R < kRowBatch; ++R)
        if (R < Count) {
          const double Mean = Stats[2 * (I0 + R)],
                       Inv = Stats[2 * (I0 + R) + 1];
#pragma unroll
          for (int K = 0; K < W; ++K) {
            const float Xh = float((Xv[R][K] - Mean) * Inv);
            // the mul op's f32 product, uncontracted
            S[K] += __fmul_rn(Dv[R][K], Xh);
            B[K] += Dv[R][K];
          }
        }
    }
#pragma unroll
    for (int K = 0; K < W; ++K) {
      Parts[C * H + J + K] = S[K];
      if (BiasParts)
        BiasParts[C * H + J + K] = B[K];
    }
  }
}

template <class TX, class TD>
__global__ void
layerNormGainPartsKernel(const TX *X, const TD *DY, const double *Stats,
                         int64_t Rows, int64_t H, int64_t RowsPer,
                         int64_t Chunks, double *Parts, double *BiasParts) {
  if (rowsVec4(H, X, DY))
    layerNormGainParts<4>(X, DY, Stats, Rows, H, RowsPer, Chunks, Parts,
                          BiasParts);
  else
    layerNormGainParts<1>(X, DY, Stats, Rows, H, RowsPer, Chunks, Parts,
                          BiasParts);
}

/// Pass 2 takes 32 columns a block (totalBlocks); of two sums in one
/// launch (sumLeadingTotalKernel's Y2), twice the blocks.
constexpr int kTotalColumns = 32;
inline unsigned totalBlocks(int64_t Inner, int Sums = 1) {
  return Sums *
         blocksFor((Inner + kTotalColumns - 1) / kTotalColumns * kThreads);
}
/// Pass 2: the chunks' sums, into y (added with \p Add). Each block takes
/// 32 columns at a time: warp w sums chunks w, w + W, ... in order (W, the
/// block's warps), then warp 0 sums the W partial sums in warp order. The
/// same order every run (the same bits every run), in chains W times
/// shorter than one thread's over all the chunks: a LayerNorm's 8192 rows
/// are 128 chunks, which one thread a column summed at a latency each
/// with only as many threads as columns. Where \p Y2 is not null, a second
/// sum of parts laid after the first's (Parts + Chunks Inner) goes there
/// from the second half of the blocks, in the same order (the LayerNorm's
/// gain and bias gradients: one launch, not two).
__global__ void sumLeadingTotalKernel(const double *Parts, int64_t Chunks,
                                      int64_t Inner, float *Y, int Add,
                                      float *Y2) {
  // Room for a block of up to 1024 threads (launches use kThreads).
  constexpr int kMostWarps = 32;
  __shared__ double Partial[kMostWarps][kTotalColumns];
  const int Lane = int(threadIdx.x % 32), Warp = int(threadIdx.x / 32);
  const int kWarps = int((blockDim.x + 31) / 32);
  const unsigned Blocks = Y2 ? gridDim.x / 2 : gridDim.x;
  unsigned Block = blockIdx.x;
  if (Y2 && Block >= Blocks) { // the second sum's block
    Block -= Blocks;
    Parts += Chunks * Inner;
    Y = Y2;
  }
  for (int64_t First = int64_t(Block) * kTotalColumns; First < Inner;
       First += int64_t(Blocks) * kTotalColumns) {
    const int64_t J = First + Lane;
    double S = 0;
    if (J < Inner) {
      // (Eight chunks' loads in flight a thread.)
      takeInBatches<8>(Parts + J, Warp * Inner, Chunks * Inner, kWarps * Inner,
                       [&S](double P) { S += P; });
    }
    Partial[Warp][Lane] = S;
    __syncthreads();
    if (Warp == 0 && J < Inner) {
      double T = 0;
      for (int W = 0; W < kWarps; ++W)
        T += Partial[W][Lane];
      Y[J] = Add ? Y[J] + float(T) : float(T);
    }
    __syncthreads();
  }
}

/// One tensor's sum of squares in a multi-tensor launch, in two passes:
/// its Span's blocks each sum a strided share of it (as a grid of that
/// many blocks alone would: reductionBlocks(N), four at a time where X is
/// aligned) into Parts at their global block index, then one block sums
/// those parts in order into *Y. A fixed order for a given N, so the sum
/// is the same every run, alone or in a run.
struct SumSquaresSpan {
  const float *X;
  float *Y;
  TensorSpan Span; // N, Groups; FirstBlock: its first part
  int64_t Blocks;  // its parts
};
__global__ void sumSquaresPartsManyKernel(const SumSquaresSpan *Table,
                                          int Count, double *Parts) {
  __shared__ double Part[kThreads];
  const SumSquaresSpan &E = entryOfBlock(Table, Count);
  const int64_t Block = int64_t(blockIdx.x) - E.Span.FirstBlock;
  const int64_t First = Block * blockDim.x + threadIdx.x,
                Stride = E.Blocks * blockDim.x;
  double S = 0;
  // (Four groups' loads in flight a thread.)
  takeInBatches<4>(reinterpret_cast<const Vec4<float> *>(E.X), First,
                   E.Span.Groups, Stride, [&S](const Vec4<float> &In) {
                     for (int K = 0; K < 4; ++K)
                       S += double(In.V[K]) * In.V[K];
                   });
  for (int64_t I = First; I < E.Span.N - 4 * E.Span.Groups; I += Stride) {
    const float V = E.X[4 * E.Span.Groups + I];
    S += double(V) * V;
  }
  S = blockSum(S, Part);
  if (threadIdx.x == 0)
    Parts[blockIdx.x] = S;
}
/// Pass 2, block e for entry e: *Y = its parts' sum.
__global__ void sumSquaresTotalsKernel(const SumSquaresSpan *Table,
                                       const double *Parts) {
  __shared__ double Part[kThreads];
  const SumSquaresSpan &E = Table[blockIdx.x];
  double S = 0;
  for (int64_t I = threadIdx.x; I < E.Blocks; I += blockDim.x)
    S += Parts[E.Span.FirstBlock + I];
  S = blockSum(S, Part);
  if (threadIdx.x == 0)
    E.Y[0] = float(S);
}

/// Blocks for a two-pass reduction over \p N elements.
inline unsigned reductionBlocks(int64_t N) {
  const unsigned B = blocksFor(N);
  return B < 1024 ? B : 1024;
}

/// c = min(1, max_norm / (sqrt(total) + 1e-6)).
__global__ void clipCoefficientKernel(const float *Total, double MaxNorm,
                                      float *C) {
  const double Norm = sqrt(fmax(0.0, double(Total[0])));
  C[0] = float(fmin(1.0, MaxNorm / (Norm + 1e-6)));
}

//===-- Attention -------------------------------------------------------===//
//
// q, k, v, y: [B, S, Hl] with NH heads of D = Hl / NH columns. Scores are
// scale * q_i . k_j in double; p = softmax over the keys row i may see;
// with probability dropout, p' = p * mask. Row statistics (max, sum) are
// kept per (batch, head, query) so the backward kernels see the forward's
// probabilities.

/// Attention dropout of a launch: off when Rate <= 0.
struct AttnDropout {
  double Rate = 0;
  uint64_t Key = 0;
  int64_t GlobalHeads = 0, BatchOffset = 0, HeadOffset = 0;
};

__device__ inline double attnMaskDev(const AttnDropout &Dr, int64_t Bi,
                                     int64_t Hh, int64_t S, int64_t I,
                                     int64_t J) {
  if (!(Dr.Rate > 0))
    return 1.0;
  const uint64_t Base = uint64_t(
      ((Bi + Dr.BatchOffset) * Dr.GlobalHeads + Hh + Dr.HeadOffset) * S * S);
  return dropoutScaleDev(Dr.Key, Base + uint64_t(I * S + J), Dr.Rate);
}

__device__ inline double attnScoreDev(const float *Qi, const float *Kj,
                                      int64_t D, double Scale) {
  double Dot = 0;
  for (int64_t E = 0; E < D; ++E)
    Dot += double(Qi[E]) * double(Kj[E]);
  return Dot * Scale;
}

/// Thread \p T of the simple kernels: its batch, head and row, and where a
/// row of its head starts in a [B, S, Hl] tensor.
struct HeadRow {
  int64_t Bi, Hh, Row, S, Hl, D;
  double Scale; // of the scores, as the CPU's attention computes it
  __device__ int64_t at(int64_t J) const { return (Bi * S + J) * Hl + Hh * D; }
  /// The last key that query Row sees.
  __device__ int64_t lastKey(int Causal) const { return Causal ? Row : S - 1; }
};
__device__ inline HeadRow headRow(int64_t T, int64_t S, int64_t Hl,
                                  int64_t NH) {
  return {T / (NH * S),
          (T / S) % NH,
          T % S,
          S,
          Hl,
          Hl / NH,
          1.0 / sqrt(double(Hl / NH))};
}

/// One thread per (batch, head, query): its row's max and sum.
__global__ void attentionRowStatsKernel(const float *Q, const float *K,
                                        int64_t B, int64_t S, int64_t Hl,
                                        int64_t NH, int Causal, double *Stats) {
  MEGAC_GRID_LOOP(T, B * NH * S) {
    const HeadRow H = headRow(T, S, Hl, NH);
    const float *Qi = Q + H.at(H.Row);
    double Max = -INFINITY;
    for (int64_t J = 0; J <= H.lastKey(Causal); ++J)
      Max = fmax(Max, attnScoreDev(Qi, K + H.at(J), H.D, H.Scale));
    double Sum = 0;
    for (int64_t J = 0; J <= H.lastKey(Causal); ++J)
      Sum += exp(attnScoreDev(Qi, K + H.at(J), H.D, H.Scale) - Max);
    Stats[2 * T] = Max;
    Stats[2 * T + 1] = Sum;
  }
}

/// y_i = sum_j p'_ij v_j.
__global__ void attentionForwardKernel(const float *Q, const float *K,
                                       const float *V, int64_t B, int64_t S,
                                       int64_t Hl, int64_t NH, int Causal,
                                       const double *Stats, AttnDropout Dr,
                                       float *Y) {
  MEGAC_GRID_LOOP(T, B * NH * S) {
    const HeadRow H = headRow(T, S, Hl, NH);
    const float *Qi = Q + H.at(H.Row);
    float *Yi = Y + H.at(H.Row);
    for (int64_t E = 0; E < H.D; ++E)
      Yi[E] = 0.0f;
    for (int64_t J = 0; J <= H.lastKey(Causal); ++J) {
      const double P =
          exp(attnScoreDev(Qi, K + H.at(J), H.D, H.Scale) - Stats[2 * T]) /
          Stats[2 * T + 1] * attnMaskDev(Dr, H.Bi, H.Hh, S, H.Row, J);
      for (int64_t E = 0; E < H.D; ++E)
        Yi[E] += float(P * double(V[H.at(J) + E]));
    }
  }
}

/// Per (batch, head, query): delta_i = sum_j p_ij dp_ij, where dp_ij =
/// (dy_i . v_j) * mask_ij, the gradient of the probabilities.
__global__ void attentionDeltaKernel(const float *Q, const float *K,
                                     const float *V, const float *DY, int64_t B,
                                     int64_t S, int64_t Hl, int64_t NH,
                                     int Causal, const double *Stats,
                                     AttnDropout Dr, double *Delta) {
  MEGAC_GRID_LOOP(T, B * NH * S) {
    const HeadRow H = headRow(T, S, Hl, NH);
    const int64_t QRow = H.at(H.Row);
    double Sum = 0;
    for (int64_t J = 0; J <= H.lastKey(Causal); ++J) {
      const double P = exp(attnScoreDev(Q + QRow, K + H.at(J), H.D, H.Scale) -
                           Stats[2 * T]) /
                       Stats[2 * T + 1];
      Sum += P * attnScoreDev(DY + QRow, V + H.at(J), H.D, 1.0) *
             attnMaskDev(Dr, H.Bi, H.Hh, S, H.Row, J);
    }
    Delta[T] = Sum;
  }
}

/// d(q|k|v) by \p Which (0, 1, 2). dq_i = scale sum_j ds_ij k_j; dk_j =
/// scale sum_i ds_ij q_i; dv_j = sum_i p'_ij dy_i; ds_ij = p_ij (dp_ij -
/// delta_i). One thread per (batch, head, row of the result).
__global__ void attentionGradKernel(const float *Q, const float *K,
                                    const float *V, const float *DY, int64_t B,
                                    int64_t S, int64_t Hl, int64_t NH,
                                    int Causal, int Which, const double *Stats,
                                    const double *Delta, AttnDropout Dr,
                                    float *DX) {
  MEGAC_GRID_LOOP(T, B * NH * S) {
    const HeadRow H = headRow(T, S, Hl, NH);
    const int64_t R = H.Row;
    const int64_t Base = T - R; // row statistics of this head
    float *Out = DX + H.at(R);
    for (int64_t E = 0; E < H.D; ++E)
      Out[E] = 0.0f;
    // dq sums over the keys row R sees; dk and dv over the queries that
    // see key R.
    const int64_t From = Which == 0 ? 0 : (Causal ? R : 0);
    const int64_t To = Which == 0 ? H.lastKey(Causal) : S - 1;
    for (int64_t O = From; O <= To; ++O) {
      const int64_t I = Which == 0 ? R : O, J = Which == 0 ? O : R;
      const int64_t QRow = H.at(I), KRow = H.at(J);
      const double P = exp(attnScoreDev(Q + QRow, K + KRow, H.D, H.Scale) -
                           Stats[2 * (Base + I)]) /
                       Stats[2 * (Base + I) + 1];
      const double Mask = attnMaskDev(Dr, H.Bi, H.Hh, S, I, J);
      if (Which == 2) {
        const double Pd = P * Mask;
        for (int64_t E = 0; E < H.D; ++E)
          Out[E] += float(Pd * double(DY[QRow + E]));
        continue;
      }
      const double Dp = attnScoreDev(DY + QRow, V + KRow, H.D, 1.0) * Mask;
      const double Ds = P * (Dp - Delta[Base + I]) * H.Scale;
      const float *Other = Which == 0 ? K + KRow : Q + QRow;
      for (int64_t E = 0; E < H.D; ++E)
        Out[E] += float(Ds * double(Other[E]));
    }
  }
}

//===-- Flash attention ---------------------------------------------------===//
//
// Tiled attention in the manner of FlashAttention (Dao et al., 2022): a
// block owns kFlashRows rows (queries in the forward pass and for dq, keys
// for dk and dv), one per thread, with the row and its accumulator in
// registers; the other side streams through shared memory kFlashTile rows
// at a time; the softmax is computed online (running max and sum), so no
// S x S matrix is ever stored: memory is O(S) per head. The backward pass
// recomputes the probabilities from each row's max and sum, as FlashAttention
// 2 does. Head sizes 32, 64 and 128 (the GPT shapes) take these kernels;
// other sizes the simple ones above.
//
// The arithmetic is fp32 (scores as the CPU's sgemm computes them, scale
// applied after the dot product), so results stay within 1e-5 of the CPU.

constexpr int kFlashRows = 64;
constexpr int kFlashTile = 32;

inline bool flashHeadSize(int64_t D) { return D == 32 || D == 64 || D == 128; }

/// Where a block's rows are: its (batch, head) and first row.
struct FlashBlock {
  int64_t Bi, Hh, Row0;
};
/// (Blocks of \p Rows rows each: a head's S rows take ceil(S / Rows).)
template <int Rows = kFlashRows>
__device__ inline FlashBlock flashBlock(int64_t S, int64_t NH) {
  const int64_t Tiles = (S + Rows - 1) / Rows;
  const int64_t BH = blockIdx.x / Tiles;
  return {BH / NH, BH % NH, (blockIdx.x % Tiles) * Rows};
}

template <int D>
__device__ inline float dotRow(const float *A, const float *B) {
  float S = 0;
  for (int E = 0; E < D; ++E)
    S += A[E] * B[E];
  return S;
}

/// Reads rows [R0, R0 + Rows) of head (Bi, Hh) of X (zeros past S) and
/// hands element E = row * D + column to Store(E, value); the block's
/// Threads threads share the work. Each thread issues a batch of loads
/// before it stores any: a store to shared memory between two loads makes
/// the second wait for the first (the compiler cannot tell the memories
/// apart), one global memory latency per element.
template <int D, int Rows, int Threads, class StoreFn>
__device__ inline void loadHeadRows(const float *X, int64_t Bi, int64_t Hh,
                                    int64_t S, int64_t Hl, int64_t R0,
                                    StoreFn Store) {
  constexpr int Batch = 16, PerThread = Rows * D / Threads;
  static_assert(PerThread % Batch == 0, "whole batches");
  for (int B0 = 0; B0 < PerThread; B0 += Batch) {
    float V[Batch];
#pragma unroll
    for (int K = 0; K < Batch; ++K) {
      const int E = int(threadIdx.x) + (B0 + K) * Threads;
      const int64_t R = R0 + E / D;
      V[K] = R < S ? X[(Bi * S + R) * Hl + Hh * D + E % D] : 0.0f;
    }
#pragma unroll
    for (int K = 0; K < Batch; ++K)
      Store(int(threadIdx.x) + (B0 + K) * Threads, V[K]);
  }
}

/// Copies rows [R0, R0 + kFlashTile) of head (Bi, Hh) of X into Tile (zeros
/// past S); every thread of the block (kFlashRows of them) takes part.
template <int D>
__device__ inline void loadTile(const float *X, int64_t Bi, int64_t Hh,
                                int64_t S, int64_t Hl, int64_t R0,
                                float *Tile) {
  loadHeadRows<D, kFlashTile, kFlashRows>(X, Bi, Hh, S, Hl, R0,
                                          [&](int E, float V) { Tile[E] = V; });
}

template <int D>
__device__ inline void loadRow(const float *X, int64_t Base, bool Active,
                               float *R) {
  for (int E = 0; E < D; ++E)
    R[E] = Active ? X[Base + E] : 0.0f;
}

/// Calls Visit(C, J) for each key J that query row I sees, in order: the
/// block loads the keys and values tile by tile into Ks and Vs (every
/// thread takes part), and the row's thread visits tile row C.
template <int D, class VisitFn>
__device__ inline void forEachKey(const float *K, const float *V,
                                  const FlashBlock &Bl, int64_t S, int64_t Hl,
                                  int Causal, int64_t I, bool Active, float *Ks,
                                  float *Vs, VisitFn Visit) {
  const int64_t End =
      Causal ? (Bl.Row0 + kFlashRows < S ? Bl.Row0 + kFlashRows : S) : S;
  for (int64_t J0 = 0; J0 < End; J0 += kFlashTile) {
    loadTile<D>(K, Bl.Bi, Bl.Hh, S, Hl, J0, Ks);
    loadTile<D>(V, Bl.Bi, Bl.Hh, S, Hl, J0, Vs);
    __syncthreads();
    for (int C = 0; Active && C < kFlashTile; ++C) {
      const int64_t J = J0 + C;
      if (J >= S || (Causal && J > I))
        break;
      Visit(C, J);
    }
    __syncthreads();
  }
}

/// y_i = sum_j softmax(s_i)_j mask_ij v_j, online over key tiles (no y
/// when \p Y is null). With \p Stats, each row's max score m and 1 / sum_j
/// exp(s_ij - m): the backward pass's p_ij = exp(s_ij - m) / sum, the
/// CPU's formula (float exponentials, the sum in double).
template <int D>
__global__ void __launch_bounds__(kFlashRows)
    flashForwardKernel(const float *Q, const float *K, const float *V,
                       int64_t S, int64_t Hl, int64_t NH, int Causal,
                       float Scale, AttnDropout Dr, float *Y, float *Stats) {
  __shared__ float Ks[kFlashTile * D];
  __shared__ float Vs[kFlashTile * D];
  const FlashBlock Bl = flashBlock(S, NH);
  const int64_t I = Bl.Row0 + threadIdx.x;
  const bool Active = I < S;
  const int64_t Base = (Bl.Bi * S + I) * Hl + Bl.Hh * D;
  float Qr[D], Acc[D];
  loadRow<D>(Q, Base, Active, Qr);
  for (int E = 0; E < D; ++E)
    Acc[E] = 0.0f;
  float M = -INFINITY;
  double L = 0;
  forEachKey<D>(
      K, V, Bl, S, Hl, Causal, I, Active, Ks, Vs, [&](int C, int64_t J) {
        const float Sc = dotRow<D>(Qr, Ks + C * D) * Scale;
        if (Sc > M) { // a new maximum rescales the sums so far
          const float Corr = expf(M - Sc);
          L *= double(Corr);
          for (int E = 0; E < D; ++E)
            Acc[E] *= Corr;
          M = Sc;
        }
        const float P = expf(Sc - M);
        L += double(P);
        if (!Y) // the statistics only
          return;
        const float Pd =
            Dr.Rate > 0
                ? float(double(P) * attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J))
                : P;
        for (int E = 0; E < D; ++E)
          Acc[E] += Pd * Vs[C * D + E];
      });
  if (!Active)
    return;
  if (Y)
    for (int E = 0; E < D; ++E)
      Y[Base + E] = float(double(Acc[E]) / L);
  if (Stats) {
    const int64_t Row = (Bl.Bi * NH + Bl.Hh) * S + I;
    Stats[2 * Row] = M;
    Stats[2 * Row + 1] = float(1.0 / L);
  }
}

/// Per query row i: delta_i = sum_j p_ij dp_ij, dp_ij = (dy_i . v_j) mask_ij.
/// With \p DQ, also dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j (a second
/// pass over the keys, once delta_i is known).
template <int D>
__global__ void __launch_bounds__(kFlashRows)
    flashQueryGradKernel(const float *Q, const float *K, const float *V,
                         const float *DY, int64_t S, int64_t Hl, int64_t NH,
                         int Causal, float Scale, AttnDropout Dr,
                         const float *Stats, float *Delta, float *DQ) {
  __shared__ float Ks[kFlashTile * D];
  __shared__ float Vs[kFlashTile * D];
  const FlashBlock Bl = flashBlock(S, NH);
  const int64_t I = Bl.Row0 + threadIdx.x;
  const bool Active = I < S;
  const int64_t Base = (Bl.Bi * S + I) * Hl + Bl.Hh * D;
  const int64_t Row = (Bl.Bi * NH + Bl.Hh) * S + I;
  float Qr[D], Dyr[D], Acc[D];
  loadRow<D>(Q, Base, Active, Qr);
  loadRow<D>(DY, Base, Active, Dyr);
  for (int E = 0; E < D; ++E)
    Acc[E] = 0.0f;
  const float Mx = Active ? Stats[2 * Row] : 0.0f;
  const float Inv = Active ? Stats[2 * Row + 1] : 0.0f;
  double Dl = 0;
  for (int Pass = 0; Pass < (DQ ? 2 : 1); ++Pass)
    forEachKey<D>(
        K, V, Bl, S, Hl, Causal, I, Active, Ks, Vs, [&](int C, int64_t J) {
          const float P = expf(dotRow<D>(Qr, Ks + C * D) * Scale - Mx) * Inv;
          const double Dp = double(dotRow<D>(Dyr, Vs + C * D)) *
                            attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J);
          if (Pass == 0) {
            Dl += double(P) * Dp;
            return;
          }
          const float Ds = float(double(P) * (Dp - Dl)) * Scale;
          for (int E = 0; E < D; ++E)
            Acc[E] += Ds * Ks[C * D + E];
        });
  if (!Active)
    return;
  Delta[Row] = float(Dl);
  if (DQ)
    for (int E = 0; E < D; ++E)
      DQ[Base + E] = Acc[E];
}

/// Per key row j: dk_j = scale sum_i p_ij (dp_ij - delta_i) q_i (\p Which
/// 1) or dv_j = sum_i p_ij mask_ij dy_i (\p Which 2), over query tiles.
template <int D>
__global__ void __launch_bounds__(kFlashRows)
    flashKeyGradKernel(const float *Q, const float *K, const float *V,
                       const float *DY, int64_t S, int64_t Hl, int64_t NH,
                       int Causal, float Scale, int Which, AttnDropout Dr,
                       const float *Stats, const float *Delta, float *Out) {
  __shared__ float Qs[kFlashTile * D];
  __shared__ float Ds[kFlashTile * D];
  __shared__ float Mx[kFlashTile], Inv[kFlashTile], Dl[kFlashTile];
  const FlashBlock Bl = flashBlock(S, NH);
  const int64_t J = Bl.Row0 + threadIdx.x;
  const bool Active = J < S;
  const int64_t Base = (Bl.Bi * S + J) * Hl + Bl.Hh * D;
  const int64_t Rows = (Bl.Bi * NH + Bl.Hh) * S;
  float Kr[D], Vr[D], Acc[D];
  loadRow<D>(K, Base, Active, Kr);
  loadRow<D>(V, Base, Active, Vr);
  for (int E = 0; E < D; ++E)
    Acc[E] = 0.0f;
  // Causal: only queries at or after the block's first key see it.
  for (int64_t I0 = Causal ? Bl.Row0 / kFlashTile * kFlashTile : 0; I0 < S;
       I0 += kFlashTile) {
    loadTile<D>(Q, Bl.Bi, Bl.Hh, S, Hl, I0, Qs);
    loadTile<D>(DY, Bl.Bi, Bl.Hh, S, Hl, I0, Ds);
    for (int64_t C = threadIdx.x; C < kFlashTile; C += blockDim.x) {
      Mx[C] = I0 + C < S ? Stats[2 * (Rows + I0 + C)] : 0.0f;
      Inv[C] = I0 + C < S ? Stats[2 * (Rows + I0 + C) + 1] : 0.0f;
      Dl[C] = I0 + C < S ? Delta[Rows + I0 + C] : 0.0f;
    }
    __syncthreads();
    for (int C = 0; Active && C < kFlashTile; ++C) {
      const int64_t I = I0 + C;
      if (I >= S)
        break;
      if (Causal && I < J)
        continue;
      const float P = expf(dotRow<D>(Qs + C * D, Kr) * Scale - Mx[C]) * Inv[C];
      const double Mask = attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J);
      if (Which == 2) {
        const float Pd = float(double(P) * Mask);
        for (int E = 0; E < D; ++E)
          Acc[E] += Pd * Ds[C * D + E];
        continue;
      }
      const double Dp = double(dotRow<D>(Ds + C * D, Vr)) * Mask;
      const float G = float(double(P) * (Dp - double(Dl[C]))) * Scale;
      for (int E = 0; E < D; ++E)
        Acc[E] += G * Qs[C * D + E];
    }
    __syncthreads();
  }
  if (Active)
    for (int E = 0; E < D; ++E)
      Out[Base + E] = Acc[E];
}

} // namespace cuda
} // namespace megac_rt

#include "flash_mma.cuh"
#include "flash_tc.cuh"

#endif // MEGAC_RT_CUDA_KERNELS_CUH
