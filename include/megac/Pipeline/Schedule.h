//===- Schedule.h - Pipeline schedules and their static check ---*- C++ -*-===//
//
// A pipeline schedule says, for each pipeline rank, the order in which it
// runs the forward and backward passes of its model chunks over the
// micro-batches. The compiler generates GPipe, 1F1B and interleaved 1F1B,
// and checks any schedule (a generated one or one edited by hand) by
// simulating it: every activation a rank sends must be received in an
// order that lets every rank finish. The same simulation gives the
// schedule's length and bubble.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_PIPELINE_SCHEDULE_H
#define MEGAC_PIPELINE_SCHEDULE_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megac {

enum class PipelineKind { GPipe, OneFOneB, Interleaved };

/// One unit of work on a pipeline rank: the forward or backward pass of a
/// micro-batch through one of the rank's model chunks (virtual stages).
struct PipelineTask {
  bool backward = false;
  int64_t microBatch = 0;
  int64_t chunk = 0; // 0 .. virtual stages - 1, on this rank
};

struct PipelineSchedule {
  int64_t stages = 1, microBatches = 1, virtualStages = 1;
  /// Per pipeline rank, its tasks in order. Model chunk c (of stages *
  /// virtualStages) lives on rank c % stages as its chunk c / stages, so
  /// the forward of chunk c sends its activation to chunk c + 1's rank and
  /// the backward sends the gradient back.
  std::vector<std::vector<PipelineTask>> ranks;
};

/// The most tasks a generated schedule may hold (2 x stages x micro-batches
/// x chunks): past ten million a schedule is gigabytes and minutes of
/// work, for no pipeline anyone runs.
constexpr int64_t kMaxScheduleTasks = 10000000;

/// Generates a schedule. Interleaved needs micro-batches divisible by the
/// stages, and the tasks may number at most kMaxScheduleTasks; returns an
/// error message in \p Error otherwise (before allocating anything).
PipelineSchedule buildPipelineSchedule(PipelineKind Kind, int64_t Stages,
                                       int64_t MicroBatches,
                                       int64_t VirtualStages,
                                       std::string &Error);

/// The outcome of running a schedule with a forward pass of a whole stage
/// taking \p ForwardTime and a backward \p BackwardTime (a chunk takes
/// 1/virtual stages of each); each rank runs its tasks in order, a task
/// waiting for the activation or gradient it receives.
struct PipelineTiming {
  double makespan = 0;
  /// Idle time over makespan x ranks, and idle time over the ideal
  /// (compute) time: (p - 1) / (m + p - 1) and (p - 1) / m for GPipe.
  double bubbleOfTotal = 0, bubbleOfIdeal = 0;
};

/// Simulates \p S. Fails with a message naming the ranks that wait and the
/// messages they wait for when the schedule would deadlock, or when a rank
/// runs a task twice, misses one, or runs a backward before its forward.
bool simulatePipeline(const PipelineSchedule &S, double ForwardTime,
                      double BackwardTime, PipelineTiming &Timing,
                      std::string &Error);

/// "F0.1" (forward of micro-batch 0, chunk 1; ".chunk" omitted for chunk
/// 0), "B3": one task as text.
std::string formatTask(const PipelineTask &Task);

/// Parses a schedule written one rank per line as tasks separated by
/// spaces or tabs ("F0 F1 B0 F2 B1 B2"), lines starting with '#' ignored. The
/// micro-batches and virtual stages are taken from the tasks.
bool parsePipelineSchedule(llvm::StringRef Text, PipelineSchedule &S,
                           std::string &Error);

} // namespace megac

#endif // MEGAC_PIPELINE_SCHEDULE_H
