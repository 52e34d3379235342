//===- flash_mma.cuh - Register-resident flash attention ------*- CUDA -*-===//
//
// Flash attention for bf16 plans in the manner of FlashAttention 2: the
// scores, probabilities and their gradients live in the accumulators of
// mma.sync (mma_sm80.cuh), whose layout puts each row in the four lanes of
// a group, so the softmax takes its row max and sum with two shuffles and
// hands the probabilities to the next product as bf16 registers. Nothing
// but the streamed tiles goes through shared memory, and those arrive by
// cp.async, the next tile's copy running under the current tile's
// products (double buffering).
//
// q, k, v and dy come as bf16: the copies their writers made, or packed
// once per attention by the runtime, which also checks that q, k and v
// held bf16 values. A block of
// 4 warps owns 64 rows, 16 per warp:
// - forward: 64 queries; y, and when asked each row's max and 1 / sum and
//   its delta = dy . y (the backward pass's statistics, in one pass);
// - dq: 64 queries over the key tiles (3 products a tile);
// - dk and dv together: 64 keys over the query tiles (4 products a tile),
//   half a query tile at a time to keep both accumulators in registers;
//   and dq in the same pass where asked (1 product a tile more, and
//   atomics), as FlashAttention 2 does, instead of dq's kernel.
// Probabilities and score gradients are rounded to bf16 for their
// products, as FlashAttention does; sums stay fp32.
//
// Included by cuda_kernels.cuh; builds with nvcc and with the emulation.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_FLASH_MMA_CUH
#define MEGAC_RT_CUDA_FLASH_MMA_CUH

#include "mma_sm80.cuh"

