//===- kernels.cpp - fp32 CPU kernels for the plan opcodes ----------------===//
//
// Matrix products go through cblas_sgemm (OpenBLAS); everything else is a
// straightforward loop. Reductions (layer norm, softmax, cross-entropy)
// accumulate in double: the runtime is a correctness reference for the
// compiler's sharding, so it should not add avoidable rounding noise that
// differs between sharded and unsharded runs. Where a reduction runs over
// one row (LayerNorm's), it adds in 8 lanes in a fixed order, which
// vectorizes and gives the same bits on every CPU.
//
//===----------------------------------------------------------------------===//

#include "kernels.h"
#include "error.h"
#include "init.h"
#include "rng.h"

#include <cblas.h>
// (OpenBLAS's own, which another cblas.h may not declare.)
extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_num_threads(void);
extern "C" char *openblas_get_corename(void);

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

// Elementwise loops that compute much per element (GeLU's exponential and
// division) are compiled once more for each wider vector unit, and the
// loader picks the widest the CPU has. Their bits are the same in every
// version: this file is compiled with -ffp-contract=off (no fused
// multiply-adds), so each one does the same IEEE operations.
#if defined(__x86_64__) && defined(__GNUC__)
#define MEGAC_VECTOR_CLONES                                                    \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MEGAC_VECTOR_CLONES
#endif

