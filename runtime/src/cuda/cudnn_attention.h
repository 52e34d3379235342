//===- cudnn_attention.h - cuDNN's fused attention for the backend --------===//
//
// The CUDA backend's third attention (MEGAC_CUDA_ATTENTION=cudnn): cuDNN's
// scaled dot-product attention (its flash-attention kernels, through the
// cuDNN frontend's graph API) on bf16 q, k, v in megac's layout. cuDNN is
// loaded at run time (dlopen), so the plugin needs it only where it is
// asked for; anything cuDNN refuses comes back as a reason, and the
// backend runs its own kernels instead.
//
// Kept out of cuda_run.cu (built by the host compiler alone, and only when
// the frontend's headers are there: MEGAC_HAVE_CUDNN_ATTENTION) so that
// neither nvcc nor the CUDA emulation sees the frontend.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CUDA_CUDNN_ATTENTION_H
#define MEGAC_RT_CUDA_CUDNN_ATTENTION_H

#include <cstdint>
#include <memory>
#include <string>

typedef struct CUstream_st *cudaStream_t;

namespace megac_rt::cuda {

/// One attention in megac's layout: q, k, v and y are [B, S, NH * D]
/// (each head's D columns side by side), bf16 bits.
struct SdpaShape {
  int64_t B = 0, S = 0, NH = 0, D = 0;
  bool Causal = false;
  float Scale = 1;
  bool operator<(const SdpaShape &O) const;
};

class CudnnAttention {
public:
  /// cuDNN's attention on the current device (a handle of its own), or
  /// null with \p Why saying what is missing. MEGAC_CUDNN_LIBRARY names
  /// the library to load (default libcudnn.so.9 from the loader's path).
  /// Its backward pass is deterministic where cuDNN has a plan for that
  /// and \p Deterministic asks for it, else cuDNN's default (PyTorch's).
  static std::unique_ptr<CudnnAttention> open(std::string &Why,
                                              bool Deterministic = true);
  virtual ~CudnnAttention() = default;

  /// y = softmax(scale q k^T (+ the causal mask)) v, enqueued on \p
  /// Stream; with \p Stats, also each row's log-sum-exp (fp32, [B, NH,
  /// S]) for backward(). "" or why cuDNN could not.
  virtual std::string forward(const SdpaShape &Sh, const void *Q, const void *K,
                              const void *V, void *Y, float *Stats,
                              cudaStream_t Stream) = 0;

  /// dq, dk and dv (bf16, fp32 accumulation inside) from the forward's y
  /// and \p Stats and the output gradient \p DY; deterministic unless
  /// open() was told otherwise.
  virtual std::string backward(const SdpaShape &Sh, const void *Q,
                               const void *K, const void *V, const void *Y,
                               const void *DY, const float *Stats, void *DQ,
                               void *DK, void *DV, cudaStream_t Stream) = 0;
};

/// Builds the forward (with and without stats) and backward graphs of \p
/// Sh and validates them for compute capability \p Sm (90: sm_90) without
/// a device (shapes, strides, types, attributes, what the architecture
/// supports): "" or the frontend's complaint. What the unit test checks on
/// a machine without a GPU.
std::string validateSdpaGraphs(const SdpaShape &Sh, int Sm);

} // namespace megac_rt::cuda

#endif // MEGAC_RT_CUDA_CUDNN_ATTENTION_H
