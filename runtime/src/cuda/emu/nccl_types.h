//===- nccl_types.h - NCCL's types where nccl.h is not ----------*- C++ -*-===//
//
// The subset of nccl.h's types the CUDA backend uses, with NCCL's values:
// for the host emulation (nccl_emu.cpp) and for a backend built without
// NCCL (cuda_api.h's stubs).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_CUDA_EMU_NCCL_TYPES_H
#define MEGAC_CUDA_EMU_NCCL_TYPES_H

enum ncclResult_t {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidUsage = 5
};
enum ncclDataType_t { ncclFloat = 7 };
enum ncclRedOp_t { ncclSum = 0 };
struct ncclUniqueId {
  char internal[128];
};
using ncclComm_t = struct ncclComm *;

#endif // MEGAC_CUDA_EMU_NCCL_TYPES_H