namespace megac_rt {
namespace kernels {

void pinBlasThreads() {
  // (0, which OpenBLAS reads as every core, and anything but a count
  // are pinned too; GOTO_NUM_THREADS and OMP_NUM_THREADS do not count.)
  const char *N = std::getenv("OPENBLAS_NUM_THREADS");
  char *End = nullptr;
  const long Asked = N ? std::strtol(N, &End, 10) : 0;
  if (!N || !*N || *End || Asked < 1)
    openblas_set_num_threads(1);
}

std::string blasDescription() {
  const char *Core = openblas_get_corename();
  const int Threads = openblas_get_num_threads();
  return std::string("OpenBLAS ") + (Core && *Core ? Core : "?") + ", " +
         std::to_string(Threads) + (Threads == 1 ? " thread" : " threads");
}

void linear(const float *X, int64_t M, int64_t K, const float *W, int64_t N,
            bool TransposeW, float *Y) {
  if (M == 0 || N == 0)
    return;
  if (K == 0) {
    std::fill(Y, Y + M * N, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, TransposeW ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), 1.0f, X, int(K), W,
              TransposeW ? int(K) : int(N), 0.0f, Y, int(N));
}

void matmul(const float *A, const float *B, int64_t Batch, int64_t M,
            int64_t K, int64_t N, float *Y) {
  for (int64_t I = 0; I < Batch; ++I)
    linear(A + I * M * K, M, K, B + I * K * N, N, false, Y + I * M * N);
}

void add(const float *A, int64_t NA, const float *B, int64_t NB, float *Y) {
  if (NB == 0) // then NA == 0 too: b's shape is a suffix of a's
    return;
  for (int64_t I = 0; I < NA; I += NB)
    for (int64_t J = 0; J < NB; ++J)
      Y[I + J] = A[I + J] + B[J];
}

void mul(const float *A, int64_t NA, const float *B, int64_t NB, float *Y) {
  if (NB == 0)
    return;
  for (int64_t I = 0; I < NA; I += NB)
    for (int64_t J = 0; J < NB; ++J)
      Y[I + J] = A[I + J] * B[J];
}

MEGAC_VECTOR_CLONES void gelu(const float *X, int64_t N, float *Y) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = geluOf(X[I]);
}

namespace {
/// Row sums in double, in kLanes lanes: lane k adds the terms i = k mod
/// kLanes in order, and the lanes are added in order at the end. The
/// lanes vectorize, and every vector width does the same operations, so
/// the sum has the same bits on every CPU.
/// (Always inlined: in the AVX-512 and AVX2 versions of their callers the
/// lanes take those units' wider vectors.)
constexpr int64_t kLanes = 8;
#define MEGAC_ALWAYS_INLINE inline __attribute__((always_inline))
/// The sums of two terms over [0, N), in one pass.
template <class TermA, class TermB>
MEGAC_ALWAYS_INLINE void sumInLanes(int64_t N, TermA A, TermB B, double &SumA,
                                    double &SumB) {
  double AccA[kLanes] = {}, AccB[kLanes] = {};
  int64_t I = 0;
  for (; I + kLanes <= N; I += kLanes)
    for (int64_t K = 0; K < kLanes; ++K) {
      AccA[K] += A(I + K);
      AccB[K] += B(I + K);
    }
  for (; I < N; ++I) {
    AccA[I % kLanes] += A(I);
    AccB[I % kLanes] += B(I);
  }
  SumA = SumB = 0;
  for (int64_t K = 0; K < kLanes; ++K) {
    SumA += AccA[K];
    SumB += AccB[K];
  }
}
/// The sum of one term (the second sum, of zeros, compiles away).
template <class Term>
MEGAC_ALWAYS_INLINE double sumInLanes(int64_t N, Term T) {
  double Sum, Zero;
  sumInLanes(N, T, [](int64_t) { return 0.0; }, Sum, Zero);
  return Sum;
}

/// A LayerNorm row's mean and 1 / sqrt(biased variance + eps), in double.
/// Shared by the forward kernel, normalize and the gradients, so that all
/// of them see the same statistics.
MEGAC_ALWAYS_INLINE void rowStats(const float *X, int64_t H, double Eps,
                                  double &Mean, double &Inv) {
  Mean = sumInLanes(H, [&](int64_t I) { return double(X[I]); }) / double(H);
  const double Var = sumInLanes(H, [&](int64_t I) {
                       const double D = X[I] - Mean;
                       return D * D;
                     }) /
                     double(H);
  Inv = 1.0 / std::sqrt(Var + Eps);
}
} // namespace

MEGAC_VECTOR_CLONES void layerNorm(const float *X, int64_t Rows, int64_t H,
                                   const float *Gamma, const float *Beta,
                                   double Eps, float *Y) {
  for (int64_t R = 0; R < Rows; ++R) {
    const float *Xr = X + R * H;
    double Mean, Inv;
    rowStats(Xr, H, Eps, Mean, Inv);
    for (int64_t I = 0; I < H; ++I)
      Y[R * H + I] = float((Xr[I] - Mean) * Inv) * Gamma[I] + Beta[I];
  }
}

namespace {
/// Y[0..N) = softmax(X[0..N)), max-subtracted and summed in double; X may
/// alias Y. Shared by the softmax op and attention's score rows.
MEGAC_VECTOR_CLONES void softmaxRow(const float *X, int64_t N, float *Y) {
  float Max = -std::numeric_limits<float>::infinity();
  for (int64_t I = 0; I < N; ++I)
    Max = std::max(Max, X[I]);
  // The exponentials vectorize (megac_exp is plain float arithmetic); the
  // sum, in double and in order, is a loop of its own.
  for (int64_t I = 0; I < N; ++I)
    Y[I] = megac_exp(X[I] - Max);
  double Sum = 0;
  for (int64_t I = 0; I < N; ++I)
    Sum += Y[I];
  float Inv = float(1.0 / Sum);
  for (int64_t I = 0; I < N; ++I)
    Y[I] *= Inv;
}

/// Causal attention takes its queries in blocks of this many: a block's
/// queries see only the keys up to its last query, so each product skips
/// the masked part of the scores to the right of the block (3/8 of the
/// work at sequence 256).
constexpr int64_t kCausalQueryBlock = 64;

/// Queries [Begin, End) and the keys [0, Keys) they see.
struct QueryBlock {
  int64_t Begin, End, Keys;
  int64_t rows() const { return End - Begin; }
};
std::vector<QueryBlock> queryBlocks(int64_t S, bool Causal) {
  if (!Causal)
    return {{0, S, S}};
  std::vector<QueryBlock> Blocks;
  for (int64_t I = 0; I < S; I += kCausalQueryBlock) {
    const int64_t End = std::min(S, I + kCausalQueryBlock);
    Blocks.push_back({I, End, End});
  }
  return Blocks;
}

/// P = softmax(scale * Q_h K_h^T) of one head, rows masked causally (masked
/// entries 0). The head's columns are strided by Hl. Shared by the forward
/// and backward kernels so the backward pass sees the forward's numbers.
void attentionProbabilities(const float *Qh, const float *Kh, int64_t S,
                            int64_t Hl, int64_t Hd, float Scale, bool Causal,
                            float *P) {
  for (const QueryBlock &Q : queryBlocks(S, Causal)) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(Q.rows()),
                int(Q.Keys), int(Hd), Scale, Qh + Q.Begin * Hl, int(Hl), Kh,
                int(Hl), 0.0f, P + Q.Begin * S, int(S));
    for (int64_t I = Q.Begin; I < Q.End; ++I) {
      float *Row = P + I * S;
      int64_t Valid = Causal ? I + 1 : S;
      softmaxRow(Row, Valid, Row);
      for (int64_t J = Valid; J < S; ++J)
        Row[J] = 0.0f;
    }
  }
}

