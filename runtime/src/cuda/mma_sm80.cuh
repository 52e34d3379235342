//===- mma_sm80.cuh - Warp tensor-core instructions, laid out -*- CUDA -*-===//
//
// The tensor-core instructions of sm_80 and later that the register-
// resident flash attention (flash_mma.cuh) is built from: mma.sync
// m16n8k16 (bf16 in, fp32 accumulation), ldmatrix (x4, plain and
// transposed) and cp.async (16 bytes, in groups). Unlike wmma, whose
// fragment layout CUDA leaves unspecified, the PTX ISA fixes which lane
// holds which element, so a kernel can take a row's softmax straight from
// the accumulators and hand them back to the next product as bf16 without
// passing through shared memory.
//
// Lane L of a warp is (group G = L / 4, thread T = L % 4). The layouts
// used here (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   A (16 x 16, row major), 4 registers of 2 bf16 (low half first):
//     R[0] (G, 2T..2T+1)   R[1] (G+8, 2T..)   R[2] (G, 2T+8..)
//     R[3] (G+8, 2T+8..)
//   B (16 x 8, k by n), 2 registers: R[0] (k 2T..2T+1, n G), R[1] (k
//     2T+8.., n G)
//   C (16 x 8 fp32), 4 floats: (G, 2T), (G, 2T+1), (G+8, 2T), (G+8, 2T+1)
// ldmatrix x4: lane L names row L % 8 of 8x8 matrix L / 8; register J of
// lane L gets matrix J's row L / 4, columns 2 (L % 4).. (transposed: its
// column L / 4, rows 2 (L % 4)..).
//
// With MEGAC_CUDA_EMULATION the same functions run on the host emulator,
// which moves the registers between lanes through its warp exchange
// exactly as the ISA says, so CI checks a kernel's use of the layouts.
// Its cp.async copies land as they are issued, the earliest a GPU may
// land them, or (MEGAC_CUDA_EMU_CP_ASYNC=late) only when a wait lets
// them, the latest: a kernel that overwrites a tile other threads still
// read, or reads one before waiting for it, computes other numbers in one
// of the two.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_MMA_SM80_CUH
#define MEGAC_RT_CUDA_MMA_SM80_CUH

#include <cstdint>
#ifndef MEGAC_CUDA_EMULATION
#include <cuda_bf16.h>
#else
#include "emu/wmma_emu.h" // the host's __nv_bfloat16 and rounding
#include <array>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <vector>
#endif

namespace megac_rt {
namespace cuda {

/// The fragments of one mma.m16n8k16.
struct MmaA {
  uint32_t R[4];
};
struct MmaC {
  float R[4];
};

/// Two floats as bf16 (round to nearest even), \p Lo in the low half.
__device__ inline uint32_t packBf16x2(float Lo, float Hi) {
#ifdef MEGAC_CUDA_EMULATION
  return uint32_t(__float2bfloat16_rn(Lo).Bits) |
         uint32_t(__float2bfloat16_rn(Hi).Bits) << 16;
#else
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(Lo))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(Hi))) << 16;
#endif
}

#ifdef MEGAC_CUDA_EMULATION

namespace emu_mma {
inline unsigned lane() { return threadIdx.x % 32; }

/// Whether cp.async copies land at the wait (MEGAC_CUDA_EMU_CP_ASYNC=late)
/// rather than when issued (unset, or "issue"); tests may set it.
inline bool &copiesLandLate() {
  static bool Late =
      megac_emu::knob("MEGAC_CUDA_EMU_CP_ASYNC", {"issue", "late"}) == "late";
  return Late;
}
/// A thread's cp.async copies in flight (late landing): the bytes read at
/// issue, where they go, and the group each belongs to.
struct AsyncCopies {
  struct Copy {
    void *To;
    std::array<unsigned char, 16> Bytes;
    int64_t Group;
  };
  std::vector<Copy> Pending;
  int64_t Committed = 0; // groups closed so far
};
/// The current thread's (fibers of one block run on one host thread).
inline AsyncCopies &asyncCopies() {
  thread_local std::unordered_map<const void *, AsyncCopies> ByThread;
  return ByThread[megac_emu::simtApi->current()];
}

/// The warp's 32 values of \p Mine (one exchange: the caller must
/// __syncthreads after reading).
template <class T> inline const unsigned char *share(const T &Mine) {
  static_assert(sizeof(T) <= megac_emu::kWarpSlotBytes, "one slot");
  return megac_emu::simtApi->warpExchange(&Mine, sizeof(T));
}
template <class T> inline T slot(const unsigned char *Warp, unsigned Lane) {
  T V;
  std::memcpy(&V, Warp + size_t(Lane) * megac_emu::kWarpSlotBytes, sizeof V);
  return V;
}
inline uint16_t half(uint32_t R, int Which) {
  return uint16_t(Which ? R >> 16 : R & 0xffffu);
}
inline float widen(uint16_t Bits) { return __bfloat162float({Bits}); }

inline void ldmatrix(uint32_t (&R)[4], const uint16_t *Row, bool Trans) {
  if (reinterpret_cast<uintptr_t>(Row) % 16) {
    std::fprintf(stderr, "ldmatrix: a row address is not 16-byte aligned\n");
    std::abort();
  }
  const unsigned char *W = share(Row);
  const unsigned L = lane();
  for (unsigned J = 0; J < 4; ++J) {
    uint16_t Lo, Hi;
    if (!Trans) {
      const uint16_t *P = slot<const uint16_t *>(W, 8 * J + L / 4);
      Lo = P[2 * (L % 4)];
      Hi = P[2 * (L % 4) + 1];
    } else {
      Lo = slot<const uint16_t *>(W, 8 * J + 2 * (L % 4))[L / 4];
      Hi = slot<const uint16_t *>(W, 8 * J + 2 * (L % 4) + 1)[L / 4];
    }
    R[J] = uint32_t(Lo) | uint32_t(Hi) << 16;
  }
  __syncthreads();
}
} // namespace emu_mma

