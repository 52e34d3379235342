//===- flash_tc.cuh - Flash attention on the tensor cores -----*- CUDA -*-===//
//
// The flash kernels of cuda_kernels.cuh keep fp32 arithmetic, one row per
// thread, so that fp32 plans match the CPU within 1e-5; that runs on the
// CUDA cores at a few TFLOP/s. In a bf16 plan, where q, k and v hold bf16
// values, these kernels run the same algorithm with its four kinds of
// products (q k^T, p v, dy v^T, ds k / ds^T q / p^T dy) on the tensor cores
// through warp matrix operations (wmma: 16x16x16 bf16 tiles, fp32
// accumulation), the probabilities, the score gradients and dy (which the
// plan need not round) rounded to bf16 for them as FlashAttention does.
//
// A block of 4 warps owns 64 rows (queries, or keys for dk and dv), 16 per
// warp; the other side streams through shared memory 64 rows at a time.
// Scores land in shared memory, where each pair of lanes takes one row for
// the softmax (half the columns each); the forward pass keeps its output
// rows in shared memory too, since the online softmax rescales them. dq,
// dk and dv accumulate in fragments.
//
// Included by cuda_kernels.cuh; builds with nvcc and with the host
// emulation (emu/wmma_emu.h).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_FLASH_TC_CUH
#define MEGAC_RT_CUDA_FLASH_TC_CUH

