//===- EmuLaunch.h - Launching kernels on the CUDA emulation in tests -----===//
//
// The emulation tests call the backend's kernels directly, as a launch
// would: one helper so that each test file need not repeat the stream's
// setup and the wait.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_UNITTESTS_EMULAUNCH_H
#define MEGAC_RT_UNITTESTS_EMULAUNCH_H

#include "cuda_api.h"
#include "cuda_kernels.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace megac_rt::cuda {

/// Runs \p Body (a kernel's call) over \p Blocks blocks of kThreads
/// threads on a stream of its own, and waits for it.
template <class Fn> void launchBlocks(int64_t Blocks, Fn Body) {
  cudaStream_t S;
  ASSERT_EQ(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking), cudaSuccess);
  megac_emu::launch({unsigned(Blocks), 1, 1}, {unsigned(kThreads), 1, 1}, 0, S,
                    Body);
  ASSERT_EQ(cudaStreamSynchronize(S), cudaSuccess);
  cudaStreamDestroy(S);
}

/// bf16 by round-to-nearest-even on the bits (finite values), worked out
/// here apart from the kernels' rounding, for tests to expect.
inline float roundedHere(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  U = (U + 0x7fffu + ((U >> 16) & 1u)) & 0xffff0000u;
  float R;
  std::memcpy(&R, &U, 4);
  return R;
}
/// The upper 16 bits of \p X: its bf16 bits where it is a bf16 value.
inline uint16_t bitsHere(float X) {
  uint32_t U;
  std::memcpy(&U, &X, 4);
  return uint16_t(U >> 16);
}

} // namespace megac_rt::cuda

#endif // MEGAC_RT_UNITTESTS_EMULAUNCH_H
