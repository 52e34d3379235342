//===- KernelsTest.cpp - CPU kernels against naive references -------------===//
//
// Each kernel is compared with a direct transcription of its definition, and
// the executor is run on whole plans (the tiny program and a GPT-2 demo) to
// check the instruction plumbing, including the single-rank collectives.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"
#include "executor.h"
#include "init.h"
#include "error.h"
#include "kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

using namespace megac_rt;
using namespace megac_rt::kernels;

namespace {

std::vector<float> iota(size_t N, float Scale = 0.1f, float Shift = 0.3f) {
  std::vector<float> V(N);
  for (size_t I = 0; I < N; ++I)
    V[I] = std::sin(float(I) * 1.3f + Shift) * Scale * float(I % 7 + 1);
  return V;
}

TEST(Kernels, LinearMatchesNaive) {
  const int64_t M = 5, K = 7, N = 3;
  auto X = iota(M * K), W = iota(K * N, 0.2f, 1.0f);
  std::vector<float> Wt(N * K), Y(M * N), Yt(M * N);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      Wt[n * K + k] = W[k * N + n];
  linear(X.data(), M, K, W.data(), N, false, Y.data());
  linear(X.data(), M, K, Wt.data(), N, true, Yt.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double Ref = 0;
      for (int64_t k = 0; k < K; ++k)
        Ref += double(X[m * K + k]) * W[k * N + n];
      EXPECT_NEAR(Y[m * N + n], Ref, 1e-5);
      EXPECT_NEAR(Yt[m * N + n], Ref, 1e-5);
    }
}

TEST(Kernels, BatchedMatmul) {
  const int64_t B = 2, M = 3, K = 4, N = 2;
  auto A = iota(B * M * K), Bm = iota(B * K * N, 0.5f);
  std::vector<float> Y(B * M * N);
  matmul(A.data(), Bm.data(), B, M, K, N, Y.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double Ref = 0;
        for (int64_t k = 0; k < K; ++k)
          Ref += double(A[(b * M + m) * K + k]) * Bm[(b * K + k) * N + n];
        EXPECT_NEAR(Y[(b * M + m) * N + n], Ref, 1e-5);
      }
}

TEST(Kernels, BroadcastAddMul) {
  std::vector<float> A = {1, 2, 3, 4, 5, 6}, B = {10, 20, 30}, Y(6);
  add(A.data(), 6, B.data(), 3, Y.data());
  EXPECT_EQ(Y, (std::vector<float>{11, 22, 33, 14, 25, 36}));
  mul(A.data(), 6, B.data(), 3, Y.data());
  EXPECT_EQ(Y, (std::vector<float>{10, 40, 90, 40, 100, 180}));
}

TEST(Kernels, GeluKnownValues) {
  std::vector<float> X = {0.0f, 1.0f, -1.0f, 3.0f}, Y(4);
  gelu(X.data(), 4, Y.data());
  EXPECT_FLOAT_EQ(Y[0], 0.0f);
  EXPECT_NEAR(Y[1], 0.8411920f, 1e-6);
  EXPECT_NEAR(Y[2], -0.1588080f, 1e-6);
  EXPECT_NEAR(Y[3], 2.9963627f, 1e-6);
}

/// GeLU and its gradient over [-12, 12] against the tanh formula in long
/// double, written with 1 - tanh|u| = 2 / (e^(2|u|) + 1) as the reference
/// so that it does not cancel: within 4e-7 absolute (about one float ulp
/// at |x| = 4.7, where the absolute error peaks). And every vector
/// width's loop gives the bits of the scalar formula, also for inputs
/// far outside that range, infinities and NaN.
TEST(Kernels, GeluAndGradAgainstLongDouble) {
  const long double C = 0.7978845608028654L, A = 0.044715L;
  auto onePlusMinus = [&](long double U, bool Plus) {
    const long double Q = 2.0L / (std::exp(2.0L * std::fabs(U)) + 1.0L);
    return (U >= 0) == Plus ? 2.0L - Q : Q;
  };
  std::vector<float> X;
  for (float V = -12.0f; V <= 12.0f; V += 1.0f / 1024)
    X.push_back(V);
  const float Inf = std::numeric_limits<float>::infinity();
  for (float V : {1e30f, -1e30f, 88.0f, -88.0f, 500.0f, -500.0f, Inf, -Inf,
                  1e-30f, -0.0f, std::numeric_limits<float>::quiet_NaN()})
    X.push_back(V);
  const int64_t N = int64_t(X.size());
  std::vector<float> DY(N, 1.0f), Y(N), DX(N);
  gelu(X.data(), N, Y.data());
  geluGrad(X.data(), DY.data(), N, DX.data());
  double WorstGelu = 0, WorstGrad = 0;
  for (int64_t I = 0; I < N; ++I) {
    const long double V = X[I], U = C * (V + A * V * V * V);
    if (std::fabs(V) <= 12) {
      const long double G = 0.5L * V * onePlusMinus(U, true);
      const long double D =
          0.5L * onePlusMinus(U, true) + 0.5L * V * onePlusMinus(U, false) *
                                             onePlusMinus(U, true) * C *
                                             (1 + 3 * A * V * V);
      WorstGelu = std::max(WorstGelu, double(std::fabs(Y[I] - G)));
      WorstGrad = std::max(WorstGrad, double(std::fabs(DX[I] - D)));
    }
    const float Scalar = geluOf(X[I]), ScalarGrad = geluGradOf(X[I], 1.0f);
    EXPECT_EQ(std::memcmp(&Scalar, &Y[I], 4), 0) << "gelu at " << X[I];
    EXPECT_EQ(std::memcmp(&ScalarGrad, &DX[I], 4), 0) << "grad at " << X[I];
  }
  EXPECT_LT(WorstGelu, 4e-7);
  EXPECT_LT(WorstGrad, 4e-7);
  // The tails: the identity and 0, and the derivative's limits 1 and 0.
  const int64_t Tail = N - 11;
  EXPECT_EQ(Y[Tail + 0], 1e30f);
  EXPECT_EQ(Y[Tail + 1], 0.0f);
  EXPECT_EQ(DX[Tail + 0], 1.0f);
  EXPECT_EQ(DX[Tail + 1], 0.0f);
  EXPECT_EQ(Y[Tail + 6], Inf);
  EXPECT_EQ(DX[Tail + 6], 1.0f);
  EXPECT_EQ(DX[Tail + 7], 0.0f);
  EXPECT_TRUE(std::isnan(Y[Tail + 10]));
  EXPECT_TRUE(std::isnan(DX[Tail + 10]));
}

TEST(Kernels, LayerNormMatchesNaive) {
  const int64_t R = 3, H = 8;
  auto X = iota(R * H, 2.0f), G = iota(H, 1.0f, 0.7f), B = iota(H, 0.1f, 2.0f);
  std::vector<float> Y(R * H);
  layerNorm(X.data(), R, H, G.data(), B.data(), 1e-5, Y.data());
  for (int64_t r = 0; r < R; ++r) {
    double Mean = 0, Var = 0;
    for (int64_t i = 0; i < H; ++i)
      Mean += X[r * H + i];
    Mean /= H;
    for (int64_t i = 0; i < H; ++i)
      Var += (X[r * H + i] - Mean) * (X[r * H + i] - Mean);
    Var /= H; // biased, as torch.nn.LayerNorm
    for (int64_t i = 0; i < H; ++i)
      EXPECT_NEAR(Y[r * H + i],
                  (X[r * H + i] - Mean) / std::sqrt(Var + 1e-5) * G[i] + B[i],
                  1e-5);
  }
}

TEST(Kernels, LayerNormGainGradIsTheThreeOpsItReplaces) {
  // sum_leading(dy * normalize(x)), bit for bit, over rows of varied
  // means and spreads; and one row of x = [1, 3] by hand: x-hat = [-1, 1]
  // / sqrt(1 + eps), so dy = [5, 7] gives [-5, 7] / sqrt(1 + eps).
  const int64_t R = 37, H = 24;
  const double Eps = 1e-5;
  const std::vector<float> X = iota(size_t(R * H), 2.0f, 0.3f),
                           DY = iota(size_t(R * H), 0.5f, 1.1f);
  std::vector<float> Xh(X.size()), P(X.size()), Want(static_cast<size_t>(H)),
      Got(static_cast<size_t>(H));
  normalize(X.data(), R, H, Eps, Xh.data());
  for (size_t I = 0; I < X.size(); ++I)
    P[I] = DY[I] * Xh[I];
  sumLeading(P.data(), R, H, Want.data());
  layerNormGainGrad(X.data(), DY.data(), R, H, Eps, Got.data());
  for (int64_t J = 0; J < H; ++J)
    EXPECT_EQ(Got[size_t(J)], Want[size_t(J)]) << "column " << J;

  const float X1[] = {1, 3}, D1[] = {5, 7};
  float G1[2];
  layerNormGainGrad(X1, D1, 1, 2, Eps, G1);
  const float Inv = float(1.0 / std::sqrt(1.0 + Eps));
  EXPECT_EQ(G1[0], -5.0f * Inv);
  EXPECT_EQ(G1[1], 7.0f * Inv);
}

TEST(Kernels, SoftmaxRowsSumToOne) {
  std::vector<float> X = {1, 2, 3, 1000, 1000, 1000}, Y(6);
  softmax(X.data(), 2, 3, Y.data());
  EXPECT_NEAR(Y[0] + Y[1] + Y[2], 1.0, 1e-6);
  EXPECT_NEAR(Y[2], std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)),
              1e-6);
  EXPECT_NEAR(Y[4], 1.0 / 3, 1e-6); // no overflow for large inputs
}

