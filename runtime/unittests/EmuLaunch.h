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

} // namespace megac_rt::cuda

#endif // MEGAC_RT_UNITTESTS_EMULAUNCH_H