namespace megac_rt {
namespace cuda {

constexpr int kMmaRows = 64; // a block's rows and a streamed tile's
static_assert(kMmaRows == kFlashRows, "blocks are counted as flashBlock does");
constexpr int kMmaThreads = 128; // 4 warps of 16 rows
/// A bf16 tile's row stride: 16 bytes of padding put the 8 rows an
/// ldmatrix reads in different banks.
template <int D> constexpr int kMmaLd = D + 8;
/// Tiles of 64 rows, and the shared memory of each kernel.
template <int D> struct MmaShared {
  static constexpr size_t Tile = size_t(kMmaRows) * kMmaLd<D> * 2;
  static constexpr size_t Forward = 5 * Tile;   // q, 2 x (k, v)
  /// The forward pass with 2 row slices a warp: q's 128 rows, 2 x (k, v).
  static constexpr size_t WideForward = 6 * Tile;
  static constexpr size_t QueryGrad = 6 * Tile; // q, dy, 2 x (k, v)
  /// k and v (MT tiles each), 2 x (q, dy), 2 x the query rows' (max, 1 /
  /// sum, delta)
  __host__ __device__ static constexpr size_t keyGrad(int MT) {
    return (2 * MT + 4) * Tile + 2 * 3 * kMmaRows * 4;
  }
  /// The score gradients of a tile pair, keys by queries in bf16, where
  /// the key-gradient kernel also gives dq.
  __host__ __device__ static constexpr size_t scoreGrads(int MT) {
    return size_t(MT) * kMmaRows * (kMmaRows + 8) * 2;
  }
  __host__ __device__ static constexpr size_t allGrads(int MT) {
    return keyGrad(MT) + scoreGrads(MT);
  }
  static constexpr size_t KeyGrad = keyGrad(1);
  static constexpr size_t AllGrads = allGrads(1);
  /// The key-gradient kernels with two key slices a warp (head sizes up
  /// to 64).
  static constexpr size_t WideKeyGrad = keyGrad(2);
  static constexpr size_t WideAllGrads = allGrads(2);
  /// What the kernels a device may run take at most.
  static constexpr size_t most() {
    size_t M = AllGrads > WideForward ? AllGrads : WideForward;
    return D <= 64 && WideAllGrads > M ? WideAllGrads : M;
  }
  static constexpr size_t Most = most();
};

/// The i-th tile of a kernel's dynamic shared memory.
template <int D>
__device__ inline uint16_t *mmaTile(unsigned char *Smem, int I) {
  return reinterpret_cast<uint16_t *>(Smem + size_t(I) * MmaShared<D>::Tile);
}

/// Starts copying rows [R0, R0 + 64) of head (Bi, Hh) of the bf16 X into
/// Tile (zeros past S); every thread takes part. The caller commits.
template <int D>
__device__ __forceinline__ void mmaLoadTile(const uint16_t *X, int64_t Bi,
                                            int64_t Hh, int64_t S, int64_t Hl,
                                            int64_t R0, uint16_t *Tile) {
  constexpr int Chunks = D / 8; // 16 bytes each
  for (int C = threadIdx.x; C < kMmaRows * Chunks; C += kMmaThreads) {
    const int R = C / Chunks, E = (C % Chunks) * 8;
    uint16_t *To = Tile + R * kMmaLd<D> + E;
    if (R0 + R < S)
      cpAsync16(To, X + (Bi * S + R0 + R) * Hl + Hh * D + E);
    else
      *reinterpret_cast<Vec4<uint32_t> *>(To) = Vec4<uint32_t>{}; // one store
  }
}

/// Where a lane's accumulator elements sit: element E of fragment N is
/// row Row(E) of the warp's 16, column 8 N + Col(E) of the tile.
struct MmaLane {
  int Warp, G, T;
  __device__ int row(int E) const { return Warp * 16 + G + 8 * (E / 2); }
  __device__ int col(int N, int E) const { return 8 * N + 2 * T + E % 2; }
};
__device__ inline MmaLane mmaLane() {
  const int L = threadIdx.x % 32;
  return {int(threadIdx.x / 32), L / 4, L % 4};
}

/// Out[t] (the warp's 16 rows of X's t-th 64 rows, by NB x 8 columns) =
/// X Y^T over D, against Y's rows [N0, N0 + 8 NB), both bf16 tiles, for
/// the warp's MT row slices t in [First, Last) (the others left alone).
/// Each of Y's fragments is loaded once for all MT slices: with two, a
/// warp's products read half as much shared memory per FLOP, as
/// FlashAttention 2's forward pass (128 queries a block of 4 warps) does.
template <int D, int NB, int MT>
__device__ __forceinline__ void
mmaRowsByRowsOf(MmaC (&Out)[MT][NB], const uint16_t *X, const uint16_t *Y,
                int N0, int First = 0, int Last = MT) {
  constexpr int Ld = kMmaLd<D>;
  const int L = threadIdx.x % 32, M = L / 8, Warp = threadIdx.x / 32;
#pragma unroll
  for (int T = 0; T < MT; ++T)
#pragma unroll
    for (int N = 0; N < NB; ++N)
#pragma unroll
      for (int E = 0; E < 4; ++E)
        Out[T][N].R[E] = 0.0f;
  // This lane's row address in the x4 loads: A's matrices are (rows 0-7,
  // 8-15) x (columns 0-7, 8-15); B's two n blocks x two k halves.
  const uint16_t *ARow =
      X + (Warp * 16 + L % 8 + 8 * (M % 2)) * Ld + 8 * (M / 2);
  const uint16_t *BRow = Y + (N0 + L % 8 + 8 * (M / 2)) * Ld + 8 * (M % 2);
#pragma unroll
  for (int K = 0; K < D / 16; ++K) {
    MmaA A[MT];
#pragma unroll
    for (int T = 0; T < MT; ++T)
      if (T >= First && T < Last)
        ldmatrixX4<false>(A[T].R, ARow + T * kMmaRows * Ld + 16 * K);
#pragma unroll
    for (int N = 0; N < NB; N += 2) {
      uint32_t B[4];
      ldmatrixX4<false>(B, BRow + N * 8 * Ld + 16 * K);
#pragma unroll
      for (int T = 0; T < MT; ++T)
        if (T >= First && T < Last) {
          mmaBf16(Out[T][N], A[T], B[0], B[1]);
          mmaBf16(Out[T][N + 1], A[T], B[2], B[3]);
        }
    }
  }
}

/// Out (the warp's 16 rows by NB x 8 columns) = X Y^T over D: X's rows
/// [16 warp, +16) against Y's rows [N0, N0 + 8 NB), both bf16 tiles.
template <int D, int NB>
__device__ __forceinline__ void
mmaRowsByRows(MmaC (&Out)[NB], const uint16_t *X, const uint16_t *Y, int N0) {
  MmaC One[1][NB];
  mmaRowsByRowsOf<D, NB, 1>(One, X, Y, N0);
#pragma unroll
  for (int N = 0; N < NB; ++N)
    Out[N] = One[0][N];
}

/// Acc[t] (the warp's t-th row slice by 8 NB columns from N0) += P[t] Y:
/// P[t]'s KS slices of 16 columns (bf16 A fragments) by rows [K0, K0 +
/// 16 KS) of the bf16 tile Y, for the slices t in [First, Last); each of
/// Y's fragments loaded once for all of them.
template <int D, int KS, int NB, int MT>
__device__ __forceinline__ void
mmaAccumulateOf(MmaC (&Acc)[MT][NB], const MmaA (&P)[MT][KS], const uint16_t *Y,
                int K0, int N0 = 0, int First = 0, int Last = MT) {
  static_assert(NB % 2 == 0, "columns go in pairs of n blocks");
  constexpr int Ld = kMmaLd<D>;
  const int L = threadIdx.x % 32, M = L / 8;
  // Transposed loads: matrices (k 0-7, 8-15) x (n 0-7, 8-15).
  const uint16_t *BRow = Y + (K0 + L % 8 + 8 * (M % 2)) * Ld + N0 + 8 * (M / 2);
#pragma unroll
  for (int K = 0; K < KS; ++K)
#pragma unroll
    for (int N = 0; N < NB; N += 2) {
      uint32_t B[4];
      ldmatrixX4<true>(B, BRow + 16 * K * Ld + 8 * N);
#pragma unroll
      for (int T = 0; T < MT; ++T)
        if (T >= First && T < Last) {
          mmaBf16(Acc[T][N], P[T][K], B[0], B[1]);
          mmaBf16(Acc[T][N + 1], P[T][K], B[2], B[3]);
        }
    }
}

/// Acc (the warp's 16 rows by 8 NB columns from N0; all D by default)
/// += P Y: P's KS slices of 16 columns (bf16 A fragments) by rows [K0, K0
/// + 16 KS) of the bf16 tile Y.
template <int D, int KS, int NB = D / 8>
__device__ __forceinline__ void
mmaAccumulate(MmaC (&Acc)[NB], const MmaA (&P)[KS], const uint16_t *Y, int K0,
              int N0 = 0) {
  MmaC One[1][NB];
  MmaA POne[1][KS];
#pragma unroll
  for (int N = 0; N < NB; ++N)
    One[0][N] = Acc[N];
#pragma unroll
  for (int K = 0; K < KS; ++K)
    POne[0][K] = P[K];
  mmaAccumulateOf<D, KS, NB, 1>(One, POne, Y, K0, N0);
#pragma unroll
  for (int N = 0; N < NB; ++N)
    Acc[N] = One[0][N];
}

/// The A fragments of columns [16 K, 16 K + 16) of accumulators C: the
/// C layout of two n blocks is the A layout of one k slice.
template <int NB>
__device__ __forceinline__ void mmaToA(const MmaC (&C)[NB], MmaA (&A)[NB / 2]) {
#pragma unroll
  for (int K = 0; K < NB / 2; ++K) {
    A[K].R[0] = packBf16x2(C[2 * K].R[0], C[2 * K].R[1]);
    A[K].R[1] = packBf16x2(C[2 * K].R[2], C[2 * K].R[3]);
    A[K].R[2] = packBf16x2(C[2 * K + 1].R[0], C[2 * K + 1].R[1]);
    A[K].R[3] = packBf16x2(C[2 * K + 1].R[2], C[2 * K + 1].R[3]);
  }
}

/// e^X as 2^(X log2 e): the special-function unit's one instruction
/// (MUFU.EX2) and a multiply, where expf takes a dozen instructions; its
/// few ulp of error vanish in the bf16 rounding of the probabilities.
__device__ inline float mmaExp(float X) {
  return exp2f(X * 1.4426950408889634f);
}

/// The sum (or max) of a row over the 4 lanes of its group.
__device__ inline float groupSum(float V) {
  V += __shfl_xor_sync(0xffffffffu, V, 1);
  return V + __shfl_xor_sync(0xffffffffu, V, 2);
}
__device__ inline float groupMax(float V) {
  V = fmaxf(V, __shfl_xor_sync(0xffffffffu, V, 1));
  return fmaxf(V, __shfl_xor_sync(0xffffffffu, V, 2));
}

/// Calls Visit(N, E, At) for each element E of accumulator N (the warp's
/// 16 rows by D of head (Bi, Hh), from row Row0) whose row lies before S,
/// At being its index in a [B, S, Hl] tensor.
template <int D, class VisitFn>
__device__ __forceinline__ void
mmaForEachInRows(const FlashBlock &Bl, int64_t S, int64_t Hl, VisitFn Visit) {
  const MmaLane L = mmaLane();
#pragma unroll
  for (int N = 0; N < D / 8; ++N)
#pragma unroll
    for (int E = 0; E < 4; ++E) {
      const int64_t I = Bl.Row0 + L.row(E);
      if (I < S)
        Visit(N, E, (Bl.Bi * S + I) * Hl + Bl.Hh * D + L.col(N, E));
    }
}

/// Writes accumulators (the warp's 16 rows by D, each row divided by
/// Div[its half]) to rows Row0.. of head (Bi, Hh) of Out, as \p Store
/// stores (rounded to bf16 with a copy of the bits, where asked).
template <int D>
__device__ __forceinline__ void
mmaStoreRows(const MmaC (&Acc)[D / 8], const FlashBlock &Bl, int64_t S,
             int64_t Hl, const float (&Div)[2], float *Out,
             OutputStore Store = OutputStore{}) {
  mmaForEachInRows<D>(Bl, S, Hl, [&](int N, int E, int64_t At) {
    Store(Out, At, Acc[N].R[E] / Div[E / 2]);
  });
}

/// Streams the other side's tiles [0, Tiles) through two buffers: Load(T,
/// Buffer) starts tile T's copies, Use(T, Buffer) runs once they landed.
/// The copy of tile T + 1 overlaps the work on tile T.
template <class LoadFn, class UseFn>
__device__ __forceinline__ void mmaStream(int64_t Tiles, LoadFn Load,
                                          UseFn Use) {
  if (Tiles > 0)
    Load(0, 0);
  cpAsyncCommit();
  for (int64_t T = 0; T < Tiles; ++T) {
    if (T + 1 < Tiles) {
      Load(T + 1, int((T + 1) % 2));
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads(); // everyone's copies landed
    Use(T, int(T % 2));
    __syncthreads(); // the buffer is read before the copy after next
  }
}

/// Streams rows [First + 64 T, +64) of the bf16 X and Y, T in [0, Tiles),
/// through tiles Tile0 + 2 b and Tile0 + 1 + 2 b of the dynamic shared
/// memory (b = T % 2): Extra(I0, b) loads what else a tile needs (into
/// shared memory, read after the wait), and Use(I0, Xs, Ys, b) runs once
/// they landed, I0 being the tile's first row.
template <int D, class ExtraFn, class UseFn>
__device__ __forceinline__ void
mmaStreamPairs(const uint16_t *X, const uint16_t *Y, const FlashBlock &Bl,
               int64_t S, int64_t Hl, int64_t First, int64_t Tiles,
               unsigned char *Smem, int Tile0, ExtraFn Extra, UseFn Use) {
  auto Load = [&](int64_t T, int Buf) {
    const int64_t I0 = First + T * kMmaRows;
    mmaLoadTile<D>(X, Bl.Bi, Bl.Hh, S, Hl, I0,
                   mmaTile<D>(Smem, Tile0 + 2 * Buf));
    mmaLoadTile<D>(Y, Bl.Bi, Bl.Hh, S, Hl, I0,
                   mmaTile<D>(Smem, Tile0 + 1 + 2 * Buf));
    Extra(I0, Buf);
  };
  mmaStream(Tiles, Load, [&](int64_t T, int Buf) {
    Use(First + T * kMmaRows, mmaTile<D>(Smem, Tile0 + 2 * Buf),
        mmaTile<D>(Smem, Tile0 + 1 + 2 * Buf), Buf);
  });
}
/// For mmaStreamPairs: nothing else to load.
struct MmaNoExtra {
  __device__ void operator()(int64_t, int) const {}
};

/// P[0] += A and P[1] += B (\p P 8-byte aligned) with atomics: one
/// vector atomic on sm_90 and later, two scalar ones before (and on the
/// emulation).
__device__ __forceinline__ void atomicAddPair(float *P, float A, float B) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2 *>(P), make_float2(A, B));
#else
  atomicAdd(P, A);
  atomicAdd(P + 1, B);
#endif
}

/// Zeroed accumulators.
template <int NB> __device__ __forceinline__ void mmaZero(MmaC (&Acc)[NB]) {
#pragma unroll
  for (int N = 0; N < NB; ++N)
#pragma unroll
    for (int E = 0; E < 4; ++E)
      Acc[N].R[E] = 0.0f;
}

/// \p X clamped to [-64, 64]: a tile's offsets (0 to 63) and their sums
/// with another's compare with it as with X, in 32 bits (in 64-bit
/// indices the unrolled tests of a tile's elements kept registers the
/// products need).
__device__ inline int mmaOffsetBound(int64_t X) {
  return int(X < -kMmaRows ? -kMmaRows : X > kMmaRows ? kMmaRows : X);
}

/// Calls Visit(N, E, I, J, Seen) for each element E of score accumulator
/// N of a query block's tile of keys from J0: query I, key J, and whether
/// I sees J (both before S; with \p Causal, J not after I), worked out
/// on the lane's offsets in the tile (mmaOffsetBound).
template <class VisitFn>
__device__ __forceinline__ void mmaForEachScore(const FlashBlock &Bl,
                                                int64_t J0, int64_t S,
                                                int Causal, VisitFn Visit) {
  const MmaLane L = mmaLane();
  // Offset R sees offset C where R < Rows, C < Cols, and (causal) C <= R +
  // Diag.
  const int Rows = mmaOffsetBound(S - Bl.Row0), Cols = mmaOffsetBound(S - J0),
            Diag = Causal ? mmaOffsetBound(Bl.Row0 - J0) : kMmaRows;
#pragma unroll
  for (int N = 0; N < kMmaRows / 8; ++N)
#pragma unroll
    for (int E = 0; E < 4; ++E) {
      const int R = L.row(E), C = L.col(N, E);
      Visit(N, E, Bl.Row0 + R, J0 + C, R < Rows && C < Cols && C <= R + Diag);
    }
}

/// The block of 64 MT rows this block runs (its batch, head and first
/// row), and in \p Bl each of its MT slices of 64 rows as a block of 64
/// would see them.
template <int MT>
__device__ __forceinline__ FlashBlock mmaSlices(int64_t S, int64_t NH,
                                                FlashBlock (&Bl)[MT]) {
  const FlashBlock Block = flashBlock<kMmaRows * MT>(S, NH);
#pragma unroll
  for (int T = 0; T < MT; ++T)
    Bl[T] = {Block.Bi, Block.Hh, Block.Row0 + T * kMmaRows};
  return Block;
}

/// Key tiles a query block of \p Rows rows visits: up to its diagonal
/// when causal.
template <int Rows = kMmaRows>
__device__ inline int64_t mmaKeyTiles(const FlashBlock &Bl, int64_t S,
                                      int Causal) {
  const int64_t End = Causal ? (Bl.Row0 + Rows < S ? Bl.Row0 + Rows : S) : S;
  return (End + kMmaRows - 1) / kMmaRows;
}

/// y = softmax(scale q k^T) v over key tiles with the online softmax;
/// when given, each row's max and 1 / sum in Stats and its delta = dy . y
/// in Delta (dy as the bf16 the gradient kernels read, so that
/// sum_j p_ij (dp_ij - delta_i) = 0 holds for the values they use).
/// A block has 64 MT queries, each warp MT slices of 16 (rows 64 t + 16
/// warp): with MT = 2 a warp's products load each k and v fragment once
/// for 32 queries (mmaRowsByRowsOf). Each row's arithmetic is the same
/// whatever MT: a slice whose rows all come before a causal tile's keys
/// skips it, as a block of its own would not have visited it. Without
/// \p Dropout the kernel ignores Dr (its caller sees it has no rate) and
/// leaves out the mask's generator, whose registers the two slices'
/// scores need at head size 128.
template <int D, int MT = 1, bool Dropout = true>
__global__ void __launch_bounds__(kMmaThreads)
    flashForwardMmaKernel(const uint16_t *Q, const uint16_t *K,
                          const uint16_t *V, int64_t S, int64_t Hl, int64_t NH,
                          int Causal, float Scale, AttnDropout Dr, float *Y,
                          float *Stats, const uint16_t *DY, float *Delta,
                          OutputStore Store) {
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  uint16_t *Qs = mmaTile<D>(Smem, 0); // MT tiles of 64 rows
  FlashBlock Bl[MT];
  const FlashBlock Block = mmaSlices(S, NH, Bl);
#pragma unroll
  for (int T = 0; T < MT; ++T)
    mmaLoadTile<D>(Q, Block.Bi, Block.Hh, S, Hl, Bl[T].Row0,
                   mmaTile<D>(Smem, T)); // in the first group
  const MmaLane L = mmaLane();

  MmaC O[MT][D / 8];
  float M[MT][2], Sum[MT][2];
#pragma unroll
  for (int T = 0; T < MT; ++T) {
    mmaZero(O[T]);
    M[T][0] = M[T][1] = -INFINITY;
    Sum[T][0] = Sum[T][1] = 0.0f;
  }
  auto Use = [&](int64_t J0, const uint16_t *Ks, const uint16_t *Vs, int) {
    // Slices whose last row comes before the tile's first key (causal).
    int First = 0;
#pragma unroll
    for (int T = 0; T < MT - 1; ++T)
      First += Causal && J0 > Bl[T].Row0 + kMmaRows - 1;
    MmaC Sc[MT][kMmaRows / 8];
    mmaRowsByRowsOf<D, kMmaRows / 8, MT>(Sc, Qs, Ks, 0, First);
    MmaA P[MT][kMmaRows / 16];
#pragma unroll
    for (int T = 0; T < MT; ++T) {
      if (T < First)
        continue;
      float TileMax[2] = {-INFINITY, -INFINITY};
      mmaForEachScore(
          Bl[T], J0, S, Causal, [&](int N, int E, int64_t, int64_t, bool Seen) {
            Sc[T][N].R[E] = Seen ? Sc[T][N].R[E] * Scale : -INFINITY;
            TileMax[E / 2] = fmaxf(TileMax[E / 2], Sc[T][N].R[E]);
          });
      float Corr[2], TileSum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int H = 0; H < 2; ++H) {
        const float NewM = fmaxf(M[T][H], groupMax(TileMax[H]));
        Corr[H] = NewM == -INFINITY ? 1.0f : mmaExp(M[T][H] - NewM);
        M[T][H] = NewM;
      }
      mmaForEachScore(
          Bl[T], J0, S, Causal, [&](int N, int E, int64_t I, int64_t J, bool) {
            const float X = Sc[T][N].R[E];
            const float P = X == -INFINITY ? 0.0f : mmaExp(X - M[T][E / 2]);
            TileSum[E / 2] += P;
            Sc[T][N].R[E] =
                Dropout && Dr.Rate > 0 && P != 0.0f
                    ? float(double(P) *
                            attnMaskDev(Dr, Bl[T].Bi, Bl[T].Hh, S, I, J))
                    : P;
          });
#pragma unroll
      for (int H = 0; H < 2; ++H)
        Sum[T][H] = Sum[T][H] * Corr[H] + groupSum(TileSum[H]);
#pragma unroll
      for (auto &F : O[T])
#pragma unroll
        for (int E = 0; E < 4; ++E)
          F.R[E] *= Corr[E / 2];
      mmaToA(Sc[T], P[T]);
    }
    mmaAccumulateOf<D, kMmaRows / 16, D / 8, MT>(O, P, Vs, 0, 0, First);
  };
  mmaStreamPairs<D>(K, V, Block, S, Hl, 0,
                    mmaKeyTiles<kMmaRows * MT>(Block, S, Causal), Smem, MT,
                    MmaNoExtra(), Use);

#pragma unroll
  for (int T = 0; T < MT; ++T) {
    if (Y || Store.Bits) // (Y null: kept in bf16 alone, its bits only)
      mmaStoreRows<D>(O[T], Bl[T], S, Hl, Sum[T], Y, Store);
    if (Delta) { // dy . y per row: the lane's columns, then its group's
      float Dot[2] = {0.0f, 0.0f};
      mmaForEachInRows<D>(Bl[T], S, Hl, [&](int N, int E, int64_t At) {
        Dot[E / 2] += megac_bf16_value(DY[At]) * (O[T][N].R[E] / Sum[T][E / 2]);
      });
#pragma unroll
      for (int H = 0; H < 2; ++H) {
        const float Total = groupSum(Dot[H]);
        const int64_t I = Bl[T].Row0 + L.row(2 * H);
        if (I < S && L.T == 0)
          Delta[(Block.Bi * NH + Block.Hh) * S + I] = Total;
      }
    }
    if (Stats && L.T == 0)
#pragma unroll
      for (int H = 0; H < 2; ++H) {
        const int64_t I = Bl[T].Row0 + L.row(2 * H);
        if (I < S) {
          const int64_t Row = (Block.Bi * NH + Block.Hh) * S + I;
          Stats[2 * Row] = M[T][H];
          Stats[2 * Row + 1] = 1.0f / Sum[T][H];
        }
      }
  }
}