// Naive multi-head attention, written directly from the definition.
std::vector<float> naiveAttention(const std::vector<float> &Q,
                                  const std::vector<float> &K,
                                  const std::vector<float> &V, int64_t B,
                                  int64_t S, int64_t Hl, int64_t Heads,
                                  bool Causal) {
  int64_t Hd = Hl / Heads;
  std::vector<float> Y(B * S * Hl, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Heads; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> P(S, 0.0);
        double Max = -1e300, Sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          if (Causal && j > i)
            continue;
          double D = 0;
          for (int64_t d = 0; d < Hd; ++d)
            D += double(Q[(b * S + i) * Hl + h * Hd + d]) *
                 K[(b * S + j) * Hl + h * Hd + d];
          P[j] = D / std::sqrt(double(Hd));
          Max = std::max(Max, P[j]);
        }
        for (int64_t j = 0; j < S; ++j)
          if (!(Causal && j > i))
            Sum += P[j] = std::exp(P[j] - Max);
          else
            P[j] = 0;
        for (int64_t j = 0; j < S; ++j)
          for (int64_t d = 0; d < Hd; ++d)
            Y[(b * S + i) * Hl + h * Hd + d] +=
                float(P[j] / Sum * V[(b * S + j) * Hl + h * Hd + d]);
      }
  return Y;
}

