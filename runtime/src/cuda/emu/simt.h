//===- simt.h - CUDA kernel code compiled for the host ----------*- C++ -*-===//
//
// The CUDA backend's kernels have to be tested where no GPU is (CI). This
// header lets a host C++ compiler build CUDA kernel source unchanged: the
// built-ins (threadIdx, blockIdx, __syncthreads, warp shuffles) go through
// a table of functions that the SIMT emulator (cuda_emu.cpp) provides. The
// emulator runs every thread of a block as a fiber and one block at a time,
// so `__shared__` variables become function statics shared by the block.
//
// The same header is included by the emulated backend and by the kernels
// of a plan, which the emulator compiles at run time (from the source the
// plan carries beside its cubins); each binds its own pointer to the table.
//
// Limits, checked nowhere but honoured by megac's kernels: warp shuffles
// and __syncthreads are called by every thread of the block alike.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_CUDA_EMU_SIMT_H
#define MEGAC_CUDA_EMU_SIMT_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace megac_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// What a thread sees of itself.
struct ThreadState {
  Dim3 Thread, Block, BlockSize, GridSize;
};

/// The emulator's services to kernel code.
struct SimtApi {
  ThreadState *(*current)();
  /// Every thread of the block waits here until all have come.
  void (*syncthreads)();
  /// The value \p V of lane (this lane ^ \p LaneMask) of this warp.
  double (*shuffleXor)(double V, int LaneMask);
  /// The launch's dynamic shared memory.
  void *(*dynamicShared)();
  /// Publishes this lane's \p Bytes (at most kWarpSlotBytes) and, once
  /// every thread of the block has published, returns the 32 slots of its
  /// warp (lane L's at L * kWarpSlotBytes). The caller reads them, then
  /// calls __syncthreads before its next exchange. The warp-wide tensor
  /// core instructions (mma_emu.h) are built on it.
  const unsigned char *(*warpExchange)(const void *Mine, unsigned Bytes);
};

constexpr unsigned kWarpSlotBytes = 64;

/// Bound once per module: by the emulator in the backend, by the entry
/// trampoline in a run-time compiled kernel module.
inline const SimtApi *simtApi = nullptr;

inline unsigned floatAsUint(float F) {
  unsigned U;
  std::memcpy(&U, &F, 4);
  return U;
}
inline float uintAsFloat(unsigned U) {
  float F;
  std::memcpy(&F, &U, 4);
  return F;
}

} // namespace megac_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (megac_emu::simtApi->current()->Thread)
#define blockIdx (megac_emu::simtApi->current()->Block)
#define blockDim (megac_emu::simtApi->current()->BlockSize)
#define gridDim (megac_emu::simtApi->current()->GridSize)
#define MEGAC_DYNAMIC_SHARED(Type, Name)                                       \
  Type *Name = static_cast<Type *>(megac_emu::simtApi->dynamicShared())

inline void __syncthreads() { megac_emu::simtApi->syncthreads(); }
inline float __shfl_xor_sync(unsigned, float V, int LaneMask, int = 32) {
  return float(megac_emu::simtApi->shuffleXor(double(V), LaneMask));
}
inline double __shfl_xor_sync(unsigned, double V, int LaneMask, int = 32) {
  return megac_emu::simtApi->shuffleXor(V, LaneMask);
}
inline unsigned __float_as_uint(float F) { return megac_emu::floatAsUint(F); }
inline float __uint_as_float(unsigned U) { return megac_emu::uintAsFloat(U); }
/// Fibers never interleave inside an expression, so plain adds are atomic.
inline float atomicAdd(float *P, float V) {
  const float Old = *P;
  *P = Old + V;
  return Old;
}
inline float rsqrtf(float X) { return 1.0f / std::sqrt(X); }
/// A product rounded to f32 that the compiler must not fuse into an add.
inline float __fmul_rn(float A, float B) { return A * B; }

using std::exp;
using std::fmax;
using std::log;
using std::sqrt;
using std::tanh;

#endif // MEGAC_CUDA_EMU_SIMT_H
