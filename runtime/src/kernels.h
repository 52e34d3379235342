//===- kernels.h - fp32 CPU kernels for the plan opcodes ------*- C++ -*-===//
//
// Plain row-major kernels, one per opcode, on raw pointers. Shapes have
// already been validated by the plan verifier; the only checks left here
// are on data (token ids, labels), which throw RunError.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_KERNELS_H
#define MEGAC_RT_KERNELS_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/elementwise.cuh"
#include "vocab_classes.h"

namespace megac_rt {
namespace kernels {

/// y[M,N] = x[M,K] * w, with w [K,N] or, if \p TransposeW, [N,K].
/// Runs the matrix products on one OpenBLAS thread, unless
/// OPENBLAS_NUM_THREADS names a count of 1 or more: OpenBLAS splits a product
/// among as many threads as the process may use cores, and a product split
/// otherwise sums in another order. One thread makes a rank's results the
/// same bits however its launcher binds it to cores (mpirun binds each
/// rank to one, torchrun none), so that a run resumed under another
/// launcher continues bit for bit. The ranks are the CPU backend's
/// parallelism.
void pinBlasThreads();

/// "OpenBLAS Haswell, 1 thread": what, besides the plan, decides the CPU
/// backend's bits (OpenBLAS's kernels for this CPU, and how many threads
/// split a product), for a checkpoint to record.
std::string blasDescription();

void linear(const float *X, int64_t M, int64_t K, const float *W, int64_t N,
            bool TransposeW, float *Y);

/// y[b] = a[b] (M,K) * b[b] (K,N) for each of \p Batch matrices.
void matmul(const float *A, const float *B, int64_t Batch, int64_t M,
            int64_t K, int64_t N, float *Y);

/// y = a op b where b (\p NB elements) repeats over a's \p NA elements.
void add(const float *A, int64_t NA, const float *B, int64_t NB, float *Y);
void mul(const float *A, int64_t NA, const float *B, int64_t NB, float *Y);

/// tanh-approximated GeLU, as GPT-2 uses, of one value, and dy times its
/// derivative: the formulas of the CUDA kernels, from their one source.
inline float geluOf(float V) { return megac_gelu(V); }
inline float geluGradOf(float X, float DY) { return megac_gelu_grad(X, DY); }

/// tanh-approximated GeLU, as GPT-2 uses.
void gelu(const float *X, int64_t N, float *Y);

/// Normalizes each of \p Rows rows of \p H elements (biased variance).
void layerNorm(const float *X, int64_t Rows, int64_t H, const float *Gamma,
               const float *Beta, double Eps, float *Y);

/// Softmax over the last dimension of \p Rows x \p Cols.
void softmax(const float *X, int64_t Rows, int64_t Cols, float *Y);

/// Dropout of attention probabilities: probability (b, h, i, j) of this
/// rank's block has the global index ((b + BatchOffset) GlobalHeads + h +
/// HeadOffset) S^2 + i S + j in the whole [GlobalBatch, GlobalHeads, S, S]
/// tensor, and is kept iff dropoutUniform(Key, index) >= Rate (rng.h), then
/// scaled by 1 / (1 - Rate).
struct AttentionDropout {
  double Rate = 0;
  uint64_t Key = 0;
  int64_t GlobalHeads = 0, BatchOffset = 0, HeadOffset = 0;
};

/// Multi-head scaled dot-product attention on (B,S,Hl) tensors; head h
/// uses columns [h*hd, (h+1)*hd). \p Drop (may be null): probability
/// dropout.
void attention(const float *Q, const float *K, const float *V, int64_t B,
               int64_t S, int64_t Hl, int64_t Heads, bool Causal, float *Y,
               const AttentionDropout *Drop = nullptr);

/// Permutes the axes of a tensor of 4-byte elements: y.shape[i] =
/// x.shape[perm[i]].
void transpose(const uint32_t *X, const std::vector<int64_t> &Shape,
               const std::vector<int64_t> &Perm, uint32_t *Y);

/// Sum over \p Rows of logsumexp(logits) - logits[label], divided by
/// \p Normalizer (<= 0: by Rows, i.e. the mean). With \p Classes > 0 (a
/// padded vocabulary) only a row's first Classes logits count. Throws
/// RunError on a label outside [0, V) (or [0, Classes)).
double crossEntropy(const float *Logits, int64_t Rows, int64_t V,
                    const int32_t *Labels, double Normalizer = 0,
                    int64_t Classes = 0);


/// The nearest bfloat16 to \p X (ties to even), as a float: NaN stays NaN
/// (quiet), values beyond bf16's range become infinity.
float roundToBf16(float X);

/// Y[i] = roundToBf16(X[i]).
void roundBf16(const float *X, int64_t N, float *Y);

/// One step of a fused elementwise kernel (plan: FusedStep): Op of the
/// values A and B, each an input (k >= 0) or an earlier step j (-(j + 1)).
enum class FusedOp { Add, Mul, Gelu, GeluGrad, RoundBf16 };
struct FusedStep {
  FusedOp Op;
  int A = 0, B = 0;
};
/// Y[i] = the last step's value at element i of \p N, input k read at
/// i % Period[k] (its element count, or the row length of a broadcast
/// vector). Each step computes what the unfused kernel computes.
void fusedElementwise(const std::vector<FusedStep> &Steps,
                      const std::vector<const float *> &In,
                      const std::vector<int64_t> &Period, int64_t N,
                      float *Y);

/// Vocabulary-parallel cross-entropy, part 1. Logits (Rows, V) hold the
/// vocabulary ids VocabStart .. VocabStart+V-1 in \p Blocks equal blocks;
/// for block k, Stats[r, 3k .. 3k+2] = (max logit m, sum exp(logit - m),
/// the label's logit if the label is in the block else 0). Ids from
/// \p Classes on (if > 0) are padding: a block of padding alone yields
/// (-infinity, 0, 0). Throws RunError on a label outside [0, VocabSize).
void crossEntropyStats(const float *Logits, int64_t Rows, int64_t V,
                       const int32_t *Labels, int64_t VocabStart,
                       int64_t VocabSize, int64_t Blocks, float *Stats,
                       int64_t Classes = 0);

/// Part 2: the loss from all blocks' statistics (Rows, 3 Blocks): per token
/// logsumexp - label logit, summed and divided by \p Normalizer (<= 0:
/// Rows). Equals crossEntropy of the logits the statistics came from.
double crossEntropyFromStats(const float *Stats, int64_t Rows, int64_t Blocks,
                             double Normalizer);

/// y[i,:] = table[ids[i]-VocabStart,:] for ids within the table's rows,
/// else 0. Throws RunError for an id outside [0, VocabSize).
void embedding(const float *Table, int64_t Rows, int64_t H,
               const int32_t *Ids, int64_t N, int64_t VocabStart,
               int64_t VocabSize, float *Y);

//===-- Backward kernels (format version 2) -------------------------------===//

/// dw = x^T dy ([K,N]) for x [M,K], dy [M,N]; with \p Transposed the
/// transpose dy^T x ([N,K]), the gradient of a linear whose weight was [N,K].
void linearWeightGrad(const float *X, int64_t M, int64_t K, const float *DY,
                      int64_t N, bool Transposed, float *DW,
                      float Beta = 0.0f);

/// dx = dy * gelu'(x) for the tanh-form GeLU.
void geluGrad(const float *X, const float *DY, int64_t N, float *DX);

/// Input gradient of layerNorm (biased variance) for \p Rows rows of \p H:
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
void layerNormGrad(const float *X, int64_t Rows, int64_t H,
                   const float *Gamma, const float *DY, double Eps,
                   float *DX);

/// xhat = (x - mean) / sqrt(var + eps) per row (layerNorm without affine).
void normalize(const float *X, int64_t Rows, int64_t H, double Eps, float *Y);

/// The gain's gradient of layerNorm: dgamma[j] = sum over the \p Rows rows
/// of dy * xhat, with xhat as normalize() gives it, each product in f32 and
/// the sums in f64 in row order: sumLeading of dy * normalize(x), bit for
/// bit, without storing either.
void layerNormGainGrad(const float *X, const float *DY, int64_t Rows, int64_t H,
                       double Eps, float *DGamma);

/// Where attentionGrads writes each gradient; null: not wanted.
struct AttentionGradOutputs {
  float *DQ = nullptr, *DK = nullptr, *DV = nullptr;
  /// The output of gradient step \p Which (0 q, 1 k, 2 v).
  float *&ofStep(int Which) { return Which == 0 ? DQ : Which == 1 ? DK : DV; }
};

/// Gradients of attention() with respect to q, k and v (those \p Out asks
/// for), recomputing the probabilities once per head for all of them; dy
/// and the results are (B,S,Hl). Each gradient has the same bits as
/// attentionGrad() gives it alone.
void attentionGrads(const float *Q, const float *K, const float *V,
                    const float *DY, int64_t B, int64_t S, int64_t Hl,
                    int64_t Heads, bool Causal, const AttentionGradOutputs &Out,
                    const AttentionDropout *Drop = nullptr);

/// Gradient of attention() with respect to q (\p Which 0), k (1) or v (2),
/// recomputing the probabilities; dy and the result are (B,S,Hl).
void attentionGrad(const float *Q, const float *K, const float *V,
                   const float *DY, int64_t B, int64_t S, int64_t Hl,
                   int64_t Heads, bool Causal, int Which, float *DX,
                   const AttentionDropout *Drop = nullptr);

/// dx = y * (dy - sum(dy * y)) per row, y = softmax(x).
void softmaxGrad(const float *Y, const float *DY, int64_t Rows, int64_t Cols,
                 float *DX);

/// dtable (Rows,H) = scatter-add of dy rows by ids - VocabStart; ids outside
/// [VocabStart, VocabStart + Rows) are ignored.
void embeddingGrad(const int32_t *Ids, int64_t N, const float *DY,
                   int64_t Rows, int64_t H, int64_t VocabStart, float *DT);

/// dtable (P,H): rows < S are dy (S,H), the rest 0.
void positionEmbeddingGrad(const float *DY, int64_t S, int64_t P, int64_t H,
                           float *DT);

/// dlogits = (softmax(logits) - onehot(label)) * DLoss / Normalizer
/// (<= 0: Rows); with \p Classes > 0 the softmax is over a row's first
/// Classes logits and the rest get 0. Throws RunError on a label outside
/// [0, V) (or [0, Classes)).
void crossEntropyGrad(const float *Logits, int64_t Rows, int64_t V,
                      const int32_t *Labels, double DLoss, double Normalizer,
                      float *DLogits, int64_t Classes = 0);

/// The same for one vocabulary block (ids VocabStart .. VocabStart+V-1):
/// the softmax normalizer comes from all blocks' statistics \p Stats
/// (Rows, 3 Blocks), and labels outside the block contribute no one-hot.
void crossEntropyGradFromStats(const float *Logits, int64_t Rows, int64_t V,
                               const int32_t *Labels, const float *Stats,
                               int64_t Blocks, int64_t VocabStart,
                               int64_t VocabSize, double DLoss,
                               double Normalizer, float *DLogits,
                               int64_t Classes = 0);

/// y[j] = sum over i < Outer of x[i*Inner + j].
void sumLeading(const float *X, int64_t Outer, int64_t Inner, float *Y);

/// Sum of x^2 (double accumulation).
double sumSquares(const float *X, int64_t N);

/// One AdamW step (t = \p Step, 1-based) on \p N elements, in place on
/// \p Param, \p M and \p V: g = grad * coef; m = b1 m + (1-b1) g;
/// v = b2 v + (1-b2) g^2; p -= lr (mhat / (sqrt(vhat) + eps) + wd p) with
/// mhat = m / (1 - b1^t), vhat = v / (1 - b2^t); the ratio
/// mhat / (sqrt(vhat) + eps) in float, the rest in double (megac_adamw,
/// the device's formula too).
void adamw(float *Param, const float *Grad, int64_t N, double Coef, float *M,
           float *V, int64_t Step, double Lr, double Beta1, double Beta2,
           double Eps, double WeightDecay);

/// Learning rate of step \p Step (1-based): linear warm-up to \p MaxLr over
/// \p Warmup steps (none if 0), then cosine decay reaching \p MinLr at
/// \p Total, \p MinLr after.
double learningRate(double MaxLr, double MinLr, int64_t Warmup, int64_t Total,
                    int64_t Step);

/// Chunk \p Index of \p Parts along a dimension: views x as
/// (Outer, Parts*Len, Inner) elements of \p Elem bytes.
void sliceChunk(const uint8_t *X, int64_t Outer, int64_t Len, int64_t Inner,
                int64_t Parts, int64_t Index, size_t Elem, uint8_t *Y);

/// Inverse of sliceChunk for all parts at once: \p Chunks holds \p Parts
/// contiguous (Outer, Len, Inner) blocks, concatenated into y along the
/// middle dimension.
void concatChunks(const uint8_t *Chunks, int64_t Outer, int64_t Len,
                  int64_t Inner, int64_t Parts, size_t Elem, uint8_t *Y);

//===-- Dropout (format version 4) -----------------------------------------===//

/// Dropout of the block \p X (shape \p Local) of a \p Global-shaped tensor,
/// the block starting at \p Offset. Element g of the global tensor (flat,
/// row-major over \p Global) is kept iff
///   u = (splitmix64(K + g) >> 11) * 2^-53  >=  Rate,
///   K = splitmix64(splitmix64(splitmix64(Seed ^ 0x64726f706f757421)
///                             + Stream) + Step)
/// (rng.h: dropoutKey, dropoutUniform; u and Rate compared as doubles);
/// a kept element becomes float(double(x) * (1.0 / (1.0 - Rate))), a dropped
/// one +0.0. The mask depends only on (Seed, Stream, Step, g), so any
/// blocking of the tensor gives the same result, and applying the same
/// dropout to dy is its gradient. Rate 0 copies x. Y may be X.
void dropout(const float *X, const std::vector<int64_t> &Local,
             const std::vector<int64_t> &Global,
             const std::vector<int64_t> &Offset, double Rate, uint64_t Seed,
             uint64_t Stream, uint64_t Step, float *Y);

} // namespace kernels
} // namespace megac_rt

#endif // MEGAC_RT_KERNELS_H
