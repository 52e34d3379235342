//===- torchrun_world.cpp - An MPI world for torchrun-style launches ------===//
//
// The rendezvous is one message each way per rank: rank r > 0 connects to
// rank 0 at MASTER_ADDR, says who it is ("MGCR", version, RANK,
// WORLD_SIZE as four little-endian uint32), and gets back a status and one
// text: the ompi-server's URI and rank 0's MPI port name, one per line (or
// why it was refused). Every rank then joins the world one at a time: the
// ranks already joined accept collectively, the newcomer connects, and the
// two sides merge, rank 0's side first.
//
//===----------------------------------------------------------------------===//

#include "torchrun_world.h"
#include "error.h"

#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace megac_rt {

/// Closes a descriptor when it goes out of scope.
struct OwnedFd {
  int N = -1;
  explicit OwnedFd(int N = -1) : N(N) {}
  OwnedFd(OwnedFd &&O) noexcept : N(O.N) { O.N = -1; }
  OwnedFd &operator=(OwnedFd &&O) noexcept {
    std::swap(N, O.N);
    return *this;
  }
  ~OwnedFd() {
    if (N >= 0)
      ::close(N);
  }
};

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x5243474d; // "MGCR" read little-endian
constexpr uint32_t kVersion = 1;

/// The variable as a whole number in [Lo, Hi]; \p Default where unset or
/// empty.
long wholeVar(const char *Name, long Lo, long Hi, long Default) {
  const char *V = std::getenv(Name);
  if (!V || !*V)
    return Default;
  char *End = nullptr;
  errno = 0;
  const long N = std::strtol(V, &End, 10);
  if (*End || errno || N < Lo || N > Hi ||
      !std::isdigit(static_cast<unsigned char>(*V)))
    throw RunError(std::string(Name) + " is '" + V +
                   "': expected a whole number from " + std::to_string(Lo) +
                   " to " + std::to_string(Hi));
  return N;
}

double secondsLeft(Clock::time_point Deadline) {
  return std::chrono::duration<double>(Deadline - Clock::now()).count();
}

Clock::time_point deadlineIn(double Sec) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(Sec));
}

/// Waits for \p Events on \p F until \p Deadline: false on timeout.
bool waitFor(int F, short Events, Clock::time_point Deadline) {
  for (;;) {
    const double Left = secondsLeft(Deadline);
    if (Left <= 0)
      return false;
    pollfd P{F, Events, 0};
    const int R = ::poll(&P, 1, int(std::min(Left * 1e3 + 1, 1e9)));
    if (R > 0)
      return true;
    if (R < 0 && errno != EINTR)
      return false;
  }
}

