//===- MmaEmuTest.cpp - The emulated tensor-core layouts, pinned ---------===//
//
// The register-resident attention (flash_mma.cuh) runs in CI on the host
// emulation of mma.sync and ldmatrix (mma_sm80.cuh). Kernel and emulation
// could share one misreading of the PTX ISA and still agree with each
// other; these tests pin both to the ISA's tables ("Matrix fragments for
// mma.m16n8k16 with floating point type"), written out below on their own
// rather than taken from either:
//   A: element I (0..7) of lane L = 4 G + T sits at row G + 8 ((I / 2) % 2),
//      column 2 T + I % 2 + 8 (I / 4);
//   B: element I (0..3) at k = 2 T + I % 2 + 8 (I / 2), n = G;
//   C: element I (0..3) at row G + 8 (I / 2), column 2 T + I % 2;
// two bf16 to a register, the lower-numbered element in the low half.
// Also the register-resident attention kernels against each other under
// the emulation's schedules, and its guard after dynamic shared memory.
//
//===----------------------------------------------------------------------===//

#include "cuda_api.h"
#include "cuda_kernels.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace megac_rt;
using namespace megac_rt::cuda;

namespace {

std::pair<int, int> aElement(int L, int I) {
  return {L / 4 + 8 * ((I / 2) % 2), 2 * (L % 4) + I % 2 + 8 * (I / 4)};
}
std::pair<int, int> bElement(int L, int I) { // (k, n)
  return {2 * (L % 4) + I % 2 + 8 * (I / 2), L / 4};
}
std::pair<int, int> cElement(int L, int I) {
  return {L / 4 + 8 * (I / 2), 2 * (L % 4) + I % 2};
}
uint16_t half(uint32_t R, int I) {
  return uint16_t(I % 2 ? R >> 16 : R & 0xffffu);
}
uint16_t bits(float F) { return __float2bfloat16_rn(F).Bits; }

/// Runs \p Body on one warp (one block of 32 threads) with \p Shared bytes
/// of dynamic shared memory, and waits for it.
template <class Fn> void onOneWarp(size_t Shared, Fn Body) {
  cudaStream_t S;
  ASSERT_EQ(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking), cudaSuccess);
  megac_emu::launch({1, 1, 1}, {32, 1, 1}, Shared, S, Body);
  ASSERT_EQ(cudaStreamSynchronize(S), cudaSuccess);
  cudaStreamDestroy(S);
}

/// A 16 x 16 bf16 tile of distinct values, row stride Ld: bits 100 r + c.
constexpr int kLd = 24; // 48 bytes: rows 16-byte aligned, as ldmatrix needs
void fillIndexTile(uint16_t *Tile) {
  for (int R = 0; R < 16; ++R)
    for (int C = 0; C < 16; ++C)
      Tile[R * kLd + C] = uint16_t(100 * R + C);
}

TEST(MmaEmu, LdmatrixGivesTheAFragment) {
  // The row each lane names, as mmaRowsByRows does for its A operand.
  std::vector<uint32_t> Got(32 * 4);
  uint32_t *Out = Got.data();
  onOneWarp(16 * kLd * 2, [=] {
    MEGAC_DYNAMIC_SHARED(uint16_t, Tile);
    const int L = threadIdx.x;
    if (L == 0)
      fillIndexTile(Tile);
    __syncthreads();
    uint32_t R[4];
    ldmatrixX4<false>(R,
                      Tile + (L % 8 + 8 * ((L / 8) % 2)) * kLd + 8 * (L / 16));
    std::memcpy(Out + 4 * L, R, sizeof R);
  });
  for (int L = 0; L < 32; ++L)
    for (int I = 0; I < 8; ++I) {
      const auto [Row, Col] = aElement(L, I);
      EXPECT_EQ(half(Got[4 * L + I / 2], I), 100 * Row + Col)
          << "lane " << L << " element " << I;
    }
}