TEST(Kernels, AttentionMatchesNaive) {
  const int64_t B = 2, S = 5, Hl = 6, Heads = 2;
  auto Q = iota(B * S * Hl, 1.0f, 0.1f), K = iota(B * S * Hl, 1.0f, 0.5f),
       V = iota(B * S * Hl, 1.0f, 0.9f);
  for (bool Causal : {true, false}) {
    std::vector<float> Y(B * S * Hl);
    attention(Q.data(), K.data(), V.data(), B, S, Hl, Heads, Causal, Y.data());
    auto Ref = naiveAttention(Q, K, V, B, S, Hl, Heads, Causal);
    for (size_t I = 0; I < Y.size(); ++I)
      ASSERT_NEAR(Y[I], Ref[I], 1e-5) << "causal=" << Causal << " i=" << I;
  }
}

TEST(Kernels, CausalAttentionFirstTokenSeesOnlyItself) {
  // One head, S=2: position 0 must return v[0] exactly.
  std::vector<float> Q = {1, 0, 0, 1}, K = {1, 0, 0, 1}, V = {3, 4, 5, 6},
                     Y(4);
  attention(Q.data(), K.data(), V.data(), 1, 2, 2, 1, true, Y.data());
  EXPECT_FLOAT_EQ(Y[0], 3);
  EXPECT_FLOAT_EQ(Y[1], 4);
  // Position 1: scores [0, 1/sqrt2] -> weights softmax.
  double W1 = 1 / (1 + std::exp(-1 / std::sqrt(2.0)));
  EXPECT_NEAR(Y[2], (1 - W1) * 3 + W1 * 5, 1e-6);
}

