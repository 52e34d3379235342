//===- NvrtcCompiler.h - Generated CUDA kernels to cubins -------*- C++ -*-===//

#ifndef MEGAC_TOOLS_NVRTCCOMPILER_H
#define MEGAC_TOOLS_NVRTCCOMPILER_H

#include "megac/Target/Plan/PlanEmitter.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace megac {

/// The GPU architectures plans carry binaries for.
const std::vector<std::string> &cudaArchitectures();

/// Where compiled kernels are cached: $MEGAC_KERNEL_CACHE ("off": no
/// cache, ""), else $XDG_CACHE_HOME/megac/kernels, else
/// ~/.cache/megac/kernels.
std::string kernelCacheDir();

/// How many cubins came from the cache and how many NVRTC compiled; and,
/// where set, what to call (once, from whichever thread) before NVRTC
/// compiles the first of them: compiling takes seconds, the cache none.
struct KernelCacheStats {
  std::atomic<unsigned> hits{0}, compiled{0};
  std::function<void()> beforeFirstCompile;
  std::once_flag announced;
};

/// Compiles \p source (kernel \p name) for each architecture with NVRTC,
/// the architectures side by side, taking the cubins the kernel cache has
/// (kernelCacheDir) and adding those it compiles; counts both into \p
/// stats where given. Returns the error (with NVRTC's log), or "".
std::string compileWithNvrtc(const std::string &name, const std::string &source,
                             PlanEmitOptions::Binaries &binaries,
                             KernelCacheStats *stats = nullptr);

} // namespace megac

#endif // MEGAC_TOOLS_NVRTCCOMPILER_H
