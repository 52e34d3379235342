//===- NvrtcCompiler.cpp - Generated CUDA kernels to cubins with NVRTC ----===//
//
// NVRTC compiles without a GPU, so `megac compile --target cuda` builds
// every kernel it generates ahead of time, for each architecture the plan
// supports, on any machine with the CUDA toolkit.
//
//===----------------------------------------------------------------------===//

#include "NvrtcCompiler.h"

#include <nvrtc.h>

#include <memory>

namespace megac {

const std::vector<std::string> &cudaArchitectures() {
  static const std::vector<std::string> archs = {"sm_80", "sm_90"};
  return archs;
}

std::string compileWithNvrtc(const std::string &name, const std::string &source,
                             PlanEmitOptions::Binaries &binaries) {
  for (const std::string &arch : cudaArchitectures()) {
    nvrtcProgram program;
    if (nvrtcCreateProgram(&program, source.c_str(), (name + ".cu").c_str(), 0,
                           nullptr, nullptr) != NVRTC_SUCCESS)
      return "nvrtcCreateProgram failed";
    std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram *)> guard(
        &program, [](nvrtcProgram *p) { nvrtcDestroyProgram(p); });
    const std::string archFlag = "--gpu-architecture=" + arch;
    // No contraction into fused multiply-adds: the kernels compute what
    // the CPU kernels compute, operation for operation.
    const char *flags[] = {archFlag.c_str(), "--std=c++17", "-default-device",
                           "--fmad=false"};
    nvrtcResult result = nvrtcCompileProgram(program, 4, flags);
    if (result != NVRTC_SUCCESS) {
      size_t size = 0;
      nvrtcGetProgramLogSize(program, &size);
      std::string log(size, '\0');
      nvrtcGetProgramLog(program, log.data());
      return arch + ": " + nvrtcGetErrorString(result) + "\n" + log;
    }
    size_t size = 0;
    if (nvrtcGetCUBINSize(program, &size) != NVRTC_SUCCESS || size == 0)
      return arch + ": NVRTC produced no cubin";
    std::vector<uint8_t> cubin(size);
    if (nvrtcGetCUBIN(program, reinterpret_cast<char *>(cubin.data())) !=
        NVRTC_SUCCESS)
      return arch + ": nvrtcGetCUBIN failed";
    binaries.push_back({arch, std::move(cubin)});
  }
  return "";
}

} // namespace megac