/// Max and sum of exp(x - max) of one row of logits, as the loss and its
/// gradient both need them (the gradient must see the loss's softmax).
struct RowSoftmax {
  float Max;
  double Sum;
};
/// The exponentials in float (megac_exp, vectorized), their sum in double
/// and in order.
MEGAC_VECTOR_CLONES RowSoftmax rowSoftmax(const float *L, int64_t V) {
  RowSoftmax Row{*std::max_element(L, L + V), 0.0};
  constexpr int64_t Chunk = 256;
  float E[Chunk];
  for (int64_t I0 = 0; I0 < V; I0 += Chunk) {
    const int64_t N = std::min(Chunk, V - I0);
    for (int64_t I = 0; I < N; ++I)
      E[I] = megac_exp(L[I0 + I] - Row.Max);
    for (int64_t I = 0; I < N; ++I)
      Row.Sum += E[I];
  }
  return Row;
}

/// D[i] = (e^(L[i] - Shift) / Div - [i == Label]) * Scale for one row of
/// logits, the exponential in float (vectorized), the rest in double;
/// Label outside [0, V): no one-hot term.
MEGAC_VECTOR_CLONES void softmaxGradRow(const float *L, int64_t V,
                                        double Shift, double Div,
                                        int64_t Label, double Scale,
                                        float *D) {
  for (int64_t I = 0; I < V; ++I) {
    const double P = double(megac_exp(float(double(L[I]) - Shift))) / Div;
    D[I] = float(P * Scale);
  }
  if (Label >= 0 && Label < V) {
    const double P =
        double(megac_exp(float(double(L[Label]) - Shift))) / Div;
    D[Label] = float((P - 1.0) * Scale);
  }
}

/// Labels[R], checked to be a class of a V-way softmax.
int32_t checkedLabel(const char *Op, const int32_t *Labels, int64_t R,
                     int64_t V) {
  int32_t Lab = Labels[R];
  if (Lab < 0 || Lab >= V)
    throw RunError(std::string(Op) + ": label " + std::to_string(Lab) +
                   " at position " + std::to_string(R) + " is outside [0, " +
                   std::to_string(V) + ")");
  return Lab;
}
} // namespace

void softmax(const float *X, int64_t Rows, int64_t Cols, float *Y) {
  for (int64_t R = 0; R < Rows; ++R)
    softmaxRow(X + R * Cols, Cols, Y + R * Cols);
}

namespace {
/// Multiplies the S x S block \p M of head (Bi, H) by the dropout mask
/// scale: 1 / (1 - rate) where kept, 0 where dropped.
void applyAttentionMask(const AttentionDropout *Drop, int64_t Bi, int64_t H,
                        int64_t S, float *M) {
  if (!Drop || !(Drop->Rate > 0))
    return;
  const double Scale = 1.0 / (1.0 - Drop->Rate);
  const uint64_t Base = uint64_t(((Bi + Drop->BatchOffset) * Drop->GlobalHeads +
                                  H + Drop->HeadOffset) *
                                 S * S);
  for (int64_t I = 0; I < S * S; ++I)
    M[I] = dropoutUniform(Drop->Key, Base + uint64_t(I)) >= Drop->Rate
               ? float(double(M[I]) * Scale)
               : 0.0f;
}
/// One row of the scores' gradient, in place: d = p * (d - sum(p * d)),
/// the sum in double and in order, the rest elementwise (vectorized).
MEGAC_VECTOR_CLONES void scoreGradRow(const float *P, int64_t S, float *D) {
  double Dot = 0;
  for (int64_t J = 0; J < S; ++J)
    Dot += double(P[J]) * D[J];
  for (int64_t J = 0; J < S; ++J)
    D[J] = float(double(P[J]) * (double(D[J]) - Dot));
}
} // namespace

