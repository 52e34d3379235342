//===- cuda_emu.h - The CUDA APIs the backend uses, on the host -*- C++ -*-===//
//
// A host stand-in for the part of the CUDA runtime, driver, cuBLAS and NCCL
// APIs that runtime/src/cuda/cuda_run.cu calls, so that the very same backend
// source builds without the toolkit and runs in CI as
// libmegac_cuda_emu.so: device memory is host memory, kernels run on the
// SIMT emulator (simt.h), GEMMs are a reference loop with cuBLAS's
// column-major conventions, a plan's generated kernels are compiled from
// their CUDA source by the host compiler at run time, and NCCL's
// collectives are MPI's (nccl_emu.cpp).
//
// It checks the backend's logic (dispatch, arena offsets, kernel indexing
// and reductions, GEMM operand conventions) against the CPU backend. It
// says nothing about speed, and nothing about what only hardware shows
// (memory-model races between blocks, occupancy, cubin loading).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_CUDA_EMU_CUDA_EMU_H
#define MEGAC_CUDA_EMU_CUDA_EMU_H

#include "nccl_types.h"
#include "simt.h"

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

//===-- Runtime API ----------------------------------------------------===//

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidResourceHandle = 400
};
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice
};
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
  size_t sharedMemPerBlockOptin;
};
using cudaStream_t = struct CUstream_st *;

const char *cudaGetErrorString(cudaError_t E);
cudaError_t cudaGetDeviceCount(int *Count);
cudaError_t cudaSetDevice(int Device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *Prop, int Device);
cudaError_t cudaMalloc(void **Ptr, size_t Bytes);
cudaError_t cudaFree(void *Ptr);
cudaError_t cudaMemcpy(void *Dst, const void *Src, size_t Bytes,
                       cudaMemcpyKind Kind);
cudaError_t cudaMemset(void *Ptr, int Value, size_t Bytes);
cudaError_t cudaGetLastError();
cudaError_t cudaDeviceSynchronize();

//===-- Streams ----------------------------------------------------------===//
//
// Streams are where a missing synchronization would hide, so the emulation
// makes it show: the first stream created (the backend's compute stream)
// runs its work at once, every later one (the communication stream) queues
// its work and runs it only when something waits for it (an event the
// compute stream waits on, a stream or device synchronization). Work that
// reads a collective's result without waiting reads stale data. With
// MEGAC_CUDA_EMU_DEFER=first the roles swap: compute is deferred, so a
// collective that does not wait for compute reads stale inputs. The null
// stream runs at once and waits for nothing.
constexpr unsigned cudaStreamNonBlocking = 1;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *S, unsigned Flags);
cudaError_t cudaStreamDestroy(cudaStream_t S);
cudaError_t cudaStreamSynchronize(cudaStream_t S);
cudaError_t cudaMemcpyAsync(void *Dst, const void *Src, size_t Bytes,
                            cudaMemcpyKind Kind, cudaStream_t S);
cudaError_t cudaMemsetAsync(void *Ptr, int Value, size_t Bytes, cudaStream_t S);
/// Events record the host's clock: the emulation runs everything at once.
using cudaEvent_t = struct CUevent_st *;
/// Kernels' attributes: only the dynamic shared memory limit, which the
/// emulation does not have.
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel *, cudaFuncAttribute, int) {
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *E);
/// An event for ordering alone: cudaEventElapsedTime refuses it, as CUDA.
constexpr unsigned cudaEventDisableTiming = 2;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *E, unsigned Flags);
cudaError_t cudaEventDestroy(cudaEvent_t E);
cudaError_t cudaEventRecord(cudaEvent_t E, cudaStream_t Stream = nullptr);
cudaError_t cudaEventElapsedTime(float *Ms, cudaEvent_t Start, cudaEvent_t End);
cudaError_t cudaStreamWaitEvent(cudaStream_t S, cudaEvent_t E,
                                unsigned Flags = 0);

//===-- Driver API: modules are compiled from CUDA source ---------------===//

enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_IMAGE = 200 };
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = cudaStream_t;

CUresult cuGetErrorString(CUresult R, const char **Msg);
CUresult cuModuleUnload(CUmodule M);
CUresult cuModuleGetFunction(CUfunction *F, CUmodule M, const char *Name);
CUresult cuLaunchKernel(CUfunction F, unsigned GridX, unsigned GridY,
                        unsigned GridZ, unsigned BlockX, unsigned BlockY,
                        unsigned BlockZ, unsigned SharedBytes, CUstream Stream,
                        void **Args, void **Extra);

