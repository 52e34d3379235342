//===- plan_file.h - Reading, writing and verifying .mgc plans -*- C++ -*-===//
//
// The one place that knows how a plan file is framed: an outer `Plan` table
// (file identifier "MGCP", format version, CRC-32) around a nested `Program`.
// Both the compiler (which writes plans) and the runtime (which loads, checks
// and prints them) go through this header. It is usable from code built
// without exceptions or RTTI: every failure comes back as a one-line message.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_PLAN_FILE_H
#define MEGAC_RT_PLAN_FILE_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "plan_generated.h"

namespace megac_rt {

/// Version written into every plan; the runtime refuses any other.
/// Version 2 added the backward/optimizer opcodes 16..29, Input.batch_offset,
/// RankProgram.forward_end, Program.train and Program.global_batch.
/// Version 3 added ZeRO-1: the opcodes ReduceScatter (30) and Assign (31)
/// and Instr.param_name / Instr.param_offset (AdamW on a parameter slice).
/// Version 4 added the Dropout opcode (32).
/// Version 5 added the vocabulary-parallel cross-entropy, gradient
/// accumulation, bf16 rounding and all-reduce buckets.
/// Version 6 added pipeline parallelism: Send (37), Recv (38),
/// RankProgram.segments / schedule and Program.pipeline_stages.
/// Version 7 changed the generated kernels' parameters: (y, y16, x0..,
/// n, p0..), y16 taking the bf16 bits of a rounded output (or null).
/// Version 8 added the bf16 inputs: (y, y16, x0.., h0.., n, p0..), hk
/// the bf16 bits of input k (or null: read xk), y null for an output kept
/// in bf16 alone.
/// Version 9 added layer_norm_gain_grad (41).
/// Version 10 let linear_bias round its outputs (round_bf16) and keep the
/// GeLU's input as a second output.
/// Version 11 let linear_bias add a residual (a fourth input) to its sum,
/// layer_norm_grad a residual gradient (a fourth input) to dx,
/// layer_norm_gain_grad write the bias gradient (a second output), and
/// attention_grad write dk and dv together (which = 3, two outputs).
/// Version 12 let attention_grad write dq, dk and dv together (which = 4,
/// three outputs).
/// Version 13 let linear_weight_grad write the bias gradient (dy's column
/// sums) as a second output, and embedding_grad add another gradient of
/// the table (a fourth input, which it may update in place).
/// Version 14 let the cross-entropy ops take the class count of a padded
/// vocabulary (their last integer) and a parameter name the shape of a
/// smaller HF tensor (Param.hf_shape) whose missing rows are zero.
/// Version 15 let linear add a third input to its product (cuBLAS's C,
/// beta = 1), rounding the sum once.
constexpr uint32_t kPlanFormatVersion = 16;

/// The release of megac (compiler and runtime): the producer a plan names
/// and what `--version` prints.
constexpr const char *kMegacRelease = "megac 0.1";

/// The most elements one buffer of a plan may hold (2^40): the runtime
/// refuses larger ones as nonsense, and the compiler refuses to emit them.
constexpr int64_t kMaxBufferElements = int64_t(1) << 40;

/// Whether \p bytes start like a plan file (the "MGCP" identifier at byte
/// 4), so that tools reading models can name a plan given in their place.
inline bool hasPlanIdentifier(const char *bytes, size_t size) {
  return size >= 8 && megac::plan::PlanBufferHasIdentifier(bytes);
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
uint32_t crc32(const uint8_t *data, size_t size);
/// The CRC-32 of the bytes whose CRC-32 is \p crc followed by \p data (zlib's
/// crc32(crc, data, size)): crc32Update(0, d, n) == crc32(d, n).
uint32_t crc32Update(uint32_t crc, const uint8_t *data, size_t size);

/// Frames a finished `Program` flatbuffer into the bytes of a plan file.
std::vector<uint8_t> wrapProgram(const uint8_t *program, size_t size,
                                 const std::string &producer);

/// A plan held in memory together with views into it.
struct LoadedPlan {
  std::vector<uint8_t> bytes;
  const megac::plan::Plan *plan = nullptr;
  const megac::plan::Program *program = nullptr;
};

/// Checks framing, CRC, version, flatbuffer structure and the program's
/// semantic invariants (buffer indices, shapes per opcode, axes and groups).
/// Returns "" on success, otherwise a one-line error message.
std::string verifyPlanBytes(std::vector<uint8_t> bytes, LoadedPlan &out);

/// Pipeline plans: runs every rank's sends and receives in its schedule's
/// order (a send does not wait, a receive waits for its send). Returns why
/// the ranks would deadlock or leave a message unreceived, "" if neither.
/// verifyPlanBytes runs it too.
std::string checkPipelineTransfers(const megac::plan::Program &program);

/// Reads `path` and verifies it; "" on success, else a one-line message that
/// names the file. "-" reads standard input; a pipe is read to its end.
std::string loadPlanFile(const std::string &path, LoadedPlan &out);

/// Human-readable dump; `rank` < 0 prints every rank.
std::string dumpPlanText(const LoadedPlan &plan, int rank = -1);

/// dumpPlanText's text handed to \p write in pieces, the header and then a
/// rank at a time; as writePlanJson, a writer's false stops it, and false
/// means the text is not whole.
bool writePlanText(const LoadedPlan &plan, int rank,
                   const std::function<bool(std::string_view)> &write);

/// The same content as JSON: {"format_version", "model", "world_size",
/// "axes", "batch", "seq", "ranks": [{"rank", "coords", "buffers", "params",
/// "inputs", "outputs", "instructions": [...]}]}. `rank` < 0 keeps all ranks.
std::string dumpPlanJson(const LoadedPlan &plan, int rank = -1);

/// dumpPlanJson's text handed to \p write in pieces, a rank at a time, so
/// that a plan of many ranks is printed without holding its whole JSON.
/// A writer that returns false (its output failed) stops it. False when
/// the text is not whole: the writer stopped it, or it failed midway (out
/// of memory); a plan that cannot be printed at all gives "{}".
bool writePlanJson(const LoadedPlan &plan, int rank,
                   const std::function<bool(std::string_view)> &write);

/// The grid as printed everywhere: "dp=2 x tp=2", or "single".
std::string gridString(const megac::plan::Program &program);

/// Lower-case name of an opcode as printed by the dumps ("all_reduce").
const char *opcodeName(megac::plan::OpCode op);

} // namespace megac_rt

#endif // MEGAC_RT_PLAN_FILE_H
