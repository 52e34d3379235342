//===- trace.h - Schedules as Chrome trace-event JSON -----------*- C++ -*-===//
//
// One format for the timeline the compiler expects (`megac inspect
// --trace`, from a cost model) and the one the runtime measures
// (`megac-run --trace`): Chrome trace-event JSON, which Perfetto and
// chrome://tracing load. One process per rank, one complete ("X") event per
// instruction, named by its opcode, collectives in their own category.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_TRACE_H
#define MEGAC_RT_TRACE_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan_generated.h"

namespace megac_rt {

/// One instruction's time span on one rank, in microseconds.
struct TraceSpan {
  uint32_t instr = 0;
  double startUs = 0, durUs = 0;
  int64_t step = -1, micro = -1; // -1: not recorded
};

/// The trace events of rank \p Rank (its name first, then one per span),
/// comma-separated, to be joined with other ranks' by traceFileJson.
std::string traceEventsJson(const megac::plan::Program &P, uint32_t Rank,
                            const std::vector<TraceSpan> &Spans);

/// A whole trace file from the ranks' event lists.
std::string traceFileJson(const std::vector<std::string> &PerRank);

/// Floating-point operations of a compute instruction (the products and
/// attention dominate; everything else counts a few per output element).
double flopsOf(const megac::plan::RankProgram &R,
               const megac::plan::Instr &In);
/// Bytes an instruction reads and writes (its inputs and outputs once).
double bytesOf(const megac::plan::RankProgram &R,
               const megac::plan::Instr &In);

/// A simple machine model for the expected schedule.
struct CostModel {
  double flopsPerUs = 20e3;      // 20 GFLOP/s per rank
  double bytesPerUs = 5e3;       // 5 GB/s memory traffic per rank
  double linkBytesPerUs = 2e3;   // 2 GB/s per link for collectives
  double collectiveLatencyUs = 20;
};

/// One instruction as a rank runs it in a training step: on which
/// micro-batch (-1: the plan has none) and in which pipeline segment (null
/// outside one).
struct ExecutionStep {
  uint32_t instr;
  int64_t micro;
  const megac::plan::Segment *segment;
};

/// The order rank program \p R runs its instructions in during one
/// training step: with micro-batches [0, accumulate_end) once per
/// micro-batch, on a pipeline the schedule's segments; then the rest once
/// (as micro-batch 0). The runtime's Executor::run follows it.
std::vector<ExecutionStep> executionOrder(const megac::plan::Program &P,
                                          const megac::plan::RankProgram &R);

/// Calls \p Visit on each step of executionOrder(P, R) in turn, without
/// holding them all (micro-batches x instructions can be large when only a
/// few steps matter to the caller).
void forEachExecutionStep(
    const megac::plan::Program &P, const megac::plan::RankProgram &R,
    const std::function<void(const ExecutionStep &)> &Visit);

/// The schedule every rank would follow under \p Model in one training
/// step (micro-batches and a pipeline's schedule unrolled): each
/// instruction takes max(flops / rate, bytes / bandwidth); a collective
/// starts when the last member of its group reaches it and takes the ring
/// algorithm's time; a pipeline send goes on at once and its message
/// arrives after the link's latency and bandwidth, which the receive waits
/// for. Fails (returns a message) when the ranks cannot all complete,
/// naming the ranks that wait.
std::string estimateSchedule(const megac::plan::Program &P,
                             const CostModel &Model,
                             std::vector<std::vector<TraceSpan>> &Out);

} // namespace megac_rt

#endif // MEGAC_RT_TRACE_H