TEST(Kernels, CrossEntropyOfUniformLogitsIsLogV) {
  const int64_t Rows = 4, V = 50;
  std::vector<float> L(Rows * V, 0.25f);
  std::vector<int32_t> Lab = {0, 7, 49, 3};
  EXPECT_NEAR(crossEntropy(L.data(), Rows, V, Lab.data()), std::log(50.0),
              1e-6);
  Lab[2] = 50;
  EXPECT_THROW(crossEntropy(L.data(), Rows, V, Lab.data()), RunError);
}

TEST(Kernels, EmbeddingWithVocabShard) {
  std::vector<float> Tab = {1, 1, 2, 2}; // rows for ids 4 and 5
  std::vector<int32_t> Ids = {4, 0, 5};
  std::vector<float> Y(6, -1);
  embedding(Tab.data(), 2, 2, Ids.data(), 3, 4, 8, Y.data());
  EXPECT_EQ(Y, (std::vector<float>{1, 1, 0, 0, 2, 2}));
  Ids[1] = 8;
  EXPECT_THROW(embedding(Tab.data(), 2, 2, Ids.data(), 3, 4, 8, Y.data()),
               RunError);
}

TEST(Kernels, TransposeAndChunks) {
  // x [2,3,4] -> perm [2,0,1] -> y [4,2,3].
  std::vector<uint32_t> X(24), Y(24);
  for (uint32_t I = 0; I < 24; ++I)
    X[I] = I;
  transpose(X.data(), {2, 3, 4}, {2, 0, 1}, Y.data());
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(Y[size_t((a * 2 + b) * 3 + c)], X[size_t((b * 3 + c) * 4 + a)]);

  // Slicing each of 2 chunks along dim 1 of [2,4,3] and concatenating them
  // back must reproduce the input.
  std::vector<float> Z = iota(24), Parts(24), Back(24);
  for (int P = 0; P < 2; ++P)
    sliceChunk(reinterpret_cast<const uint8_t *>(Z.data()), 2, 2, 3, 2, P, 4,
               reinterpret_cast<uint8_t *>(Parts.data() + P * 12));
  EXPECT_EQ(Parts[0], Z[0]);
  EXPECT_EQ(Parts[12], Z[6]); // chunk 1 starts at row 2 of batch 0
  concatChunks(reinterpret_cast<const uint8_t *>(Parts.data()), 2, 2, 3, 2, 4,
               reinterpret_cast<uint8_t *>(Back.data()));
  EXPECT_EQ(Back, Z);
}

TEST(Executor, RunsTinyProgram) {
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(builder::buildPlanBytes(test::tinyProgram()), L),
            "");
  Executor E(*L.program, 0);
  E.allocate();
  E.initParams(7);
  EXPECT_EQ(E.paramElements(), 64u);
  EXPECT_EQ(E.tokensNeeded(), 6u);
  E.setInputs({1, 2, 3, 4, 5, 6});
  LocalCollectives C;
  RunStats S = E.run(C);
  EXPECT_EQ(S.instructions, 2u);
  EXPECT_EQ(S.collectives, 0u);
  // logits[0,0,:] = wte[1,:] @ head.
  const Tensor &Wte = E.buffer(0), &Head = E.buffer(1), &Y = E.buffer(4);
  for (int n = 0; n < 8; ++n) {
    double Ref = 0;
    for (int k = 0; k < 4; ++k)
      Ref += double(Wte.f[size_t(4 + k)]) * Head.f[size_t(k * 8 + n)];
    EXPECT_NEAR(Y.f[size_t(n)], Ref, 1e-7);
  }
}

TEST(Executor, Gpt2DemoLossNearLogVocabAtInit) {
  builder::Gpt2DemoOptions O;
  O.vocab = 96;
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(builder::buildPlanBytes(builder::buildGpt2Demo(O)),
                            L),
            "");
  Executor E(*L.program, 0);
  E.allocate();
  E.initParams(1);
  E.setInputs(defaultTokenStream(1, E.tokensNeeded(), O.vocab));
  LocalCollectives C;
  RunStats S = E.run(C);
  EXPECT_EQ(S.collectives, size_t(2 + 2 * O.nLayer));
  const auto *Outs = E.rankProgram().outputs();
  float Loss = E.buffer(Outs->Get(1)->buffer()).f[0];
  // Small init weights give near-uniform predictions.
  EXPECT_NEAR(Loss, std::log(96.0), 0.1);
}

} // namespace

