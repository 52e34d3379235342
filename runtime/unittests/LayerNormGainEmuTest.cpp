//===- LayerNormGainEmuTest.cpp - A LayerNorm gain's gradient, emulated ---===//
//
// The CUDA backend computes layer_norm_gain_grad (sum over rows of dy *
// x-hat) in one pass over x and dy. It must give what the three ops it
// replaces gave on the same backend, bit for bit: normalize's x-hat (the
// LayerNorm row kernel without gain), the f32 product with dy, and
// sum_leading's chunked f64 column sums. Checked here on the emulation
// with f32 and bf16 inputs, aligned and unaligned, and against the CPU
// kernel within f64 rounding (its sums run in another order).
//
// The embedding's gradient (a column sum over each id's tokens) runs in a
// fixed order, the CPU's: its kernels are checked here against the CPU's
// embeddingGrad bit for bit.
//
// A product's bias gradient comes from its weight gradient's product
// (cuBLASLt's BGRADA and BGRADB epilogues, "w" groups): the emulated
// cuBLASLt is checked here against dy's column sums and x^T dy in double,
// with the descriptors the backend builds for a weight used as stored and
// transposed.
//
//===----------------------------------------------------------------------===//

#include "EmuLaunch.h"
#include "kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace megac_rt;
using namespace megac_rt::cuda;