void attention(const float *Q, const float *K, const float *V, int64_t B,
               int64_t S, int64_t Hl, int64_t Heads, bool Causal, float *Y,
               const AttentionDropout *Drop) {
  const int64_t Hd = Hl / Heads;
  const float Scale = float(1.0 / std::sqrt(double(Hd)));
  std::vector<float> Scores(size_t(S * S));
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t H = 0; H < Heads; ++H) {
      const int64_t Base = Bi * S * Hl + H * Hd;
      attentionProbabilities(Q + Base, K + Base, S, Hl, Hd, Scale, Causal,
                             Scores.data());
      applyAttentionMask(Drop, Bi, H, S, Scores.data());
      for (const QueryBlock &Qb : queryBlocks(S, Causal))
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(Qb.rows()),
                    int(Hd), int(Qb.Keys), 1.0f, Scores.data() + Qb.Begin * S,
                    int(S), V + Base, int(Hl), 0.0f, Y + Base + Qb.Begin * Hl,
                    int(Hl));
    }
}

void transpose(const uint32_t *X, const std::vector<int64_t> &Shape,
               const std::vector<int64_t> &Perm, uint32_t *Y) {
  const size_t R = Shape.size();
  int64_t N = 1;
  for (int64_t D : Shape)
    N *= D;
  if (N == 0)
    return;
  std::vector<int64_t> InStride(R, 1), OutShape(R), Idx(R, 0);
  for (size_t I = R; I-- > 1;)
    InStride[I - 1] = InStride[I] * Shape[I];
  for (size_t I = 0; I < R; ++I)
    OutShape[I] = Shape[Perm[I]];
  // Walk y in order with an odometer over its index, tracking x's offset.
  int64_t Src = 0;
  for (int64_t O = 0; O < N; ++O) {
    Y[O] = X[Src];
    for (size_t D = R; D-- > 0;) {
      Src += InStride[Perm[D]];
      if (++Idx[D] < OutShape[D])
        break;
      Src -= InStride[Perm[D]] * OutShape[D];
      Idx[D] = 0;
    }
  }
}

double crossEntropy(const float *Logits, int64_t Rows, int64_t V,
                    const int32_t *Labels, double Normalizer,
                    int64_t Classes) {
  const int64_t C = classesInBlock(0, V, Classes);
  double Total = 0;
  for (int64_t R = 0; R < Rows; ++R) {
    const float *L = Logits + R * V;
    int32_t Lab = checkedLabel("cross_entropy", Labels, R, C);
    RowSoftmax Row = rowSoftmax(L, C);
    Total += std::log(Row.Sum) + Row.Max - L[Lab];
  }
  if (Normalizer > 0)
    return Total / Normalizer;
  return Rows ? Total / double(Rows) : 0.0;
}

namespace {
/// log sum_v exp(logit_v) of one token from its blocks' statistics.
double logSumExpOfBlocks(const float *St, int64_t Blocks) {
  float Max = St[0];
  for (int64_t K = 1; K < Blocks; ++K)
    Max = std::max(Max, St[3 * K]);
  double Sum = 0;
  for (int64_t K = 0; K < Blocks; ++K)
    Sum += double(St[3 * K + 1]) * std::exp(double(St[3 * K]) - Max);
  return std::log(Sum) + Max;
}
} // namespace

float roundToBf16(float X) {
  uint32_t U;
  std::memcpy(&U, &X, sizeof(U));
  if ((U & 0x7f800000u) == 0x7f800000u) {
    // Infinity keeps its bits; NaN stays a (quiet) NaN after truncation.
    if (U & 0x007fffffu)
      U |= 0x00400000u;
  } else {
    // Round to nearest, ties to even, on the 16 bits that are dropped;
    // a carry into the exponent is the correct rounding (up to infinity).
    U += 0x7fffu + ((U >> 16) & 1u);
  }
  U &= 0xffff0000u;
  float Y;
  std::memcpy(&Y, &U, sizeof(Y));
  return Y;
}

void roundBf16(const float *X, int64_t N, float *Y) {
  for (int64_t I = 0; I < N; ++I)
    Y[I] = roundToBf16(X[I]);
}

