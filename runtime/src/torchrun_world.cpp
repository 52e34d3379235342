//===- torchrun_world.cpp - An MPI world for torchrun-style launches ------===//
//
// The rendezvous: rank r > 0 connects to rank 0 at MASTER_ADDR and says
// who it is ("MGCR", version, RANK, WORLD_SIZE and the 64-bit job key, six
// little-endian uint32). Rank 0 answers with messages of a status, a
// length and a text:
//   kOk        the ompi-server's URI (first), later an empty text once
//              every rank came (the joining starts);
//   kRefused   why the world will not form (every rank hears it);
//   kOtherJob  the process belongs to another job and is turned away.
// The ranks then join in rounds, as a binary tree (join_tree.h): the first
// rank of each accepting block opens an MPI port, and its name travels to
// the other block's first rank as a kPortTag frame (the tag byte, the
// uint32 receiving rank, a uint32 length, the name) over the
// rendezvous connections, which rank 0's monitor relays. Every rank but
// rank 0 receives one port name. Afterwards each connection carries one byte,
// kBye, when its rank ends normally; a connection that closes without it
// means its rank ended early.
//
//===----------------------------------------------------------------------===//

#include "torchrun_world.h"
#include "env.h"
#include "error.h"
#include "join_tree.h"

#include <arpa/inet.h>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <netdb.h>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace megac_rt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x5243474d; // "MGCR" read little-endian
constexpr uint32_t kVersion = 3;
enum Status : uint32_t { kOk = 0, kRefused = 1, kOtherJob = 2 };
constexpr char kBye = 'B', kPortTag = 'P';

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

double secondsLeft(Clock::time_point Deadline) {
  return std::chrono::duration<double>(Deadline - Clock::now()).count();
}

Clock::time_point deadlineIn(double Sec) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(Sec));
}

std::string seconds(double Sec) { return std::to_string(int(Sec)) + " s"; }

