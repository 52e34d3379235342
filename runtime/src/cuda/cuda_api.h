//===- cuda_api.h - CUDA, or its host emulation ----------------*- C++ -*-===//
//
// The CUDA backend is one source built two ways: with nvcc against the CUDA
// toolkit (libmegac_cuda.so), and with the host compiler against the SIMT
// emulation in emu/ (libmegac_cuda_emu.so, MEGAC_CUDA_EMULATION), so that
// CI runs the backend's own kernels and logic without a GPU. Kernels are
// launched through launch() rather than <<<>>>, the one construct a host
// compiler cannot parse.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_API_H
#define MEGAC_RT_CUDA_API_H

#ifdef MEGAC_CUDA_EMULATION
#include "emu/cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#define MEGAC_DYNAMIC_SHARED(Type, Name)                                       \
  extern __shared__ Type Name##Storage[];                                      \
  Type *Name = Name##Storage
#endif

#include <cstddef>

namespace megac_rt {

/// Kernel<<<Grid, Block, SharedBytes>>>(Args...) on the default stream.
template <class... Params, class... Args>
void launch(void (*Kernel)(Params...), unsigned Grid, unsigned Block,
            size_t SharedBytes, Args... A) {
#ifdef MEGAC_CUDA_EMULATION
  megac_emu::launch({Grid, 1, 1}, {Block, 1, 1}, SharedBytes,
                    [&] { Kernel(Params(A)...); });
#else
  Kernel<<<Grid, Block, SharedBytes>>>(Params(A)...);
#endif
}

} // namespace megac_rt

#endif // MEGAC_RT_CUDA_API_H
