//===- NvrtcCompiler.h - Generated CUDA kernels to binaries -----*- C++ -*-===//

#ifndef MEGAC_TOOLS_NVRTCCOMPILER_H
#define MEGAC_TOOLS_NVRTCCOMPILER_H

#include "megac/Target/Plan/PlanEmitter.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace megac {

/// The GPU architectures plans carry binaries for unless `--cuda-arch`
/// names others: cubins for sm_80 and sm_90 ("sm_XY"), and PTX for
/// compute_90 ("compute_XY", a virtual architecture), which the driver
/// compiles for a later GPU no cubin runs on (a cubin runs on its own
/// major version alone).
const std::vector<std::string> &defaultCudaArchitectures();

/// Whether \p arch names a virtual architecture, whose binary is PTX.
bool isPtxArchitecture(const std::string &arch);

/// The error in a list of architectures for `--cuda-arch`, or "": each
/// must be sm_XY or compute_XY (an "a" suffix allowed from sm_90 on, an
/// "f" one from sm_100 on) of an architecture this NVRTC compiles for,
/// sm_80 or later (the CUDA backend needs bf16 tensor cores), and given
/// once.
std::string checkCudaArchitectures(const std::vector<std::string> &archs);

/// \p archs as a compile's progress line names them: "for sm_80 and
/// sm_90, and to PTX for compute_90".
std::string cudaArchitecturesText(const std::vector<std::string> &archs);

/// Where compiled kernels are cached: $MEGAC_KERNEL_CACHE ("off", in
/// any case: no cache, ""), else $XDG_CACHE_HOME/megac/kernels, else
/// ~/.cache/megac/kernels.
std::string kernelCacheDir();

/// How many cubins came from the cache, how many NVRTC compiled and how
/// many of those the cache could not store (a directory that cannot be
/// written); and,
/// where set, what to call (once, from whichever thread) before NVRTC
/// compiles the first of them: compiling takes seconds, the cache none.
struct KernelCacheStats {
  std::atomic<unsigned> hits{0}, compiled{0}, notStored{0};
  std::function<void()> beforeFirstCompile;
  std::once_flag announced;
};

/// Compiles \p source (kernel \p name) for each of \p archs with NVRTC,
/// the architectures side by side, taking the binaries the kernel cache has
/// (kernelCacheDir) and adding those it compiles; counts both into \p
/// stats where given. Returns the error (with NVRTC's log), or "".
std::string compileWithNvrtc(const std::string &name, const std::string &source,
                             const std::vector<std::string> &archs,
                             PlanEmitOptions::Binaries &binaries,
                             KernelCacheStats *stats = nullptr);

} // namespace megac

#endif // MEGAC_TOOLS_NVRTCCOMPILER_H
