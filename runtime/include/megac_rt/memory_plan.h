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
#include <functional>
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

/// Every arena offset (buffers, slots, bf16 copies) is a multiple of this;
/// with the arena itself from cudaMalloc (256-byte aligned), so is every
/// buffer's address, which the CUDA backend tells cuBLASLt. 256 bytes is
/// what cuBLASLt assumes unless told less, and what PyTorch's caching
/// allocator gives: told 64, its heuristic may leave out the fastest
/// Hopper kernels.
constexpr uint64_t kArenaAlign = 256;

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
  /// bf16 copies (planned only when asked: the CUDA backend's): byte
  /// offset in the arena of each buffer's copy, -1 for none, its writer
  /// and the last instruction that may read it (bf16CopyLifetimes). Their
  /// bytes count as workspace in the peak.
  std::vector<int64_t> copyOffset, copyFirst, copyLast;
  uint64_t copyBytes = 0; // what the copies would take without reuse
  /// Per buffer: kept in bf16 only (Bf16Storage::Bf16Only): no fp32
  /// storage (offset -1), its copy is the buffer. Their bf16 bytes (half
  /// what fp32 storage of them would take).
  std::vector<bool> bf16Only;
  uint64_t bf16OnlyBytes = 0;
  /// Per buffer: the AdamW instruction that also writes this buffer's
  /// bf16 bits for the next step, else -1 (parameterCopies). Such a buffer
  /// (a parameter's rounding, kept in bf16 alone) spans the whole run, so
  /// that its bits survive from one step's update to the next step's
  /// readers.
  std::vector<int64_t> parameterCopyUpdate;
  /// Per instruction: the forward attention output its gradient step reads
  /// (attentionOutputsOfGradients; a backend other than the CPU's), else
  /// -1. The backend takes the pairing from here.
  std::vector<int64_t> attentionOutputOf;
  /// Whole-rank peak: parameters + optimizer state + arena.
  uint64_t totalBytes() const {
    return parameterBytes + optimizerBytes + arenaBytes;
  }
};

/// How a backend keeps the tensors a bf16 plan rounds.
enum class Bf16Storage {
  Fp32,   // in fp32 alone (the CPU backend)
  Copies, // in fp32, with bf16 copies for the tensor cores (bf16CopyLifetimes)
  Bf16Only, // the same, but those every reader of which takes bf16 in bf16
            // alone (bf16OnlyBuffers): the CUDA backend's default
};

/// Whether an attention (or attention gradient) instruction runs on
/// kernels that read and write bf16 (the CUDA backend's register-resident
/// ones); null: attentionInBf16ByDefault.
using AttentionInBf16 = std::function<bool(const megac::plan::Instr &)>;

/// Plans rank program \p R of \p P. Buffers are aligned to 64 bytes.
MemoryPlan planMemory(const megac::plan::Program &P,
                      const megac::plan::RankProgram &R,
                      Bf16Storage Storage = Bf16Storage::Fp32,
                      const AttentionInBf16 &Attention = nullptr);

/// The parameter roundings whose bits the CUDA backend's AdamW writes as it
/// updates the parameter, for the next step (the rounding then has nothing
/// left to do, and the step does not read the fp32 parameter for it):
/// per buffer, the AdamW instruction, else -1. A buffer qualifies where \p
/// Bf16Only keeps it in bf16 alone, its one writer is a round_bf16 of a
/// whole parameter, exactly one AdamW updates that parameter in place, and
/// nothing reads the buffer from that AdamW on. Not in a pipelined plan
/// (its segments run apart).
std::vector<int64_t> parameterCopies(const megac::plan::RankProgram &R,
                                     const std::vector<bool> &Bf16Only);

/// Whether \p In rounds its output to bf16: a round_bf16, an op rounding
/// its output as it writes it (Instr.round_bf16), or a fused kernel whose
/// last step is a rounding.
bool roundsToBf16(const megac::plan::Program &P, const megac::plan::Instr &In);

/// Which buffers of \p R hold bf16 values in fp32: a --precision bf16
/// plan's rounded tensors, and their moves (gather, slice, reshape,
/// transpose, copy); an in-place all-reduce of rounded values sums them,
/// so it does not keep them bf16. A fixed point grown from the rounding
/// writers alone, so a cycle of moves stays out.
std::vector<bool> bf16Values(const megac::plan::Program &P,
                             const megac::plan::RankProgram &R);