namespace megac_emu {

/// Compiles \p Source (a kernel file as NVRTC gets it) with the host
/// compiler, with one entry for the kernel \p Name whose parameters have
/// the C++ types \p ParamTypes. The error text is the compiler's output.
CUresult moduleFromSource(CUmodule *M, const std::string &Source,
                          const std::string &Name,
                          const std::vector<std::string> &ParamTypes,
                          std::string &Error);

/// Runs \p Body as every thread of a \p Grid x \p Block launch, on
/// stream \p S (now, or when the stream runs its queue).
void launch(Dim3 Grid, Dim3 Block, size_t SharedBytes, cudaStream_t S,
            std::function<void()> Body);
/// Runs \p Work on stream \p S: now, or queued (see Streams above).
void submit(cudaStream_t S, std::function<void()> Work);

/// MEGAC_CUDA_EMU_TRACE=1: the emulation writes a line on stderr for each
/// kernel launch, product and device copy or fill as the host issues it,
/// and the backend one for each instruction before its work (traceLine):
/// what a step launches, and on how many elements, countable without a
/// GPU (scripts/launch_summary.py totals it by instruction).
bool tracing();
/// Writes "megac-emu: <Line>" on stderr where tracing().
void traceLine(const std::string &Line);
/// traceLine "kernel <name> <grid>x<block>" for a launch of \p Fn, named
/// as the library's symbol table names it (demangled, without namespace
/// or parameters: "widenBf16Kernel", "linearEpilogueKernel<float>").
void traceKernel(const void *Fn, Dim3 Grid, Dim3 Block);

/// The value of the emulation's environment knob \p Name: one of \p
/// Choices, the first where it is unset or empty; any other value ends
/// the process (exit status 1) with an error line saying what is
/// expected.
std::string knob(const char *Name, std::initializer_list<const char *> Choices);

/// The emulation's knob \p Name as a whole number in [\p Lo, \p Hi];
/// \p Default where it is unset or empty; anything else ends the process
/// as knob's choices do.
long wholeKnob(const char *Name, long Lo, long Hi, long Default);

/// Whether a block's threads run from the last to the first between
/// barriers, rather than from the first (MEGAC_CUDA_EMU_THREAD_ORDER=
/// reverse, or set by a test). A kernel whose threads meet in shared
/// memory without the barrier between them reads what another thread has
/// not written yet in one order, or has overwritten already in the other.
bool &threadsInReverse();

} // namespace megac_emu

//===-- cuBLAS -----------------------------------------------------------===//

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
};
using cublasHandle_t = struct cublasContext *;

cublasStatus_t cublasCreate(cublasHandle_t *H);
cublasStatus_t cublasDestroy(cublasHandle_t H);
cublasStatus_t cublasSetMathMode(cublasHandle_t H, cublasMath_t Mode);
cublasStatus_t cublasSetStream(cublasHandle_t H, cudaStream_t S);
/// Accepted and unused: the emulated products need no workspace.
cublasStatus_t cublasSetWorkspace(cublasHandle_t H, void *Workspace,
                                  size_t Bytes);
/// C = alpha op(A) op(B) + beta C, column-major, as cuBLAS.
cublasStatus_t cublasSgemm(cublasHandle_t H, cublasOperation_t TransA,
                           cublasOperation_t TransB, int M, int N, int K,
                           const float *Alpha, const float *A, int Lda,
                           const float *B, int Ldb, const float *Beta, float *C,
                           int Ldc);
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
/// Mixed precision: A and B in \p TypeA / \p TypeB (fp32 or bf16), C in
/// fp32, accumulated in fp32 or better.
cublasStatus_t cublasGemmEx(cublasHandle_t H, cublasOperation_t TransA,
                            cublasOperation_t TransB, int M, int N, int K,
                            const void *Alpha, const void *A,
                            cudaDataType_t TypeA, int Lda, const void *B,
                            cudaDataType_t TypeB, int Ldb, const void *Beta,
                            void *C, cudaDataType_t TypeC, int Ldc,
                            cublasComputeType_t Compute, cublasGemmAlgo_t Algo);
cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t H, cublasOperation_t TransA, cublasOperation_t TransB, int M,
    int N, int K, const float *Alpha, const float *A, int Lda,
    long long StrideA, const float *B, int Ldb, long long StrideB,
    const float *Beta, float *C, int Ldc, long long StrideC, int BatchCount);

