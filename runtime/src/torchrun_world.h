//===- torchrun_world.h - An MPI world for torchrun-style launches -*- C++
//-*-===//
//
// torchrun (and cluster scripts in its style) start every process on its
// own, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in
// the environment instead of an MPI launcher's. Each such process is an MPI
// singleton. This joins them into one intracommunicator ordered by RANK
// with MPI's own dynamic-process calls (MPI_Comm_accept/connect and
// MPI_Intercomm_merge), so that everything above runs the same collectives
// and transfers as under mpirun.
//
// Open MPI connects separately started processes through an ompi-server,
// which rank 0 starts. The other ranks learn its address from rank 0 over
// a TCP connection to MASTER_ADDR (the rendezvous), and join in rounds, as
// a binary tree, the MPI ports' names traveling over those connections.
// The connections stay open for the whole run: the ranks are separate MPI
// jobs, so MPI_Abort ends only its own, and a rank that ends before the job
// finished (an abort, a crash, a kill) is noticed there instead. Rank 0 then
// ends, and the other ranks with it.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_TORCHRUN_WORLD_H
#define MEGAC_RT_TORCHRUN_WORLD_H

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace megac_rt {

/// What a torchrun-style launcher told this process.
struct TorchrunLaunch {
  int Rank = 0, Size = 1;
  std::string MasterAddr;
  /// Where rank 0 listens for the rendezvous: MEGAC_RENDEZVOUS_PORT if set,
  /// else MASTER_PORT, or MASTER_PORT + 1 where torchrun's own store holds
  /// MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
  int Port = 0;
  /// How long a rank waits for the others to meet, and for each step of
  /// joining (seconds, MEGAC_RENDEZVOUS_TIMEOUT, default 300).
  double TimeoutSec = 300;
  /// The job's identity: its command line and torchrun's run id. Rank 0
  /// takes in only processes with its own (a process left over from
  /// another job must not become one of its ranks).
  uint64_t JobKey = 0;
};

/// The launch when WORLD_SIZE > 1 is set and no MPI launcher started this
/// process; nullopt otherwise. Throws RunError when the variables are
/// incomplete or malformed.
std::optional<TorchrunLaunch> torchrunLaunch(int Argc, char **Argv);

/// The joined world. Construction calls MPI_Init; destruction (after
/// MPI_Finalize) closes the connections and stops rank 0's ompi-server.
class TorchrunWorld {
public:
  /// Throws RunError on failure (MPI may then be initialized: the caller
  /// reports and exits without MPI_Finalize).
  TorchrunWorld(const TorchrunLaunch &L, int *Argc, char ***Argv);
  ~TorchrunWorld();
  TorchrunWorld(const TorchrunWorld &) = delete;
  TorchrunWorld &operator=(const TorchrunWorld &) = delete;

  /// The world, rank i being the process with RANK=i.
  MPI_Comm world() const;

  /// Says this rank ends normally, once every rank has passed the job's
  /// last collective: from then on the others' connections may close.
  void finish();

  struct State;

private:
  std::unique_ptr<State> S;
};

} // namespace megac_rt

#endif // MEGAC_RT_TORCHRUN_WORLD_H