/// The inputs of \p In that the CUDA backend reads as bf16 on the tensor
/// cores, given \p Bf16 (bf16Values): both operands of a product of bf16
/// values, and q, k and v of an attention (forward) on bf16 values.
std::vector<uint32_t> tensorCoreOperands(const megac::plan::Instr &In,
                                         const std::vector<bool> &Bf16);

/// The bf16 copies the CUDA backend keeps so that products and attention
/// read bf16 operands without packing them first: the instruction that
/// rounds a tensor also writes its bf16 bits, and its tensor-core readers
/// in the same part of the step (the forward or the backward part, or
/// one pipeline segment) read those. A copy lives from that writer to its
/// last such reader; later readers (the backward pass's weight gradients
/// of saved activations) pack as before, so saved activations keep no
/// copy from one part to the other. The logits are the one exception:
/// the cross-entropy and its gradient over the whole vocabulary read them
/// in bf16 too, and the gradient, which opens the backward part, extends
/// their copy across the boundary. Only buffers with one writer, which
/// rounds, get one.
struct CopyLifetimes {
  /// Per buffer: the instruction writing its copy, and the last that reads
  /// it (both -1: no copy).
  std::vector<int64_t> first, last;
};
CopyLifetimes bf16CopyLifetimes(const megac::plan::Program &P,
                                const megac::plan::RankProgram &R);

/// The buffers the CUDA backend keeps in bf16 alone, with no fp32 storage:
/// rounded tensors with one writer, whose kernel can store just the bf16
/// bits (round_bf16, a generated kernel ending in a rounding, a product of
/// bf16 values, an attention or its gradient on bf16 kernels (\p
/// Attention), and LayerNorm, its gradient, the cross-entropy gradient and
/// the embedding where they round), and whose every reader reads bf16
/// (products of bf16 values, attentions on bf16 kernels, generated
/// kernels, plain adds and products, column sums, LayerNorm's input and
/// its gradient's input and output gradient, the logits of the
/// cross-entropy and of its gradient over the whole vocabulary). Parameters
/// and inputs (which the host writes) stay fp32, and so does everything of
/// a pipeline rank (its micro-batch slots hold fp32 buffers); an output
/// (the logits) qualifies, and the backend widens it as the host reads it.
/// Saved activations qualify: a copy lives as long as its buffer would.
std::vector<bool> bf16OnlyBuffers(const megac::plan::Program &P,
                                  const megac::plan::RankProgram &R,
                                  AttentionInBf16 Attention = nullptr);

/// The head size of attention (or attention gradient) \p In whose q, k
/// and v hold bf16 values (bf16Values \p Bf16); 0 for any other.
int64_t bf16AttentionHeadSize(const megac::plan::RankProgram &R,
                              const megac::plan::Instr &In,
                              const std::vector<bool> &Bf16);

/// The CUDA backend's choice on a device with the shared memory of sm_90
/// and the default MEGAC_CUDA_ATTENTION: q, k and v hold bf16 values
/// (bf16Values \p Bf16) and the head size is 32, 64 or 128.
bool attentionInBf16ByDefault(const megac::plan::RankProgram &R,
                              const megac::plan::Instr &In,
                              const std::vector<bool> &Bf16);

/// Per instruction of \p R: for a gradient step of an attention on bf16
/// kernels (\p Attention; null: attentionInBf16ByDefault), the output
/// buffer of its forward attention (the latest before it on the same q,
/// k, v, heads and causality), else -1. The CUDA backend keeps the
/// forward's row statistics for the gradient steps, which then take each
/// row's delta = dy . y from that output instead of running the forward
/// again; planMemory keeps the output alive until its last gradient step
/// (for a backend other than the CPU's).
std::vector<int64_t>
attentionOutputsOfGradients(const megac::plan::Program &P,
                            const megac::plan::RankProgram &R,
                            const AttentionInBf16 &Attention = nullptr);

/// Micro-batches a pipeline rank holds at once under its schedule (from
/// its first task on a micro-batch to its last); 1 without a pipeline.
uint32_t pipelineSlots(const megac::plan::Program &P,
                       const megac::plan::RankProgram &R);

/// "12.3 MiB" (binary units).
std::string formatBytes(uint64_t Bytes);

} // namespace megac_rt

#endif // MEGAC_RT_MEMORY_PLAN_H
