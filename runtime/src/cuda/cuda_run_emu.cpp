//===- cuda_run_emu.cpp - The CUDA backend on the host emulation ----------===//
//
// cuda_run.cu compiled by the host compiler against emu/cuda_emu.h: see
// cuda_api.h. Built everywhere, with or without the CUDA toolkit.
//
//===----------------------------------------------------------------------===//

#define MEGAC_CUDA_EMULATION 1
#include "cuda_run.cu"