void crossEntropyStats(const float *Logits, int64_t Rows, int64_t V,
                       const int32_t *Labels, int64_t VocabStart,
                       int64_t VocabSize, int64_t Blocks, float *Stats,
                       int64_t Classes) {
  const int64_t Width = V / Blocks;
  for (int64_t R = 0; R < Rows; ++R) {
    const int32_t Lab = checkedLabel(
        "cross_entropy_stats", Labels, R,
        Classes > 0 ? std::min(VocabSize, Classes) : VocabSize);
    for (int64_t K = 0; K < Blocks; ++K) {
      const float *L = Logits + R * V + K * Width;
      float *St = Stats + (R * Blocks + K) * 3;
      const int64_t Valid =
          classesInBlock(VocabStart + K * Width, Width, Classes);
      if (Valid == 0) { // padding alone: no term in the sum
        St[0] = -std::numeric_limits<float>::infinity();
        St[1] = 0.0f;
        St[2] = 0.0f;
        continue;
      }
      RowSoftmax Block = rowSoftmax(L, Valid);
      const int64_t Local = Lab - VocabStart - K * Width;
      St[0] = Block.Max;
      St[1] = float(Block.Sum);
      St[2] = Local >= 0 && Local < Width ? L[Local] : 0.0f;
    }
  }
}

double crossEntropyFromStats(const float *Stats, int64_t Rows, int64_t Blocks,
                             double Normalizer) {
  double Total = 0;
  for (int64_t R = 0; R < Rows; ++R) {
    const float *St = Stats + R * Blocks * 3;
    double Target = 0;
    for (int64_t K = 0; K < Blocks; ++K)
      Target += St[3 * K + 2];
    Total += logSumExpOfBlocks(St, Blocks) - Target;
  }
  if (Normalizer > 0)
    return Total / Normalizer;
  return Rows ? Total / double(Rows) : 0.0;
}

void embedding(const float *Table, int64_t Rows, int64_t H,
               const int32_t *Ids, int64_t N, int64_t VocabStart,
               int64_t VocabSize, float *Y) {
  for (int64_t I = 0; I < N; ++I) {
    int64_t Id = Ids[I];
    if (Id < 0 || Id >= VocabSize)
      throw RunError("embedding: token id " + std::to_string(Id) +
                     " at position " + std::to_string(I) +
                     " is outside the vocabulary [0, " +
                     std::to_string(VocabSize) + ")");
    int64_t Row = Id - VocabStart;
    if (Row >= 0 && Row < Rows)
      std::memcpy(Y + I * H, Table + Row * H, size_t(H) * sizeof(float));
    else
      std::fill(Y + I * H, Y + (I + 1) * H, 0.0f);
  }
}

//===----------------------------------------------------------------------===//
// Backward kernels
//===----------------------------------------------------------------------===//

void linearWeightGrad(const float *X, int64_t M, int64_t K, const float *DY,
                      int64_t N, bool Transposed, float *DW, float Beta) {
  if (K == 0 || N == 0)
    return;
  if (M == 0) {
    if (Beta == 0.0f)
      std::fill(DW, DW + K * N, 0.0f);
    return;
  }
  if (!Transposed) // [K,N] = X^T DY (+ Beta DW)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(K), int(N),
                int(M), 1.0f, X, int(K), DY, int(N), Beta, DW, int(N));
  else // [N,K] = DY^T X (+ Beta DW)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(N), int(K),
                int(M), 1.0f, DY, int(N), X, int(K), Beta, DW, int(K));
}

MEGAC_VECTOR_CLONES void geluGrad(const float *X, const float *DY, int64_t N,
                                  float *DX) {
  for (int64_t I = 0; I < N; ++I)
    DX[I] = geluGradOf(X[I], DY[I]);
}

void fusedElementwise(const std::vector<FusedStep> &Steps,
                      const std::vector<const float *> &In,
                      const std::vector<int64_t> &Period, int64_t N,
                      float *Y) {
  std::vector<float> V(Steps.size());
  for (int64_t I = 0; I < N; ++I) {
    auto Arg = [&](int K) {
      return K >= 0 ? In[size_t(K)][I % Period[size_t(K)]] : V[size_t(-K - 1)];
    };
    for (size_t J = 0; J < Steps.size(); ++J) {
      const FusedStep &S = Steps[J];
      switch (S.Op) {
      case FusedOp::Add:
        V[J] = Arg(S.A) + Arg(S.B);
        break;
      case FusedOp::Mul:
        V[J] = Arg(S.A) * Arg(S.B);
        break;
      case FusedOp::Gelu:
        V[J] = geluOf(Arg(S.A));
        break;
      case FusedOp::GeluGrad:
        V[J] = geluGradOf(Arg(S.A), Arg(S.B));
        break;
      case FusedOp::RoundBf16:
        V[J] = roundToBf16(Arg(S.A));
        break;
      }
    }
    Y[I] = V.back();
  }
}