TEST(MmaEmu, LdmatrixGivesBFragmentsOfRowsAndOfColumns) {
  // Y stored by n (keys: rows n, columns k), read plainly, and stored by
  // k (values: rows k, columns n), read transposed: registers 0-1 are
  // the B fragment of n block 0, 2-3 of n block 1.
  std::vector<uint32_t> Got(32 * 8);
  uint32_t *Out = Got.data();
  onOneWarp(16 * kLd * 2, [=] {
    MEGAC_DYNAMIC_SHARED(uint16_t, Tile);
    const int L = threadIdx.x, M = L / 8;
    if (L == 0)
      fillIndexTile(Tile);
    __syncthreads();
    uint32_t ByN[4], ByK[4];
    ldmatrixX4<false>(ByN, Tile + (L % 8 + 8 * (M / 2)) * kLd + 8 * (M % 2));
    ldmatrixX4<true>(ByK, Tile + (L % 8 + 8 * (M % 2)) * kLd + 8 * (M / 2));
    std::memcpy(Out + 8 * L, ByN, sizeof ByN);
    std::memcpy(Out + 8 * L + 4, ByK, sizeof ByK);
  });
  for (int L = 0; L < 32; ++L)
    for (int Nb = 0; Nb < 2; ++Nb)
      for (int I = 0; I < 4; ++I) {
        const auto [K, N] = bElement(L, I);
        const uint32_t RegN = Got[8 * L + 2 * Nb + I / 2];
        const uint32_t RegK = Got[8 * L + 4 + 2 * Nb + I / 2];
        EXPECT_EQ(half(RegN, I), 100 * (8 * Nb + N) + K)
            << "stored by n: lane " << L << " n block " << Nb << " element "
            << I;
        EXPECT_EQ(half(RegK, I), 100 * K + 8 * Nb + N)
            << "stored by k: lane " << L << " n block " << Nb << " element "
            << I;
      }
}

TEST(MmaEmu, MmaMultipliesFragmentsLaidOutByTheIsa) {
  // Small integers: exact in bf16 and in fp32 sums.
  auto A = [](int R, int K) { return float((R * 3 + K * 5) % 7 - 3); };
  auto B = [](int K, int N) { return float((K * 2 + N * 3) % 5 - 2); };
  auto C0 = [](int R, int N) { return float(R - N); };
  std::vector<float> Got(32 * 4);
  float *Out = Got.data();
  onOneWarp(0, [=] {
    const int L = threadIdx.x;
    uint16_t Ae[8], Be[4];
    for (int I = 0; I < 8; ++I) {
      const auto [R, K] = aElement(L, I);
      Ae[I] = bits(A(R, K));
    }
    for (int I = 0; I < 4; ++I) {
      const auto [K, N] = bElement(L, I);
      Be[I] = bits(B(K, N));
    }
    MmaA Af;
    for (int J = 0; J < 4; ++J)
      Af.R[J] = uint32_t(Ae[2 * J]) | uint32_t(Ae[2 * J + 1]) << 16;
    MmaC Cf;
    for (int I = 0; I < 4; ++I) {
      const auto [R, N] = cElement(L, I);
      Cf.R[I] = C0(R, N);
    }
    mmaBf16(Cf, Af, uint32_t(Be[0]) | uint32_t(Be[1]) << 16,
            uint32_t(Be[2]) | uint32_t(Be[3]) << 16);
    std::memcpy(Out + 4 * L, Cf.R, sizeof Cf.R);
  });
  for (int L = 0; L < 32; ++L)
    for (int I = 0; I < 4; ++I) {
      const auto [R, N] = cElement(L, I);
      float Want = C0(R, N);
      for (int K = 0; K < 16; ++K)
        Want += A(R, K) * B(K, N);
      EXPECT_EQ(Got[4 * L + I], Want) << "lane " << L << " element " << I;
    }
}