namespace {

/// The upper 16 bits of \p X: bf16 by truncation (any bf16 value will do).
uint16_t bf16Bits(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  return uint16_t(U >> 16);
}
float bf16Value(uint16_t B) {
  const uint32_t U = uint32_t(B) << 16;
  float X;
  std::memcpy(&X, &U, 4);
  return X;
}

/// Rows of varied means and spreads, so that x-hat is no multiple of x.
std::vector<float> values(int64_t N, double Phase) {
  std::vector<float> V(static_cast<size_t>(N));
  for (int64_t I = 0; I < N; ++I)
    V[size_t(I)] = float(std::sin(0.731 * double(I) + Phase) * 2.5 +
                         std::cos(0.013 * double(I)) * 4.0);
  return V;
}

constexpr int64_t kRowsPer = 64; // the backend's chunk of rows

int64_t chunksOf(int64_t Rows) {
  return std::max<int64_t>(1, (Rows + kRowsPer - 1) / kRowsPer);
}

/// sum_leading's kernels over \p DY, as the backend launches them.
template <class T>
std::vector<float> columnSums(const T *DY, int64_t Rows, int64_t H) {
  const int64_t Chunks = chunksOf(Rows);
  std::vector<double> Parts(size_t(Chunks * H));
  std::vector<float> Y(size_t(H), -1.0f);
  double *Pp = Parts.data();
  float *Yp = Y.data();
  launchBlocks(blocksFor(Chunks * H), [=] {
    sumLeadingPartsKernel<T>(DY, Rows, H, kRowsPer, Chunks, Pp);
  });
  launchBlocks(totalBlocks(H),
               [=] { sumLeadingTotalKernel(Pp, Chunks, H, Yp, 0, nullptr); });
  return Y;
}

/// sum_leading(dy * normalize(x)) as the backend ran it before: three
/// kernels and two tensors in memory.
template <class T>
std::vector<float> unfused(const T *X, const T *DY, int64_t Rows, int64_t H,
                           double Eps) {
  std::vector<float> Xh(size_t(Rows * H)), P(size_t(Rows * H));
  float *XhP = Xh.data(), *PP = P.data();
  launchBlocks(warpRowBlocks(Rows), [=] {
    layerNormKernel<T>(X, Rows, H, nullptr, nullptr, Eps, XhP, OutputStore{},
                       nullptr);
  });
  launchBlocks(blocksFor(Rows * H), [=] {
    broadcastKernel<T, float>(DY, Rows * H, XhP, Rows * H, PP, 1);
  });
  return columnSums(PP, Rows, H);
}

/// The fused op's kernels, as the backend launches them; with \p Bias
/// (format 11's second output) dy's column sums from the same pass too.
template <class T>
std::vector<float> fused(const T *X, const T *DY, int64_t Rows, int64_t H,
                         double Eps, const std::vector<float> &Init = {},
                         bool Add = false, std::vector<float> *Bias = nullptr) {
  const int64_t Chunks = chunksOf(Rows);
  std::vector<double> Scratch(size_t(2 * Chunks * H + 2 * Rows));
  std::vector<float> Y =
      Init.empty() ? std::vector<float>(size_t(H), -1.0f) : Init;
  double *Parts = Scratch.data(), *BiasParts = Parts + Chunks * H,
         *Stats = BiasParts + Chunks * H;
  float *Yp = Y.data();
  if (Rows > 0)
    launchBlocks(warpRowBlocks(Rows),
                 [=] { rowStatsKernel<T>(X, Rows, H, Eps, Stats); });
  double *BiasOut = Bias ? BiasParts : nullptr;
  launchBlocks(blocksFor(Chunks * H), [=] {
    layerNormGainPartsKernel<T, T>(X, DY, Stats, Rows, H, kRowsPer, Chunks,
                                   Parts, BiasOut);
  });
  // The gain's and the bias's totals in one launch, as the backend runs
  // them.
  float *Bp = nullptr;
  if (Bias) {
    Bias->assign(size_t(H), -1.0f);
    Bp = Bias->data();
  }
  launchBlocks(totalBlocks(H, Bias ? 2 : 1), [=] {
    sumLeadingTotalKernel(Parts, Chunks, H, Yp, int(Add), Bp);
  });
  return Y;
}

void expectSameBits(const std::vector<float> &A, const std::vector<float> &B) {
  ASSERT_EQ(A.size(), B.size());
  for (size_t J = 0; J < A.size(); ++J)
    EXPECT_EQ(std::memcmp(&A[J], &B[J], 4), 0)
        << "column " << J << ": " << A[J] << " vs " << B[J];
}

struct Shape {
  int64_t Rows, H, Offset; // Offset (elements) 1: unaligned rows
};
// The last three have more chunks of 64 rows than a block has warps (the
// second pass's warps each take several) and columns past a block's 32;
// the last, more than 8 a warp (the second pass loads 8 a warp at once,
// then the rest one at a time).
const Shape kShapes[] = {{1, 8, 0},     {3, 5, 0},    {130, 64, 0},
                         {129, 12, 1},  {200, 96, 0}, {0, 16, 0},
                         {1100, 70, 0}, {600, 33, 1}, {5000, 36, 0}};

/// \p V as floats (T = float) or their bf16 bits (T = uint16_t), from
/// element \p Offset of a buffer with room to spare (an offset of 1 leaves
/// the rows unaligned).
template <class T>
std::vector<T> placed(const std::vector<float> &V, int64_t Offset) {
  std::vector<T> Out(V.size() + 4);
  for (size_t I = 0; I < V.size(); ++I) {
    if constexpr (std::is_same_v<T, float>)
      Out[I + size_t(Offset)] = V[I];
    else
      Out[I + size_t(Offset)] = bf16Bits(V[I]);
  }
  return Out;
}

TEST(LayerNormGain, F32IsTheUnfusedOpsBitForBit) {
  for (const Shape &Sh : kShapes) {
    SCOPED_TRACE(testing::Message()
                 << Sh.Rows << " x " << Sh.H << " offset " << Sh.Offset);
    const int64_t N = Sh.Rows * Sh.H;
    const std::vector<float> X = placed<float>(values(N, 0.3), Sh.Offset),
                             DY = placed<float>(values(N, 1.9), Sh.Offset);
    const float *Xp = X.data() + Sh.Offset, *Dp = DY.data() + Sh.Offset;
    const std::vector<float> Want = unfused(Xp, Dp, Sh.Rows, Sh.H, 1e-5);
    expectSameBits(fused(Xp, Dp, Sh.Rows, Sh.H, 1e-5), Want);
    // The CPU's kernel: the same products, summed in one f64 chain.
    std::vector<float> Cpu(size_t(Sh.H), -1.0f);
    kernels::layerNormGainGrad(Xp, Dp, Sh.Rows, Sh.H, 1e-5, Cpu.data());
    for (int64_t J = 0; J < Sh.H; ++J)
      EXPECT_NEAR(Cpu[size_t(J)], Want[size_t(J)],
                  1e-6 * (1.0 + std::fabs(Want[size_t(J)])))
          << "column " << J;
  }
}

/// The rows' statistics the LayerNorm forward keeps for the gain's
/// gradient are rowStatsKernel's, bit for bit (the gradient takes them
/// instead of its own pass over x).
template <class T> void expectForwardStatsAreRowStats(const Shape &Sh) {
  const int64_t N = Sh.Rows * Sh.H;
  const std::vector<T> X = placed<T>(values(N, 1.3), Sh.Offset);
  const T *Xp = X.data() + Sh.Offset;
  std::vector<double> Kept(size_t(2 * Sh.Rows), -1.0),
      Own(size_t(2 * Sh.Rows), -2.0);
  std::vector<float> Y(static_cast<size_t>(N));
  std::vector<float> Gamma(size_t(Sh.H), 1.5f), Beta(size_t(Sh.H), 0.25f);
  double *Kp = Kept.data(), *Op = Own.data();
  float *Yp = Y.data();
  const float *Gp = Gamma.data(), *Bp = Beta.data();
  const int64_t Rows = Sh.Rows, H = Sh.H;
  launchBlocks(warpRowBlocks(Rows), [=] {
    layerNormKernel<T>(Xp, Rows, H, Gp, Bp, 1e-5, Yp, OutputStore{}, Kp);
  });
  launchBlocks(warpRowBlocks(Rows),
               [=] { rowStatsKernel<T>(Xp, Rows, H, 1e-5, Op); });
  for (size_t K = 0; K < Kept.size(); ++K)
    EXPECT_EQ(std::memcmp(&Kept[K], &Own[K], sizeof(double)), 0)
        << "row " << K / 2 << (K % 2 ? " 1/sqrt(var+eps)" : " mean") << ": "
        << Kept[K] << " vs " << Own[K];
}

TEST(LayerNormGain, ForwardKeepsTheRowStatsBitForBit) {
  for (const Shape &Sh : kShapes) {
    SCOPED_TRACE(testing::Message()
                 << Sh.Rows << " x " << Sh.H << " offset " << Sh.Offset);
    expectForwardStatsAreRowStats<float>(Sh);
    expectForwardStatsAreRowStats<uint16_t>(Sh);
  }
}

/// LayerNorm's input gradient from the statistics its forward kept is
/// the gradient that computes them itself, bit for bit: with dy as
/// aligned as x (the kernel reads the rows as the forward did and takes
/// the kept statistics) and with dy one element off (it reads x one
/// column at a time, so it computes its own).
template <class T>
void expectGradientTakesKeptStats(const Shape &Sh, int64_t DyOffset) {
  const int64_t N = Sh.Rows * Sh.H, Rows = Sh.Rows, H = Sh.H;
  const std::vector<T> X = placed<T>(values(N, 0.9), Sh.Offset),
                       DY = placed<T>(values(N, 2.6), DyOffset);
  const T *Xp = X.data() + Sh.Offset, *Dp = DY.data() + DyOffset;
  std::vector<double> Kept(size_t(2 * Rows));
  std::vector<float> Y(static_cast<size_t>(N)), Gamma(static_cast<size_t>(H)),
      Beta(static_cast<size_t>(H), 0.0f), Taken(static_cast<size_t>(N), -1.0f),
      Own(static_cast<size_t>(N), -2.0f);
  for (int64_t J = 0; J < H; ++J)
    Gamma[size_t(J)] = 0.5f + 0.01f * float(J);
  double *Kp = Kept.data();
  float *Yp = Y.data(), *Tp = Taken.data(), *Op = Own.data();
  const float *Gp = Gamma.data(), *Bp = Beta.data();
  launchBlocks(warpRowBlocks(Rows), [=] {
    layerNormKernel<T>(Xp, Rows, H, Gp, Bp, 1e-5, Yp, OutputStore{}, Kp);
  });
  for (const bool WithKept : {true, false}) {
    float *Out = WithKept ? Tp : Op;
    const double *S = WithKept ? Kp : nullptr;
    launchBlocks(warpRowBlocks(Rows), [=] {
      layerNormGradKernel<T, T, float>(Xp, Rows, H, Gp, Dp, 1e-5, Out,
                                       OutputStore{}, nullptr, S);
    });
  }
  expectSameBits(Taken, Own);
}

TEST(LayerNormGain, InputGradientTakesTheKeptStatsBitForBit) {
  for (const Shape &Sh : kShapes) {
    SCOPED_TRACE(testing::Message()
                 << Sh.Rows << " x " << Sh.H << " offset " << Sh.Offset);
    for (const int64_t DyOffset : {Sh.Offset, Sh.Offset + 1}) {
      expectGradientTakesKeptStats<float>(Sh, DyOffset);
      expectGradientTakesKeptStats<uint16_t>(Sh, DyOffset);
    }
  }
}

TEST(LayerNormGain, Bf16InputsAreTheUnfusedOpsBitForBit) {
  for (const Shape &Sh : kShapes) {
    SCOPED_TRACE(testing::Message()
                 << Sh.Rows << " x " << Sh.H << " offset " << Sh.Offset);
    const int64_t N = Sh.Rows * Sh.H;
    const std::vector<uint16_t> X = placed<uint16_t>(values(N, 2.2), Sh.Offset),
                                DY =
                                    placed<uint16_t>(values(N, 0.7), Sh.Offset);
    const uint16_t *Xp = X.data() + Sh.Offset, *Dp = DY.data() + Sh.Offset;
    expectSameBits(fused(Xp, Dp, Sh.Rows, Sh.H, 1e-5),
                   unfused(Xp, Dp, Sh.Rows, Sh.H, 1e-5));
  }
}

TEST(LayerNormGain, BiasGradientIsSumLeadingsBitForBit) {
  // Format 11's second output: dy's column sums from the gain gradient's
  // pass, the same bits as sum_leading's kernels over dy (f32 and bf16
  // dy, rows aligned for four columns a thread or not), and the gain
  // gradient unchanged beside it.
  for (const Shape &Sh : kShapes) {
    SCOPED_TRACE(testing::Message()
                 << Sh.Rows << " x " << Sh.H << " offset " << Sh.Offset);
    const int64_t N = Sh.Rows * Sh.H;
    const std::vector<float> Xv = values(N, 0.3), Dv = values(N, 1.9);
    const std::vector<float> X = placed<float>(Xv, Sh.Offset),
                             DY = placed<float>(Dv, Sh.Offset);
    const float *Xp = X.data() + Sh.Offset, *Dp = DY.data() + Sh.Offset;
    std::vector<float> Bias;
    expectSameBits(fused(Xp, Dp, Sh.Rows, Sh.H, 1e-5, {}, false, &Bias),
                   fused(Xp, Dp, Sh.Rows, Sh.H, 1e-5));
    expectSameBits(Bias, columnSums(Dp, Sh.Rows, Sh.H));
    const std::vector<uint16_t> X16 = placed<uint16_t>(Xv, Sh.Offset),
                                DY16 = placed<uint16_t>(Dv, Sh.Offset);
    const uint16_t *Xb = X16.data() + Sh.Offset, *Db = DY16.data() + Sh.Offset;
    fused(Xb, Db, Sh.Rows, Sh.H, 1e-5, {}, false, &Bias);
    expectSameBits(Bias, columnSums(Db, Sh.Rows, Sh.H));
  }
}

TEST(LayerNormGain, HandWorkedBiasGradient) {
  // dy = [[5, 7], [11, 13]]: the bias gradient is [16, 20].
  const std::vector<float> X = {1, 3, 2, 2}, DY = {5, 7, 11, 13};
  std::vector<float> Bias;
  fused(X.data(), DY.data(), 2, 2, 1e-5, {}, false, &Bias);
  EXPECT_EQ(Bias, (std::vector<float>{16.0f, 20.0f}));
}

TEST(LayerNormGain, HandWorkedRows) {
  // Rows [1, 3] and [2, 2]: means 2 and 2, variances 1 and 0, so x-hat is
  // [-1, 1] / sqrt(1 + eps) and [0, 0]; dy = [[5, 7], [11, 13]] gives
  // dgamma = [-5, 7] / sqrt(1 + eps).
  const double Eps = 1e-5;
  const std::vector<float> X = {1, 3, 2, 2}, DY = {5, 7, 11, 13};
  const std::vector<float> Y = fused(X.data(), DY.data(), 2, 2, Eps);
  const float Inv = float(1.0 / std::sqrt(1.0 + Eps));
  EXPECT_EQ(Y[0], -5.0f * Inv);
  EXPECT_EQ(Y[1], 7.0f * Inv);
}

TEST(LayerNormGain, AddsIntoAMicroBatchSum) {
  const std::vector<float> X = values(300, 0.1), DY = values(300, 0.5);
  const std::vector<float> Alone = fused(X.data(), DY.data(), 10, 30, 1e-5);
  std::vector<float> Before(30);
  for (size_t J = 0; J < Before.size(); ++J)
    Before[J] = float(J) * 0.25f - 3.0f;
  const std::vector<float> Sum =
      fused(X.data(), DY.data(), 10, 30, 1e-5, Before, /*Add=*/true);
  for (size_t J = 0; J < Sum.size(); ++J)
    EXPECT_EQ(Sum[J], Before[J] + Alone[J]) << "column " << J;
}

/// The weight gradient of x [Rows, K] and dy [Rows, N] (bf16 values) with
/// the bias gradient, as the CUDA backend asks the emulated cuBLASLt for
/// it: column-major dw^T [N, K] = dy^T x with BGRADA (dy is A), or, the
/// weight used transposed, dw^T [K, N] = x^T dy with BGRADB (dy is B).
/// Returns dw as stored (row-major [K, N], or [N, K] transposed) and the
/// bias gradient in \p Bias.
std::vector<float> weightBiasGrad(const std::vector<uint16_t> &X,
                                  const std::vector<uint16_t> &DY, int64_t Rows,
                                  int64_t K, int64_t N, bool T,
                                  std::vector<float> &Bias) {
  cublasLtHandle_t Lt;
  EXPECT_EQ(cublasLtCreate(&Lt), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t Desc;
  EXPECT_EQ(cublasLtMatmulDescCreate(&Desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  const int32_t OpT = CUBLAS_OP_T;
  const uint32_t Epi = T ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(Desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &OpT, sizeof OpT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                           &Epi, sizeof Epi),
            CUBLAS_STATUS_SUCCESS);
  const int64_t Rd = T ? K : N, Cd = T ? N : K; // D's rows and columns
  cublasLtMatrixLayout_t A, B, D;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&A, CUDA_R_16BF, Rd, Rows, Rd),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&B, CUDA_R_16BF, Cd, Rows, Cd),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&D, CUDA_R_32F, Rd, Cd, Rd),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> Dw(size_t(K * N), -1.0f);
  Bias.assign(size_t(N), -1.0f);
  void *BiasPtr = Bias.data();
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(Desc,
                                           CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                           &BiasPtr, sizeof BiasPtr),
            CUBLAS_STATUS_SUCCESS);
  const float One = 1.0f, Zero = 0.0f;
  EXPECT_EQ(cublasLtMatmul(Lt, Desc, &One, T ? X.data() : DY.data(), A,
                           T ? DY.data() : X.data(), B, &Zero, Dw.data(), D,
                           Dw.data(), D, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (cublasLtMatrixLayout_t L : {A, B, D})
    cublasLtMatrixLayoutDestroy(L);
  cublasLtMatmulDescDestroy(Desc);
  cublasLtDestroy(Lt);
  return Dw;
}

TEST(WeightBiasGrad, BgradEpiloguesSumDyAsTheProductReadsIt) {
  // 37 rows (not a multiple of any tile), K = 16, N = 24.
  const int64_t Rows = 37, K = 16, N = 24;
  std::vector<uint16_t> X(size_t(Rows * K)), DY(size_t(Rows * N));
  const std::vector<float> Xv = values(Rows * K, 0.3),
                           Dv = values(Rows * N, 1.7);
  for (size_t I = 0; I < X.size(); ++I)
    X[I] = bf16Bits(Xv[I]);
  for (size_t I = 0; I < DY.size(); ++I)
    DY[I] = bf16Bits(Dv[I]);
  for (bool T : {false, true}) {
    std::vector<float> Bias;
    const std::vector<float> Dw = weightBiasGrad(X, DY, Rows, K, N, T, Bias);
    for (int64_t J = 0; J < N; ++J) {
      double Sum = 0, Abs = 0;
      for (int64_t R = 0; R < Rows; ++R) {
        Sum += bf16Value(DY[size_t(R * N + J)]);
        Abs += std::fabs(bf16Value(DY[size_t(R * N + J)]));
      }
      EXPECT_NEAR(Bias[size_t(J)], Sum, 1e-6 * Abs)
          << (T ? "BGRADB" : "BGRADA") << ", column " << J;
      for (int64_t Kk = 0; Kk < K; ++Kk) {
        double W = 0, WAbs = 0;
        for (int64_t R = 0; R < Rows; ++R) {
          const double P = double(bf16Value(X[size_t(R * K + Kk)])) *
                           bf16Value(DY[size_t(R * N + J)]);
          W += P;
          WAbs += std::fabs(P);
        }
        const float Got = Dw[size_t(T ? J * K + Kk : Kk * N + J)];
        EXPECT_NEAR(Got, W, 1e-6 * WAbs)
            << (T ? "transposed" : "as stored") << ", dw at " << Kk << "," << J;
      }
    }
  }
}

/// The CUDA backend's four embedding-gradient kernels (embeddingGrad in
/// cuda_run.cu) over \p Ids and dy [N, H]: the table's rows [Start, Start +
/// Rows) into DT, Into added where given (DT == Into: in place).
void deviceEmbeddingGrad(const std::vector<int32_t> &Ids,
                         const std::vector<float> &DY, int64_t Rows, int64_t H,
                         int64_t Start, const float *Into, float *DT) {
  const int64_t N = int64_t(Ids.size());
  std::vector<int32_t> Rank(static_cast<size_t>(N)),
      Counts(static_cast<size_t>(Rows), 0), Offsets(static_cast<size_t>(Rows)),
      Tokens(static_cast<size_t>(N));
  const int32_t *I = Ids.data();
  int32_t *Rk = Rank.data(), *C = Counts.data(), *O = Offsets.data(),
          *T = Tokens.data();
  const float *D = DY.data();
  // Two blocks of ranks over the tokens, to cross a block's tile.
  launchBlocks(2, [=] { tokenRanksKernel(I, N, Start, Rows, Rk, C); });
  launchBlocks(1, [=] { rowOffsetsKernel(C, Rows, O); });
  launchBlocks(2, [=] { placeTokensKernel(I, N, Start, Rk, O, T); });
  launchBlocks(3, [=] {
    embeddingGradRowsKernel<float>(D, Rows, H, C, O, T, Into, DT,
                                   int(Into == DT));
  });
}

TEST(EmbeddingGrad, SumsEachRowsTokensInTheCpusOrder) {
  // 700 tokens (more than two blocks' tiles) over ids 0..39, many
  // repeated; this rank's rows are ids 5..34 (others are skipped); dy of
  // widely varying magnitudes, so that the order of a sum shows in its
  // bits.
  const int64_t N = 700, H = 6, Rows = 30, Start = 5;
  std::vector<int32_t> Ids(static_cast<size_t>(N));
  for (int64_t K = 0; K < N; ++K)
    Ids[size_t(K)] = int32_t((K * 7 + K / 13) % 40);
  std::vector<float> DY = values(N * H, 0.9);
  for (size_t K = 0; K < DY.size(); ++K)
    DY[K] *= float(std::pow(10.0, double(K % 7) - 3.0));
  std::vector<float> Want(static_cast<size_t>(Rows * H)),
      Got(static_cast<size_t>(Rows * H), -1.0f);
  kernels::embeddingGrad(Ids.data(), N, DY.data(), Rows, H, Start, Want.data());
  deviceEmbeddingGrad(Ids, DY, Rows, H, Start, nullptr, Got.data());
  expectSameBits(Got, Want);
  // Added to another gradient (a tied embedding's output layer): Into +
  // the sum, as the CPU's add of the two; in place, the rows no token
  // touched stay as they were.
  std::vector<float> Into = values(Rows * H, 2.1), Sum(Into.size());
  for (size_t K = 0; K < Sum.size(); ++K)
    Sum[K] = Into[K] + Want[K];
  std::vector<float> Apart(Into.size(), -1.0f), InPlace = Into;
  deviceEmbeddingGrad(Ids, DY, Rows, H, Start, Into.data(), Apart.data());
  expectSameBits(Apart, Sum);
  deviceEmbeddingGrad(Ids, DY, Rows, H, Start, InPlace.data(), InPlace.data());
  expectSameBits(InPlace, Sum);
  // (Ids 5..34 all occur: no row is untouched here; id 40 and over never.)
  std::vector<int32_t> Sparse = {7, 7, 9, 7};
  std::vector<float> Few(4 * H);
  for (size_t K = 0; K < Few.size(); ++K)
    Few[K] = float(K) + 0.5f;
  std::vector<float> Kept = Into;
  deviceEmbeddingGrad(Sparse, Few, Rows, H, Start, Kept.data(), Kept.data());
  for (int64_t R = 0; R < Rows; ++R)
    for (int64_t J = 0; J < H; ++J) {
      const size_t At = size_t(R * H + J);
      float Add = 0.0f;
      for (size_t K = 0; K < Sparse.size(); ++K)
        if (Sparse[K] - Start == R)
          Add += Few[K * size_t(H) + size_t(J)];
      EXPECT_EQ(Kept[At], R == 2 || R == 4 ? Into[At] + Add : Into[At])
          << "row " << R << ", column " << J;
    }
}

} // namespace
