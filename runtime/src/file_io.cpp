//===- file_io.cpp - Writing files whole, without harm --------------------===//

#include "file_io.h"
#include "error.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace megac_rt {

bool endsWith(const std::string &S, const std::string &End) {
  return S.size() >= End.size() &&
         S.compare(S.size() - End.size(), End.size(), End) == 0;
}

std::string parentOf(const std::string &Path) {
  size_t P = Path.rfind('/');
  if (P == std::string::npos)
    return ".";
  return P == 0 ? "/" : Path.substr(0, P);
}

void fsyncDir(const std::string &Dir) {
  int Fd = ::open(Dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (Fd < 0)
    throw RunError(
        Dir + ": cannot open directory to sync it: " + std::strerror(errno));
  int Rc = ::fsync(Fd);
  int E = errno;
  ::close(Fd);
  // Some file systems refuse fsync on directories; that is not an error.
  if (Rc != 0 && E != EINVAL && E != EROFS)
    throw RunError(Dir + ": cannot sync directory: " + std::strerror(E));
}

std::string writeTarget(const std::string &Path) {
  std::string Target = Path;
  // (As many links as the kernel follows in one path.)
  for (int Hops = 0; Hops < 40; ++Hops) {
    struct stat St;
    if (::lstat(Target.c_str(), &St) != 0 || !S_ISLNK(St.st_mode))
      return Target;
    char Buf[PATH_MAX];
    const ssize_t N = ::readlink(Target.c_str(), Buf, sizeof(Buf) - 1);
    if (N <= 0)
      return Target;
    std::string Link(Buf, size_t(N));
    Target = Link[0] == '/' ? Link : parentOf(Target) + "/" + Link;
  }
  throw RunError(Path + ": too many levels of symbolic links");
}

namespace {

/// Writes all of \p Data to \p Fd; false (errno set) on a failure.
bool writeAll(int Fd, const void *Data, size_t Size) {
  const uint8_t *P = static_cast<const uint8_t *>(Data);
  while (Size) {
    ssize_t N = ::write(Fd, P, Size);
    if (N < 0 && errno == EINTR)
      continue;
    if (N <= 0) {
      if (N == 0)
        errno = EIO;
      return false;
    }
    P += N;
    Size -= size_t(N);
  }
  return true;
}

} // namespace

void writeFileAtomic(const std::string &Path, const void *Data, size_t Size) {
  struct stat St;
  if (::stat(Path.c_str(), &St) == 0 && !S_ISREG(St.st_mode)) {
    if (S_ISDIR(St.st_mode))
      throw RunError(Path + ": is a directory, not a file");
    // A device or a pipe: what it takes, it takes in place, through the
    // path itself (the kernel follows /dev/stdout's link to a pipe, which
    // has no name to follow by hand).
    int Fd = ::open(Path.c_str(), O_WRONLY | O_CLOEXEC);
    if (Fd < 0)
      throw RunError(Path + ": cannot write: " + std::strerror(errno));
    const bool Ok = writeAll(Fd, Data, Size);
    const int E = errno;
    if (::close(Fd) != 0 || !Ok)
      throw RunError(Path +
                     ": error writing: " + std::strerror(Ok ? errno : E));
    return;
  }
  const std::string Target = writeTarget(Path);
  const std::string Tmp = Target + ".tmp";
  int Fd = ::open(Tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (Fd < 0)
    throw RunError(Path + ": cannot create " + Tmp + ": " +
                   std::strerror(errno));
  if (!writeAll(Fd, Data, Size)) {
    int E = errno;
    ::close(Fd);
    ::unlink(Tmp.c_str());
    throw RunError(Path + ": error writing " + Tmp + ": " + std::strerror(E));
  }
  if (::fsync(Fd) != 0 || ::close(Fd) != 0) {
    int E = errno;
    ::unlink(Tmp.c_str());
    throw RunError(Path + ": cannot sync " + Tmp + ": " + std::strerror(E));
  }
  if (::rename(Tmp.c_str(), Target.c_str()) != 0) {
    int E = errno;
    ::unlink(Tmp.c_str());
    throw RunError(Path + ": cannot rename " + Tmp + ": " + std::strerror(E));
  }
  fsyncDir(parentOf(Target));
}

int openWithoutWaiting(const std::string &Path) {
  int Fd = ::open(Path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  // A lease another process holds (a Samba or NFS server's) answers a
  // non-blocking open with EWOULDBLOCK until it is released. Leases exist
  // only on regular files, so this open waits for that release, not for
  // a pipe's writer.
  if (Fd < 0 && errno == EWOULDBLOCK)
    Fd = ::open(Path.c_str(), O_RDONLY | O_CLOEXEC);
  // (Reads of the file block as usual: a regular file's read under a
  // lease being broken would fail with EWOULDBLOCK.)
  if (Fd >= 0)
    if (const int Flags = ::fcntl(Fd, F_GETFL); Flags >= 0)
      ::fcntl(Fd, F_SETFL, Flags & ~O_NONBLOCK);
  return Fd;
}

int64_t regularFileSize(const std::string &Path) {
  struct stat St;
  if (::stat(Path.c_str(), &St) != 0) {
    // Nothing there (or a file where a directory of the path should be);
    // any other failure is not "missing", and saying so would mislead.
    if (errno == ENOENT || errno == ENOTDIR)
      return -1;
    throw RunError(Path + ": cannot read: " + std::strerror(errno));
  }
  if (!S_ISREG(St.st_mode))
    throw RunError(Path + ": not a regular file (" +
                   (S_ISDIR(St.st_mode)    ? "a directory"
                    : S_ISFIFO(St.st_mode) ? "a pipe"
                                           : "a device or a socket") +
                   ")");
  return int64_t(St.st_size);
}

std::vector<uint8_t> readRegularFile(const std::string &Path, bool &Missing,
                                     uint64_t Limit, const std::string &What) {
  const int64_t Size = regularFileSize(Path);
  Missing = Size < 0;
  if (Missing)
    return {};
  if (uint64_t(Size) > Limit)
    throw RunError(Path + ": " + std::to_string(Size) + " bytes, more than " +
                   What + " (" + std::to_string(Limit) + ")");
  // (A pipe put there since the check is refused below, not waited on.)
  const int Fd = openWithoutWaiting(Path);
  if (Fd < 0)
    throw RunError(Path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> Bytes(static_cast<size_t>(Size));
  size_t Got = 0;
  struct stat St;
  bool Ok = ::fstat(Fd, &St) == 0 && S_ISREG(St.st_mode);
  while (Ok && Got < Bytes.size()) {
    const ssize_t N = ::read(Fd, Bytes.data() + Got, Bytes.size() - Got);
    if (N < 0 && errno == EINTR)
      continue;
    Ok = N > 0;
    Got += Ok ? size_t(N) : 0;
  }
  ::close(Fd);
  if (!Ok)
    throw RunError(Path + ": read error (the file changed while read?)");
  return Bytes;
}

} // namespace megac_rt