TEST(MmaEmu, AttentionProductsMatchAReferenceProduct) {
  // The flash kernels' two products on one warp, head size 16: scores =
  // X Y^T (mmaRowsByRows), then acc = P Z with P the scores as bf16 A
  // fragments (mmaToA, mmaAccumulate), against products taken here.
  constexpr int D = 16, Ld = kMmaLd<D>;
  auto X = [](int R, int C) { return float((R + 2 * C) % 5 - 2); };
  auto Y = [](int R, int C) { return float((3 * R + C) % 4 - 1); };
  auto Z = [](int R, int C) { return float((R * C) % 3 - 1); };
  std::vector<float> Scores(32 * 8), Acc(32 * 8);
  float *SOut = Scores.data(), *AOut = Acc.data();
  onOneWarp(3 * 16 * Ld * 2, [=] {
    MEGAC_DYNAMIC_SHARED(uint16_t, Smem);
    uint16_t *Xs = Smem, *Ys = Smem + 16 * Ld, *Zs = Smem + 32 * Ld;
    const int L = threadIdx.x;
    if (L == 0)
      for (int R = 0; R < 16; ++R)
        for (int C = 0; C < D; ++C) {
          Xs[R * Ld + C] = bits(X(R, C));
          Ys[R * Ld + C] = bits(Y(R, C));
          Zs[R * Ld + C] = bits(Z(R, C));
        }
    __syncthreads();
    MmaC S[2];
    mmaRowsByRows<D, 2>(S, Xs, Ys, 0);
    MmaA P[1];
    mmaToA(S, P);
    MmaC O[D / 8];
    mmaZero(O);
    mmaAccumulate<D, 1>(O, P, Zs, 0);
    for (int N = 0; N < 2; ++N) {
      std::memcpy(SOut + 8 * L + 4 * N, S[N].R, sizeof S[N].R);
      std::memcpy(AOut + 8 * L + 4 * N, O[N].R, sizeof O[N].R);
    }
  });
  float Ref[16][16], Out[16][16];
  for (int R = 0; R < 16; ++R)
    for (int N = 0; N < 16; ++N) {
      Ref[R][N] = 0;
      for (int K = 0; K < D; ++K)
        Ref[R][N] += X(R, K) * Y(N, K);
    }
  for (int R = 0; R < 16; ++R)
    for (int N = 0; N < D; ++N) {
      Out[R][N] = 0;
      for (int K = 0; K < 16; ++K) // the scores are small integers: exact
        Out[R][N] += Ref[R][K] * Z(K, N);
    }
  for (int L = 0; L < 32; ++L)
    for (int N = 0; N < 2; ++N)
      for (int I = 0; I < 4; ++I) {
        const auto [R, C] = cElement(L, I);
        EXPECT_EQ(Scores[8 * L + 4 * N + I], Ref[R][8 * N + C])
            << "score lane " << L << " n block " << N << " element " << I;
        EXPECT_EQ(Acc[8 * L + 4 * N + I], Out[R][8 * N + C])
            << "product lane " << L << " n block " << N << " element " << I;
      }
}

/// Runs a register-resident attention kernel's \p Body over \p Blocks
/// blocks of kMmaThreads threads with \p Shared bytes of dynamic shared
/// memory, and waits for it.
template <class Fn> void onMmaBlocks(int64_t Blocks, size_t Shared, Fn Body) {
  cudaStream_t St;
  ASSERT_EQ(cudaStreamCreateWithFlags(&St, cudaStreamNonBlocking), cudaSuccess);
  megac_emu::launch({unsigned(Blocks), 1, 1}, {unsigned(kMmaThreads), 1, 1},
                    Shared, St, Body);
  ASSERT_EQ(cudaStreamSynchronize(St), cudaSuccess);
  cudaStreamDestroy(St);
}

/// q, k, v and dy of \p N elements each: bf16 values drawn from the
/// standard normal.
using AttentionInputs = std::array<std::vector<uint16_t>, 4>;
AttentionInputs randomAttentionInputs(std::mt19937 &Gen, int64_t N) {
  std::normal_distribution<float> Normal(0.0f, 1.0f);
  AttentionInputs In;
  for (auto &X : In)
    for (int64_t I = 0; I < N; ++I)
      X.push_back(bits(Normal(Gen)));
  return In;
}

