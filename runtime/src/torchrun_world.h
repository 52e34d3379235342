//===- torchrun_world.h - An MPI world for torchrun-style launches -*- C++
//-*-===//
//
// torchrun (and cluster scripts in its style) start every process on its
// own, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in
// the environment instead of an MPI launcher's. Each such process is an MPI
// singleton. This joins them into one intracommunicator ordered by RANK
// with MPI's own dynamic-process calls (MPI_Comm_accept/connect and
// MPI_Intercomm_merge), so that everything above runs on a real MPI world
// exactly as under mpirun.
//
// Open MPI connects separately started processes through an ompi-server,
// which rank 0 starts. The other ranks learn its address, and rank 0's MPI
// port, from rank 0 over one short TCP exchange at MASTER_ADDR (the
// rendezvous); nothing else travels over it.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_TORCHRUN_WORLD_H
#define MEGAC_RT_TORCHRUN_WORLD_H

#include <mpi.h>

#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace megac_rt {

/// A socket, closed when it goes out of scope.
struct OwnedFd;

/// What a torchrun-style launcher told this process.
struct TorchrunLaunch {
  int Rank = 0, Size = 1;
  std::string MasterAddr;
  /// Where rank 0 listens for the rendezvous: MEGAC_RENDEZVOUS_PORT if set,
  /// else MASTER_PORT, or MASTER_PORT + 1 where torchrun's own store holds
  /// MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
  int Port = 0;
  /// How long a rank waits for the others to meet (seconds,
  /// MEGAC_RENDEZVOUS_TIMEOUT, default 300).
  double TimeoutSec = 300;
};

/// The launch when WORLD_SIZE > 1 is set and no MPI launcher started this
/// process; nullopt otherwise. Throws RunError when the variables are
/// incomplete or malformed.
std::optional<TorchrunLaunch> torchrunLaunch();

/// The joined world. Construction calls MPI_Init; destruction (after
/// MPI_Finalize) stops rank 0's ompi-server.
class TorchrunWorld {
public:
  /// Throws RunError on failure (MPI may then be initialized: the caller
  /// reports and exits without MPI_Finalize, and the launcher ends the
  /// other ranks as it does for any rank that fails).
  TorchrunWorld(const TorchrunLaunch &L, int *Argc, char ***Argv);
  ~TorchrunWorld();
  TorchrunWorld(const TorchrunWorld &) = delete;
  TorchrunWorld &operator=(const TorchrunWorld &) = delete;

  /// The world, rank i being the process with RANK=i.
  MPI_Comm world() const { return World; }

private:
  void meet(const TorchrunLaunch &L, int *Argc, char ***Argv);
  /// Rank 0: starts ompi-server and returns its URI.
  std::string startServer();
  void stopServer();
  /// Joins the world through rank 0's MPI \p Port. Rank 0 passes the
  /// other ranks' rendezvous connections, over which it tells each when
  /// to connect.
  void join(const TorchrunLaunch &L, const std::string &Port,
            std::vector<OwnedFd> *Peers);

  MPI_Comm World = MPI_COMM_NULL;
  pid_t Server = -1;
  std::string UriFile;
};

} // namespace megac_rt

#endif // MEGAC_RT_TORCHRUN_WORLD_H