//===-- cuBLASLt: the subset the backend uses -----------------------------===//

using cublasLtHandle_t = struct cublasLtContext *;
using cublasLtMatmulDesc_t = struct cublasLtMatmulDescOpaque *;
using cublasLtMatrixLayout_t = struct cublasLtMatrixLayoutOpaque *;
using cublasLtMatmulPreference_t = struct cublasLtMatmulPreferenceOpaque *;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12
};
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_BIAS = 36,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
  CUBLASLT_EPILOGUE_DGELU = 192,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
};
enum cublasLtReductionScheme_t {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
  CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
  CUBLASLT_REDUCTION_SCHEME_MASK = 7
};

enum cublasLtMatmulAlgoConfigAttributes_t {
  CUBLASLT_ALGO_CONFIG_ID = 0,
  CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,
  CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,
  CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *H);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t H);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *D,
                                        cublasComputeType_t Compute,
                                        cudaDataType_t Scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t D);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t D,
                                              cublasLtMatmulDescAttributes_t A,
                                              const void *Value, size_t Bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *L,
                                          cudaDataType_t Type, uint64_t Rows,
                                          uint64_t Cols, int64_t Ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t L);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *P);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t P);
cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t P,
                                     cublasLtMatmulPreferenceAttributes_t A,
                                     const void *Value, size_t Bytes);
/// Up to three algorithms for any valid problem (all computing alike).
/// As cuBLASLt, each assumes the alignment the preference gives for A, B,
/// C and D (256 bytes unless set) and, for the epilogue's bias and
/// auxiliary matrix, the alignment of the pointers the descriptor has at
/// the query (a null pointer counts as 256-byte aligned); cublasLtMatmul
/// refuses (CUBLAS_STATUS_NOT_SUPPORTED) pointers less aligned than its
/// algorithm assumed. (A null algorithm is not checked.)
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t H, cublasLtMatmulDesc_t D, cublasLtMatrixLayout_t A,
    cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
    cublasLtMatrixLayout_t Dl, cublasLtMatmulPreference_t P, int Requested,
    cublasLtMatmulHeuristicResult_t *Results, int *Returned);
/// An emulated algorithm's configuration: its index among the heuristic's
/// results (ID), one split of k and no reduction (SPLITK_NUM 1,
/// REDUCTION_SCHEME 0), 0 for the rest; sizes checked as cuBLASLt's
/// (int32_t for ID and SPLITK_NUM, uint32_t for the others).
cublasStatus_t
cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *Algo,
                                     cublasLtMatmulAlgoConfigAttributes_t A,
                                     void *Value, size_t Bytes,
                                     size_t *Written);
/// D = alpha op(A) op(B) + beta C, then the epilogue (the bias per row of
/// D), column-major as cuBLAS.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t H, cublasLtMatmulDesc_t Desc,
                              const void *Alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *Beta,
                              const void *C, cublasLtMatrixLayout_t Cl, void *D,
                              cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *Algo, void *Workspace,
                              size_t WorkspaceBytes, cudaStream_t Stream);

//===-- NCCL, over MPI (the ranks are megac-run's MPI processes) ---------===//

const char *ncclGetErrorString(ncclResult_t R);
ncclResult_t ncclGetUniqueId(ncclUniqueId *Id);
/// Collective over every MPI rank: each initializes its communicators in
/// the same order (what megac's backend does, one per grid axis).
ncclResult_t ncclCommInitRank(ncclComm_t *Comm, int NRanks, ncclUniqueId Id,
                              int Rank);
ncclResult_t ncclCommDestroy(ncclComm_t Comm);
ncclResult_t ncclCommAbort(ncclComm_t Comm);
ncclResult_t ncclAllReduce(const void *Send, void *Recv, size_t Count,
                           ncclDataType_t Type, ncclRedOp_t Op, ncclComm_t Comm,
                           cudaStream_t Stream);
ncclResult_t ncclAllGather(const void *Send, void *Recv, size_t Count,
                           ncclDataType_t Type, ncclComm_t Comm,
                           cudaStream_t Stream);
ncclResult_t ncclReduceScatter(const void *Send, void *Recv, size_t Count,
                               ncclDataType_t Type, ncclRedOp_t Op,
                               ncclComm_t Comm, cudaStream_t Stream);

#endif // MEGAC_CUDA_EMU_CUDA_EMU_H