TEST(MmaEmu, KeyGradPassGivesTheQueryGradientToo) {
  // dq summed with atomics in dk and dv's pass (flashKeyGradMmaKernel
  // with WithQuery) against dq's own kernel and a double-precision
  // reference, over 150 positions (three key blocks, the last partial,
  // so a query tile's dq gathers several blocks' sums), causal or not;
  // and all four kernels the same with cp.async copies landing late, and
  // with the threads run in reverse.
  constexpr int D = 32;
  const int64_t B = 1, S = 150, NH = 2, Hl = NH * D, N = B * S * Hl;
  const int64_t Blocks = B * NH * ((S + kMmaRows - 1) / kMmaRows);
  const float Scale = 1.0f / std::sqrt(float(D));
  std::mt19937 Gen(7);
  const AttentionInputs In = randomAttentionInputs(Gen, N);
  auto Value = [&](int T, int64_t I, int64_t H, int64_t E) {
    return double(megac_bf16_value(In[T][I * Hl + H * D + E]));
  };
  // Every output of the three backward kernels (and the forward's
  // statistics they read), for the causal mask or not.
  struct Outputs {
    std::vector<float> Y, Stats, Delta, Dq, Dk, Dv, DkAll, DvAll, Sums;
    bool operator==(const Outputs &O) const {
      return Y == O.Y && Stats == O.Stats && Delta == O.Delta && Dq == O.Dq &&
             Dk == O.Dk && Dv == O.Dv && DkAll == O.DkAll && DvAll == O.DvAll &&
             Sums == O.Sums;
    }
  };
  auto runAll = [&](int Causal) {
    Outputs O{
        std::vector<float>(N),          std::vector<float>(2 * B * NH * S),
        std::vector<float>(B * NH * S), std::vector<float>(N),
        std::vector<float>(N),          std::vector<float>(N),
        std::vector<float>(N),          std::vector<float>(N),
        std::vector<float>(N, 0.0f)};
    const uint16_t *Q = In[0].data(), *K = In[1].data(), *V = In[2].data(),
                   *DY = In[3].data();
    float *Yp = O.Y.data(), *Stp = O.Stats.data(), *Dlp = O.Delta.data(),
          *Dqp = O.Dq.data(), *Dkp = O.Dk.data(), *Dvp = O.Dv.data(),
          *DkAllp = O.DkAll.data(), *DvAllp = O.DvAll.data(),
          *Sump = O.Sums.data();
    onMmaBlocks(Blocks, MmaShared<D>::Forward, [=] {
      flashForwardMmaKernel<D>(Q, K, V, S, Hl, NH, Causal, Scale, AttnDropout{},
                               Yp, Stp, DY, Dlp, OutputStore{});
    });
    onMmaBlocks(Blocks, MmaShared<D>::QueryGrad, [=] {
      flashQueryGradMmaKernel<D>(Q, K, V, DY, S, Hl, NH, Causal, Scale,
                                 AttnDropout{}, Stp, Dlp, Dqp, OutputStore{});
    });
    onMmaBlocks(Blocks, MmaShared<D>::KeyGrad, [=] {
      flashKeyGradMmaKernel<D>(Q, K, V, DY, S, Hl, NH, Causal, Scale,
                               AttnDropout{}, Stp, Dlp, Dkp, Dvp, OutputStore{},
                               OutputStore{}, nullptr);
    });
    onMmaBlocks(Blocks, MmaShared<D>::AllGrads, [=] {
      flashKeyGradMmaKernel<D, true>(Q, K, V, DY, S, Hl, NH, Causal, Scale,
                                     AttnDropout{}, Stp, Dlp, DkAllp, DvAllp,
                                     OutputStore{}, OutputStore{}, Sump);
    });
    return O;
  };
  for (int Causal : {1, 0}) {
    const Outputs O = runAll(Causal);
    // cp.async copies landing only when the kernels wait for them (the
    // latest a GPU may land them) change nothing: each tile is waited for
    // before it is read, and read before it is overwritten.
    emu_mma::copiesLandLate() = true;
    const Outputs Late = runAll(Causal);
    emu_mma::copiesLandLate() = false;
    EXPECT_TRUE(O == Late) << "causal " << Causal;
    // Nor do a block's threads running last to first between barriers:
    // no thread reads shared memory another writes without a barrier
    // between the two.
    megac_emu::threadsInReverse() = true;
    const Outputs Reversed = runAll(Causal);
    megac_emu::threadsInReverse() = false;
    EXPECT_TRUE(O == Reversed) << "causal " << Causal;
    const std::vector<float> &Dq = O.Dq, &Dk = O.Dk, &Dv = O.Dv,
                             &DkAll = O.DkAll, &DvAll = O.DvAll, &Sums = O.Sums;
    // dk and dv: the same pass, the same bits.
    EXPECT_EQ(Dk, DkAll) << "causal " << Causal;
    EXPECT_EQ(Dv, DvAll) << "causal " << Causal;
    // dq in double: softmax rows, dp = dy v^T, ds = p (dp - dy . y).
    double Err = 0, Ref2 = 0, KernelErr = 0;
    for (int64_t H = 0; H < NH; ++H)
      for (int64_t I = 0; I < S; ++I) {
        const int64_t Last = Causal ? I : S - 1;
        std::vector<double> P(Last + 1), Dp(Last + 1);
        double Max = -INFINITY, Sum = 0, DeltaI = 0;
        for (int64_t J = 0; J <= Last; ++J) {
          P[J] = 0;
          for (int64_t E = 0; E < D; ++E)
            P[J] += Value(0, I, H, E) * Value(1, J, H, E) * Scale;
          Max = std::max(Max, P[J]);
        }
        for (int64_t J = 0; J <= Last; ++J)
          Sum += P[J] = std::exp(P[J] - Max);
        for (int64_t J = 0; J <= Last; ++J) {
          P[J] /= Sum;
          Dp[J] = 0;
          for (int64_t E = 0; E < D; ++E)
            Dp[J] += Value(3, I, H, E) * Value(2, J, H, E);
          DeltaI += P[J] * Dp[J];
        }
        for (int64_t E = 0; E < D; ++E) {
          double Want = 0;
          for (int64_t J = 0; J <= Last; ++J)
            Want += P[J] * (Dp[J] - DeltaI) * Scale * Value(1, J, H, E);
          const int64_t At = I * Hl + H * D + E;
          Err += (Sums[At] - Want) * (Sums[At] - Want);
          KernelErr += (Sums[At] - Dq[At]) * (Sums[At] - Dq[At]);
          Ref2 += Want * Want;
        }
      }
    // The score gradients are rounded to bf16 for their products (as in
    // FlashAttention): within bf16's precision of the exact dq; against
    // dq's own kernel, which rounds the same values, only the order of
    // fp32 sums differs.
    EXPECT_LT(std::sqrt(Err / Ref2), 1e-2) << "causal " << Causal;
    EXPECT_LT(std::sqrt(KernelErr / Ref2), 1e-6) << "causal " << Causal;
  }
}

