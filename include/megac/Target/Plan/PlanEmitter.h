//===- PlanEmitter.h - Localized IR to a FlatBuffers plan -------*- C++ -*-===//
//
// Turns a module that went through the partition pipeline into the bytes of
// a .mgc plan: one instruction stream per rank, with rank-dependent values
// (slice offsets, vocabulary starts, collective groups) resolved.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_TARGET_PLAN_PLANEMITTER_H
#define MEGAC_TARGET_PLAN_PLANEMITTER_H

#include "megac/Pipeline/Schedule.h"
#include "megac_rt/plan_file.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace megac {

struct PlanEmitOptions {
  /// Seed for parameter init and the default token batch.
  uint64_t seed = 1234;
  /// Hash of the model as given by the user (before any pass).
  uint64_t modelHash = 0;
  std::string producer = megac_rt::kMegacRelease;
  /// Pipeline parallelism (a module placed by megac-pipeline-stages): the
  /// schedule every pipeline rank follows, and its name for the plan.
  PipelineSchedule schedule;
  std::string scheduleName;
  /// "cpu", or "cuda": every fusion group (megac-fuse-elementwise) becomes
  /// one instruction; elementwise groups become generated CUDA kernels,
  /// compiled by \p compileKernel.
  std::string target = "cpu";
  /// Compiles the CUDA source of kernel \p name into (architecture, cubin)
  /// pairs; returns an error message, or "" on success. Called for every
  /// kernel at once, from threads of its own: it must be thread-safe.
  using Binaries = std::vector<std::pair<std::string, std::vector<uint8_t>>>;
  std::function<std::string(const std::string &name,
                            const std::string &source, Binaries &binaries)>
      compileKernel;
};

/// The CUDA C++ source of a generated elementwise kernel: \p steps as
/// (opcode name, arguments) with arguments as in plan.fbs's FusedStep,
/// over \p inputs inputs. Exposed for tests.
std::string cudaKernelSource(
    const std::string &name,
    const std::vector<std::pair<std::string, std::vector<int>>> &steps,
    unsigned inputs);

/// Emits the plan for `module`; on failure a diagnostic has been reported.
mlir::FailureOr<std::vector<uint8_t>>
emitPlan(mlir::ModuleOp module, const PlanEmitOptions &options);

} // namespace megac

#endif // MEGAC_TARGET_PLAN_PLANEMITTER_H
