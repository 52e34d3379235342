//===- NvrtcCompiler.cpp - Generated CUDA kernels to binaries with NVRTC --===//
//
// NVRTC compiles without a GPU, so `megac compile --target cuda` builds
// every kernel it generates ahead of time, for each architecture the plan
// supports (cubins, and PTX for later GPUs), on any machine with the CUDA
// toolkit. The architectures compile side by side, and each binary goes
// into a cache keyed by all that determines it (NVRTC's version, the
// flags, the architecture and the source), so that compiling a model
// again, or another model with the same kernels, takes none of NVRTC's
// time.
//
//===----------------------------------------------------------------------===//

#include "NvrtcCompiler.h"

#include "megac_rt/kernel_image.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <nvrtc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <tuple>

namespace megac {

const std::vector<std::string> &defaultCudaArchitectures() {
  static const std::vector<std::string> archs = {"sm_80", "sm_90",
                                                 "compute_90"};
  return archs;
}

bool isPtxArchitecture(const std::string &arch) {
  return megac_rt::parseArch(arch).Ptx;
}

std::string checkCudaArchitectures(const std::vector<std::string> &archs) {
  int count = 0;
  std::vector<int> supported;
  if (nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0) {
    supported.resize(size_t(count));
    if (nvrtcGetSupportedArchs(supported.data()) != NVRTC_SUCCESS)
      supported.clear();
  }
  std::vector<std::string> usable;
  for (int version : supported)
    if (version >= 80)
      usable.push_back("sm_" + std::to_string(version));
  const std::string expected =
      "expected sm_XY (a cubin) or compute_XY (PTX), an \"a\" or \"f\" "
      "suffix allowed, of an architecture this NVRTC compiles for from "
      "sm_80 on: " +
      llvm::join(usable, ", ");
  if (archs.empty())
    return "--cuda-arch names no architecture; " + expected;
  for (size_t i = 0; i < archs.size(); ++i) {
    const megac_rt::ArchName arch = megac_rt::parseArch(archs[i]);
    if (arch.Version < 80 || !llvm::is_contained(supported, arch.Version))
      return "--cuda-arch: '" + archs[i] + "': " + expected;
    // Arch-specific targets begin with sm_90, family-specific ones with
    // sm_100.
    if ((arch.Suffix == 'a' && arch.Version < 90) ||
        (arch.Suffix == 'f' && arch.Version < 100))
      return "--cuda-arch: '" + archs[i] + "': an \"" + arch.Suffix +
             "\" target exists from " +
             (arch.Suffix == 'a' ? "sm_90" : "sm_100") + " on";
    if (llvm::is_contained(llvm::ArrayRef(archs).take_front(i), archs[i]))
      return "--cuda-arch: '" + archs[i] + "' is named twice";
  }
  return "";
}

std::string cudaArchitecturesText(const std::vector<std::string> &archs) {
  std::vector<std::string> cubins, ptx;
  for (const std::string &arch : archs)
    (isPtxArchitecture(arch) ? ptx : cubins).push_back(arch);
  std::string text = cubins.empty() ? "" : "for " + llvm::join(cubins, " and ");
  if (!ptx.empty())
    text += (cubins.empty() ? "to PTX for " : ", and to PTX for ") +
            llvm::join(ptx, " and ");
  return text;
}

std::string kernelCacheDir() {
  // "off" in any case (OFF made a directory of that name, which no one
  // asking for it meant).
  if (const char *dir = std::getenv("MEGAC_KERNEL_CACHE"))
    return llvm::StringRef(dir).equals_insensitive("off") ? ""
                                                          : std::string(dir);
  llvm::SmallString<256> path;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    path = xdg;
  else if (const char *home = std::getenv("HOME"); home && *home)
    llvm::sys::path::append(path, home, ".cache");
  else
    return "";
  llvm::sys::path::append(path, "megac", "kernels");
  return std::string(path);
}

namespace {

/// The flags every kernel compiles with, after the architecture's.
/// No contraction into fused multiply-adds: the kernels compute what the
/// CPU kernels compute, operation for operation.
const char *const kFlags[] = {"--std=c++17", "-default-device", "--fmad=false"};

/// Where the binary (cubin or PTX) of \p source for \p arch is cached in
/// \p dir: a name from the SHA-256 of NVRTC's version, the flags, the
/// architecture and the source.
std::string cachePath(const std::string &dir, const std::string &arch,
                      const std::string &source) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  llvm::SHA256 hash;
  hash.update("nvrtc " + std::to_string(major) + "." + std::to_string(minor));
  for (const char *flag : kFlags)
    hash.update(llvm::StringRef(flag));
  hash.update(arch);
  hash.update(source);
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path,
                          arch + "-" + llvm::toHex(hash.final(), true) +
                              (isPtxArchitecture(arch) ? ".ptx" : ".cubin"));
  return std::string(path);
}

/// Whether \p bytes are a whole 64-bit little-endian ELF file, as cubins
/// are: its magic, and its program and section header tables (which
/// NVRTC writes at the end) within the file. A cubin cut short, by a full
/// disk or by hand, fails the second.
bool isWholeElf64(llvm::StringRef bytes) {
  constexpr size_t kHeader = 64;
  if (bytes.size() < kHeader || !bytes.starts_with("\x7f"
                                                   "ELF\x02\x01"))
    return false;
  auto read = [&](size_t at, size_t width) {
    uint64_t value = 0;
    for (size_t i = width; i-- > 0;)
      value = value << 8 | uint8_t(bytes[at + i]);
    return value;
  };
  // (e_phoff, e_phentsize, e_phnum; e_shoff, e_shentsize, e_shnum.)
  for (auto [offset, entry, count] :
       {std::tuple{read(0x20, 8), read(0x36, 2), read(0x38, 2)},
        std::tuple{read(0x28, 8), read(0x3A, 2), read(0x3C, 2)}})
    if (offset > bytes.size() || entry * count > bytes.size() - offset)
      return false;
  return true;
}