/// The forward kernel with two row slices a warp (blocks of 128
/// queries) against the one with one (blocks of 64), at head size \p D:
/// y (rounded, with its bits), each row's statistics and delta the same
/// bit for bit, causal or not, at lengths that leave the last block of
/// 128 partly or wholly past S (a second slice with no rows at all); and
/// the wide kernel the same with its copies landing late and its
/// threads run in reverse. With \p Dropout (the kernel the backend runs
/// at head sizes up to 64) also with a dropout mask.
template <int D, bool Dropout> void expectWideForwardLikeNarrow() {
  const int64_t B = 2, NH = 2, Hl = NH * D;
  std::mt19937 Gen(11);
  const float Scale = 1.0f / std::sqrt(float(D));
  for (int64_t S : {int64_t(40), int64_t(150), int64_t(200)}) {
    const int64_t N = B * S * Hl, Rows = B * NH * S;
    const AttentionInputs In = randomAttentionInputs(Gen, N);
    struct Outputs {
      std::vector<float> Y, Stats, Delta;
      std::vector<uint16_t> Bits;
      bool operator==(const Outputs &O) const {
        return Y == O.Y && Stats == O.Stats && Delta == O.Delta &&
               Bits == O.Bits;
      }
    };
    auto run = [&](int MT, int Causal, const AttnDropout &Dr) {
      const float Unset = std::nanf("");
      Outputs O{std::vector<float>(N, Unset),
                std::vector<float>(2 * Rows, Unset),
                std::vector<float>(Rows, Unset), std::vector<uint16_t>(N, 1)};
      const uint16_t *Q = In[0].data(), *K = In[1].data(), *V = In[2].data(),
                     *DY = In[3].data();
      float *Yp = O.Y.data(), *Stp = O.Stats.data(), *Dlp = O.Delta.data();
      const OutputStore Store{1, O.Bits.data()};
      const int64_t BlockRows = kMmaRows * MT;
      const int64_t Blocks = B * NH * ((S + BlockRows - 1) / BlockRows);
      if (MT == 1)
        onMmaBlocks(Blocks, MmaShared<D>::Forward, [=] {
          flashForwardMmaKernel<D>(Q, K, V, S, Hl, NH, Causal, Scale, Dr, Yp,
                                   Stp, DY, Dlp, Store);
        });
      else
        onMmaBlocks(Blocks, MmaShared<D>::WideForward, [=] {
          flashForwardMmaKernel<D, 2, Dropout>(
              Q, K, V, S, Hl, NH, Causal, Scale, Dr, Yp, Stp, DY, Dlp, Store);
        });
      return O;
    };
    for (int Causal : {1, 0})
      for (double Rate : {0.0, 0.25}) {
        if (Rate > 0 && !Dropout)
          continue;
        AttnDropout Dr;
        Dr.Rate = Rate;
        Dr.Key = 5;
        Dr.GlobalHeads = NH;
        const std::string Case =
            "D " + std::to_string(D) + " S " + std::to_string(S) + " causal " +
            std::to_string(Causal) + " rate " + std::to_string(Rate);
        const Outputs Narrow = run(1, Causal, Dr), Wide = run(2, Causal, Dr);
        EXPECT_TRUE(Narrow == Wide) << Case;
        // Every output written (none left at its NaN fill, which would
        // also have made the comparison above fail).
        auto unset = [](const std::vector<float> &X) {
          return std::count_if(X.begin(), X.end(),
                               [](float F) { return std::isnan(F); });
        };
        EXPECT_EQ(unset(Wide.Y) + unset(Wide.Stats) + unset(Wide.Delta), 0);
        emu_mma::copiesLandLate() = true;
        megac_emu::threadsInReverse() = true;
        const Outputs Shuffled = run(2, Causal, Dr);
        emu_mma::copiesLandLate() = false;
        megac_emu::threadsInReverse() = false;
        EXPECT_TRUE(Wide == Shuffled) << Case;
      }
  }
}