#endif

/// ldmatrix.x4 (\p Trans: .trans): \p Row is the row this lane names
/// (16-byte aligned, in shared memory).
template <bool Trans>
__device__ inline void ldmatrixX4(uint32_t (&R)[4], const uint16_t *Row) {
#ifdef MEGAC_CUDA_EMULATION
  emu_mma::ldmatrix(R, Row, Trans);
#else
  const uint32_t At = uint32_t(__cvta_generic_to_shared(Row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, "
                 "%2, %3}, [%4];\n"
                 : "=r"(R[0]), "=r"(R[1]), "=r"(R[2]), "=r"(R[3])
                 : "r"(At));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, "
                 "[%4];\n"
                 : "=r"(R[0]), "=r"(R[1]), "=r"(R[2]), "=r"(R[3])
                 : "r"(At));
#endif
}

/// C += A B for one 16x8x16 tile; \p B0 and \p B1 are B's registers.
__device__ inline void mmaBf16(MmaC &C, const MmaA &A, uint32_t B0,
                               uint32_t B1) {
#ifdef MEGAC_CUDA_EMULATION
  using namespace emu_mma;
  struct Regs {
    uint32_t A[4], B[2];
  } Mine = {{A.R[0], A.R[1], A.R[2], A.R[3]}, {B0, B1}};
  const unsigned char *W = share(Mine);
  const unsigned L = lane();
  auto ElemA = [&](int Row, int K) {
    const Regs R = slot<Regs>(W, unsigned((Row % 8) * 4 + (K % 8) / 2));
    return widen(half(R.A[Row / 8 + 2 * (K / 8)], K % 2));
  };
  auto ElemB = [&](int K, int N) {
    const Regs R = slot<Regs>(W, unsigned(N * 4 + (K % 8) / 2));
    return widen(half(R.B[K / 8], K % 2));
  };
  float Out[4];
  for (int E = 0; E < 4; ++E) {
    const int Row = int(L / 4) + 8 * (E / 2), Col = int(L % 4) * 2 + E % 2;
    float S = C.R[E];
    for (int K = 0; K < 16; ++K)
      S += ElemA(Row, K) * ElemB(K, Col);
    Out[E] = S;
  }
  __syncthreads();
  for (int E = 0; E < 4; ++E)
    C.R[E] = Out[E];
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(C.R[0]), "+f"(C.R[1]), "+f"(C.R[2]), "+f"(C.R[3])
               : "r"(A.R[0]), "r"(A.R[1]), "r"(A.R[2]), "r"(A.R[3]), "r"(B0),
                 "r"(B1));
#endif
}

/// Starts copying 16 bytes from global to shared memory (both 16-byte
/// aligned); cpAsyncCommit closes a group of such copies, and
/// cpAsyncWait<N> waits until at most N groups are still in flight. (The
/// emulation copies at once.)
__device__ inline void cpAsync16(void *Shared, const void *Global) {
#ifdef MEGAC_CUDA_EMULATION
  if (reinterpret_cast<uintptr_t>(Shared) % 16 ||
      reinterpret_cast<uintptr_t>(Global) % 16) {
    std::fprintf(stderr, "cp.async: an address is not 16-byte aligned\n");
    std::abort();
  }
  if (!emu_mma::copiesLandLate()) {
    std::memcpy(Shared, Global, 16);
    return;
  }
  emu_mma::AsyncCopies &A = emu_mma::asyncCopies();
  emu_mma::AsyncCopies::Copy C{Shared, {}, A.Committed};
  std::memcpy(C.Bytes.data(), Global, 16);
  A.Pending.push_back(C);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   uint32_t(__cvta_generic_to_shared(Shared))),
               "l"(Global)
               : "memory");
#endif
}
__device__ inline void cpAsyncCommit() {
#ifdef MEGAC_CUDA_EMULATION
  if (emu_mma::copiesLandLate())
    ++emu_mma::asyncCopies().Committed;
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ inline void cpAsyncWait() {
#ifdef MEGAC_CUDA_EMULATION
  if (!emu_mma::copiesLandLate())
    return;
  // The groups closed before the newest N land (copies after the last
  // commit belong to no closed group yet: they stay in flight).
  emu_mma::AsyncCopies &A = emu_mma::asyncCopies();
  std::vector<emu_mma::AsyncCopies::Copy> Still;
  for (const auto &C : A.Pending)
    if (C.Group < A.Committed - N)
      std::memcpy(C.To, C.Bytes.data(), 16);
    else
      Still.push_back(C);
  A.Pending.swap(Still);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

} // namespace cuda
} // namespace megac_rt

#endif // MEGAC_RT_CUDA_MMA_SM80_CUH