/// dq_i = scale sum_j p_ij (dp_ij - delta_i) k_j, dp_ij = (dy_i . v_j)
/// mask_ij, over key tiles.
template <int D>
__global__ void __launch_bounds__(kMmaThreads)
    flashQueryGradMmaKernel(const uint16_t *Q, const uint16_t *K,
                            const uint16_t *V, const uint16_t *DY, int64_t S,
                            int64_t Hl, int64_t NH, int Causal, float Scale,
                            AttnDropout Dr, const float *Stats,
                            const float *Delta, float *DQ, OutputStore Store) {
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  uint16_t *Qs = mmaTile<D>(Smem, 0), *Dys = mmaTile<D>(Smem, 1);
  const FlashBlock Bl = flashBlock(S, NH);
  const MmaLane L = mmaLane();
  mmaLoadTile<D>(Q, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Qs);
  mmaLoadTile<D>(DY, Bl.Bi, Bl.Hh, S, Hl, Bl.Row0, Dys);
  float Mx[2], Inv[2], Dl[2]; // the lane's two rows
#pragma unroll
  for (int H = 0; H < 2; ++H) {
    const int64_t I = Bl.Row0 + L.row(2 * H);
    const int64_t Row = (Bl.Bi * NH + Bl.Hh) * S + I;
    Mx[H] = I < S ? Stats[2 * Row] : 0.0f;
    Inv[H] = I < S ? Stats[2 * Row + 1] : 0.0f;
    Dl[H] = I < S ? Delta[Row] : 0.0f;
  }
  MmaC Acc[D / 8];
  mmaZero(Acc);
  auto Use = [&](int64_t J0, const uint16_t *Ks, const uint16_t *Vs, int) {
    MmaC Sc[kMmaRows / 8], Dp[kMmaRows / 8];
    mmaRowsByRows<D, kMmaRows / 8>(Sc, Qs, Ks, 0);
    mmaRowsByRows<D, kMmaRows / 8>(Dp, Dys, Vs, 0);
    mmaForEachScore(
        Bl, J0, S, Causal, [&](int N, int E, int64_t I, int64_t J, bool Seen) {
          float Ds = 0.0f;
          if (Seen) {
            const int H = E / 2;
            const float P = mmaExp(Sc[N].R[E] * Scale - Mx[H]) * Inv[H];
            const float Mask =
                Dr.Rate > 0 ? float(attnMaskDev(Dr, Bl.Bi, Bl.Hh, S, I, J))
                            : 1.0f;
            Ds = P * (Dp[N].R[E] * Mask - Dl[H]) * Scale;
          }
          Sc[N].R[E] = Ds;
        });
    MmaA Dsa[kMmaRows / 16];
    mmaToA(Sc, Dsa);
    mmaAccumulate<D, kMmaRows / 16>(Acc, Dsa, Ks, 0);
  };
  mmaStreamPairs<D>(K, V, Bl, S, Hl, 0, mmaKeyTiles(Bl, S, Causal), Smem, 2,
                    MmaNoExtra(), Use);
  const float One[2] = {1.0f, 1.0f};
  mmaStoreRows<D>(Acc, Bl, S, Hl, One, DQ, Store);
}