TEST(MmaEmu, WideForwardGivesTheNarrowOnesBits) {
  expectWideForwardLikeNarrow<32, true>();
  expectWideForwardLikeNarrow<64, true>();
  expectWideForwardLikeNarrow<128, false>();
}

/// The key-gradient kernel with two key slices a warp (blocks of 128
/// keys) against the one with one, at head size \p D, over statistics and
/// deltas from the forward kernel: dk and dv (rounded, with their bits)
/// the same bit for bit, with and without dq, causal or not, with
/// dropout or not; dq's sums, which gather a block's keys before their
/// atomic add, within fp32 rounding of the narrow kernel's; and the wide
/// kernel the same with its copies landing late and its threads run in
/// reverse.
template <int D> void expectWideKeyGradLikeNarrow() {
  const int64_t B = 1, NH = 2, Hl = NH * D;
  std::mt19937 Gen(13);
  const float Scale = 1.0f / std::sqrt(float(D));
  for (int64_t S : {int64_t(40), int64_t(150), int64_t(200)}) {
    const int64_t N = B * S * Hl, Rows = B * NH * S;
    const AttentionInputs In = randomAttentionInputs(Gen, N);
    const uint16_t *Q = In[0].data(), *K = In[1].data(), *V = In[2].data(),
                   *DY = In[3].data();
    struct Outputs {
      std::vector<float> Dk, Dv, DqSums;
      std::vector<uint16_t> DkBits, DvBits;
    };
    for (double Rate : {0.0, 0.25})
      for (int Causal : {1, 0}) {
        AttnDropout Dr;
        Dr.Rate = Rate;
        Dr.Key = 99;
        Dr.GlobalHeads = NH;
        std::vector<float> Stats(2 * Rows), Delta(Rows), Y(N);
        float *Stp = Stats.data(), *Dlp = Delta.data(), *Yp = Y.data();
        onMmaBlocks(B * NH * ((S + kMmaRows - 1) / kMmaRows),
                    MmaShared<D>::Forward, [=] {
                      flashForwardMmaKernel<D>(Q, K, V, S, Hl, NH, Causal,
                                               Scale, Dr, Yp, Stp, DY, Dlp,
                                               OutputStore{});
                    });
        auto run = [&](int MT, bool WithQuery) {
          const float Unset = std::nanf("");
          Outputs O{std::vector<float>(N, Unset), std::vector<float>(N, Unset),
                    std::vector<float>(N, 0.0f), std::vector<uint16_t>(N, 1),
                    std::vector<uint16_t>(N, 1)};
          float *Dkp = O.Dk.data(), *Dvp = O.Dv.data(),
                *Sump = WithQuery ? O.DqSums.data() : nullptr;
          const OutputStore SK{1, O.DkBits.data()}, SV{1, O.DvBits.data()};
          const int64_t Blocks =
              B * NH * ((S + kMmaRows * MT - 1) / (kMmaRows * MT));
          using Sh = MmaShared<D>;
          auto launch = [&](auto Kernel, size_t Shared) {
            onMmaBlocks(Blocks, Shared, [=] {
              Kernel(Q, K, V, DY, S, Hl, NH, Causal, Scale, Dr, Stp, Dlp, Dkp,
                     Dvp, SK, SV, Sump);
            });
          };
          if (MT == 1 && WithQuery)
            launch(flashKeyGradMmaKernel<D, true>, Sh::AllGrads);
          else if (MT == 1)
            launch(flashKeyGradMmaKernel<D, false>, Sh::KeyGrad);
          else if (WithQuery)
            launch(flashKeyGradMmaKernel<D, true, 2>, Sh::WideAllGrads);
          else
            launch(flashKeyGradMmaKernel<D, false, 2>, Sh::WideKeyGrad);
          return O;
        };
        const std::string Case =
            "D " + std::to_string(D) + " S " + std::to_string(S) + " causal " +
            std::to_string(Causal) + " rate " + std::to_string(Rate);
        for (bool WithQuery : {false, true}) {
          const Outputs Narrow = run(1, WithQuery), Wide = run(2, WithQuery);
          EXPECT_EQ(Narrow.Dk, Wide.Dk) << Case;
          EXPECT_EQ(Narrow.Dv, Wide.Dv) << Case;
          EXPECT_EQ(Narrow.DkBits, Wide.DkBits) << Case;
          EXPECT_EQ(Narrow.DvBits, Wide.DvBits) << Case;
          double Err = 0, Ref = 0;
          for (int64_t I = 0; I < N; ++I) {
            const double Dif = Wide.DqSums[I] - Narrow.DqSums[I];
            Err += Dif * Dif;
            Ref += double(Narrow.DqSums[I]) * Narrow.DqSums[I];
          }
          if (WithQuery) {
            EXPECT_GT(Ref, 0.0) << Case;
            EXPECT_LT(std::sqrt(Err / Ref), 1e-6) << Case;
          }
          if (!WithQuery || S != 150)
            continue;
          emu_mma::copiesLandLate() = true;
          megac_emu::threadsInReverse() = true;
          const Outputs Shuffled = run(2, WithQuery);
          emu_mma::copiesLandLate() = false;
          megac_emu::threadsInReverse() = false;
          EXPECT_EQ(Wide.Dk, Shuffled.Dk) << Case;
          EXPECT_EQ(Wide.Dv, Shuffled.Dv) << Case;
          EXPECT_EQ(Wide.DqSums, Shuffled.DqSums) << Case;
        }
      }
  }
}