MEGAC_VECTOR_CLONES void layerNormGrad(const float *X, int64_t Rows, int64_t H,
                                       const float *Gamma, const float *DY,
                                       double Eps, float *DX) {
  if (H == 0)
    return;
  for (int64_t R = 0; R < Rows; ++R) {
    const float *Xr = X + R * H, *Dr = DY + R * H;
    double Mean, Inv;
    rowStats(Xr, H, Eps, Mean, Inv);
    double SumG, SumGX;
    sumInLanes(
        H, [&](int64_t I) { return double(Dr[I]) * Gamma[I]; },
        [&](int64_t I) {
          return double(Dr[I]) * Gamma[I] * (Xr[I] - Mean) * Inv;
        },
        SumG, SumGX);
    SumG /= double(H);
    SumGX /= double(H);
    for (int64_t I = 0; I < H; ++I) {
      double G = double(Dr[I]) * Gamma[I];
      double Xh = (Xr[I] - Mean) * Inv;
      DX[R * H + I] = float(Inv * (G - SumG - Xh * SumGX));
    }
  }
}

MEGAC_VECTOR_CLONES void normalize(const float *X, int64_t Rows, int64_t H,
                                   double Eps, float *Y) {
  if (H == 0)
    return;
  for (int64_t R = 0; R < Rows; ++R) {
    double Mean, Inv;
    rowStats(X + R * H, H, Eps, Mean, Inv);
    for (int64_t I = 0; I < H; ++I)
      Y[R * H + I] = float((X[R * H + I] - Mean) * Inv);
  }
}

MEGAC_VECTOR_CLONES void layerNormGainGrad(const float *X, const float *DY,
                                           int64_t Rows, int64_t H, double Eps,
                                           float *DGamma) {
  std::vector<double> Acc(size_t(H), 0.0);
  for (int64_t R = 0; R < Rows; ++R) {
    double Mean, Inv;
    rowStats(X + R * H, H, Eps, Mean, Inv);
    for (int64_t J = 0; J < H; ++J) {
      const float Xh = float((X[R * H + J] - Mean) * Inv);
      const float Product = DY[R * H + J] * Xh; // rounded to f32, as mul's
      Acc[size_t(J)] += Product;
    }
  }
  for (int64_t J = 0; J < H; ++J)
    DGamma[J] = float(Acc[size_t(J)]);
}

void attentionGrads(const float *Q, const float *K, const float *V,
                    const float *DY, int64_t B, int64_t S, int64_t Hl,
                    int64_t Heads, bool Causal, const AttentionGradOutputs &Out,
                    const AttentionDropout *Drop) {
  const int64_t Hd = Hl / Heads;
  const float Scale = float(1.0 / std::sqrt(double(Hd)));
  const bool Dropping = Drop && Drop->Rate > 0;
  std::vector<float> Prob(size_t(S * S)), DP(size_t(S * S));
  std::vector<float> Dropped(Out.DV && Dropping ? size_t(S * S) : 0);
  const std::vector<QueryBlock> Blocks = queryBlocks(S, Causal);
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t H = 0; H < Heads; ++H) {
      const int64_t Base = Bi * S * Hl + H * Hd;
      // The probabilities exactly as the forward kernel computes them,
      // once for all three gradients.
      attentionProbabilities(Q + Base, K + Base, S, Hl, Hd, Scale, Causal,
                             Prob.data());
      if (Out.DV) { // dV = P'^T dY, P' the dropped-out probabilities
        const float *PD = Prob.data();
        if (Dropping) {
          std::copy(Prob.begin(), Prob.end(), Dropped.begin());
          applyAttentionMask(Drop, Bi, H, S, Dropped.data());
          PD = Dropped.data();
        }
        // Keys of a block are seen by the queries from the block on.
        for (const QueryBlock &Kb : Blocks)
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(Kb.rows()),
                      int(Hd), int(S - Kb.Begin), 1.0f,
                      PD + Kb.Begin * S + Kb.Begin, int(S),
                      DY + Base + Kb.Begin * Hl, int(Hl), 0.0f,
                      Out.DV + Base + Kb.Begin * Hl, int(Hl));
      }
      if (!Out.DQ && !Out.DK)
        continue;
      // dP' = dY V^T and dP = dP' times the mask (dropout's gradient), then
      // dScores = P * (dP - rowsum(P * dP)).
      for (const QueryBlock &Qb : Blocks)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(Qb.rows()),
                    int(Qb.Keys), int(Hd), 1.0f, DY + Base + Qb.Begin * Hl,
                    int(Hl), V + Base, int(Hl), 0.0f, DP.data() + Qb.Begin * S,
                    int(S));
      applyAttentionMask(Drop, Bi, H, S, DP.data());
      // Masked entries: P is 0 there, so dScores is too (the products
      // below read those left of their block's end).
      for (int64_t I = 0; I < S; ++I) {
        const int64_t Valid = Causal ? I + 1 : S;
        scoreGradRow(Prob.data() + I * S, Valid, DP.data() + I * S);
        std::fill(DP.data() + I * S + Valid, DP.data() + (I + 1) * S, 0.0f);
      }
      if (Out.DQ) // dQ = scale * dScores K
        for (const QueryBlock &Qb : Blocks)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                      int(Qb.rows()), int(Hd), int(Qb.Keys), Scale,
                      DP.data() + Qb.Begin * S, int(S), K + Base, int(Hl),
                      0.0f, Out.DQ + Base + Qb.Begin * Hl, int(Hl));
      if (Out.DK) // dK = scale * dScores^T Q
        for (const QueryBlock &Kb : Blocks)
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(Kb.rows()),
                      int(Hd), int(S - Kb.Begin), Scale,
                      DP.data() + Kb.Begin * S + Kb.Begin, int(S),
                      Q + Base + Kb.Begin * Hl, int(Hl), 0.0f,
                      Out.DK + Base + Kb.Begin * Hl, int(Hl));
    }
}

