//===- mpi_comm.h - MPI implementation of Collectives ---------*- C++ -*-===//
//
// One sub-communicator per grid axis, split from the world so that the
// communicator rank of every process equals its coordinate on that axis
// (its position in its group), which is the order AllGather concatenates in.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_MPI_COMM_H
#define MEGAC_RT_MPI_COMM_H

#include "executor.h"

#include <mpi.h>

#include <vector>

namespace megac_rt {

class MpiCollectives : public Collectives {
public:
  /// Collective over \p World (MPI_COMM_WORLD, or the world a
  /// torchrun-style launch joined): every rank must call it.
  MpiCollectives(const megac::plan::Program &P, uint32_t Rank, MPI_Comm World);
  ~MpiCollectives() override;
  MpiCollectives(const MpiCollectives &) = delete;
  MpiCollectives &operator=(const MpiCollectives &) = delete;

  void allReduceSum(int Axis, float *Data, size_t N) override;
  void allGather(int Axis, const void *Send, size_t Bytes,
                 void *Recv) override;
  void reduceScatterSum(int Axis, const float *Send, float *Recv,
                        size_t N) override;
  void send(int Peer, int64_t Tag, const void *Data, size_t Bytes) override;
  void recv(int Peer, int64_t Tag, void *Data, size_t Bytes) override;
  void finishSends() override;

private:
  std::vector<MPI_Comm> Comms;
  /// Pipeline transfers on their own communicator (so their tags cannot
  /// meet anything else), each send staged in its own copy until done.
  MPI_Comm P2P = MPI_COMM_NULL;
  int TagLimit = 32767;
  struct PendingSend {
    MPI_Request Request;
    std::vector<unsigned char> Staged;
  };
  std::vector<PendingSend> Pending;
};

} // namespace megac_rt

#endif // MEGAC_RT_MPI_COMM_H