#ifdef MEGAC_CUDA_EMULATION
#include "emu/wmma_emu.h"
#else
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace megac_rt {
namespace cuda {

namespace wm = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTcRows = 64; // a block's rows, 16 per warp
static_assert(kTcRows == kFlashRows, "blocks are counted as flashBlock does");
constexpr int kTcThreads = 128;     // 4 warps
constexpr int kTcLdS = kTcRows + 4; // fp32 score tiles [64][68]
constexpr int kTcLdP = kTcRows + 8; // bf16 probability tiles [64][72]
template <int D> constexpr int kTcLdH = D + 8; // bf16 [64][D + 8]

using TcFragA = wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::row_major>;
using TcFragB = wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::row_major>;
using TcFragBt = wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::col_major>;
using TcFragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

/// Shared memory of the kernels: two streamed bf16 tiles, two fp32 score
/// tiles (which first stage the block's own rows), a bf16 tile of
/// probabilities, the other side's row statistics, and for the forward
/// pass its fp32 output rows.
template <int D> struct TcShared {
  static constexpr size_t Tile = size_t(kTcRows) * kTcLdH<D> * 2;
  static constexpr size_t Scores = size_t(kTcRows) * kTcLdS * 4;
  static constexpr size_t Probs = size_t(kTcRows) * kTcLdP * 2;
  static constexpr size_t Rows = 3 * kTcRows * 4;
  static constexpr size_t Out = size_t(kTcRows) * (D + 4) * 4;
  static constexpr size_t Grad = 2 * Tile + 2 * Scores + Probs + Rows;
  static constexpr size_t Forward = Grad + Out;
  static_assert(2 * Tile <= 2 * Scores && Out <= 2 * Scores,
                "the staged rows fit where the scores go");
};

/// The regions of a kernel's dynamic shared memory, in TcShared's order.
struct TcRegions {
  bf16 *Tile0, *Tile1; // the streamed side
  float *Scores, *Second;
  bf16 *Probs;
  float *Rows; // [3][64]: the streamed rows' max, 1 / sum and delta
  float *Out;  // the forward pass's output rows
};
template <int D> __device__ inline TcRegions tcRegions(unsigned char *Smem) {
  using Sh = TcShared<D>;
  unsigned char *Scores = Smem + 2 * Sh::Tile, *Probs = Scores + 2 * Sh::Scores;
  return {reinterpret_cast<bf16 *>(Smem),
          reinterpret_cast<bf16 *>(Smem + Sh::Tile),
          reinterpret_cast<float *>(Scores),
          reinterpret_cast<float *>(Scores + Sh::Scores),
          reinterpret_cast<bf16 *>(Probs),
          reinterpret_cast<float *>(Probs + Sh::Probs),
          reinterpret_cast<float *>(Smem + Sh::Grad)};
}

/// Rows [R0, R0 + 64) of head (Bi, Hh) of X as bf16 in Tile (zeros past
/// S); every thread takes part. With \p Inexact, flags a value bf16 does
/// not hold exactly (the bf16 analysis was wrong).
template <int D>
__device__ inline void tcLoadTile(const float *X, int64_t Bi, int64_t Hh,
                                  int64_t S, int64_t Hl, int64_t R0, bf16 *Tile,
                                  int *Inexact) {
  unsigned Low = 0;
  loadHeadRows<D, kTcRows, kTcThreads>(
      X, Bi, Hh, S, Hl, R0, [&](int E, float V) {
        Low |= __float_as_uint(V) & 0xffffu;
        Tile[(E / D) * kTcLdH<D> + E % D] = __float2bfloat16_rn(V);
      });
  if (Inexact && Low)
    *Inexact = 1;
}

/// A warp's 16 rows of a staged tile as matrix_a fragments.
template <int D>
__device__ inline void tcRowFragments(const bf16 *Tile, TcFragA (&A)[D / 16]) {
  const bf16 *Rows = Tile + (threadIdx.x / 32) * 16 * kTcLdH<D>;
  for (int K = 0; K < D / 16; ++K)
    wm::load_matrix_sync(A[K], Rows + K * 16, kTcLdH<D>);
}

/// Out (16 x 64 fp32, the warp's rows of a score tile) = A X^T: the warp's
/// rows against the 64 rows of the bf16 tile X.
template <int D>
__device__ inline void tcRowsByTile(const TcFragA (&A)[D / 16], const bf16 *X,
                                    float *Scores) {
  float *Out = Scores + (threadIdx.x / 32) * 16 * kTcLdS;
  for (int N = 0; N < kTcRows / 16; ++N) {
    TcFragC Acc;
    wm::fill_fragment(Acc, 0.0f);
    for (int K = 0; K < D / 16; ++K) {
      TcFragBt B;
      wm::load_matrix_sync(B, X + N * 16 * kTcLdH<D> + K * 16, kTcLdH<D>);
      wm::mma_sync(Acc, A[K], B, Acc);
    }
    wm::store_matrix_sync(Out + N * 16, Acc, kTcLdS, wm::mem_row_major);
  }
}

/// Acc += P X: the warp's 16 rows of the bf16 tile P (16 x 64) times the
/// 64 x D bf16 tile X.
template <int D>
__device__ inline void tcAccumulate(TcFragC (&Acc)[D / 16], const bf16 *Probs,
                                    const bf16 *X) {
  const bf16 *P = Probs + (threadIdx.x / 32) * 16 * kTcLdP;
  for (int K = 0; K < kTcRows / 16; ++K) {
    TcFragA A;
    wm::load_matrix_sync(A, P + K * 16, kTcLdP);
    for (int N = 0; N < D / 16; ++N) {
      TcFragB B;
      wm::load_matrix_sync(B, X + K * 16 * kTcLdH<D> + N * 16, kTcLdH<D>);
      wm::mma_sync(Acc[N], A, B, Acc[N]);
    }
  }
}

/// Where a lane works in the elementwise steps: row Row of the block (two
/// lanes a row), columns [Col0, Col0 + 32) of a score tile.
struct TcLane {
  int Row, Col0;
};
__device__ inline TcLane tcLane() {
  const int Lane = threadIdx.x % 32;
  return {int(threadIdx.x / 32) * 16 + Lane / 2, (Lane % 2) * 32};
}

/// Writes the block's rows (fp32 in shared memory, stride D + 4, divided
/// by \p Div when given) to rows Row0.. of head (Bi, Hh) of Out; each lane
/// pair writes its row.
template <int D>
__device__ inline void tcStoreRows(const float *Rows, const FlashBlock &Bl,
                                   int64_t S, int64_t Hl, float Div,
                                   float *Out) {
  const TcLane L = tcLane();
  const int64_t I = Bl.Row0 + L.Row;
  if (I >= S)
    return;
  const int E0 = (L.Col0 / 32) * (D / 2);
  for (int E = E0; E < E0 + D / 2; ++E)
    Out[(Bl.Bi * S + I) * Hl + Bl.Hh * D + E] = Rows[L.Row * (D + 4) + E] / Div;
}

/// Stores the accumulators (a warp's 16 rows each) to shared rows, then to
/// Out. The caller has synchronized the block (Rows aliases the scores).
template <int D>
__device__ inline void tcStoreAccumulators(const TcFragC (&Acc)[D / 16],
                                           float *Rows, const FlashBlock &Bl,
                                           int64_t S, int64_t Hl, float *Out) {
  float *Mine = Rows + (threadIdx.x / 32) * 16 * (D + 4);
  for (int N = 0; N < D / 16; ++N)
    wm::store_matrix_sync(Mine + N * 16, Acc[N], D + 4, wm::mem_row_major);
  __syncwarp();
  tcStoreRows<D>(Rows, Bl, S, Hl, 1.0f, Out);
}

/// As flashForwardKernel: y = softmax(s) v online over key tiles, and each
/// row's max and 1 / sum in \p Stats when given.
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flashForwardTcKernel(const float *Q, const float *K, const float *V,
                         int64_t S, int64_t Hl, int64_t NH, int Causal,
                         float Scale, AttnDropout Dr, float *Y, float *Stats,
                         int *Inexact) {
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  const TcRegions Sm = tcRegions<D>(Smem);
  bf16 *Ks = Sm.Tile0, *Vs = Sm.Tile1, *Probs = Sm.Probs;
  float *Scores = Sm.Scores, *Out = Sm.Out;
  const FlashBlock Bl = flashBlock(S, NH);
  const TcLane L = tcLane();
  const int64_t I = Bl.Row0 + L.Row;

  tcLoadTile<D>(Q, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0,
                reinterpret_cast<bf16 *>(Scores), Inexact);
  for (int E = threadIdx.x; E < kTcRows * (D + 4); E += blockDim.x)
    Out[E] = 0.0f;
  __syncthreads();
  TcFragA Qa[D / 16];
  tcRowFragments<D>(reinterpret_cast<bf16 *>(Scores), Qa);

  float M = -INFINITY, Sum = 0.0f;
  const int64_t End =
      Causal ? (Bl.Row0 + kTcRows < S ? Bl.Row0 + kTcRows : S) : S;
  for (int64_t J0 = 0; J0 < End; J0 += kTcRows) {
    __syncthreads(); // the last tile (or the staged queries) is read
    tcLoadTile<D>(K, Bl.Bi, Bl.Hh, S, Hl, J0, Ks, Inexact);
    tcLoadTile<D>(V, Bl.Bi, Bl.Hh, S, Hl, J0, Vs, Inexact);
    __syncthreads();
    tcRowsByTile<D>(Qa, Ks, Scores);
    __syncwarp();
    // Online softmax of the lane's half row.
    const float *Srow = Scores + L.Row * kTcLdS + L.Col0;
    float Sc[32], TileMax = -INFINITY;
    for (int C = 0; C < 32; ++C) {
      const int64_t J = J0 + L.Col0 + C;
      const bool Seen = I < S && J < S && !(Causal && J > I);
      Sc[C] = Seen ? Srow[C] * Scale : -INFINITY;
      TileMax = fmaxf(TileMax, Sc[C]);
    }
    TileMax = fmaxf(TileMax, __shfl_xor_sync(0xffffffffu, TileMax, 1));
    const float NewM = fmaxf(M, TileMax);
    const float Corr = NewM == -INFINITY ? 1.0f : expf(M - NewM);
    bf16 *Prow = Probs + L.Row * kTcLdP + L.Col0;
    float TileSum = 0.0f;
    for (int C = 0; C < 32; ++C) {
      const float P = Sc[C] == -INFINITY ? 0.0f : expf(Sc[C] - NewM);
      TileSum += P;
      const float Pd = Dr.Rate > 0 && P != 0.0f
                           ? float(double(P) * attnMaskDev(Dr, Bl.Bi, Bl.Hh, S,
                                                           I, J0 + L.Col0 + C))
                           : P;
      Prow[C] = __float2bfloat16_rn(Pd);
    }
    TileSum += __shfl_xor_sync(0xffffffffu, TileSum, 1);
    Sum = Sum * Corr + TileSum;
    M = NewM;
    float *Orow = Out + L.Row * (D + 4) + (L.Col0 / 32) * (D / 2);
    for (int E = 0; E < D / 2; ++E)
      Orow[E] *= Corr;
    __syncwarp();
    // out += p v, the warp's rows.
    float *Mine = Out + (threadIdx.x / 32) * 16 * (D + 4);
    TcFragC Acc[D / 16];
    for (int N = 0; N < D / 16; ++N)
      wm::load_matrix_sync(Acc[N], Mine + N * 16, D + 4, wm::mem_row_major);
    __syncwarp(); // every lane has read the rows before any writes them
    tcAccumulate<D>(Acc, Probs, Vs);
    for (int N = 0; N < D / 16; ++N)
      wm::store_matrix_sync(Mine + N * 16, Acc[N], D + 4, wm::mem_row_major);
  }
  __syncwarp();
  if (Y)
    tcStoreRows<D>(Out, Bl, S, Hl, Sum, Y);
  if (Stats && I < S && L.Col0 == 0) {
    const int64_t Row = (Bl.Bi * NH + Bl.Hh) * S + I;
    Stats[2 * Row] = M;
    Stats[2 * Row + 1] = 1.0f / Sum;
  }
}

/// delta_i = dy_i . y_i per query row (= sum_j p_ij dp_ij, dropout
/// included): one thread a row.
__global__ void attentionRowDotKernel(const float *DY, const float *Y,
                                      int64_t B, int64_t S, int64_t Hl,
                                      int64_t NH, int64_t D, float *Delta) {
  MEGAC_GRID_LOOP(Row, B * NH * S) {
    const int64_t I = Row % S, Hh = Row / S % NH, Bi = Row / S / NH;
    const int64_t Base = (Bi * S + I) * Hl + Hh * D;
    float Acc = 0.0f;
    for (int64_t E = 0; E < D; ++E)
      Acc += DY[Base + E] * Y[Base + E];
    Delta[Row] = Acc;
  }
}

/// dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j, dp_ij = (dy_i . v_j)
/// mask_ij, over key tiles.
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flashQueryGradTcKernel(const float *Q, const float *K, const float *V,
                           const float *DY, int64_t S, int64_t Hl, int64_t NH,
                           int Causal, float Scale, AttnDropout Dr,
                           const float *Stats, const float *Delta, float *DQ,
                           int *Inexact) {
  using Sh = TcShared<D>;
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  const TcRegions Sm = tcRegions<D>(Smem);
  bf16 *Ks = Sm.Tile0, *Vs = Sm.Tile1, *Probs = Sm.Probs;
  float *Scores = Sm.Scores, *Dps = Sm.Second;
  const FlashBlock Bl = flashBlock(S, NH);
  const TcLane L = tcLane();
  const int64_t I = Bl.Row0 + L.Row;
  const int64_t Row = (Bl.Bi * NH + Bl.Hh) * S + I;

  bf16 *Stage = reinterpret_cast<bf16 *>(Scores);
  tcLoadTile<D>(Q, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Stage, Inexact);
  tcLoadTile<D>(DY, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Stage + Sh::Tile / 2,
                nullptr);
  __syncthreads();
  TcFragA Qa[D / 16], Dya[D / 16];
  tcRowFragments<D>(Stage, Qa);
  tcRowFragments<D>(Stage + Sh::Tile / 2, Dya);
  const float Mx = I < S ? Stats[2 * Row] : 0.0f;
  const float Inv = I < S ? Stats[2 * Row + 1] : 0.0f;
  const float Dl = I < S ? Delta[Row] : 0.0f;
  TcFragC Acc[D / 16];
  for (int N = 0; N < D / 16; ++N)
    wm::fill_fragment(Acc[N], 0.0f);

  const int64_t End =
      Causal ? (Bl.Row0 + kTcRows < S ? Bl.Row0 + kTcRows : S) : S;
  for (int64_t J0 = 0; J0 < End; J0 += kTcRows) {
    __syncthreads();
    tcLoadTile<D>(K, Bl.Bi, Bl.Hh, S, Hl, J0, Ks, Inexact);
    tcLoadTile<D>(V, Bl.Bi, Bl.Hh, S, Hl, J0, Vs, Inexact);
    __syncthreads();
    tcRowsByTile<D>(Qa, Ks, Scores);
    tcRowsByTile<D>(Dya, Vs, Dps);
    __syncwarp();
    const float *Srow = Scores + L.Row * kTcLdS + L.Col0;
    const float *Drow = Dps + L.Row * kTcLdS + L.Col0;
    bf16 *Prow = Probs + L.Row * kTcLdP + L.Col0;
    for (int C = 0; C < 32; ++C) {
      const int64_t J = J0 + L.Col0 + C;
      const bool Seen = I < S && J < S && !(Causal && J > I);
      float Ds = 0.0f;
      if (Seen) {
        const float P = expf(Srow[C] * Scale - Mx) * Inv;
        const float Mask =
            Dr.Rate > 0 ? float(attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J)) : 1.0f;
        Ds = P * (Drow[C] * Mask - Dl) * Scale;
      }
      Prow[C] = __float2bfloat16_rn(Ds);
    }
    __syncwarp();
    tcAccumulate<D>(Acc, Probs, Ks);
  }
  __syncthreads(); // the scores are read; their space takes the rows out
  tcStoreAccumulators<D>(Acc, Scores, Bl, S, Hl, DQ);
}

/// Per key row j: dk_j = scale sum_i p_ij (dp_ij - delta_i) q_i (\p Which
/// 1) or dv_j = sum_i p_ij mask_ij dy_i (\p Which 2), over query tiles.
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    flashKeyGradTcKernel(const float *Q, const float *K, const float *V,
                         const float *DY, int64_t S, int64_t Hl, int64_t NH,
                         int Causal, float Scale, int Which, AttnDropout Dr,
                         const float *Stats, const float *Delta, float *Out,
                         int *Inexact) {
  using Sh = TcShared<D>;
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  const TcRegions Sm = tcRegions<D>(Smem);
  bf16 *Qs = Sm.Tile0, *Dys = Sm.Tile1, *Probs = Sm.Probs;
  float *Scores = Sm.Scores, *Dps = Sm.Second;
  float *Mx = Sm.Rows, *Inv = Mx + kTcRows, *Dl = Inv + kTcRows;
  const FlashBlock Bl = flashBlock(S, NH);
  const TcLane L = tcLane();
  const int64_t J = Bl.Row0 + L.Row;
  const int64_t Rows = (Bl.Bi * NH + Bl.Hh) * S;

  bf16 *Stage = reinterpret_cast<bf16 *>(Scores);
  tcLoadTile<D>(K, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Stage, Inexact);
  tcLoadTile<D>(V, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Stage + Sh::Tile / 2, Inexact);
  __syncthreads();
  TcFragA Ka[D / 16], Va[D / 16];
  tcRowFragments<D>(Stage, Ka);
  tcRowFragments<D>(Stage + Sh::Tile / 2, Va);
  TcFragC Acc[D / 16];
  for (int N = 0; N < D / 16; ++N)
    wm::fill_fragment(Acc[N], 0.0f);

  // Causal: only queries at or after the block's first key see its keys.
  for (int64_t I0 = Causal ? Bl.Row0 : 0; I0 < S; I0 += kTcRows) {
    __syncthreads();
    tcLoadTile<D>(Q, Bl.Bi, Bl.Hh, S, Hl, I0, Qs, Inexact);
    tcLoadTile<D>(DY, Bl.Bi, Bl.Hh, S, Hl, I0, Dys, nullptr);
    for (int C = threadIdx.x; C < kTcRows; C += blockDim.x) {
      const bool In = I0 + C < S;
      Mx[C] = In ? Stats[2 * (Rows + I0 + C)] : 0.0f;
      Inv[C] = In ? Stats[2 * (Rows + I0 + C) + 1] : 0.0f;
      Dl[C] = In ? Delta[Rows + I0 + C] : 0.0f;
    }
    __syncthreads();
    tcRowsByTile<D>(Ka, Qs, Scores); // s^T: the warp's keys by the queries
    if (Which == 1)
      tcRowsByTile<D>(Va, Dys, Dps); // dp^T
    __syncwarp();
    const float *Srow = Scores + L.Row * kTcLdS + L.Col0;
    const float *Drow = Dps + L.Row * kTcLdS + L.Col0;
    bf16 *Prow = Probs + L.Row * kTcLdP + L.Col0;
    for (int C = 0; C < 32; ++C) {
      const int Ci = L.Col0 + C;
      const int64_t I = I0 + Ci;
      const bool Seen = J < S && I < S && !(Causal && I < J);
      float G = 0.0f;
      if (Seen) {
        const float P = expf(Srow[C] * Scale - Mx[Ci]) * Inv[Ci];
        const float Mask =
            Dr.Rate > 0 ? float(attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J)) : 1.0f;
        G = Which == 2 ? P * Mask : P * (Drow[C] * Mask - Dl[Ci]) * Scale;
      }
      Prow[C] = __float2bfloat16_rn(G);
    }
    __syncwarp();
    tcAccumulate<D>(Acc, Probs, Which == 2 ? Dys : Qs);
  }
  __syncthreads();
  tcStoreAccumulators<D>(Acc, Scores, Bl, S, Hl, Out);
}

} // namespace cuda
} // namespace megac_rt

#endif // MEGAC_RT_CUDA_FLASH_TC_CUH