/// Waits for \p Events on \p F until \p Deadline: false on timeout. (What
/// is ready already is found even past the deadline.)
bool waitFor(int F, short Events, Clock::time_point Deadline) {
  for (;;) {
    const double Left = std::max(0.0, secondsLeft(Deadline));
    pollfd P{F, Events, 0};
    const int R = ::poll(&P, 1, int(std::min(Left * 1e3 + 1, 1e9)));
    if (R > 0)
      return true;
    if (R < 0 && errno != EINTR)
      return false;
    if (R == 0 && secondsLeft(Deadline) <= 0)
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

bool sendMessage(int F, Status S, const std::string &Text,
                 Clock::time_point Deadline) {
  uint32_t Head[2] = {S, uint32_t(Text.size())};
  return exchange(F, Head, sizeof(Head), true, Deadline) &&
         exchange(F, const_cast<char *>(Text.data()), Text.size(), true,
                  Deadline);
}

/// One message of rank 0's; false if none came whole before \p Deadline
/// (\p Closed: because the connection closed).
bool readMessage(int F, Clock::time_point Deadline, uint32_t &S,
                 std::string &Text, bool &Closed) {
  uint32_t Head[2] = {0, 0};
  bool Whole =
      exchange(F, Head, sizeof(Head), false, Deadline) && Head[1] <= (1u << 20);
  if (Whole) {
    Text.resize(Head[1]);
    Whole = exchange(F, Text.data(), Text.size(), false, Deadline);
  }
  Closed = !Whole && secondsLeft(Deadline) > 0;
  S = Head[0];
  return Whole;
}

/// Sends a port name frame for rank \p To (kPortTag, To, the length, the
/// name).
bool sendPort(int F, int To, const std::string &Port,
              Clock::time_point Deadline) {
  char Tag = kPortTag;
  uint32_t Head[2] = {uint32_t(To), uint32_t(Port.size())};
  return exchange(F, &Tag, 1, true, Deadline) &&
         exchange(F, Head, sizeof(Head), true, Deadline) &&
         exchange(F, const_cast<char *>(Port.data()), Port.size(), true,
                  Deadline);
}

/// The rest of a port name frame whose tag was read: its receiving rank
/// and the name; false if it did not come whole before \p Deadline.
bool readPortRest(int F, Clock::time_point Deadline, int &To,
                  std::string &Port) {
  uint32_t Head[2] = {0, 0};
  if (!exchange(F, Head, sizeof(Head), false, Deadline) ||
      Head[1] > MPI_MAX_PORT_NAME || Head[0] > uint32_t(INT_MAX))
    return false;
  To = int(Head[0]);
  Port.resize(Head[1]);
  return exchange(F, Port.data(), Port.size(), false, Deadline);
}

/// Connects to \p A before \p Deadline (a connect() of its own could wait
/// minutes for an address that drops packets); the socket or -1 (errno).
int connectWithin(const addrinfo *A, Clock::time_point Deadline) {
  OwnedFd S(::socket(A->ai_family,
                     A->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                     A->ai_protocol));
  if (S.N < 0)
    return -1;
  if (::connect(S.N, A->ai_addr, A->ai_addrlen) != 0) {
    if (errno != EINPROGRESS)
      return -1;
    if (!waitFor(S.N, POLLOUT, std::min(Deadline, deadlineIn(5)))) {
      errno = ETIMEDOUT;
      return -1;
    }
    int Err = 0;
    socklen_t Len = sizeof(Err);
    ::getsockopt(S.N, SOL_SOCKET, SO_ERROR, &Err, &Len);
    if (Err) {
      errno = Err;
      return -1;
    }
  }
  const int F = S.N;
  S.N = -1;
  return F;
}

std::string where(const TorchrunLaunch &L) {
  return L.MasterAddr + ":" + std::to_string(L.Port);
}

/// Warns unless MASTER_ADDR names this host, where the other ranks look
/// for rank 0. (An address is this host's where a socket can bind to it;
/// one that reaches it from elsewhere, through NAT or a service address,
/// may still work.)
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
    std::fprintf(stderr,
                 "megac-run: warning: MASTER_ADDR=%s is not an address of "
                 "this host, where rank 0 runs: the other ranks must reach "
                 "rank 0 through it\n",
                 L.MasterAddr.c_str());
}

/// Open MPI's transports as a torchrun-style launch needs them: separately
/// started jobs reach each other over TCP only (shared memory stays within
/// one job), so a list of transports gets TCP, and one that excludes TCP
/// is refused (Open MPI crashes joining without it).
void requireTcpTransport() {
  const char *Btl = std::getenv("OMPI_MCA_btl");
  if (!Btl || !*Btl)
    return;
  std::string List = Btl;
  const bool Excludes = List[0] == '^';
  bool NamesTcp = false;
  size_t At = Excludes ? 1 : 0;
  while (At <= List.size()) {
    const size_t Comma = std::min(List.find(',', At), List.size());
    NamesTcp |= List.compare(At, Comma - At, "tcp") == 0;
    At = Comma + 1;
  }
  if (Excludes && NamesTcp)
    throw RunError("OMPI_MCA_btl=" + List +
                   " excludes TCP, which the ranks of a torchrun-style "
                   "launch need: separately started Open MPI jobs reach "
                   "each other over TCP only");
  if (!Excludes && !NamesTcp)
    ::setenv("OMPI_MCA_btl", (List + ",tcp").c_str(), 1);
}

/// Creates Open MPI's top session directory of this host,
/// <tmpdir>/ompi.<host>.<euid>, where it is missing. Every rank of a
/// torchrun-style launch starts as a singleton whose MPI_Init creates it,
/// all at once, and Open MPI 4's creation fails on the directory another
/// rank made a moment before ("A call to mkdir was unable to create the
/// desired directory ... File exists"). On rank 0's host its ompi-server
/// made it first; on every other host of a multi-node job, with two or
/// more ranks there, the ranks raced (about 1 start in 15 of
/// torchrun-two-hosts.test, whose 2 ranks a host cannot show the race
/// reliably). The name is Open MPI 4's (orte_session_dir): the whole of
/// OMPI_MCA_orte_top_session_dir where set; else the base from
/// OMPI_MCA_orte_tmpdir_base, TMPDIR, TEMP or TMP, else /tmp, and the
/// host name up to its first '.' unless OMPI_MCA_orte_keep_fqdn_hostnames
/// is set (a name from a params file is not seen). A name that differs
/// only leaves an unused empty directory. (A job of another user of
/// this host that ends between this mkdir and MPI_Init removes the
/// directory again: the race is back for that start alone.)
void makeSessionTop() {
  auto Env = [](const char *Name) -> const char * {
    const char *V = std::getenv(Name);
    return V && *V ? V : nullptr;
  };
  std::string Top;
  if (const char *Whole = Env("OMPI_MCA_orte_top_session_dir")) {
    Top = Whole;
  } else {
    std::string Base = "/tmp";
    for (const char *Var :
         {"OMPI_MCA_orte_tmpdir_base", "TMPDIR", "TEMP", "TMP"})
      if (const char *V = Env(Var)) {
        Base = V;
        break;
      }
    char Host[256] = {};
    if (::gethostname(Host, sizeof(Host) - 1) != 0)
      return;
    std::string Name = Host;
    const char *Fqdn = Env("OMPI_MCA_orte_keep_fqdn_hostnames");
    const bool KeepFqdn =
        Fqdn &&
        (std::strcmp(Fqdn, "1") == 0 || std::strcmp(Fqdn, "true") == 0 ||
         std::strcmp(Fqdn, "t") == 0 || std::strcmp(Fqdn, "yes") == 0);
    // (An address as the name keeps its dots, as Open MPI keeps them.)
    if (!KeepFqdn && Name.find_first_not_of("0123456789.") != std::string::npos)
      Name = Name.substr(0, Name.find('.'));
    Top = Base + "/ompi." + Name + "." +
          std::to_string(static_cast<unsigned long>(::geteuid()));
  }
  // (EEXIST is the point; another failure is MPI_Init's to report.)
  ::mkdir(Top.c_str(), 0700);
}

} // namespace