/// Per key row j, both dk_j = scale sum_i p_ij (dp_ij - delta_i) q_i and
/// dv_j = sum_i p_ij mask_ij dy_i, over query tiles. \p WithQuery: the
/// same pass also gives dq, as FlashAttention 2's does: each tile's score
/// gradients go through shared memory (keys by queries, the bf16 values
/// dk's product takes), and each warp adds its 16 queries' share of
/// ds k into the fp32 sums \p DQSum with atomics (zeroed before; the
/// caller stores dq from them). One tile product a tile pair for dq,
/// where the query-gradient kernel takes three, at the price of the order
/// of those sums, which varies from run to run.
/// A block has 64 MT keys, each warp MT slices of 16 (rows 64 t + 16
/// warp), whose products share each q and dy fragment they load (as the
/// forward's slices share k and v): dk and dv come out the same bit for
/// bit whatever MT; dq's sums gather a block's keys before their atomic
/// add, so its order of sums differs. Two slices need the registers of
/// two slices' dk and dv: head sizes up to 64.
template <int D, bool WithQuery = false, int MT = 1>
__global__ void __launch_bounds__(kMmaThreads)
    flashKeyGradMmaKernel(const uint16_t *Q, const uint16_t *K,
                          const uint16_t *V, const uint16_t *DY, int64_t S,
                          int64_t Hl, int64_t NH, int Causal, float Scale,
                          AttnDropout Dr, const float *Stats,
                          const float *Delta, float *DK, float *DV,
                          OutputStore StoreK, OutputStore StoreV,
                          float *DQSum) {
  using Sh = MmaShared<D>;
  MEGAC_DYNAMIC_SHARED(unsigned char, Smem);
  // k's MT tiles, v's, then two buffers of (q, dy) from tile 2 MT.
  uint16_t *Ks = mmaTile<D>(Smem, 0), *Vs = mmaTile<D>(Smem, MT);
  float *Rows =
      reinterpret_cast<float *>(Smem + (2 * MT + 4) * Sh::Tile); // [2][3][64]
  // [64 MT keys][64 queries + 8]: rows 16-byte aligned for ldmatrix.
  constexpr int LdS = kMmaRows + 8;
  uint16_t *DsT = reinterpret_cast<uint16_t *>(Smem + Sh::keyGrad(MT));
  FlashBlock Bl[MT];
  const FlashBlock Block = mmaSlices(S, NH, Bl);
#pragma unroll
  for (int T = 0; T < MT; ++T) {
    mmaLoadTile<D>(K, Block.Bi, Block.Hh, S, Hl, Bl[T].Row0,
                   mmaTile<D>(Smem, T));
    mmaLoadTile<D>(V, Block.Bi, Block.Hh, S, Hl, Bl[T].Row0,
                   mmaTile<D>(Smem, MT + T));
  }
  const MmaLane L = mmaLane();
  const int64_t RowBase = (Block.Bi * NH + Block.Hh) * S;
  MmaC Dk[MT][D / 8], Dv[MT][D / 8];
#pragma unroll
  for (int T = 0; T < MT; ++T) {
    mmaZero(Dk[T]);
    mmaZero(Dv[T]);
  }
  // Causal: only queries at or after the block's first key see its keys.
  const int64_t First = Causal ? Block.Row0 : 0;
  auto LoadRows = [&](int64_t I0, int Buf) {
    float *R = Rows + Buf * 3 * kMmaRows; // plain loads, read after the wait
    for (int C = threadIdx.x; C < kMmaRows; C += kMmaThreads) {
      const bool In = I0 + C < S;
      R[C] = In ? Stats[2 * (RowBase + I0 + C)] : 0.0f;
      R[kMmaRows + C] = In ? Stats[2 * (RowBase + I0 + C) + 1] : 0.0f;
      R[2 * kMmaRows + C] = In ? Delta[RowBase + I0 + C] : 0.0f;
    }
  };
  auto Use = [&](int64_t I0, const uint16_t *Qs, const uint16_t *Dys, int Buf) {
    const float *Mx = Rows + Buf * 3 * kMmaRows, *Inv = Mx + kMmaRows,
                *Dl = Inv + kMmaRows;
    constexpr int Half = kMmaRows / 2; // queries a pass takes
    // Key offset R of slice t sees query offset C where R < Keys[t], C <
    // Queries and (causal) R <= C + Diag[t] (mmaOffsetBound).
    int Keys[MT], Diag[MT];
    const int Queries = mmaOffsetBound(S - I0);
    // Slices whose first key comes after the tile's last query (causal)
    // see none of its queries: they skip it, as a block of their own
    // would not have visited it (nor do their score gradients reach dq).
    int Last = MT;
#pragma unroll
    for (int T = 0; T < MT; ++T) {
      Keys[T] = mmaOffsetBound(S - Bl[T].Row0);
      Diag[T] = Causal ? mmaOffsetBound(I0 - Bl[T].Row0) : kMmaRows;
      if (Causal && Last == MT && Bl[T].Row0 > I0 + kMmaRows - 1)
        Last = T;
    }
    for (int C0 = 0; C0 < kMmaRows; C0 += Half) {
      MmaC St[MT][Half / 8], Dpt[MT][Half / 8]; // s^T, dp^T: keys by queries
      mmaRowsByRowsOf<D, Half / 8, MT>(St, Ks, Qs, C0, 0, Last);
      mmaRowsByRowsOf<D, Half / 8, MT>(Dpt, Vs, Dys, C0, 0, Last);
      MmaA Pa[MT][Half / 16], Dsa[MT][Half / 16];
#pragma unroll
      for (int T = 0; T < MT; ++T) {
        if (T >= Last)
          break;
#pragma unroll
        for (int N = 0; N < Half / 8; ++N)
#pragma unroll
          for (int E = 0; E < 4; ++E) {
            const int Ci = C0 + L.col(N, E), R = L.row(E);
            float Pd = 0.0f, Ds = 0.0f;
            if (R < Keys[T] && Ci < Queries && R <= Ci + Diag[T]) {
              const int64_t J = Bl[T].Row0 + R, I = I0 + Ci;
              const float P = mmaExp(St[T][N].R[E] * Scale - Mx[Ci]) * Inv[Ci];
              const float Mask =
                  Dr.Rate > 0
                      ? float(attnMaskDev(Dr, Block.Bi, Block.Hh, S, I, J))
                      : 1.0f;
              Pd = P * Mask;
              Ds = P * (Dpt[T][N].R[E] * Mask - Dl[Ci]) * Scale;
            }
            St[T][N].R[E] = Pd;
            Dpt[T][N].R[E] = Ds;
          }
        mmaToA(St[T], Pa[T]);
        mmaToA(Dpt[T], Dsa[T]);
      }
      mmaAccumulateOf<D, Half / 16, D / 8, MT>(Dv, Pa, Dys, C0, 0, 0, Last);
      mmaAccumulateOf<D, Half / 16, D / 8, MT>(Dk, Dsa, Qs, C0, 0, 0, Last);
      if constexpr (WithQuery) { // the A fragments' pairs: rows G, G + 8
#pragma unroll
        for (int T = 0; T < MT; ++T)
#pragma unroll
          for (int Kk = 0; Kk < Half / 16; ++Kk) {
            if (T >= Last)
              break;
            uint16_t *At =
                DsT + (T * kMmaRows + L.row(0)) * LdS + C0 + 16 * Kk + 2 * L.T;
            *reinterpret_cast<uint32_t *>(At) = Dsa[T][Kk].R[0];
            *reinterpret_cast<uint32_t *>(At + 8 * LdS) = Dsa[T][Kk].R[1];
            *reinterpret_cast<uint32_t *>(At + 8) = Dsa[T][Kk].R[2];
            *reinterpret_cast<uint32_t *>(At + 8 * LdS + 8) = Dsa[T][Kk].R[3];
          }
      }
    }
    if constexpr (WithQuery) {
      __syncthreads(); // every warp's score gradients are in DsT
      // Warp w: queries [16 w, 16 w + 16) of the tile by all 64 MT keys,
      // as A fragments read transposed from DsT (keys by queries), a
      // slice of 16 keys at a time (again for each chunk of columns:
      // registers are what the head-128 kernel lacks, not shared-memory
      // bandwidth).
      const int Lane = threadIdx.x % 32, M = Lane / 8;
      const uint16_t *ARow =
          DsT + (8 * (M / 2) + Lane % 8) * LdS + 16 * L.Warp + 8 * (M % 2);
      constexpr int Chunk = 32; // columns a pass takes: 4 accumulators
      // Not unrolled: unrolled, the head-128 kernel spilled 40 bytes a
      // thread on sm_90 (255 registers); rolled it takes 238 and none.
#pragma unroll 1
      for (int N0 = 0; N0 < D; N0 += Chunk) {
        MmaC Dq[Chunk / 8];
        mmaZero(Dq);
#pragma unroll
        for (int Kk = 0; Kk < MT * kMmaRows / 16; ++Kk) {
          if (Kk >= Last * kMmaRows / 16) // (the slices that skipped it)
            break;
          MmaA DsQ[1];
          ldmatrixX4<true>(DsQ[0].R, ARow + 16 * Kk * LdS);
          mmaAccumulate<D, 1, Chunk / 8>(Dq, DsQ, Ks, 16 * Kk, N0);
        }
#pragma unroll
        for (int N = 0; N < Chunk / 8; ++N)
#pragma unroll
          for (int E = 0; E < 4; E += 2) { // a row's two adjacent columns
            const int64_t I = I0 + L.row(E);
            if (I < S)
              atomicAddPair(DQSum + (Block.Bi * S + I) * Hl + Block.Hh * D +
                                N0 + L.col(N, E),
                            Dq[N].R[E], Dq[N].R[E + 1]);
          }
      }
    }
  };
  const int64_t Tiles = First < S ? (S - First + kMmaRows - 1) / kMmaRows : 0;
  mmaStreamPairs<D>(Q, DY, Block, S, Hl, First, Tiles, Smem, 2 * MT, LoadRows,
                    Use);
  const float One[2] = {1.0f, 1.0f};
#pragma unroll
  for (int T = 0; T < MT; ++T) {
    mmaStoreRows<D>(Dk[T], Bl[T], S, Hl, One, DK, StoreK);
    mmaStoreRows<D>(Dv[T], Bl[T], S, Hl, One, DV, StoreV);
  }
}

