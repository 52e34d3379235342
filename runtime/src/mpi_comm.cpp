//===- mpi_comm.cpp - MPI implementation of Collectives -------------------===//
//
// Counts are passed to MPI as int; buffers above INT_MAX elements are sent
// in pieces (all-reduce, reduce-scatter) or as a contiguous derived type
// (all-gather) so a large tensor never overflows MPI's count argument.
//
//===----------------------------------------------------------------------===//

#include "mpi_comm.h"
#include "error.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

using namespace megac::plan;

namespace megac_rt {

MpiCollectives::MpiCollectives(const Program &P, uint32_t Rank,
                               MPI_Comm World) {
  const RankProgram &RP = *P.ranks()->Get(Rank);
  size_t NAxes = P.axes() ? P.axes()->size() : 0;
  for (size_t A = 0; A < NAxes; ++A) {
    const Axis &Ax = *P.axes()->Get(A);
    int Color = 0;
    for (uint32_t G = 0; G < Ax.groups()->size(); ++G)
      for (uint32_t R : *Ax.groups()->Get(G)->ranks())
        if (R == Rank)
          Color = int(G);
    MPI_Comm C;
    MPI_Comm_split(World, Color, int(RP.coords()->Get(A)), &C);
    Comms.push_back(C);
  }
  MPI_Comm_dup(World, &P2P);
  int *Limit = nullptr, Found = 0;
  MPI_Comm_get_attr(P2P, MPI_TAG_UB, &Limit, &Found);
  if (Found && Limit)
    TagLimit = *Limit;
}

MpiCollectives::~MpiCollectives() {
  finishSends();
  for (MPI_Comm &C : Comms)
    MPI_Comm_free(&C);
  MPI_Comm_free(&P2P);
}

static int checkedTag(int64_t Tag, int Limit) {
  if (Tag < 0 || Tag > Limit)
    throw RunError("transfer tag " + std::to_string(Tag) +
                   " exceeds this MPI's limit " + std::to_string(Limit) +
                   " (too many transfers x micro-batches)");
  return int(Tag);
}

void MpiCollectives::send(int Peer, int64_t Tag, const void *Data,
                          size_t Bytes) {
  if (Bytes > size_t(INT_MAX))
    throw RunError("a pipeline transfer of " + std::to_string(Bytes) +
                   " bytes exceeds MPI's count limit");
  // Copies of sends that have completed are freed as we go, so a rank
  // holds only what its peers have not received yet.
  Pending.erase(std::remove_if(Pending.begin(), Pending.end(),
                               [](PendingSend &S) {
                                 int Done = 0;
                                 MPI_Test(&S.Request, &Done,
                                          MPI_STATUS_IGNORE);
                                 return Done != 0;
                               }),
                Pending.end());
  // The buffer may be reused by the next instruction (the arena), so the
  // message goes out from a copy; the sender does not wait for the peer.
  Pending.push_back({MPI_REQUEST_NULL, std::vector<unsigned char>(
                                           static_cast<const unsigned char *>(Data),
                                           static_cast<const unsigned char *>(Data) + Bytes)});
  PendingSend &S = Pending.back();
  if (MPI_Isend(S.Staged.data(), int(Bytes), MPI_BYTE, Peer,
                checkedTag(Tag, TagLimit), P2P, &S.Request) != MPI_SUCCESS)
    throw RunError("MPI_Isend to rank " + std::to_string(Peer) + " failed");
}

void MpiCollectives::recv(int Peer, int64_t Tag, void *Data, size_t Bytes) {
  if (Bytes > size_t(INT_MAX))
    throw RunError("a pipeline transfer of " + std::to_string(Bytes) +
                   " bytes exceeds MPI's count limit");
  MPI_Status St;
  if (MPI_Recv(Data, int(Bytes), MPI_BYTE, Peer, checkedTag(Tag, TagLimit),
               P2P, &St) != MPI_SUCCESS)
    throw RunError("MPI_Recv from rank " + std::to_string(Peer) + " failed");
  int Got = 0;
  MPI_Get_count(&St, MPI_BYTE, &Got);
  if (size_t(Got) != Bytes)
    throw RunError("received " + std::to_string(Got) + " bytes from rank " +
                   std::to_string(Peer) + " where the plan expects " +
                   std::to_string(Bytes));
}

void MpiCollectives::finishSends() {
  for (PendingSend &S : Pending)
    MPI_Wait(&S.Request, MPI_STATUS_IGNORE);
  Pending.clear();
}

void MpiCollectives::allReduceSum(int Axis, float *Data, size_t N) {
  while (N) {
    int Count = int(std::min<size_t>(N, INT_MAX));
    if (MPI_Allreduce(MPI_IN_PLACE, Data, Count, MPI_FLOAT, MPI_SUM,
                      Comms[size_t(Axis)]) != MPI_SUCCESS)
      throw RunError("MPI_Allreduce failed");
    Data += Count;
    N -= size_t(Count);
  }
}

void MpiCollectives::allGather(int Axis, const void *Send, size_t Bytes,
                               void *Recv) {
  MPI_Datatype T = MPI_BYTE;
  int Count = int(Bytes);
  bool Derived = Bytes > size_t(INT_MAX);
  if (Derived) {
    // Bytes is a multiple of 4 (f32/i32), and below 2^40 * 4.
    MPI_Type_contiguous(int(Bytes / 4), MPI_FLOAT, &T);
    MPI_Type_commit(&T);
    Count = 1;
  }
  int Rc = MPI_Allgather(Send, Count, T, Recv, Count, T, Comms[size_t(Axis)]);
  if (Derived)
    MPI_Type_free(&T);
  if (Rc != MPI_SUCCESS)
    throw RunError("MPI_Allgather failed");
}

void MpiCollectives::reduceScatterSum(int Axis, const float *Send,
                                      float *Recv, size_t N) {
  MPI_Comm C = Comms[size_t(Axis)];
  if (N <= size_t(INT_MAX)) {
    if (MPI_Reduce_scatter_block(Send, Recv, int(N), MPI_FLOAT, MPI_SUM, C) !=
        MPI_SUCCESS)
      throw RunError("MPI_Reduce_scatter_block failed");
    return;
  }
  // Per-member chunks above INT_MAX floats: scatter them piece by piece,
  // staging piece [Begin, Begin + Count) of every member's chunk.
  int G = 1;
  MPI_Comm_size(C, &G);
  std::vector<float> Stage;
  for (size_t Begin = 0; Begin < N;) {
    size_t Count = std::min<size_t>(N - Begin, INT_MAX);
    Stage.resize(Count * size_t(G));
    for (int K = 0; K < G; ++K)
      std::memcpy(Stage.data() + size_t(K) * Count,
                  Send + size_t(K) * N + Begin, Count * sizeof(float));
    if (MPI_Reduce_scatter_block(Stage.data(), Recv + Begin, int(Count),
                                 MPI_FLOAT, MPI_SUM, C) != MPI_SUCCESS)
      throw RunError("MPI_Reduce_scatter_block failed");
    Begin += Count;
  }
}

} // namespace megac_rt