struct TorchrunWorld::State {
  TorchrunLaunch L;
  MPI_Comm World = MPI_COMM_NULL;
  pid_t Server = -1;
  std::string UriFile;
  /// torchrun's agent, which owns this rank (0: not started by one). A
  /// rank whose agent is gone (SIGKILLed) ends the job: else the ranks
  /// trained on, orphaned, holding their checkpoint's lock.
  pid_t Launcher = 0;
  /// Rank 0: its connection to every other rank (by rank); the others:
  /// theirs to rank 0 (index 0).
  std::vector<OwnedFd> Links;

  // The monitor: a thread that ends this rank when a connection closes
  // early, or when joining makes no progress for TimeoutSec.
  std::thread Monitor;
  int Wake[2] = {-1, -1};
  std::atomic<bool> WatchLinks{false}, Finishing{false}, Stop{false};
  /// When the current round of joining began (steady-clock ticks; 0: not
  /// joining), the two blocks joining in it (ranks JoinFirst to JoinLast,
  /// the second from JoinSplit) and how many timeouts it may take.
  std::atomic<int64_t> JoinSince{0};
  std::atomic<int> JoinFirst{0}, JoinLast{0}, JoinSplit{0},
      JoinRoundsAllowed{1};

  /// Ranks > 0: the port name the monitor received for this rank (its
  /// block's turn to connect).
  std::mutex PortMutex;
  std::condition_variable PortArrived;
  std::optional<std::string> ReceivedPort;

  /// Also when construction failed: the monitor stops before the
  /// connections close, and the server last.
  ~State() {
    Stop = true;
    if (Monitor.joinable()) {
      const char Any = 0;
      (void)!::write(Wake[1], &Any, 1);
      Monitor.join();
    }
    for (int &F : Wake)
      if (F >= 0)
        ::close(F);
    Links.clear();
    stopServer();
  }

  void meet(int *Argc, char ***Argv);
  std::string startServer();
  void stopServer();
  std::string serveRendezvous(const OwnedFd &Listen, const std::string &Uri);
  std::string askRendezvous();
  void waitForStart();
  void join();
  std::string openBlockPort(const JoinRound &J);
  std::string awaitBlockPort();
  void startMonitor();
  void watch();
  bool takeFrame(size_t Link, char Tag);
  [[noreturn]] void die(const std::string &Why);
  /// Starts the watchdog's clock on a round of joining: \p Rounds
  /// timeouts for it (those of the rounds the other block may still be
  /// doing, where this rank sat the same rounds out).
  void progress(const JoinRound &J, int Rounds) {
    JoinFirst = std::min(J.First, J.OtherFirst);
    JoinLast = std::max(J.Last, J.OtherLast);
    JoinSplit = std::max(J.First, J.OtherFirst);
    JoinRoundsAllowed = Rounds;
    JoinSince = Clock::now().time_since_epoch().count();
  }
};