void attentionGrad(const float *Q, const float *K, const float *V,
                   const float *DY, int64_t B, int64_t S, int64_t Hl,
                   int64_t Heads, bool Causal, int Which, float *DX,
                   const AttentionDropout *Drop) {
  AttentionGradOutputs Out;
  Out.ofStep(Which) = DX;
  attentionGrads(Q, K, V, DY, B, S, Hl, Heads, Causal, Out, Drop);
}

void softmaxGrad(const float *Y, const float *DY, int64_t Rows, int64_t Cols,
                 float *DX) {
  for (int64_t R = 0; R < Rows; ++R) {
    const float *Yr = Y + R * Cols, *Dr = DY + R * Cols;
    double Dot = 0;
    for (int64_t I = 0; I < Cols; ++I)
      Dot += double(Yr[I]) * Dr[I];
    for (int64_t I = 0; I < Cols; ++I)
      DX[R * Cols + I] = float(double(Yr[I]) * (double(Dr[I]) - Dot));
  }
}

void embeddingGrad(const int32_t *Ids, int64_t N, const float *DY,
                   int64_t Rows, int64_t H, int64_t VocabStart, float *DT) {
  std::fill(DT, DT + Rows * H, 0.0f);
  for (int64_t I = 0; I < N; ++I) {
    int64_t Row = int64_t(Ids[I]) - VocabStart;
    if (Row < 0 || Row >= Rows)
      continue;
    float *D = DT + Row * H;
    const float *G = DY + I * H;
    for (int64_t J = 0; J < H; ++J)
      D[J] += G[J];
  }
}

void positionEmbeddingGrad(const float *DY, int64_t S, int64_t P, int64_t H,
                           float *DT) {
  std::memcpy(DT, DY, size_t(S * H) * sizeof(float));
  std::fill(DT + S * H, DT + P * H, 0.0f);
}

void crossEntropyGrad(const float *Logits, int64_t Rows, int64_t V,
                      const int32_t *Labels, double DLoss, double Normalizer,
                      float *DLogits, int64_t Classes) {
  const double Scale =
      DLoss / (Normalizer > 0 ? Normalizer : double(std::max<int64_t>(Rows, 1)));
  const int64_t C = classesInBlock(0, V, Classes);
  for (int64_t R = 0; R < Rows; ++R) {
    const float *L = Logits + R * V;
    float *D = DLogits + R * V;
    int32_t Lab = checkedLabel("cross_entropy_grad", Labels, R, C);
    RowSoftmax Row = rowSoftmax(L, C);
    softmaxGradRow(L, C, Row.Max, Row.Sum, Lab, Scale, D);
    std::fill(D + C, D + V, 0.0f); // padding
  }
}