TEST(MmaEmu, WideKeyGradGivesTheNarrowOnesDkAndDv) {
  expectWideKeyGradLikeNarrow<32>();
  expectWideKeyGradLikeNarrow<64>();
}

// The emulation's guard after a launch's dynamic shared memory: bytes
// 0xff, so that a kernel reading past what it asked for reads NaNs, and
// one writing there is caught after its block (a GPU faults on both).
TEST(CudaEmu, ReadingPastDynamicSharedMemoryGivesNaN) {
  std::vector<float> Got(2);
  float *Out = Got.data();
  onOneWarp(16, [=] {
    MEGAC_DYNAMIC_SHARED(float, Smem);
    if (threadIdx.x == 0) {
      Out[0] = Smem[3]; // the last of the 16 bytes asked for: zeroed
      Out[1] = Smem[4]; // past them
    }
  });
  EXPECT_EQ(Got[0], 0.0f);
  EXPECT_TRUE(std::isnan(Got[1]));
}

TEST(CudaEmuDeathTest, WritingPastDynamicSharedMemoryIsCaught) {
  EXPECT_DEATH(onOneWarp(16,
                         [] {
                           MEGAC_DYNAMIC_SHARED(float, Smem);
                           if (threadIdx.x == 0)
                             Smem[4] = 1.0f;
                         }),
               "block \\(0, 0, 0\\) of a launch wrote past the 16 bytes of "
               "dynamic shared memory it asked for");
}

} // namespace