void TorchrunWorld::State::die(const std::string &Why) {
  std::fprintf(stderr, "megac-run: error: %s\n", Why.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

/// Rank 0: listens at the rendezvous port (before anything of its own,
/// ompi-server included, takes a port the system may hand out).
static OwnedFd listenForRanks(const TorchrunLaunch &L) {
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
                   (errno == EADDRINUSE
                        ? " (another program holds it, perhaps a "
                          "second process started with RANK=0; "
                          "MEGAC_RENDEZVOUS_PORT picks another port, "
                          "the same on every rank)"
                        : " (MEGAC_RENDEZVOUS_PORT picks another "
                          "port, the same on every rank)"));
  return Listen;
}

/// Rank 0: meets every other rank at \p Listen and gives each the
/// server's \p Uri; keeps their connections in Links. Throws when the
/// ranks do not all come before the deadline or disagree on the world.
std::string TorchrunWorld::State::serveRendezvous(const OwnedFd &Listen,
                                                  const std::string &Uri) {
  const auto Deadline = deadlineIn(L.TimeoutSec);
  Links.clear();
  Links.resize(size_t(L.Size));
  // Every rank that came hears why the world will not form (whichever
  // rank's message the launcher lets through names the cause).
  auto GiveUp = [&](const std::string &Why, int Also) {
    for (OwnedFd &P : Links)
      if (P.N >= 0)
        sendMessage(P.N, kRefused, Why, deadlineIn(1));
    if (Also >= 0)
      sendMessage(Also, kRefused, Why, deadlineIn(1));
    throw RunError("rendezvous: " + Why);
  };
  int Missing = L.Size - 1, TurnedAway = 0;
  while (Missing > 0) {
    if (!waitFor(Listen.N, POLLIN, Deadline)) {
      std::string Who;
      int Named = 0;
      for (int R = 1; R < L.Size && Named < 8; ++R)
        if (Links[size_t(R)].N < 0)
          Who += (Named++ ? ", " : "") + std::to_string(R);
      const int Others = L.Size - 1;
      GiveUp("rank 0 met " + std::to_string(Others - Missing) + " of " +
                 std::to_string(Others) + " other rank" +
                 (Others == 1 ? "" : "s") + " at port " +
                 std::to_string(L.Port) + " within " + seconds(L.TimeoutSec) +
                 "; missing: rank" + (Missing == 1 ? " " : "s ") + Who +
                 (Missing > Named ? ", ..." : "") +
                 (TurnedAway ? "; " + std::to_string(TurnedAway) + " process" +
                                   (TurnedAway == 1 ? "" : "es") +
                                   " of another job (another command line "
                                   "or TORCHELASTIC_RUN_ID) came instead"
                             : std::string()) +
                 " (MEGAC_RENDEZVOUS_TIMEOUT sets the wait)",
             -1);
    }
    OwnedFd Peer(::accept4(Listen.N, nullptr, nullptr, SOCK_CLOEXEC));
    if (Peer.N < 0)
      continue;
    // A peer gets a few seconds to say who it is: anything else that
    // connects (a port scan) must not hold the others up.
    uint32_t Hello[6];
    if (!exchange(Peer.N, Hello, sizeof(Hello), false,
                  std::min(Deadline, deadlineIn(10))) ||
        Hello[0] != kMagic)
      continue;
    const int R = int(Hello[2]), Size = int(Hello[3]);
    const uint64_t Key = uint64_t(Hello[4]) | uint64_t(Hello[5]) << 32;
    const std::string Rank = "rank " + std::to_string(R);
    if (Hello[1] != kVersion)
      GiveUp(Rank + " runs a megac-run of another rendezvous version (" +
                 std::to_string(Hello[1]) + ") than rank 0's (" +
                 std::to_string(kVersion) + ")",
             Peer.N);
    if (Key != L.JobKey) {
      sendMessage(Peer.N, kOtherJob,
                  "rank 0 at " + where(L) +
                      " runs another job (another command line or "
                      "TORCHELASTIC_RUN_ID): this process is not one of "
                      "its ranks (a job's ranks run the same arguments; "
                      "torchrun's ${local_rank} in them makes them "
                      "differ)",
                  deadlineIn(1));
      ++TurnedAway;
      continue;
    }
    if (Size != L.Size)
      GiveUp(Rank + " has WORLD_SIZE " + std::to_string(Size) +
                 " but rank 0 has " + std::to_string(L.Size),
             Peer.N);
    if (R <= 0 || R >= L.Size || Links[size_t(R)].N >= 0)
      GiveUp("RANK " + std::to_string(R) + " was started twice", Peer.N);
    if (!sendMessage(Peer.N, kOk, Uri, Deadline))
      GiveUp(Rank + " went away while rank 0 answered it", -1);
    Links[size_t(R)] = std::move(Peer);
    --Missing;
  }
  return Uri;
}

/// Rank r > 0: asks rank 0 (retrying while it is not yet listening) for
/// the server's URI; keeps the connection in Links[0].
std::string TorchrunWorld::State::askRendezvous() {
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
        OwnedFd S(connectWithin(A, Deadline));
        if (S.N < 0) {
          LastWhy = std::strerror(errno);
          continue;
        }
        ::freeaddrinfo(List);
        uint32_t Hello[6] = {
            kMagic,           kVersion,           uint32_t(L.Rank),
            uint32_t(L.Size), uint32_t(L.JobKey), uint32_t(L.JobKey >> 32)};
        uint32_t Status = 0;
        std::string Text;
        bool Closed = false;
        if (!exchange(S.N, Hello, sizeof(Hello), true, Deadline) ||
            !readMessage(S.N, Deadline, Status, Text, Closed))
          throw RunError("rendezvous: rank 0 at " + where(L) +
                         (Closed ? " closed the connection before answering "
                                   "(rank 0 failed, or another program "
                                   "listens there: MEGAC_RENDEZVOUS_PORT "
                                   "picks the port)"
                                 : " did not answer in time (is another "
                                   "program listening there? "
                                   "MEGAC_RENDEZVOUS_PORT picks the port)"));
        if (Status != kOk)
          throw RunError("rendezvous: " + Text);
        Links.clear();
        Links.push_back(std::move(S));
        return Text;
      }
      ::freeaddrinfo(List);
    }
    if (secondsLeft(Deadline) <= 0)
      throw RunError("rendezvous: cannot reach rank 0 at " + where(L) +
                     " within " + seconds(L.TimeoutSec) + " (" + LastWhy +
                     "; MEGAC_RENDEZVOUS_TIMEOUT sets the wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// Rank r > 0: waits for rank 0 to say that every rank came (or why the
/// world will not form).
void TorchrunWorld::State::waitForStart() {
  uint32_t Status = 0;
  std::string Text;
  bool Closed = false;
  // (Rank 0 gives up on ranks that do not come within the timeout and
  // says so; this wait also covers its MPI_Init after the last one came.)
  if (!readMessage(Links[0].N, deadlineIn(2 * L.TimeoutSec), Status, Text,
                   Closed))
    throw RunError(
        "rendezvous: rank 0 at " + where(L) +
        (Closed ? " closed the connection (rank 0 failed; its own message "
                  "says why)"
                : " did not start the joining within " +
                      seconds(2 * L.TimeoutSec) +
                      " (MEGAC_RENDEZVOUS_TIMEOUT sets the wait)"));
  if (Status != kOk)
    throw RunError("rendezvous: " + Text);
}

/// The first rank of an accepting block: opens an MPI port and sends its
/// name to the other block's first rank (through rank 0's monitor unless
/// this is rank 0).
std::string TorchrunWorld::State::openBlockPort(const JoinRound &J) {
  char Name[MPI_MAX_PORT_NAME] = {0};
  if (MPI_Open_port(MPI_INFO_NULL, Name) != MPI_SUCCESS)
    throw RunError("rank " + std::to_string(L.Rank) +
                   " cannot open an MPI port for " +
                   rankSpan(J.OtherFirst, J.OtherLast));
  const int Via = L.Rank == 0 ? J.OtherFirst : 0;
  if (!sendPort(Links[size_t(Via)].N, J.OtherFirst, Name,
                deadlineIn(L.TimeoutSec)))
    throw RunError("rendezvous: rank " + std::to_string(Via) +
                   " went away before the world formed");
  return Name;
}

/// The first rank of a connecting block: the port name its monitor
/// received.
std::string TorchrunWorld::State::awaitBlockPort() {
  std::unique_lock<std::mutex> Lock(PortMutex);
  // (The monitor's watchdog ends the wait that lasts too long.)
  PortArrived.wait(Lock, [this] { return ReceivedPort.has_value(); });
  return *ReceivedPort;
}

/// Joins the world in rounds (the header's tree): in each, this rank's
/// block takes in the next block or joins the one before it.
void TorchrunWorld::State::join() {
  MPI_Comm Joined = MPI_COMM_SELF;
  // (A block that sat rounds out waits for the other block's rounds too.)
  int LastMerged = -1;
  for (int Round = 0; Round < joinRounds(L.Size); ++Round) {
    const JoinRound J = joinRound(L.Rank, L.Size, Round);
    if (!J.Merges)
      continue;
    progress(J, Round - LastMerged);
    LastMerged = Round;
    const bool Leads = L.Rank == J.First;
    // (The port name matters at the first rank of a block only.)
    std::string Port = !Leads      ? std::string()
                       : J.Accepts ? openBlockPort(J)
                                   : awaitBlockPort();
    std::vector<char> Name(Port.begin(), Port.end());
    Name.push_back('\0');
    MPI_Comm Inter, Merged;
    const int Opened =
        J.Accepts
            ? MPI_Comm_accept(Name.data(), MPI_INFO_NULL, 0, Joined, &Inter)
            : MPI_Comm_connect(Name.data(), MPI_INFO_NULL, 0, Joined, &Inter);
    if (Opened != MPI_SUCCESS ||
        MPI_Intercomm_merge(Inter, /*high=*/J.Accepts ? 0 : 1, &Merged) !=
            MPI_SUCCESS)
      throw RunError(rankSpan(J.First, J.Last) + " could not join " +
                     rankSpan(J.OtherFirst, J.OtherLast) + " in the MPI world");
    MPI_Comm_free(&Inter);
    if (Leads && J.Accepts)
      MPI_Close_port(Name.data());
    if (Joined != MPI_COMM_SELF)
      MPI_Comm_free(&Joined);
    Joined = Merged;
  }
  JoinSince = 0;
  World = Joined;
  int Mine = 0, Size = 0;
  MPI_Comm_rank(World, &Mine);
  MPI_Comm_size(World, &Size);
  if (Mine != L.Rank || Size != L.Size)
    throw RunError("rank " + std::to_string(L.Rank) + " joined the world as " +
                   std::to_string(Mine) + " of " + std::to_string(Size));
  // From here MPI errors end the process, as under mpirun.
  MPI_Comm_set_errhandler(World, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
}

void TorchrunWorld::State::startMonitor() {
  if (::pipe2(Wake, O_CLOEXEC) != 0)
    throw RunError(std::string("cannot create a pipe: ") +
                   std::strerror(errno));
  Monitor = std::thread([this] { watch(); });
}

void TorchrunWorld::State::watch() {
  std::vector<bool> Done(Links.size(), false);
  while (!Stop) {
    std::vector<pollfd> Fds{{Wake[0], POLLIN, 0}};
    std::vector<size_t> Which{0};
    if (WatchLinks)
      for (size_t I = 0; I < Links.size(); ++I)
        if (Links[I].N >= 0 && !Done[I]) {
          Fds.push_back({Links[I].N, POLLIN, 0});
          Which.push_back(I);
        }
    ::poll(Fds.data(), Fds.size(), 200);
    if (Stop)
      return;
    if (Launcher && !Finishing && ::getppid() != Launcher)
      die("rank " + std::to_string(L.Rank) + ": its launcher (process " +
          std::to_string(Launcher) + ") ended before the job finished; rank " +
          std::to_string(L.Rank) + " ends the job");
    if (const int64_t Since = JoinSince; Since) {
      const double Idle =
          std::chrono::duration<double>(
              Clock::now() - Clock::time_point(Clock::duration(Since)))
              .count();
      if (Idle > L.TimeoutSec * JoinRoundsAllowed) {
        // (Either block may hold the join up: the accept and the connect
        // are collectives of each block's ranks.)
        const int First = JoinFirst, Last = JoinLast, Split = JoinSplit;
        die("rank " + std::to_string(L.Rank) + ": " +
            rankSpan(First, Split - 1) + " and " + rankSpan(Split, Last) +
            " did not join in one MPI world within " +
            seconds(L.TimeoutSec * JoinRoundsAllowed) +
            " (MPI_Comm_connect/accept; a rank among them that is hung or "
            "gone? MEGAC_RENDEZVOUS_TIMEOUT sets the wait)");
      }
    }
    for (size_t F = 1; F < Fds.size(); ++F) {
      if (!Fds[F].revents)
        continue;
      char C = 0;
      const ssize_t N = ::recv(Fds[F].fd, &C, 1, 0);
      if (N < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (N == 1 && C == kBye) {
        Done[Which[F]] = true;
        continue;
      }
      if (N == 1 && takeFrame(Which[F], C))
        continue;
      if (Finishing)
        return;
      if (L.Rank == 0)
        die("rank " + std::to_string(Which[F]) +
            " ended before the job finished (its own message or its "
            "launcher says why); rank 0 ends the job");
      die("rank 0 ended before the job finished (it or another rank "
          "failed; their messages say why); rank " +
          std::to_string(L.Rank) + " ends too");
    }
  }
}

/// A frame that began with \p Tag on connection \p Link: a port name,
/// which rank 0 passes on to the rank it is for and the others keep for
/// join(). False for anything else (a connection that speaks otherwise
/// belongs to a rank that failed).
bool TorchrunWorld::State::takeFrame(size_t Link, char Tag) {
  int To = -1;
  std::string Port;
  if (Tag != kPortTag || !readPortRest(Links[Link].N, deadlineIn(10), To, Port))
    return false;
  if (L.Rank != 0) {
    if (To != L.Rank)
      return false;
    {
      std::lock_guard<std::mutex> Lock(PortMutex);
      ReceivedPort = std::move(Port);
    }
    PortArrived.notify_one();
    return true;
  }
  // Rank 0 relays; a block's first rank sends to the block after it only.
  if (To <= int(Link) || To >= L.Size || Links[size_t(To)].N < 0)
    return false;
  if (!sendPort(Links[size_t(To)].N, To, Port, deadlineIn(L.TimeoutSec)))
    die("rank " + std::to_string(To) +
        " ended before the world formed (its own message or its launcher "
        "says why); rank 0 ends the job");
  return true;
}

void TorchrunWorld::State::meet(int *Argc, char ***Argv) {
  requireTcpTransport();
  // Rank 0's ompi-server first: every singleton's MPI_Init must know it.
  // (Rank 0 meets the others before its own MPI_Init, so that all of them
  // start MPI at once.)
  std::string Uri;
  if (L.Rank == 0) {
    checkThisHost(L);
    const OwnedFd Listen = listenForRanks(L);
    Uri = serveRendezvous(Listen, startServer());
  } else {
    Uri = askRendezvous();
  }
  ::setenv("OMPI_MCA_pmix_server_uri", Uri.c_str(), 1);
  makeSessionTop();
  MPI_Init(Argc, Argv);
  // A failed accept, connect or merge is reported here, as one line.
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  if (L.Rank == 0) {
    for (size_t R = 1; R < Links.size(); ++R)
      if (!sendMessage(Links[R].N, kOk, "", deadlineIn(L.TimeoutSec)))
        throw RunError("rendezvous: rank " + std::to_string(R) +
                       " went away before the world formed");
  } else {
    waitForStart();
  }
  // (From here the monitor alone reads the connections.)
  WatchLinks = true;
  startMonitor();
  join();
}

std::string TorchrunWorld::State::startServer() {
  char Path[] = "/tmp/megac-ompi-server-XXXXXX";
  const int F = ::mkstemp(Path);
  if (F < 0)
    throw RunError(std::string("cannot create a file for ompi-server's "
                               "address in /tmp: ") +
                   std::strerror(errno));
  ::close(F);
  UriFile = Path;
  const pid_t Parent = ::getpid();
  Server = ::fork();
  if (Server < 0)
    throw RunError(std::string("cannot start ompi-server: ") +
                   std::strerror(errno));
  if (Server == 0) {
    // The server ends with rank 0, however rank 0 ends (also if it ended
    // before this line).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != Parent)
      ::_exit(1);
    const int Null = ::open("/dev/null", O_RDWR);
    if (Null >= 0) {
      // (Its stderr too: it may report its own end, under the SIGTERM
      // of a failed job, over the message that says why the job failed.)
      ::dup2(Null, 0);
      ::dup2(Null, 1);
      ::dup2(Null, 2);
    }
    ::execlp("ompi-server", "ompi-server", "--no-daemonize", "--report-uri",
             Path, static_cast<char *>(nullptr));
    ::_exit(127);
  }
  // Its URI appears in the file once it listens.
  const auto Deadline = deadlineIn(60);
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

void TorchrunWorld::State::stopServer() {
  if (Server > 0) {
    // It may linger over its clients (a rank still waiting to join);
    // the job no longer needs it either way.
    ::kill(Server, SIGTERM);
    int Status = 0;
    const auto Deadline = deadlineIn(1);
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

std::optional<TorchrunLaunch> torchrunLaunch(int Argc, char **Argv) {
  // An MPI launcher's own variables win: under mpirun or srun, a RANK or
  // WORLD_SIZE left in the environment is someone else's.
  for (const char *Var :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(Var))
      return std::nullopt;
  TorchrunLaunch L;
  L.Size = int(envWholeNumber("WORLD_SIZE", 1, 1 << 20).value_or(1));
  // A world of one is this process alone, whose RANK can only be 0 (as a
  // larger world's is checked against its size below).
  if (L.Size <= 1) {
    envWholeNumber("RANK", 0, 0, "0 (WORLD_SIZE is 1)");
    return std::nullopt;
  }
  const std::string Ws = std::to_string(L.Size);
  for (const char *Need : {"RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (const char *V = std::getenv(Need); !V || !*V)
      throw RunError("WORLD_SIZE=" + Ws + " is set but " + Need +
                     " is not: a torchrun-style launch gives every process "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  L.Rank = int(envWholeNumber("RANK", 0, L.Size - 1).value_or(0));
  L.MasterAddr = std::getenv("MASTER_ADDR");
  const long MasterPort = envWholeNumber("MASTER_PORT", 1, 65535).value_or(0);
  const char *AgentStore = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool PortTaken = AgentStore && (std::string(AgentStore) == "True" ||
                                        std::string(AgentStore) == "1");
  const std::optional<long> OwnPort =
      envWholeNumber("MEGAC_RENDEZVOUS_PORT", 1, 65535);
  // The port after torchrun's store's: MASTER_PORT=65535 has none (it
  // once wrapped to port 1, a privileged port no rank could listen on).
  if (!OwnPort && PortTaken && MasterPort == 65535)
    throw RunError("MASTER_PORT is 65535 and torchrun's own store holds it "
                   "(TORCHELASTIC_USE_AGENT_STORE=" +
                   std::string(AgentStore) +
                   "): the rendezvous takes the next port, and there is "
                   "none; MEGAC_RENDEZVOUS_PORT picks one, the same on "
                   "every rank");
  L.Port = int(OwnPort.value_or(PortTaken ? MasterPort + 1 : MasterPort));
  L.TimeoutSec = double(
      envWholeNumber("MEGAC_RENDEZVOUS_TIMEOUT", 1, 86400).value_or(300));
  // FNV-1a over the command line and torchrun's run id. (Not its restart
  // count, which torchrun's agents on different nodes do not keep in
  // step.)
  uint64_t H = 0xcbf29ce484222325ull;
  auto Mix = [&H](const char *Text) {
    for (const char *C = Text ? Text : ""; *C; ++C)
      H = (H ^ uint8_t(*C)) * 0x100000001b3ull;
    H = (H ^ 0xff) * 0x100000001b3ull; // (a separator no text holds)
  };
  for (int I = 1; I < Argc; ++I)
    Mix(Argv[I]);
  Mix(std::getenv("TORCHELASTIC_RUN_ID"));
  L.JobKey = H;
  return L;
}

TorchrunWorld::TorchrunWorld(const TorchrunLaunch &L, int *Argc, char ***Argv)
    : S(std::make_unique<State>()) {
  S->L = L;
  // torchrun's agent gives each worker it starts its restart count.
  // (A wrapper that does not exec megac-run is the parent watched.)
  const pid_t Parent = ::getppid();
  if (const char *Restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
      Restarts && *Restarts && Parent > 1)
    S->Launcher = Parent;
  S->meet(Argc, Argv); // (on failure, ~State cleans up)
}

MPI_Comm TorchrunWorld::world() const { return S->World; }

void TorchrunWorld::finish() {
  S->Finishing = true;
  const char Bye = kBye;
  for (OwnedFd &F : S->Links)
    if (F.N >= 0)
      exchange(F.N, const_cast<char *>(&Bye), 1, true, deadlineIn(1));
}

TorchrunWorld::~TorchrunWorld() = default;

} // namespace megac_rt