/// delta_i = dy_i . y_i per query row from the forward's stored output y
/// (fp32, or the bf16 bits of a y kept in bf16 alone) and dy as the bf16
/// the gradient kernels read: what they take when the forward kept its
/// rows' statistics, in place of a forward pass of their own. One warp a
/// row; every warp of a block runs the same iterations (its shuffles).
template <class TY>
__global__ void attentionDeltaFromOutputKernel(const uint16_t *DY, const TY *Y,
                                               int64_t B, int64_t S, int64_t Hl,
                                               int64_t NH, int64_t D,
                                               float *Delta) {
  const int64_t Rows = B * NH * S, PerBlock = blockDim.x / 32;
  const int Lane = int(threadIdx.x % 32);
  for (int64_t Row0 = blockIdx.x * PerBlock; Row0 < Rows;
       Row0 += int64_t(gridDim.x) * PerBlock) {
    const int64_t Row = Row0 + threadIdx.x / 32;
    float Acc = 0.0f;
    if (Row < Rows) {
      const int64_t I = Row % S, Hh = Row / S % NH, Bi = Row / S / NH;
      const int64_t Base = (Bi * S + I) * Hl + Hh * D;
      for (int64_t E = Lane; E < D; E += 32)
        Acc += megac_bf16_value(DY[Base + E]) * valueOf(Y[Base + E]);
    }
#pragma unroll
    for (int O = 16; O > 0; O /= 2)
      Acc += __shfl_xor_sync(0xffffffffu, Acc, O);
    if (Row < Rows && Lane == 0)
      Delta[Row] = Acc;
  }
}

} // namespace cuda
} // namespace megac_rt

#endif // MEGAC_RT_CUDA_FLASH_MMA_CUH
