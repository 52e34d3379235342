//===- cuda_api.h - CUDA, or its host emulation ----------------*- C++ -*-===//
//
// The CUDA backend is one source built two ways: with nvcc against the CUDA
// toolkit (libmegac_cuda.so), and with the host compiler against the SIMT
// emulation in emu/ (libmegac_cuda_emu.so, MEGAC_CUDA_EMULATION), so that
// CI runs the backend's own kernels and logic without a GPU. Kernels are
// launched through launchOn() rather than <<<>>>, the one construct a host
// compiler cannot parse.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_API_H
#define MEGAC_RT_CUDA_API_H

#ifdef MEGAC_CUDA_EMULATION
#include "emu/cuda_emu.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#ifndef MEGAC_NO_NCCL
#include <nccl.h>
#else
// Built without NCCL (the toolkit lacked it): every NCCL call fails with
// this message, and megacCreateCudaRun refuses plans of several ranks.
#include "emu/nccl_types.h"
inline const char *ncclGetErrorString(ncclResult_t) {
  return "libmegac_cuda.so was built without NCCL";
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return ncclInvalidUsage; }
inline ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
inline ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
inline ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t,
                                  ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t,
                                  ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclReduceScatter(const void *, void *, size_t,
                                      ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                      cudaStream_t) {
  return ncclInvalidUsage;
}
#endif
#define MEGAC_DYNAMIC_SHARED(Type, Name)                                       \
  extern __shared__ __align__(128) Type Name##Storage[];                      \
  Type *Name = Name##Storage
#endif

#include <cstddef>

namespace megac_rt {

/// Kernel<<<Grid, Block, SharedBytes, Stream>>>(Args...). The arguments
/// are taken by value (the emulation may run the launch later).
template <class... Params, class... Args>
void launchOn(cudaStream_t Stream, void (*Kernel)(Params...), unsigned Grid,
              unsigned Block, size_t SharedBytes, Args... A) {
#ifdef MEGAC_CUDA_EMULATION
  megac_emu::traceKernel(reinterpret_cast<const void *>(Kernel), {Grid, 1, 1},
                         {Block, 1, 1});
  megac_emu::launch({Grid, 1, 1}, {Block, 1, 1}, SharedBytes, Stream,
                    [=] { Kernel(Params(A)...); });
#else
  Kernel<<<Grid, Block, SharedBytes, Stream>>>(Params(A)...);
#endif
}

} // namespace megac_rt

#endif // MEGAC_RT_CUDA_API_H
