//===- file_io.h - Writing files whole, without harm ----------*- C++ -*-===//
//
// The runtime's files (outputs, checkpoint shards, meta.json) are written
// whole or not at all: a temporary beside the file, synced, renamed over
// it. Renaming is right only for a regular file: a path that is a
// symbolic link means the file it leads to, and a device or a pipe
// (`--save-outputs /dev/null`) is written in place, since renaming over it
// would replace the device with a file.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_FILE_IO_H
#define MEGAC_RT_FILE_IO_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace megac_rt {

/// The directory part of \p Path ("." for a bare name, "/" for "/x").
std::string parentOf(const std::string &Path);

/// Whether \p S ends with \p End (file extensions, tensor-name suffixes).
bool endsWith(const std::string &S, const std::string &End);

/// fsync of a directory (after a rename into it). Throws RunError; file
/// systems that cannot sync directories are not an error.
void fsyncDir(const std::string &Dir);

/// Where a write to \p Path lands: \p Path with its symbolic links
/// followed (also a link to a file not yet there).
std::string writeTarget(const std::string &Path);

/// Writes \p Path atomically: a temporary, fsync, rename, fsync of the
/// directory; in place where \p Path names an existing file that is not
/// a regular one. Throws RunError "<path>: <what>".
void writeFileAtomic(const std::string &Path, const void *Data, size_t Size);

/// Opens \p Path for reading without waiting for a pipe's writer (callers
/// check that the descriptor is a regular file's), also under another
/// process's lease; reads on it block as usual. -1 and errno as open's.
int openWithoutWaiting(const std::string &Path);

/// The size of the regular file \p Path, or -1 when nothing is there.
/// Throws RunError "<Path>: not a regular file (...)" for a directory, a
/// pipe or a device: opening a pipe would wait for a writer for ever, and
/// a directory reports no size worth allocating; and "<Path>: cannot
/// read: <why>" where it cannot be examined (a loop of symbolic links, no
/// permission to search a directory of the path).
int64_t regularFileSize(const std::string &Path);

/// The regular file \p Path whole (Missing when nothing is there), read
/// only when it holds at most \p Limit bytes; else RunError "<Path>: N
/// bytes, more than <What> (Limit)" without reading it.
std::vector<uint8_t> readRegularFile(const std::string &Path, bool &Missing,
                                     uint64_t Limit, const std::string &What);

} // namespace megac_rt

#endif // MEGAC_RT_FILE_IO_H
