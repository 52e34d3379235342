//===- NvrtcCompiler.h - Generated CUDA kernels to cubins -------*- C++ -*-===//

#ifndef MEGAC_TOOLS_NVRTCCOMPILER_H
#define MEGAC_TOOLS_NVRTCCOMPILER_H

#include "megac/Target/Plan/PlanEmitter.h"

#include <string>
#include <vector>

namespace megac {

/// The GPU architectures plans carry binaries for.
const std::vector<std::string> &cudaArchitectures();

/// Compiles \p source (kernel \p name) for each architecture with NVRTC;
/// returns the error (with NVRTC's log), or "".
std::string compileWithNvrtc(const std::string &name, const std::string &source,
                             PlanEmitOptions::Binaries &binaries);

} // namespace megac

#endif // MEGAC_TOOLS_NVRTCCOMPILER_H