void crossEntropyGradFromStats(const float *Logits, int64_t Rows, int64_t V,
                               const int32_t *Labels, const float *Stats,
                               int64_t Blocks, int64_t VocabStart,
                               int64_t VocabSize, double DLoss,
                               double Normalizer, float *DLogits,
                               int64_t Classes) {
  const double Scale =
      DLoss / (Normalizer > 0 ? Normalizer : double(std::max<int64_t>(Rows, 1)));
  const int64_t Valid = classesInBlock(VocabStart, V, Classes);
  for (int64_t R = 0; R < Rows; ++R) {
    const float *L = Logits + R * V;
    float *D = DLogits + R * V;
    const int64_t Local =
        checkedLabel("cross_entropy_grad", Labels, R,
                     Classes > 0 ? std::min(VocabSize, Classes) : VocabSize) -
        VocabStart;
    const double Lse = logSumExpOfBlocks(Stats + R * Blocks * 3, Blocks);
    softmaxGradRow(L, Valid, Lse, 1.0, Local, Scale, D);
    std::fill(D + Valid, D + V, 0.0f); // padding
  }
}

void sumLeading(const float *X, int64_t Outer, int64_t Inner, float *Y) {
  std::vector<double> Acc(size_t(Inner), 0.0);
  for (int64_t I = 0; I < Outer; ++I)
    for (int64_t J = 0; J < Inner; ++J)
      Acc[size_t(J)] += X[I * Inner + J];
  for (int64_t J = 0; J < Inner; ++J)
    Y[J] = float(Acc[size_t(J)]);
}

double sumSquares(const float *X, int64_t N) {
  double S = 0;
  for (int64_t I = 0; I < N; ++I)
    S += double(X[I]) * X[I];
  return S;
}

MEGAC_VECTOR_CLONES void adamw(float *Param, const float *Grad, int64_t N,
                               double Coef, float *M, float *V, int64_t Step,
                               double Lr, double Beta1, double Beta2,
                               double Eps, double WeightDecay) {
  const megac_adamw_step S = megac_adamw_constants(
      Coef, Lr, Beta1, Beta2, Eps, WeightDecay, std::pow(Beta1, double(Step)),
      std::pow(Beta2, double(Step)));
  for (int64_t I = 0; I < N; ++I)
    megac_adamw(S, Param[I], Grad[I], M[I], V[I]);
}

double learningRate(double MaxLr, double MinLr, int64_t Warmup, int64_t Total,
                    int64_t Step) {
  if (Warmup > 0 && Step <= Warmup)
    return MaxLr * double(Step) / double(Warmup);
  if (Step >= Total)
    return MinLr;
  double Progress = double(Step - Warmup) / double(Total - Warmup);
  return MinLr + 0.5 * (MaxLr - MinLr) *
                     (1.0 + std::cos(3.14159265358979323846 * Progress));
}

void sliceChunk(const uint8_t *X, int64_t Outer, int64_t Len, int64_t Inner,
                int64_t Parts, int64_t Index, size_t Elem, uint8_t *Y) {
  const size_t Row = size_t(Len * Inner) * Elem;
  for (int64_t O = 0; O < Outer; ++O)
    std::memcpy(Y + O * Row, X + (O * Parts + Index) * Row, Row);
}

void concatChunks(const uint8_t *Chunks, int64_t Outer, int64_t Len,
                  int64_t Inner, int64_t Parts, size_t Elem, uint8_t *Y) {
  const size_t Row = size_t(Len * Inner) * Elem;
  const size_t Chunk = Row * size_t(Outer);
  for (int64_t P = 0; P < Parts; ++P)
    for (int64_t O = 0; O < Outer; ++O)
      std::memcpy(Y + (O * Parts + P) * Row, Chunks + P * Chunk + O * Row,
                  Row);
}

void dropout(const float *X, const std::vector<int64_t> &Local,
             const std::vector<int64_t> &Global,
             const std::vector<int64_t> &Offset, double Rate, uint64_t Seed,
             uint64_t Stream, uint64_t Step, float *Y) {
  int64_t N = 1;
  for (int64_t D : Local)
    N *= D;
  if (!(Rate > 0)) { // every u >= 0 and the scale is 1: the identity
    if (X != Y)
      std::copy(X, X + N, Y);
    return;
  }
  const uint64_t Key = dropoutKey(Seed, Stream, Step);
  const double Scale = 1.0 / (1.0 - Rate);
  forEachRun(Local, Offset, Global, [&](int64_t L, int64_t G, int64_t Len) {
    for (int64_t J = 0; J < Len; ++J)
      Y[L + J] = dropoutUniform(Key, uint64_t(G + J)) >= Rate
                     ? float(double(X[L + J]) * Scale)
                     : 0.0f;
  });
}

} // namespace kernels
} // namespace megac_rt