/// Whether \p bytes look like a binary for \p arch: a cubin is an ELF
/// file; PTX is text naming its target, ending in the NUL the driver's
/// loader needs.
bool looksLikeBinary(const std::string &arch, llvm::StringRef bytes) {
  if (isPtxArchitecture(arch))
    return bytes.ends_with(llvm::StringRef("\0", 1)) &&
           bytes.contains(".target sm_" + arch.substr(strlen("compute_")));
  return isWholeElf64(bytes);
}

/// A cached binary for \p arch, or empty where there is none (or it is
/// not one: a cache entry someone damaged is compiled again).
std::vector<uint8_t> readCached(const std::string &path,
                                const std::string &arch) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer || !looksLikeBinary(arch, (*buffer)->getBuffer()))
    return {};
  llvm::StringRef bytes = (*buffer)->getBuffer();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

/// Stores \p binary at \p path, best effort: into a file of its own, then
/// renamed into place, so that a reader never sees half of one. False
/// where it could not.
bool writeCached(const std::string &path, const std::vector<uint8_t> &binary) {
  static std::atomic<unsigned> counter{0};
  if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(path)))
    return false;
  const std::string temp = path + ".tmp" +
                           std::to_string(llvm::sys::Process::getProcessId()) +
                           "-" + std::to_string(counter++);
  {
    std::error_code error;
    llvm::raw_fd_ostream out(temp, error);
    if (error)
      return false;
    out.write(reinterpret_cast<const char *>(binary.data()), binary.size());
    out.close();
    if (out.has_error()) {
      out.clear_error();
      llvm::sys::fs::remove(temp);
      return false;
    }
  }
  if (llvm::sys::fs::rename(temp, path)) {
    llvm::sys::fs::remove(temp);
    return false;
  }
  return true;
}

/// Compiles \p source for \p arch into \p binary (a cubin, or PTX for a
/// virtual architecture, with its NUL); the error, or "".
std::string compileOne(const std::string &name, const std::string &source,
                       const std::string &arch, std::vector<uint8_t> &binary) {
  nvrtcProgram program;
  if (nvrtcCreateProgram(&program, source.c_str(), (name + ".cu").c_str(), 0,
                         nullptr, nullptr) != NVRTC_SUCCESS)
    return "nvrtcCreateProgram failed";
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram *)> guard(
      &program, [](nvrtcProgram *p) { nvrtcDestroyProgram(p); });
  const std::string archFlag = "--gpu-architecture=" + arch;
  std::vector<const char *> flags = {archFlag.c_str()};
  flags.insert(flags.end(), std::begin(kFlags), std::end(kFlags));
  nvrtcResult result =
      nvrtcCompileProgram(program, int(flags.size()), flags.data());
  if (result != NVRTC_SUCCESS) {
    size_t size = 0;
    nvrtcGetProgramLogSize(program, &size);
    std::string log(size, '\0');
    nvrtcGetProgramLog(program, log.data());
    return arch + ": " + nvrtcGetErrorString(result) + "\n" + log;
  }
  // PTX (its size counts the terminating NUL) or a cubin.
  const bool ptx = isPtxArchitecture(arch);
  const char *kind = ptx ? "PTX" : "cubin";
  auto getSize = ptx ? nvrtcGetPTXSize : nvrtcGetCUBINSize;
  auto get = ptx ? nvrtcGetPTX : nvrtcGetCUBIN;
  size_t size = 0;
  if (getSize(program, &size) != NVRTC_SUCCESS || size <= (ptx ? 1u : 0u))
    return arch + ": NVRTC produced no " + kind;
  binary.resize(size);
  if (get(program, reinterpret_cast<char *>(binary.data())) != NVRTC_SUCCESS)
    return arch + ": NVRTC did not hand over its " + kind;
  return "";
}

} // namespace

std::string compileWithNvrtc(const std::string &name, const std::string &source,
                             const std::vector<std::string> &archs,
                             PlanEmitOptions::Binaries &binaries,
                             KernelCacheStats *stats) {
  const std::string dir = kernelCacheDir();
  std::vector<std::vector<uint8_t>> cubins(archs.size());
  std::vector<std::future<std::string>> jobs;
  for (size_t i = 0; i < archs.size(); ++i) {
    const std::string path =
        dir.empty() ? "" : cachePath(dir, archs[i], source);
    if (!path.empty()) {
      cubins[i] = readCached(path, archs[i]);
      if (!cubins[i].empty()) {
        if (stats)
          ++stats->hits;
        jobs.push_back({});
        continue;
      }
    }
    if (stats) {
      ++stats->compiled;
      if (stats->beforeFirstCompile)
        std::call_once(stats->announced, stats->beforeFirstCompile);
    }
    jobs.push_back(std::async(std::launch::async, [&, i, path] {
      std::string error = compileOne(name, source, archs[i], cubins[i]);
      if (error.empty() && !path.empty() && !writeCached(path, cubins[i]) &&
          stats)
        ++stats->notStored;
      return error;
    }));
  }
  std::string firstError;
  for (std::future<std::string> &job : jobs)
    if (job.valid())
      if (std::string error = job.get(); firstError.empty())
        firstError = error;
  if (!firstError.empty())
    return firstError;
  for (size_t i = 0; i < archs.size(); ++i)
    binaries.push_back({archs[i], std::move(cubins[i])});
  return "";
}

} // namespace megac
