//===- memory_plan.h - Liveness-based static arena of a rank -----*- C++ -*-===//
//
// Every buffer of a rank program except the parameters gets an offset in one
// arena, reused by buffers whose lifetimes (first write to last read, in
// instruction order) do not overlap. The compiler reports the plan (peak
// bytes by kind, `megac compile --device-memory` checks it) and the runtime
// allocates the arena from the same function, so the two cannot disagree.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_MEMORY_PLAN_H
#define MEGAC_RT_MEMORY_PLAN_H

#include <cstdint>
#include <string>
#include <vector>

#include "plan_generated.h"

namespace megac_rt {

/// What a buffer holds, for the report.
enum class MemoryKind : uint8_t {
  Parameter,  // a parameter (or its in-place update): outside the arena
  Gradient,   // a weight gradient (or its reduction, accumulation)
  Activation, // written by the forward part (and the token inputs)
  Workspace,  // everything else: activation gradients, temporaries
};

struct MemoryPlan {
  /// Byte offset of each buffer in the arena; -1 for parameters.
  std::vector<int64_t> offset;
  std::vector<MemoryKind> kind;
  /// Size of the arena (>= the peak of live arena bytes: fragmentation),
  /// and what its buffers would take without reuse.
  uint64_t arenaBytes = 0, unsharedBytes = 0;
  /// Parameters, and the AdamW moments the runtime keeps (2 per update).
  uint64_t parameterBytes = 0, optimizerBytes = 0;
  /// Live arena bytes by kind at the instruction where their sum peaks.
  uint64_t peakGradientBytes = 0, peakActivationBytes = 0,
           peakWorkspaceBytes = 0;
  uint32_t peakInstruction = 0;
  /// Bytes written by the forward part and read by the backward part (the
  /// activations a training step keeps from one to the other).
  uint64_t savedActivationBytes = 0;
  /// Pipeline parallelism: the buffers of one micro-batch (written before
  /// accumulate_end, and the inputs) exist once per micro-batch in flight.
  /// Those have their offset inside a slot; slot s starts at slotBase + s *
  /// slotBytes. Without a pipeline: one slot, no such buffers.
  std::vector<bool> perMicro;
  uint32_t slots = 1;
  uint64_t slotBase = 0, slotBytes = 0;
  /// Whole-rank peak: parameters + optimizer state + arena.
  uint64_t totalBytes() const {
    return parameterBytes + optimizerBytes + arenaBytes;
  }
};

/// Plans rank program \p R of \p P. Buffers are aligned to 64 bytes.
MemoryPlan planMemory(const megac::plan::Program &P,
                      const megac::plan::RankProgram &R);

/// Micro-batches a pipeline rank holds at once under its schedule (from
/// its first task on a micro-batch to its last); 1 without a pipeline.
uint32_t pipelineSlots(const megac::plan::Program &P,
                       const megac::plan::RankProgram &R);

/// "12.3 MiB" (binary units).
std::string formatBytes(uint64_t Bytes);

} // namespace megac_rt

#endif // MEGAC_RT_MEMORY_PLAN_H
