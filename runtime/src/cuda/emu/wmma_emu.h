//===- wmma_emu.h - nvcuda::wmma and bf16 on the host emulation -*- C++ -*-===//
//
// The warp matrix operations the tensor-core attention kernels use
// (16x16x16 tiles, bf16 inputs, fp32 accumulators), for the SIMT emulation.
// On a GPU a fragment is spread over the warp's 32 lanes in a layout CUDA
// does not specify; here every lane holds the whole tile and computes the
// whole operation itself. Kernels that only load, multiply, fill and store
// fragments (never index their elements) see the same results either way,
// up to the order in which fp32 sums are taken. As on a GPU, the stride
// (ldm) must be a multiple of 16 bytes.
// __syncwarp is a block barrier here: the kernels call it the same number
// of times in every warp.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_EMU_WMMA_EMU_H
#define MEGAC_RT_CUDA_EMU_WMMA_EMU_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

/// bf16 as CUDA's __nv_bfloat16: the high half of an fp32.
struct __nv_bfloat16 {
  uint16_t Bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float F) {
  uint32_t U;
  std::memcpy(&U, &F, 4);
  if ((U & 0x7f800000u) != 0x7f800000u) // finite: round to nearest even
    U += 0x7fffu + ((U >> 16) & 1u);
  else if (U & 0x007fffffu) // NaN: stays one (quiet), as CUDA's
    return {uint16_t((U >> 16) | 0x40u)};
  return {uint16_t(U >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 H) {
  const uint32_t U = uint32_t(H.Bits) << 16;
  float F;
  std::memcpy(&F, &U, 4);
  return F;
}

inline void __syncwarp(unsigned = 0xffffffffu) { __syncthreads(); }

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

/// A 16x16 tile, whole in every lane, as floats (bf16 widens exactly).
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "16x16x16 tiles only");
  float V[16 * 16];
};

/// CUDA requires ldm to be a multiple of 16 bytes; so does the emulation
/// (in release builds too), so that CI catches a kernel that breaks it.
inline void checkStride(unsigned Ld, size_t ElementBytes) {
  if (Ld * ElementBytes % 16) {
    std::fprintf(stderr, "wmma: ldm %u is not a multiple of 16 bytes\n", Ld);
    std::abort();
  }
}

template <class T> inline float widen(const T &X) { return float(X); }
template <> inline float widen(const __nv_bfloat16 &X) {
  return __bfloat162float(X);
}

/// Element (R, C) of a tile stored row- or column-major with stride Ld.
template <class T>
inline float at(const T *P, unsigned Ld, bool ColMajor, int R, int C) {
  return widen(ColMajor ? P[size_t(C) * Ld + R] : P[size_t(R) * Ld + C]);
}

template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &F,
                             const T *P, unsigned Ld) {
  static_assert(!std::is_same<Use, accumulator>::value,
                "an accumulator's load names its memory layout");
  checkStride(Ld, sizeof(T));
  const bool Col = std::is_same<Layout, col_major>::value;
  for (int R = 0; R < 16; ++R)
    for (int C = 0; C < 16; ++C)
      F.V[R * 16 + C] = at(P, Ld, Col, R, C);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &F,
                             const float *P, unsigned Ld, layout_t L) {
  checkStride(Ld, sizeof(float));
  for (int R = 0; R < 16; ++R)
    for (int C = 0; C < 16; ++C)
      F.V[R * 16 + C] = at(P, Ld, L == mem_col_major, R, C);
}

inline void store_matrix_sync(float *P,
                              const fragment<accumulator, 16, 16, 16, float> &F,
                              unsigned Ld, layout_t L) {
  checkStride(Ld, sizeof(float));
  for (int R = 0; R < 16; ++R)
    for (int C = 0; C < 16; ++C)
      (L == mem_col_major ? P[size_t(C) * Ld + R] : P[size_t(R) * Ld + C]) =
          F.V[R * 16 + C];
}

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &F, float X) {
  for (float &E : F.V)
    E = X;
}

/// D = A B + C, fp32 accumulation.
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &D,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &A,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &B,
                     const fragment<accumulator, 16, 16, 16, float> &C) {
  float Out[16 * 16];
  for (int R = 0; R < 16; ++R)
    for (int Cc = 0; Cc < 16; ++Cc) {
      float S = C.V[R * 16 + Cc];
      for (int K = 0; K < 16; ++K)
        S += A.V[R * 16 + K] * B.V[K * 16 + Cc];
      Out[R * 16 + Cc] = S;
    }
  std::memcpy(D.V, Out, sizeof Out);
}

} // namespace wmma
} // namespace nvcuda

#endif // MEGAC_RT_CUDA_EMU_WMMA_EMU_H