/// Reads or writes exactly \p Bytes before \p Deadline; false otherwise
/// (timeout, a closed peer, an error).
bool exchange(int F, void *Data, size_t Bytes, bool Write,
              Clock::time_point Deadline) {
  auto *P = static_cast<unsigned char *>(Data);
  while (Bytes) {
    if (!waitFor(F, Write ? POLLOUT : POLLIN, Deadline))
      return false;
    const ssize_t N =
        Write ? ::send(F, P, Bytes, MSG_NOSIGNAL) : ::recv(F, P, Bytes, 0);
    if (N < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (N <= 0)
      return false;
    P += N;
    Bytes -= size_t(N);
  }
  return true;
}

/// A reply: status 0 and the text, or status 1 and why.
bool sendReply(int F, uint32_t Status, const std::string &Text,
               Clock::time_point Deadline) {
  uint32_t Head[2] = {Status, uint32_t(Text.size())};
  return exchange(F, Head, sizeof(Head), true, Deadline) &&
         exchange(F, const_cast<char *>(Text.data()), Text.size(), true,
                  Deadline);
}

std::string where(const TorchrunLaunch &L) {
  return L.MasterAddr + ":" + std::to_string(L.Port);
}

/// Throws unless \p Addr names this host: the other ranks look for rank 0
/// there. (An address is this host's where a socket can bind to it.)
void checkThisHost(const TorchrunLaunch &L) {
  addrinfo Hints{};
  Hints.ai_family = AF_UNSPEC;
  Hints.ai_socktype = SOCK_DGRAM;
  addrinfo *List = nullptr;
  if (const int G = ::getaddrinfo(L.MasterAddr.c_str(), nullptr, &Hints, &List);
      G != 0)
    throw RunError("MASTER_ADDR=" + L.MasterAddr +
                   " cannot be resolved on rank 0: " + gai_strerror(G));
  bool Local = false;
  for (addrinfo *A = List; A && !Local; A = A->ai_next) {
    OwnedFd S(::socket(A->ai_family, A->ai_socktype | SOCK_CLOEXEC, 0));
    Local = S.N >= 0 && ::bind(S.N, A->ai_addr, A->ai_addrlen) == 0;
  }
  ::freeaddrinfo(List);
  if (!Local)
    throw RunError("MASTER_ADDR=" + L.MasterAddr +
                   " is not an address of this host, where rank 0 runs: the "
                   "other ranks meet rank 0 there, so it must name rank 0's "
                   "host");
}

/// Rank 0: meets every other rank and gives each \p Text; returns their
/// connections by rank, to say later whose turn it is to join. Throws when
/// the ranks do not all come before the deadline or disagree on the world.
std::vector<OwnedFd> serveRendezvous(const TorchrunLaunch &L,
                                     const std::string &Text) {
  const auto Deadline = deadlineIn(L.TimeoutSec);
  OwnedFd Listen(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  bool V6 = Listen.N >= 0;
  if (!V6)
    Listen = OwnedFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (Listen.N < 0)
    throw RunError(std::string("rendezvous: cannot open a socket: ") +
                   std::strerror(errno));
  int One = 1, Zero = 0;
  ::setsockopt(Listen.N, SOL_SOCKET, SO_REUSEADDR, &One, sizeof(One));
  int Bound;
  if (V6) {
    // Both IPv6 and IPv4 peers (MASTER_ADDR may name either).
    ::setsockopt(Listen.N, IPPROTO_IPV6, IPV6_V6ONLY, &Zero, sizeof(Zero));
    sockaddr_in6 A{};
    A.sin6_family = AF_INET6;
    A.sin6_addr = in6addr_any;
    A.sin6_port = htons(uint16_t(L.Port));
    Bound = ::bind(Listen.N, reinterpret_cast<sockaddr *>(&A), sizeof(A));
  } else {
    sockaddr_in A{};
    A.sin_family = AF_INET;
    A.sin_addr.s_addr = htonl(INADDR_ANY);
    A.sin_port = htons(uint16_t(L.Port));
    Bound = ::bind(Listen.N, reinterpret_cast<sockaddr *>(&A), sizeof(A));
  }
  if (Bound != 0 || ::listen(Listen.N, 128) != 0)
    throw RunError("rendezvous: rank 0 cannot listen on port " +
                   std::to_string(L.Port) + ": " + std::strerror(errno) +
                   " (set MEGAC_RENDEZVOUS_PORT to a free port, the same "
                   "on every rank)");
  std::vector<OwnedFd> Peers(size_t(L.Size));
  std::vector<bool> Met(size_t(L.Size), false);
  Met[0] = true;
  // Every rank that came hears why the world will not form (whichever
  // rank's message the launcher lets through names the cause).
  auto GiveUp = [&](const std::string &Why, int Also) {
    for (OwnedFd &P : Peers)
      if (P.N >= 0)
        sendReply(P.N, 1, Why, deadlineIn(1));
    if (Also >= 0)
      sendReply(Also, 1, Why, deadlineIn(1));
    throw RunError("rendezvous: " + Why);
  };
  int Missing = L.Size - 1;
  while (Missing > 0) {
    if (!waitFor(Listen.N, POLLIN, Deadline)) {
      std::string Who;
      int Named = 0;
      for (int R = 1; R < L.Size && Named < 8; ++R)
        if (!Met[size_t(R)])
          Who += (Named++ ? ", " : "") + std::to_string(R);
      const int Others = L.Size - 1;
      GiveUp("rank 0 met " + std::to_string(Others - Missing) + " of " +
                 std::to_string(Others) + " other rank" +
                 (Others == 1 ? "" : "s") + " at port " +
                 std::to_string(L.Port) + " within " +
                 std::to_string(int(L.TimeoutSec)) + " s; missing: rank" +
                 (Missing == 1 ? " " : "s ") + Who +
                 (Missing > Named ? ", ..." : "") +
                 " (MEGAC_RENDEZVOUS_TIMEOUT sets the wait)",
             -1);
    }
    OwnedFd Peer(::accept4(Listen.N, nullptr, nullptr, SOCK_CLOEXEC));
    if (Peer.N < 0)
      continue;
    // A peer gets a few seconds to say who it is: anything else that
    // connects (a port scan) must not hold the others up.
    const auto HelloBy =
        std::min(Deadline, Clock::now() + std::chrono::seconds(10));
    uint32_t Hello[4];
    if (!exchange(Peer.N, Hello, sizeof(Hello), false, HelloBy) ||
        Hello[0] != kMagic)
      continue;
    const int R = int(Hello[2]), Size = int(Hello[3]);
    const std::string Rank = "rank " + std::to_string(R);
    if (Hello[1] != kVersion)
      GiveUp(Rank + " runs a megac-run of another rendezvous version (" +
                 std::to_string(Hello[1]) + ") than rank 0's (" +
                 std::to_string(kVersion) + ")",
             Peer.N);
    if (Size != L.Size)
      GiveUp(Rank + " has WORLD_SIZE " + std::to_string(Size) +
                 " but rank 0 has " + std::to_string(L.Size),
             Peer.N);
    if (R <= 0 || R >= L.Size || Met[size_t(R)])
      GiveUp("RANK " + std::to_string(R) + " was started twice", Peer.N);
    if (!sendReply(Peer.N, 0, Text, Deadline))
      GiveUp(Rank + " went away while rank 0 answered it", -1);
    Met[size_t(R)] = true;
    Peers[size_t(R)] = std::move(Peer);
    --Missing;
  }
  return Peers;
}

/// Reads one reply of rank 0's: its text, or throws with \p What.
std::string readReply(int F, const TorchrunLaunch &L,
                      Clock::time_point Deadline, const std::string &What) {
  uint32_t Head[2] = {0, 0};
  std::string Text;
  bool Whole =
      exchange(F, Head, sizeof(Head), false, Deadline) && Head[1] <= (1u << 20);
  if (Whole) {
    Text.resize(Head[1]);
    Whole = exchange(F, Text.data(), Text.size(), false, Deadline);
  }
  if (!Whole)
    throw RunError(
        "rendezvous: rank 0 at " + where(L) +
        (secondsLeft(Deadline) > 0
             ? std::string(" closed the connection (rank 0 failed; its own "
                           "message says why)")
             : " " + What));
  if (Head[0] != 0)
    throw RunError("rendezvous: " + Text);
  return Text;
}

/// Rank r > 0: asks rank 0 (retrying while it is not yet listening) for
/// the text it serves; \p Conn keeps the connection, on which rank 0 later
/// says when to join.
std::string askRendezvous(const TorchrunLaunch &L, OwnedFd &Conn) {
  const auto Deadline = deadlineIn(L.TimeoutSec);
  addrinfo Hints{};
  Hints.ai_family = AF_UNSPEC;
  Hints.ai_socktype = SOCK_STREAM;
  std::string LastWhy = "nothing listened";
  for (;;) {
    addrinfo *List = nullptr;
    const int G = ::getaddrinfo(L.MasterAddr.c_str(),
                                std::to_string(L.Port).c_str(), &Hints, &List);
    if (G != 0) {
      LastWhy = std::string("cannot resolve MASTER_ADDR: ") + gai_strerror(G);
    } else {
      for (addrinfo *A = List; A; A = A->ai_next) {
        OwnedFd S(::socket(A->ai_family, A->ai_socktype | SOCK_CLOEXEC,
                           A->ai_protocol));
        if (S.N < 0 || ::connect(S.N, A->ai_addr, A->ai_addrlen) != 0) {
          LastWhy = std::strerror(errno);
          continue;
        }
        ::freeaddrinfo(List);
        uint32_t Hello[4] = {kMagic, kVersion, uint32_t(L.Rank),
                             uint32_t(L.Size)};
        if (!exchange(S.N, Hello, sizeof(Hello), true, Deadline))
          throw RunError("rendezvous: rank 0 at " + where(L) +
                         " went away while this rank said who it is");
        std::string Text = readReply(
            S.N, L, Deadline,
            "did not answer in time (is another program listening there? "
            "MEGAC_RENDEZVOUS_PORT picks the port)");
        Conn = std::move(S);
        return Text;
      }
      ::freeaddrinfo(List);
    }
    if (secondsLeft(Deadline) <= 0)
      throw RunError("rendezvous: cannot reach rank 0 at " + where(L) +
                     " within " + std::to_string(int(L.TimeoutSec)) + " s (" +
                     LastWhy + "; MEGAC_RENDEZVOUS_TIMEOUT sets the wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

} // namespace

std::optional<TorchrunLaunch> torchrunLaunch() {
  // An MPI launcher's own variables win: under mpirun or srun, a RANK or
  // WORLD_SIZE left in the environment is someone else's.
  for (const char *Var :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(Var))
      return std::nullopt;
  TorchrunLaunch L;
  L.Size = int(wholeVar("WORLD_SIZE", 1, 1 << 20, 1));
  if (L.Size <= 1)
    return std::nullopt;
  const std::string Ws = std::to_string(L.Size);
  for (const char *Need : {"RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (const char *V = std::getenv(Need); !V || !*V)
      throw RunError("WORLD_SIZE=" + Ws + " is set but " + Need +
                     " is not: a torchrun-style launch gives every process "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  L.Rank = int(wholeVar("RANK", 0, L.Size - 1, 0));
  L.MasterAddr = std::getenv("MASTER_ADDR");
  const long MasterPort = wholeVar("MASTER_PORT", 1, 65535, 0);
  const char *AgentStore = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool PortTaken = AgentStore && (std::string(AgentStore) == "True" ||
                                        std::string(AgentStore) == "1");
  L.Port = int(wholeVar("MEGAC_RENDEZVOUS_PORT", 1, 65535,
                        PortTaken ? (MasterPort % 65535) + 1 : MasterPort));
  L.TimeoutSec = double(wholeVar("MEGAC_RENDEZVOUS_TIMEOUT", 1, 86400, 300));
  return L;
}

TorchrunWorld::TorchrunWorld(const TorchrunLaunch &L, int *Argc, char ***Argv) {
  try {
    meet(L, Argc, Argv);
  } catch (...) {
    stopServer();
    throw;
  }
}

void TorchrunWorld::meet(const TorchrunLaunch &L, int *Argc, char ***Argv) {
  // Rank 0's ompi-server first: every singleton's MPI_Init must know it.
  std::string Uri;
  OwnedFd Conn;
  if (L.Rank == 0) {
    checkThisHost(L);
    Uri = startServer();
  } else
    Uri = askRendezvous(L, Conn);
  ::setenv("OMPI_MCA_pmix_server_uri", Uri.c_str(), 1);
  // Separately started Open MPI jobs reach each other over TCP only (its
  // shared-memory transport stays within one job): a transport list that
  // names others gets TCP too.
  if (const char *Btl = std::getenv("OMPI_MCA_btl");
      Btl && *Btl && *Btl != '^' && !std::strstr(Btl, "tcp"))
    ::setenv("OMPI_MCA_btl", (std::string(Btl) + ",tcp").c_str(), 1);
  MPI_Init(Argc, Argv);
  // A failed accept or connect is reported here, as one line.
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  if (L.Rank == 0) {
    char Name[MPI_MAX_PORT_NAME] = {0};
    if (MPI_Open_port(MPI_INFO_NULL, Name) != MPI_SUCCESS)
      throw RunError("rank 0 cannot open an MPI port for the others");
    std::vector<OwnedFd> Peers = serveRendezvous(L, Uri);
    join(L, Name, &Peers);
    MPI_Close_port(Name);
  } else {
    // Rank 0 sends its port when this rank's turn to join comes: Open
    // MPI's accept and connect pair up reliably only one newcomer at a
    // time.
    // (Rank 0 waits as long for the last rank to reach it, and then names
    // the missing ones; this rank waits a little longer.)
    const std::string Port =
        readReply(Conn.N, L, deadlineIn(L.TimeoutSec + 10),
                  "did not let this rank join within " +
                      std::to_string(int(L.TimeoutSec) + 10) +
                      " s (rank 0 waits for every rank to reach it)");
    join(L, Port, nullptr);
  }
}

std::string TorchrunWorld::startServer() {
  char Path[] = "/tmp/megac-ompi-server-XXXXXX";
  const int F = ::mkstemp(Path);
  if (F < 0)
    throw RunError(std::string("cannot create a file for ompi-server's "
                               "address in /tmp: ") +
                   std::strerror(errno));
  ::close(F);
  UriFile = Path;
  Server = ::fork();
  if (Server < 0)
    throw RunError(std::string("cannot start ompi-server: ") +
                   std::strerror(errno));
  if (Server == 0) {
    // The server ends with rank 0, however rank 0 ends.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    const int Null = ::open("/dev/null", O_RDWR);
    if (Null >= 0) {
      ::dup2(Null, 0);
      ::dup2(Null, 1);
    }
    ::execlp("ompi-server", "ompi-server", "--no-daemonize", "--report-uri",
             Path, static_cast<char *>(nullptr));
    ::_exit(127);
  }
  // Its URI appears in the file once it listens.
  const auto Deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    struct stat St {};
    if (::stat(Path, &St) == 0 && St.st_size > 0) {
      // (Written in one line; wait for its end.)
      FILE *In = std::fopen(Path, "r");
      char Buf[4096] = {0};
      const bool Whole =
          In && std::fgets(Buf, sizeof(Buf), In) && std::strchr(Buf, '\n');
      if (In)
        std::fclose(In);
      if (Whole) {
        // (Read: the file has served its purpose.)
        ::unlink(Path);
        UriFile.clear();
        std::string Uri = Buf;
        while (!Uri.empty() && (Uri.back() == '\n' || Uri.back() == '\r'))
          Uri.pop_back();
        return Uri;
      }
    }
    int Status = 0;
    if (::waitpid(Server, &Status, WNOHANG) == Server) {
      Server = -1;
      throw RunError(
          WIFEXITED(Status) && WEXITSTATUS(Status) == 127
              ? "a torchrun-style launch needs Open MPI's ompi-server on "
                "PATH (it connects the separately started ranks)"
              : "ompi-server (which connects the separately started ranks) "
                "exited with status " +
                    std::to_string(WIFEXITED(Status) ? WEXITSTATUS(Status)
                                                     : 128 + WTERMSIG(Status)));
    }
    if (Clock::now() > Deadline)
      throw RunError("ompi-server did not report its address within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void TorchrunWorld::join(const TorchrunLaunch &L, const std::string &Port,
                         std::vector<OwnedFd> *Peers) {
  std::vector<char> Name(Port.begin(), Port.end());
  Name.push_back('\0');
  MPI_Comm Joined = MPI_COMM_SELF;
  if (L.Rank != 0) {
    MPI_Comm Inter;
    if (MPI_Comm_connect(Name.data(), MPI_INFO_NULL, 0, MPI_COMM_SELF,
                         &Inter) != MPI_SUCCESS)
      throw RunError("rank " + std::to_string(L.Rank) +
                     " cannot connect to rank 0's MPI port");
    MPI_Intercomm_merge(Inter, /*high=*/1, &Joined);
    MPI_Comm_free(&Inter);
  }
  // The ranks already joined take in the newcomers in RANK order, so the
  // world comes out ordered.
  int Size = 1;
  MPI_Comm_size(Joined, &Size);
  for (; Size < L.Size; MPI_Comm_size(Joined, &Size)) {
    if (Peers &&
        !sendReply((*Peers)[size_t(Size)].N, 0, Port, deadlineIn(L.TimeoutSec)))
      throw RunError("rendezvous: rank " + std::to_string(Size) +
                     " went away before it joined");
    MPI_Comm Inter, Merged;
    if (MPI_Comm_accept(Name.data(), MPI_INFO_NULL, 0, Joined, &Inter) !=
        MPI_SUCCESS)
      throw RunError("rank " + std::to_string(Size) + " could not join");
    MPI_Intercomm_merge(Inter, /*high=*/0, &Merged);
    MPI_Comm_free(&Inter);
    if (Joined != MPI_COMM_SELF)
      MPI_Comm_free(&Joined);
    Joined = Merged;
  }
  World = Joined;
  int Mine = 0;
  MPI_Comm_rank(World, &Mine);
  if (Mine != L.Rank)
    throw RunError("rank " + std::to_string(L.Rank) + " joined the world as " +
                   std::to_string(Mine));
}

void TorchrunWorld::stopServer() {
  if (Server > 0) {
    // It may linger over its clients (a rank still waiting to join);
    // the job no longer needs it either way.
    ::kill(Server, SIGTERM);
    int Status = 0;
    const auto Deadline = Clock::now() + std::chrono::seconds(1);
    while (::waitpid(Server, &Status, WNOHANG) == 0) {
      if (Clock::now() > Deadline) {
        ::kill(Server, SIGKILL);
        ::waitpid(Server, &Status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Server = -1;
  }
  if (!UriFile.empty())
    ::unlink(UriFile.c_str());
  UriFile.clear();
}

TorchrunWorld::~TorchrunWorld() { stopServer(); }

} // namespace megac_rt
