//===- GradTest.cpp - Backward kernels against finite differences ---------===//
//
// Each backward kernel is checked against central finite differences of the
// corresponding *forward* kernel: for a fixed random cotangent dy, the
// scalar L(x) = sum(forward(x) * dy) is accumulated in double from the float
// forward outputs, and (L(x + h e_i) - L(x - h e_i)) / (2h) must match the
// backward kernel's i-th entry. The step is h = 1e-2 (the exact float
// difference of the perturbed inputs is the denominator): the forward
// kernels round their outputs to float, which puts ~1e-7 of noise into L,
// i.e. ~1e-4 into a difference quotient with h = 1e-3, whereas with 1e-2
// both that noise and the O(h^2) truncation error stay near 1e-5. The
// tolerance is relative 1e-3 of max(|fd|, 5% of the largest gradient entry)
// plus 1e-5 absolute.
//
//===----------------------------------------------------------------------===//

#include "error.h"
#include "kernels.h"
#include "rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

using namespace megac_rt;
using namespace megac_rt::kernels;

namespace {

/// Deterministic pseudo-random values in [-Scale, Scale].
std::vector<float> rnd(size_t N, uint32_t Seed, float Scale = 1.0f) {
  std::vector<float> V(N);
  uint32_t S = Seed * 2654435761u + 12345u;
  for (size_t I = 0; I < N; ++I) {
    S = S * 1664525u + 1013904223u;
    V[I] = Scale * (float(S >> 8) / float(1 << 24) * 2.0f - 1.0f);
  }
  return V;
}

double dot(const std::vector<float> &A, const std::vector<float> &B) {
  double S = 0;
  for (size_t I = 0; I < A.size(); ++I)
    S += double(A[I]) * B[I];
  return S;
}

using LossFn = std::function<double(const std::vector<float> &)>;

/// Compares \p Grad with central differences of \p L at \p X.
void expectMatchesFD(const std::string &What, const std::vector<float> &X,
                     const LossFn &L, const std::vector<float> &Grad,
                     double H = 1e-2, double Rel = 1e-3) {
  ASSERT_EQ(Grad.size(), X.size()) << What;
  std::vector<double> FD(X.size());
  double MaxAbs = 0;
  for (size_t I = 0; I < X.size(); ++I) {
    std::vector<float> Xp = X, Xm = X;
    Xp[I] = float(double(X[I]) + H);
    Xm[I] = float(double(X[I]) - H);
    FD[I] = (L(Xp) - L(Xm)) / (double(Xp[I]) - double(Xm[I]));
    MaxAbs = std::max(MaxAbs, std::fabs(FD[I]));
  }
  ASSERT_GT(MaxAbs, 1e-3) << What << ": degenerate test (zero gradient)";
  for (size_t I = 0; I < X.size(); ++I) {
    double Tol = Rel * std::max(std::fabs(FD[I]), 0.05 * MaxAbs) + 1e-5;
    ASSERT_NEAR(Grad[I], FD[I], Tol) << What << ", element " << I;
  }
}

TEST(Grad, LinearWeightBothLayouts) {
  const int64_t M = 6, K = 5, N = 4; // x [2,3,K] flattened to [6,K]
  auto X = rnd(M * K, 1), DY = rnd(M * N, 2);
  for (bool T : {false, true}) {
    auto W = rnd(K * N, 3); // [K,N] or [N,K]
    LossFn L = [&](const std::vector<float> &Wv) {
      std::vector<float> Y(M * N);
      linear(X.data(), M, K, Wv.data(), N, T, Y.data());
      return dot(Y, DY);
    };
    std::vector<float> DW(K * N);
    linearWeightGrad(X.data(), M, K, DY.data(), N, T, DW.data());
    expectMatchesFD(T ? "linear_weight_grad [N,K]" : "linear_weight_grad [K,N]",
                    W, L, DW);
  }
}

TEST(Grad, Gelu) {
  const int64_t N = 40;
  auto X = rnd(N, 4, 3.0f), DY = rnd(N, 5);
  LossFn L = [&](const std::vector<float> &Xv) {
    std::vector<float> Y(N);
    gelu(Xv.data(), N, Y.data());
    return dot(Y, DY);
  };
  std::vector<float> DX(N);
  geluGrad(X.data(), DY.data(), N, DX.data());
  expectMatchesFD("gelu_grad", X, L, DX);
}

TEST(Grad, LayerNormInputAndAffine) {
  const int64_t R = 3, H = 8;
  auto X = rnd(R * H, 6, 2.0f), G = rnd(H, 7), B = rnd(H, 8), DY = rnd(R * H, 9);
  for (float &V : G)
    V += 1.5f;
  const double Eps = 1e-5;
  auto Fwd = [&](const std::vector<float> &Xv, const std::vector<float> &Gv,
                 const std::vector<float> &Bv) {
    std::vector<float> Y(R * H);
    layerNorm(Xv.data(), R, H, Gv.data(), Bv.data(), Eps, Y.data());
    return dot(Y, DY);
  };
  std::vector<float> DX(R * H);
  layerNormGrad(X.data(), R, H, G.data(), DY.data(), Eps, DX.data());
  expectMatchesFD("layer_norm_grad", X,
                  [&](const std::vector<float> &Xv) { return Fwd(Xv, G, B); },
                  DX);
  // dgamma = sum over rows of dy * normalize(x); dbeta = sum of dy.
  std::vector<float> Xh(R * H), Prod(R * H), DG(H), DB(H);
  normalize(X.data(), R, H, Eps, Xh.data());
  for (int64_t I = 0; I < R * H; ++I)
    Prod[size_t(I)] = DY[size_t(I)] * Xh[size_t(I)];
  sumLeading(Prod.data(), R, H, DG.data());
  sumLeading(DY.data(), R, H, DB.data());
  expectMatchesFD("layer_norm gamma (normalize + sum_leading)", G,
                  [&](const std::vector<float> &Gv) { return Fwd(X, Gv, B); },
                  DG);
  expectMatchesFD("layer_norm beta (sum_leading)", B,
                  [&](const std::vector<float> &Bv) { return Fwd(X, G, Bv); },
                  DB);
}

/// L(x) = sum(attention(q, k, v) * dy) as a function of q (\p Which 0), k
/// (1) or v (2), the others fixed.
LossFn attentionLoss(const std::vector<float> &Q, const std::vector<float> &K,
                     const std::vector<float> &V, const std::vector<float> &DY,
                     int64_t B, int64_t S, int64_t Hl, int64_t Heads,
                     bool Causal, int Which,
                     const AttentionDropout *Drop = nullptr) {
  return [=, &Q, &K, &V, &DY](const std::vector<float> &Xv) {
    const std::vector<float> &Qv = Which == 0 ? Xv : Q;
    const std::vector<float> &Kv = Which == 1 ? Xv : K;
    const std::vector<float> &Vv = Which == 2 ? Xv : V;
    std::vector<float> Y(Q.size());
    attention(Qv.data(), Kv.data(), Vv.data(), B, S, Hl, Heads, Causal,
              Y.data(), Drop);
    return dot(Y, DY);
  };
}

TEST(Grad, AttentionQKVCausalAndNot) {
  const int64_t B = 2, S = 4, Hl = 6, Heads = 2, N = B * S * Hl;
  auto Q = rnd(N, 10), K = rnd(N, 11), V = rnd(N, 12), DY = rnd(N, 13);
  for (bool Causal : {true, false})
    for (int Which = 0; Which < 3; ++Which) {
      LossFn L = attentionLoss(Q, K, V, DY, B, S, Hl, Heads, Causal, Which);
      std::vector<float> D(N);
      attentionGrad(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                    Causal, Which, D.data());
      const std::vector<float> &X = Which == 0 ? Q : Which == 1 ? K : V;
      expectMatchesFD(std::string("attention_grad ") + "qkv"[Which] +
                          (Causal ? " causal" : " full"),
                      X, L, D);
    }
}

/// Dropout of the attention probabilities of a rank that holds all
/// \p Heads heads and the whole batch.
AttentionDropout probabilityDropout(double Rate, uint64_t Key, int64_t Heads) {
  AttentionDropout Drop;
  Drop.Rate = Rate;
  Drop.Key = Key;
  Drop.GlobalHeads = Heads;
  return Drop;
}
const AttentionDropout *noDropout() { return nullptr; }

/// Attention with probability dropout: the gradients (the same mask drawn
/// again) match finite differences of the forward with that mask, the mask
/// is active, and a rank holding heads [1, 2) of the batch row 1 (a tp and
/// dp split) computes exactly that block of the whole attention.
TEST(Grad, AttentionWithProbabilityDropout) {
  const int64_t B = 2, S = 4, Hl = 6, Heads = 2, N = B * S * Hl;
  auto Q = rnd(N, 30), K = rnd(N, 31), V = rnd(N, 32), DY = rnd(N, 33);
  const AttentionDropout Drop =
      probabilityDropout(0.3, 0x9e3779b97f4a7c15ull, Heads);
  for (int Which = 0; Which < 3; ++Which) {
    LossFn L =
        attentionLoss(Q, K, V, DY, B, S, Hl, Heads, true, Which, &Drop);
    std::vector<float> D(N);
    attentionGrad(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                  true, Which, D.data(), &Drop);
    const std::vector<float> &X = Which == 0 ? Q : Which == 1 ? K : V;
    expectMatchesFD(std::string("attention_grad with dropout ") + "qkv"[Which],
                    X, L, D);
  }
  std::vector<float> Whole(N), Plain(N);
  attention(Q.data(), K.data(), V.data(), B, S, Hl, Heads, true, Whole.data(),
            &Drop);
  attention(Q.data(), K.data(), V.data(), B, S, Hl, Heads, true, Plain.data());
  EXPECT_NE(Whole, Plain);
  // Batch row 1, head 1 (columns 3..5) alone, as its rank sees it.
  const int64_t Hd = Hl / Heads;
  std::vector<float> Qb(S * Hd), Kb(S * Hd), Vb(S * Hd), Yb(S * Hd);
  for (int64_t I = 0; I < S; ++I)
    for (int64_t C = 0; C < Hd; ++C) {
      const int64_t From = (1 * S + I) * Hl + Hd + C;
      Qb[I * Hd + C] = Q[From];
      Kb[I * Hd + C] = K[From];
      Vb[I * Hd + C] = V[From];
    }
  AttentionDropout Block = Drop;
  Block.BatchOffset = 1;
  Block.HeadOffset = 1;
  attention(Qb.data(), Kb.data(), Vb.data(), 1, S, Hd, 1, true, Yb.data(),
            &Block);
  for (int64_t I = 0; I < S; ++I)
    for (int64_t C = 0; C < Hd; ++C)
      EXPECT_NEAR(Yb[I * Hd + C], Whole[(1 * S + I) * Hl + Hd + C], 1e-6);
}

/// The three gradients from one pass (what an "a" group's instruction
/// runs) are, bit for bit, the gradients each step computes alone, with
/// and without dropout, causal or not; and a pass asked for some of them
/// writes only those.
TEST(Grad, AttentionGradsInOnePassEqualEachAlone) {
  const int64_t B = 2, S = 5, Hl = 8, Heads = 2, N = B * S * Hl;
  auto Q = rnd(N, 40), K = rnd(N, 41), V = rnd(N, 42), DY = rnd(N, 43);
  const AttentionDropout Drop = probabilityDropout(0.25, 12345, Heads);
  for (const AttentionDropout *D : {noDropout(), &Drop})
    for (bool Causal : {true, false}) {
      std::vector<std::vector<float>> Alone(3, std::vector<float>(N));
      for (int Which = 0; Which < 3; ++Which)
        attentionGrad(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                      Causal, Which, Alone[Which].data(), D);
      std::vector<float> DQ(N), DK(N), DV(N);
      attentionGrads(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                     Causal, {DQ.data(), DK.data(), DV.data()}, D);
      EXPECT_EQ(DQ, Alone[0]);
      EXPECT_EQ(DK, Alone[1]);
      EXPECT_EQ(DV, Alone[2]);
      std::vector<float> KeyOnly(N);
      AttentionGradOutputs Some;
      Some.DK = KeyOnly.data();
      attentionGrads(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                     Causal, Some, D);
      EXPECT_EQ(KeyOnly, Alone[1]);
      EXPECT_NE(Alone[0], Alone[1]); // the comparisons above can fail
    }
}

/// At a sequence long enough for several query blocks (150: blocks of 64,
/// the last one partial), the blocked causal kernels match attention and
/// its gradients written out naively in double, with and without dropout.
TEST(Grad, CausalAttentionAcrossQueryBlocksMatchesNaive) {
  const int64_t B = 1, S = 150, Hl = 16, Heads = 2, Hd = Hl / Heads;
  const int64_t N = B * S * Hl;
  auto Q = rnd(N, 50), K = rnd(N, 51), V = rnd(N, 52), DY = rnd(N, 53);
  const AttentionDropout Drop = probabilityDropout(0.2, 99, Heads);
  for (const AttentionDropout *D : {noDropout(), &Drop}) {
    std::vector<float> Y(N), DQ(N), DK(N), DV(N);
    attention(Q.data(), K.data(), V.data(), B, S, Hl, Heads, true, Y.data(), D);
    attentionGrads(Q.data(), K.data(), V.data(), DY.data(), B, S, Hl, Heads,
                   true, {DQ.data(), DK.data(), DV.data()}, D);
    std::vector<double> RY(N), RQ(N), RK(N), RV(N);
    const double Scale = 1.0 / std::sqrt(double(Hd));
    for (int64_t H = 0; H < Heads; ++H) {
      auto at = [&](const std::vector<float> &T, int64_t I, int64_t C) {
        return double(T[I * Hl + H * Hd + C]);
      };
      // P (masked softmax), the kept mask M (1 / (1 - rate) or 0).
      std::vector<double> P(S * S, 0.0), M(S * S, 1.0), DS(S * S, 0.0);
      for (int64_t I = 0; I < S; ++I) {
        double Max = -1e300;
        std::vector<double> Row(I + 1);
        for (int64_t J = 0; J <= I; ++J) {
          double Dot = 0;
          for (int64_t C = 0; C < Hd; ++C)
            Dot += at(Q, I, C) * at(K, J, C);
          Row[J] = Dot * Scale;
          Max = std::max(Max, Row[J]);
        }
        double Sum = 0;
        for (int64_t J = 0; J <= I; ++J)
          Sum += (Row[J] = std::exp(Row[J] - Max));
        for (int64_t J = 0; J <= I; ++J)
          P[I * S + J] = Row[J] / Sum;
      }
      if (D) // the mask of probability (0, H, i, j), as kernels.h defines it
        for (int64_t I = 0; I < S * S; ++I)
          M[I] = dropoutUniform(D->Key, uint64_t(H * S * S + I)) >= D->Rate
                     ? 1.0 / (1.0 - D->Rate)
                     : 0.0;
      for (int64_t I = 0; I < S; ++I)
        for (int64_t C = 0; C < Hd; ++C) {
          double Acc = 0;
          for (int64_t J = 0; J <= I; ++J)
            Acc += P[I * S + J] * M[I * S + J] * at(V, J, C);
          RY[I * Hl + H * Hd + C] = Acc;
        }
      for (int64_t I = 0; I < S; ++I) {
        std::vector<double> DPr(I + 1);
        double Dot = 0;
        for (int64_t J = 0; J <= I; ++J) {
          double A = 0;
          for (int64_t C = 0; C < Hd; ++C)
            A += at(DY, I, C) * at(V, J, C);
          DPr[J] = A * M[I * S + J];
          Dot += P[I * S + J] * DPr[J];
        }
        for (int64_t J = 0; J <= I; ++J)
          DS[I * S + J] = P[I * S + J] * (DPr[J] - Dot);
      }
      for (int64_t I = 0; I < S; ++I)
        for (int64_t C = 0; C < Hd; ++C) {
          double Aq = 0, Ak = 0, Av = 0;
          for (int64_t J = 0; J < S; ++J) {
            Aq += DS[I * S + J] * at(K, J, C);
            Ak += DS[J * S + I] * at(Q, J, C);
            Av += P[J * S + I] * M[J * S + I] * at(DY, J, C);
          }
          RQ[I * Hl + H * Hd + C] = Aq * Scale;
          RK[I * Hl + H * Hd + C] = Ak * Scale;
          RV[I * Hl + H * Hd + C] = Av;
        }
    }
    auto expectClose = [&](const char *Name, const std::vector<float> &Got,
                           const std::vector<double> &Want) {
      double Err = 0, Norm = 0;
      for (int64_t I = 0; I < N; ++I) {
        Err = std::max(Err, std::fabs(Got[I] - Want[I]));
        Norm = std::max(Norm, std::fabs(Want[I]));
      }
      EXPECT_LT(Err, 1e-5 * Norm) << Name << (D ? " with dropout" : "");
    };
    expectClose("y", Y, RY);
    expectClose("dq", DQ, RQ);
    expectClose("dk", DK, RK);
    expectClose("dv", DV, RV);
  }
}

TEST(Grad, Softmax) {
  const int64_t R = 3, C = 7;
  auto X = rnd(R * C, 14, 2.0f), DY = rnd(R * C, 15);
  LossFn L = [&](const std::vector<float> &Xv) {
    std::vector<float> Y(R * C);
    softmax(Xv.data(), R, C, Y.data());
    return dot(Y, DY);
  };
  std::vector<float> Y(R * C), DX(R * C);
  softmax(X.data(), R, C, Y.data());
  softmaxGrad(Y.data(), DY.data(), R, C, DX.data());
  expectMatchesFD("softmax_grad", X, L, DX);
}

TEST(Grad, CrossEntropyWithNormalizer) {
  const int64_t R = 4, V = 9;
  auto X = rnd(R * V, 16, 2.0f);
  std::vector<int32_t> Lab = {3, 0, 8, 5};
  const double DLoss = 1.7, Norm = 10; // e.g. the global token count
  LossFn L = [&](const std::vector<float> &Xv) {
    return DLoss * crossEntropy(Xv.data(), R, V, Lab.data(), Norm);
  };
  std::vector<float> DX(R * V);
  crossEntropyGrad(X.data(), R, V, Lab.data(), DLoss, Norm, DX.data());
  expectMatchesFD("cross_entropy_grad", X, L, DX);
  // Normalizer semantics: sum / normalizer; none = the local mean.
  double Sum = crossEntropy(X.data(), R, V, Lab.data(), 1.0);
  EXPECT_NEAR(crossEntropy(X.data(), R, V, Lab.data()), Sum / R, 1e-12);
  EXPECT_NEAR(crossEntropy(X.data(), R, V, Lab.data(), Norm), Sum / Norm,
              1e-12);
  Lab[1] = 9;
  EXPECT_THROW(crossEntropyGrad(X.data(), R, V, Lab.data(), 1, 0, DX.data()),
               RunError);
}

/// Vocabulary-parallel cross-entropy as three ranks would run it: each
/// holds 4 of the 12 vocabulary columns (one rank's block split in two more
/// blocks), computes its statistics, the statistics are concatenated (the
/// all-gather), and the loss and each rank's gradient block follow.
TEST(Grad, VocabParallelCrossEntropy) {
  const int64_t R = 4, V = 12, Ranks = 3, Vl = V / Ranks;
  auto X = rnd(R * V, 21, 3.0f);
  std::vector<int32_t> Lab = {3, 0, 11, 6};
  const double DLoss = 0.8, Norm = 7;
  // Rank r's logits: columns [r Vl, (r+1) Vl); rank 2 uses 2 blocks.
  auto blockOf = [&](const std::vector<float> &Xv, int64_t Rank) {
    std::vector<float> B(R * Vl);
    for (int64_t I = 0; I < R; ++I)
      for (int64_t J = 0; J < Vl; ++J)
        B[I * Vl + J] = Xv[I * V + Rank * Vl + J];
    return B;
  };
  const int64_t BlocksOf[Ranks] = {1, 1, 2};
  auto gatheredStats = [&](const std::vector<float> &Xv) {
    std::vector<float> All;
    std::vector<std::vector<float>> Per(Ranks);
    for (int64_t Rank = 0; Rank < Ranks; ++Rank) {
      Per[Rank].resize(R * 3 * BlocksOf[Rank]);
      crossEntropyStats(blockOf(Xv, Rank).data(), R, Vl, Lab.data(),
                        Rank * Vl, V, BlocksOf[Rank], Per[Rank].data());
    }
    for (int64_t I = 0; I < R; ++I) // concatenation along the last dim
      for (int64_t Rank = 0; Rank < Ranks; ++Rank)
        All.insert(All.end(), Per[Rank].begin() + I * 3 * BlocksOf[Rank],
                   Per[Rank].begin() + (I + 1) * 3 * BlocksOf[Rank]);
    return All;
  };
  const int64_t Blocks = 4;
  auto St = gatheredStats(X);
  ASSERT_EQ(St.size(), size_t(R * 3 * Blocks));
  // The loss equals the whole-row cross-entropy.
  EXPECT_NEAR(crossEntropyFromStats(St.data(), R, Blocks, Norm),
              crossEntropy(X.data(), R, V, Lab.data(), Norm), 1e-6);
  // Each rank's gradient block equals the whole-row gradient's columns, and
  // together they match finite differences of the statistics-based loss.
  std::vector<float> Whole(R * V), DX(R * V);
  crossEntropyGrad(X.data(), R, V, Lab.data(), DLoss, Norm, Whole.data());
  for (int64_t Rank = 0; Rank < Ranks; ++Rank) {
    std::vector<float> D(R * Vl);
    crossEntropyGradFromStats(blockOf(X, Rank).data(), R, Vl, Lab.data(),
                              St.data(), Blocks, Rank * Vl, V, DLoss, Norm,
                              D.data());
    for (int64_t I = 0; I < R; ++I)
      for (int64_t J = 0; J < Vl; ++J) {
        DX[I * V + Rank * Vl + J] = D[I * Vl + J];
        EXPECT_NEAR(D[I * Vl + J], Whole[I * V + Rank * Vl + J], 1e-7);
      }
  }
  LossFn L = [&](const std::vector<float> &Xv) {
    auto S = gatheredStats(Xv);
    return DLoss * crossEntropyFromStats(S.data(), R, Blocks, Norm);
  };
  expectMatchesFD("vocab-parallel cross_entropy_grad", X, L, DX);
  // Labels are checked against the whole vocabulary, not the block.
  Lab[0] = 12;
  EXPECT_THROW(gatheredStats(X), RunError);
}

TEST(Grad, EmbeddingWithVocabShard) {
  // This rank holds vocabulary rows [4, 7); ids elsewhere contribute nothing.
  const int64_t Rows = 3, H = 2, VocabStart = 4, Vocab = 10;
  std::vector<int32_t> Ids = {4, 1, 6, 4, 9, 5};
  const int64_t N = int64_t(Ids.size());
  auto T = rnd(Rows * H, 17), DY = rnd(N * H, 18);
  LossFn L = [&](const std::vector<float> &Tv) {
    std::vector<float> Y(N * H);
    embedding(Tv.data(), Rows, H, Ids.data(), N, VocabStart, Vocab, Y.data());
    return dot(Y, DY);
  };
  std::vector<float> DT(Rows * H, 42.0f);
  embeddingGrad(Ids.data(), N, DY.data(), Rows, H, VocabStart, DT.data());
  expectMatchesFD("embedding_grad", T, L, DT);
  // Row 0 (id 4) gathers positions 0 and 3.
  EXPECT_FLOAT_EQ(DT[0], DY[0] + DY[6]);
}

TEST(Grad, PositionEmbedding) {
  const int64_t P = 5, S = 3, H = 2;
  auto T = rnd(P * H, 19), DY = rnd(S * H, 20);
  LossFn L = [&](const std::vector<float> &Tv) {
    return dot(std::vector<float>(Tv.begin(), Tv.begin() + S * H), DY);
  };
  std::vector<float> DT(P * H, 7.0f);
  positionEmbeddingGrad(DY.data(), S, P, H, DT.data());
  expectMatchesFD("position_embedding_grad", T, L, DT);
}

TEST(Grad, Reductions) {
  std::vector<float> X = {1, 2, 3, 4, 5, 6}, Y(3);
  sumLeading(X.data(), 2, 3, Y.data());
  EXPECT_EQ(Y, (std::vector<float>{5, 7, 9}));
  EXPECT_DOUBLE_EQ(sumSquares(X.data(), 6), 91.0);
  // d/dx sum(x^2) = 2x, checked the same way as the other kernels.
  auto Z = rnd(5, 21);
  std::vector<float> G(5);
  for (size_t I = 0; I < 5; ++I)
    G[I] = 2 * Z[I];
  expectMatchesFD("sum_squares", Z,
                  [](const std::vector<float> &V) {
                    return sumSquares(V.data(), int64_t(V.size()));
                  },
                  G);
}

} // namespace