TEST(Kernels, RoundToBf16) {
  // bf16 keeps 8 significant bits: the spacing above 1 is 2^-7.
  EXPECT_EQ(roundToBf16(1.0f), 1.0f);
  EXPECT_EQ(roundToBf16(1.0f + 0x1p-9f), 1.0f);             // below half
  EXPECT_EQ(roundToBf16(1.0f + 0x1p-8f), 1.0f);             // tie, to even
  EXPECT_EQ(roundToBf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f); // tie, to even
  EXPECT_EQ(roundToBf16(1.0f + 0x1p-8f + 0x1p-12f), 1.0f + 0x1p-7f);
  EXPECT_EQ(roundToBf16(-3.140625f), -3.140625f);            // exact in bf16
  EXPECT_EQ(roundToBf16(0.1f), 0.10009765625f);
  // The largest bf16 is (2 - 2^-7) 2^127; from halfway above it, infinity.
  EXPECT_EQ(roundToBf16(0x1.fep127f), 0x1.fep127f);
  EXPECT_TRUE(std::isinf(roundToBf16(0x1.ffp127f)));
  EXPECT_TRUE(std::isinf(roundToBf16(INFINITY)));
  EXPECT_TRUE(std::isnan(roundToBf16(NAN)));
  // Subnormals keep bf16's 7 fraction bits: 2^-130 is one, and 2^-140 is
  // below half of the smallest (2^-133).
  EXPECT_EQ(roundToBf16(0x1p-130f), 0x1p-130f);
  EXPECT_EQ(roundToBf16(0x1p-140f), 0.0f);
  std::vector<float> X = {1.0f + 0x1p-9f, -2.5f}, Y(2);
  roundBf16(X.data(), 2, Y.data());
  EXPECT_EQ(Y[0], 1.0f);
  EXPECT_EQ(Y[1], -2.5f);
}

TEST(Kernels, FusedStepsMatchTheKernelsOneByOne) {
  // ((x + bias) * s, through GeLU's gradient against g, rounded to bf16):
  // the fused loop must give bit for bit what the kernels give in turn.
  const int64_t Rows = 3, H = 5, N = Rows * H;
  std::vector<float> X(N), G(N), Bias(H), S(N);
  for (int64_t I = 0; I < N; ++I) {
    X[size_t(I)] = 0.37f * float(I) - 2.1f;
    G[size_t(I)] = std::sin(float(I));
    S[size_t(I)] = 1.0f + 0.01f * float(I);
  }
  for (int64_t J = 0; J < H; ++J)
    Bias[size_t(J)] = 0.5f - 0.2f * float(J);
  std::vector<float> A(N), B(N), C(N), Want(N);
  add(X.data(), N, Bias.data(), H, A.data());
  mul(A.data(), N, S.data(), N, B.data());
  geluGrad(B.data(), G.data(), N, C.data());
  roundBf16(C.data(), N, Want.data());
  std::vector<FusedStep> Steps = {{FusedOp::Add, 0, 1},
                                  {FusedOp::Mul, -1, 2},
                                  {FusedOp::GeluGrad, -2, 3},
                                  {FusedOp::RoundBf16, -3, 0}};
  std::vector<float> Got(N);
  fusedElementwise(Steps, {X.data(), Bias.data(), S.data(), G.data()},
                   {N, H, N, N}, N, Got.data());
  EXPECT_EQ(Got, Want);
  // GeLU and a value used twice.
  std::vector<float> Gl(N), Sq(N);
  gelu(X.data(), N, Gl.data());
  mul(Gl.data(), N, Gl.data(), N, Sq.data());
  fusedElementwise({{FusedOp::Gelu, 0, 0}, {FusedOp::Mul, -1, -1}},
                   {X.data()}, {N}, N, Got.data());
  EXPECT_EQ(Got, Sq);
}
