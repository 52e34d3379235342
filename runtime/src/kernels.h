//===- kernels.h - fp32 CPU kernels for the plan opcodes ------*- C++ -*-===//
//
// Plain row-major kernels, one per opcode, on raw pointers. Shapes have
// already been validated by the plan verifier; the only checks left here
// are on data (token ids, labels), which throw RunError.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_KERNELS_H
#define MEGAC_RT_KERNELS_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megac_rt {
namespace kernels {

/// y[M,N] = x[M,K] * w, with w [K,N] or, if \p TransposeW, [N,K].
void linear(const float *X, int64_t M, int64_t K, const float *W, int64_t N,
            bool TransposeW, float *Y);

/// y[b] = a[b] (M,K) * b[b] (K,N) for each of \p Batch matrices.
void matmul(const float *A, const float *B, int64_t Batch, int64_t M,
            int64_t K, int64_t N, float *Y);

/// y = a op b where b (\p NB elements) repeats over a's \p NA elements.
void add(const float *A, int64_t NA, const float *B, int64_t NB, float *Y);
void mul(const float *A, int64_t NA, const float *B, int64_t NB, float *Y);

/// tanh-approximated GeLU, as GPT-2 uses.
void gelu(const float *X, int64_t N, float *Y);

/// Normalizes each of \p Rows rows of \p H elements (biased variance).
void layerNorm(const float *X, int64_t Rows, int64_t H, const float *Gamma,
               const float *Beta, double Eps, float *Y);

/// Softmax over the last dimension of \p Rows x \p Cols.
void softmax(const float *X, int64_t Rows, int64_t Cols, float *Y);

/// Multi-head scaled dot-product attention on (B,S,Hl) tensors; head h
/// uses columns [h*hd, (h+1)*hd).
void attention(const float *Q, const float *K, const float *V, int64_t B,
               int64_t S, int64_t Hl, int64_t Heads, bool Causal, float *Y);

/// Permutes the axes of a tensor of 4-byte elements: y.shape[i] =
/// x.shape[perm[i]].
void transpose(const uint32_t *X, const std::vector<int64_t> &Shape,
               const std::vector<int64_t> &Perm, uint32_t *Y);

/// Mean over \p Rows of logsumexp(logits) - logits[label]. Throws RunError
/// on a label outside [0, V).
double crossEntropy(const float *Logits, int64_t Rows, int64_t V,
                    const int32_t *Labels);

/// y[i,:] = table[ids[i]-VocabStart,:] for ids within the table's rows,
/// else 0. Throws RunError for an id outside [0, VocabSize).
void embedding(const float *Table, int64_t Rows, int64_t H,
               const int32_t *Ids, int64_t N, int64_t VocabStart,
               int64_t VocabSize, float *Y);

/// Chunk \p Index of \p Parts along a dimension: views x as
/// (Outer, Parts*Len, Inner) elements of \p Elem bytes.
void sliceChunk(const uint8_t *X, int64_t Outer, int64_t Len, int64_t Inner,
                int64_t Parts, int64_t Index, size_t Elem, uint8_t *Y);

/// Inverse of sliceChunk for all parts at once: \p Chunks holds \p Parts
/// contiguous (Outer, Len, Inner) blocks, concatenated into y along the
/// middle dimension.
void concatChunks(const uint8_t *Chunks, int64_t Outer, int64_t Len,
                  int64_t Inner, int64_t Parts, size_t Elem, uint8_t *Y);

} // namespace kernels
} // namespace megac_rt

#endif // MEGAC_RT_KERNELS_H
