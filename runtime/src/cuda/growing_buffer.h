//===- growing_buffer.h - Device memory that grows on demand ---*- C++ -*-===//
//
// Shared by the CUDA backend (cuda_run.cu, on CUDA or its emulation) and
// its cuDNN attention: include it after the CUDA runtime API (cuda_api.h,
// or <cuda_runtime.h>).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_GROWING_BUFFER_H
#define MEGAC_RT_CUDA_GROWING_BUFFER_H

#include <cstddef>
#include <stdexcept>
#include <string>

namespace megac_rt::cuda {

/// Device memory that grows to the largest size asked of it; what it holds
/// is lost when it grows. (cudaFree waits for the device, so work still
/// reading the old memory finishes first.)
struct GrowingBuffer {
  void *Ptr = nullptr;
  size_t Bytes = 0;
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer &) = delete;
  GrowingBuffer &operator=(const GrowingBuffer &) = delete;
  /// At least \p N bytes; \p What names them in an allocation failure.
  void *atLeast(size_t N, const char *What) {
    if (N > Bytes) {
      cudaFree(Ptr);
      Ptr = nullptr;
      Bytes = 0;
      if (const cudaError_t E = cudaMalloc(&Ptr, N); E != cudaSuccess)
        throw std::runtime_error(std::string("cudaMalloc (") + What +
                                 "): " + cudaGetErrorString(E));
      Bytes = N;
    }
    return Ptr;
  }
  ~GrowingBuffer() { cudaFree(Ptr); }
};

} // namespace megac_rt::cuda

#endif // MEGAC_RT_CUDA_GROWING_BUFFER_H
