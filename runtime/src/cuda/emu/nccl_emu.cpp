//===- nccl_emu.cpp - NCCL's collectives as MPI's, for the emulation ------===//
//
// The emulated backend runs in megac-run's MPI processes, so a
// communicator is an MPI communicator split from megac-run's world: the
// unique id carries the world rank of the group's first member, which
// colours the split. Device memory is host memory, so buffers go to MPI as they
// are.
//
//===----------------------------------------------------------------------===//

#include "cuda_emu.h"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

struct ncclComm {
  MPI_Comm Comm;
};

/// The launcher's world: MPI_COMM_WORLD, unless megac-run joined a
/// torchrun-style launch into another (it says so through
/// megacEmuSetWorld before the backend starts).
static MPI_Comm EmuWorld = MPI_COMM_WORLD;

extern "C" void megacEmuSetWorld(MPI_Comm World) { EmuWorld = World; }

// MPI's default error handler ends the job on a failed collective, so a
// queued one has no status to return.

const char *ncclGetErrorString(ncclResult_t R) {
  switch (R) {
  case ncclSuccess:
    return "no error";
  case ncclInternalError:
    return "internal error (emulated NCCL: MEGAC_CUDA_EMU_FAIL_NCCL)";
  default:
    return "MPI call failed (emulated NCCL)";
  }
}

/// MEGAC_CUDA_EMU_FAIL_NCCL=id: this process's ncclGetUniqueId fails;
/// =init: its ncclCommInitRank fails once the group has met (the peers'
/// succeed), as a real one can on one rank. For the tests of one rank
/// failing to join the communicators (cuda-rank-failure.test); =hang:
/// its ncclCommInitRank never returns, as one waiting for a peer that
/// never comes (fault.test).
static bool ncclFails(const char *Call) {
  static const std::string Asked = megac_emu::knob(
      "MEGAC_CUDA_EMU_FAIL_NCCL", {"none", "id", "init", "hang"});
  return Asked == Call;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *Id) {
  if (ncclFails("id"))
    return ncclInternalError;
  std::memset(Id->internal, 0, sizeof(Id->internal));
  int Rank = 0;
  MPI_Comm_rank(EmuWorld, &Rank);
  std::memcpy(Id->internal, &Rank, sizeof(Rank));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *Comm, int NRanks, ncclUniqueId Id,
                              int Rank) {
  while (ncclFails("hang"))
    pause();
  int Leader = 0;
  std::memcpy(&Leader, Id.internal, sizeof(Leader));
  auto *C = new ncclComm;
  if (MPI_Comm_split(EmuWorld, Leader, Rank, &C->Comm) != MPI_SUCCESS) {
    delete C;
    return ncclSystemError;
  }
  int Size = 0;
  MPI_Comm_size(C->Comm, &Size);
  if (Size != NRanks) {
    MPI_Comm_free(&C->Comm);
    delete C;
    return ncclSystemError;
  }
  if (ncclFails("init")) {
    MPI_Comm_free(&C->Comm);
    delete C;
    return ncclInternalError;
  }
  *Comm = C;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t Comm) {
  MPI_Comm_free(&Comm->Comm);
  delete Comm;
  return ncclSuccess;
}

// Called from the watchdog's thread while another may be inside MPI,
// which is not thread-safe here; the process is about to exit anyway.
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }

// Collectives run on their stream (now, or when the stream runs its
// queue); the counts are checked now.
ncclResult_t ncclAllReduce(const void *Send, void *Recv, size_t Count,
                           ncclDataType_t, ncclRedOp_t, ncclComm_t Comm,
                           cudaStream_t Stream) {
  if (Count > size_t(INT_MAX))
    return ncclSystemError;
  megac_emu::submit(Stream, [=] {
    MPI_Allreduce(Send == Recv ? MPI_IN_PLACE : Send, Recv, int(Count),
                  MPI_FLOAT, MPI_SUM, Comm->Comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *Send, void *Recv, size_t Count,
                           ncclDataType_t, ncclComm_t Comm,
                           cudaStream_t Stream) {
  if (Count > size_t(INT_MAX))
    return ncclSystemError;
  megac_emu::submit(Stream, [=] {
    MPI_Allgather(Send, int(Count), MPI_FLOAT, Recv, int(Count), MPI_FLOAT,
                  Comm->Comm);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *Send, void *Recv, size_t Count,
                               ncclDataType_t, ncclRedOp_t, ncclComm_t Comm,
                               cudaStream_t Stream) {
  if (Count > size_t(INT_MAX))
    return ncclSystemError;
  megac_emu::submit(Stream, [=] {
    MPI_Reduce_scatter_block(Send, Recv, int(Count), MPI_FLOAT, MPI_SUM,
                             Comm->Comm);
  });
  return ncclSuccess;
}
