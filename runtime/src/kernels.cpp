//===- kernels.cpp - fp32 CPU kernels for the plan opcodes ----------------===//
//
// Matrix products go through cblas_sgemm (OpenBLAS); everything else is a
// straightforward loop. Reductions (layer norm, softmax, cross-entropy)
// accumulate in double: the runtime is a correctness reference for the
// compiler's sharding, so it should not add avoidable rounding noise that
// differs between sharded and unsharded runs.
//
//===----------------------------------------------------------------------===//

#include "kernels.h"
#include "error.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace megac_rt {
namespace kernels {

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

void gelu(const float *X, int64_t N, float *Y) {
  const float C = 0.7978845608028654f; // sqrt(2/pi)
  for (int64_t I = 0; I < N; ++I) {
    float V = X[I];
    Y[I] = 0.5f * V * (1.0f + std::tanh(C * (V + 0.044715f * V * V * V)));
  }
}

void layerNorm(const float *X, int64_t Rows, int64_t H, const float *Gamma,
               const float *Beta, double Eps, float *Y) {
  for (int64_t R = 0; R < Rows; ++R) {
    const float *Xr = X + R * H;
    double Mean = 0, Var = 0;
    for (int64_t I = 0; I < H; ++I)
      Mean += Xr[I];
    Mean /= double(H);
    for (int64_t I = 0; I < H; ++I)
      Var += (Xr[I] - Mean) * (Xr[I] - Mean);
    Var /= double(H);
    double Inv = 1.0 / std::sqrt(Var + Eps);
    for (int64_t I = 0; I < H; ++I)
      Y[R * H + I] = float((Xr[I] - Mean) * Inv) * Gamma[I] + Beta[I];
  }
}

namespace {
/// Y[0..N) = softmax(X[0..N)), max-subtracted and summed in double; X may
/// alias Y. Shared by the softmax op and attention's score rows.
void softmaxRow(const float *X, int64_t N, float *Y) {
  float Max = -std::numeric_limits<float>::infinity();
  for (int64_t I = 0; I < N; ++I)
    Max = std::max(Max, X[I]);
  double Sum = 0;
  for (int64_t I = 0; I < N; ++I) {
    Y[I] = std::exp(X[I] - Max);
    Sum += Y[I];
  }
  float Inv = float(1.0 / Sum);
  for (int64_t I = 0; I < N; ++I)
    Y[I] *= Inv;
}
} // namespace

void softmax(const float *X, int64_t Rows, int64_t Cols, float *Y) {
  for (int64_t R = 0; R < Rows; ++R)
    softmaxRow(X + R * Cols, Cols, Y + R * Cols);
}

void attention(const float *Q, const float *K, const float *V, int64_t B,
               int64_t S, int64_t Hl, int64_t Heads, bool Causal, float *Y) {
  const int64_t Hd = Hl / Heads;
  const float Scale = float(1.0 / std::sqrt(double(Hd)));
  std::vector<float> Scores(size_t(S * S));
  for (int64_t Bi = 0; Bi < B; ++Bi)
    for (int64_t H = 0; H < Heads; ++H) {
      const int64_t Base = Bi * S * Hl + H * Hd;
      // Scores = scale * Q_h K_h^T; the head's columns are strided by Hl.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(S), int(S),
                  int(Hd), Scale, Q + Base, int(Hl), K + Base, int(Hl), 0.0f,
                  Scores.data(), int(S));
      for (int64_t I = 0; I < S; ++I) {
        float *Row = Scores.data() + I * S;
        int64_t Valid = Causal ? I + 1 : S;
        softmaxRow(Row, Valid, Row);
        for (int64_t J = Valid; J < S; ++J)
          Row[J] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(S), int(Hd),
                  int(S), 1.0f, Scores.data(), int(S), V + Base, int(Hl), 0.0f,
                  Y + Base, int(Hl));
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
                    const int32_t *Labels) {
  double Total = 0;
  for (int64_t R = 0; R < Rows; ++R) {
    const float *L = Logits + R * V;
    int32_t Lab = Labels[R];
    if (Lab < 0 || Lab >= V)
      throw RunError("cross_entropy: label " + std::to_string(Lab) +
                     " at position " + std::to_string(R) +
                     " is outside [0, " + std::to_string(V) + ")");
    float Max = *std::max_element(L, L + V);
    double Sum = 0;
    for (int64_t I = 0; I < V; ++I)
      Sum += std::exp(double(L[I]) - Max);
    Total += std::log(Sum) + Max - L[Lab];
  }
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

} // namespace kernels
} // namespace megac_rt
