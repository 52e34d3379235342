//===- checkpoint.h - Sharded, atomic training checkpoints ----*- C++ -*-===//
//
// A checkpoint of a training run is a directory
//
//   DIR/step-00000040/rank-00000.safetensors   one shard per rank
//   DIR/step-00000040/meta.json                written after every shard
//   DIR/latest                                 "step-00000040", written last
//
// Each shard holds the rank's parameter slices ("param/<name>") and the
// AdamW moments ("adam_m/<name>", "adam_v/<name>": of the parameter's local
// slice, or under ZeRO of the part this rank updates, placed by the
// adam_w's param_offset); its __metadata__ maps
// every tensor to a JSON string {"global_shape": [...], "offset": [...]}
// so utils/merge_checkpoint.py can rebuild whole tensors. Every file is
// written to a temporary name, fsync'ed, renamed and its directory
// fsync'ed, and `latest` moves only after meta.json (which lists each
// shard's size and CRC-32) is durable: a crash at any point leaves `latest`
// naming the previous complete checkpoint.
//
// Nothing here communicates: megac-run gathers the shard descriptions
// (size, CRC) to rank 0 and calls writeCheckpointMeta there.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_CHECKPOINT_H
#define MEGAC_RT_CHECKPOINT_H

#include "executor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megac_rt {

struct ShardInfo {
  uint32_t rank = 0;
  std::string file; // relative to the step directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointMeta {
  int64_t step = 0;          // optimizer steps completed
  uint64_t dataPosition = 0; // stream position of the next step's batch
  uint64_t seed = 0;
  uint32_t worldSize = 0;
  std::string grid;
  uint64_t modelHash = 0;
  std::vector<ShardInfo> shards;
  /// The data the run read: its token file's path as given and length
  /// (empty and 0 for the seeded stream), and --sample's mode. Checkpoints
  /// written before these fields existed say nothing: hasData is false.
  bool hasData = false;
  std::string dataFile;
  uint64_t dataTokens = 0;
  std::string sample;
  /// TokenSource::fingerprint of the tokens (checkpoints before it: none).
  bool hasDataCrc = false;
  uint32_t dataCrc = 0;
  /// What computed the run's steps, besides the plan: "cpu (OpenBLAS
  /// Haswell, 1 thread)", "cuda (NVIDIA H100 80GB HBM3 (sm_90), attention
  /// auto)". A run that resumes on another may continue only within
  /// rounding of the saved run. "" in checkpoints before the field.
  std::string arithmetic;
};

/// "step-00000040".
std::string stepDirName(int64_t Step);
/// "rank-00003.safetensors".
std::string shardFileName(uint32_t Rank);

/// Whether writing \p Path would overwrite a file of the checkpoint
/// directory \p Dir (its latest, its .megac-lock, or a file in one of its step
/// directories; \p Dir may name a step directory itself), or take the
/// name of a step directory, links followed. Other files beside the steps
/// (a run's metrics, say) are not its.
bool isCheckpointFile(const std::string &Path, const std::string &Dir);

/// Creates \p Dir and its parents where missing. Throws RunError
/// "<dir>: cannot create checkpoint directory: <why>", or "not a
/// directory" where a file stands in the way.
void makeDirs(const std::string &Dir);

/// Takes the lock of checkpoint directory \p Dir (its file .megac-lock,
/// flock'ed) for the rest of the process, so that a second run saving
/// into it is refused rather than interleaving its steps and `latest`
/// with this run's. Throws RunError naming the holder (the process and
/// host it wrote into the file). Returns "" where the lock is held, else
/// a warning to print: the file system keeps no such locks.
std::string lockCheckpointDirectory(const std::string &Dir);

/// ".step-00000040.partial": where a step's shards and meta.json are
/// written before the step is moved into place whole.
std::string stagingDirName(int64_t Step);

/// Rank 0, before any rank writes a shard of step \p Step: removes what
/// an earlier save of it that crashed left in its staging directory, and
/// creates the directory. Throws RunError.
void prepareStepStaging(const std::string &Dir, int64_t Step);

/// Writes this rank's shard into \p Dir's staging directory of step
/// \p Step (stagingDirName; creating both directories) and returns its
/// description. Throws RunError.
ShardInfo writeCheckpointShard(const std::string &Dir, int64_t Step,
                               const Executor &E);

/// Test hook: MEGAC_TEST_CRASH_IN_SAVE=after-shards makes the process
/// _exit(9) where megac-run calls this (after the shards, before meta.json).
void crashHookAfterShards();

/// Writes meta.json into the step's staging directory, moves that to
/// \p Dir/step-<step> whole (swapping out a step of that name already
/// there), then replaces \p Dir/latest. Call once (rank 0) after every
/// shard is written. Throws RunError.
void writeCheckpointMeta(const std::string &Dir, const CheckpointMeta &M);

/// Resolves \p Dir (a checkpoint directory with `latest`, or a step
/// directory) into \p StepDir, reads its meta.json and checks it against
/// the plan (world size, grid, model hash). Throws RunError with a one-line
/// message naming the file.
CheckpointMeta readCheckpointMeta(const std::string &Dir,
                                  const megac::plan::Program &P,
                                  std::string &StepDir);

/// Loads this rank's shard of \p StepDir after checking its size and CRC-32
/// against \p M: every parameter, and with \p WithMoments the moments of
/// every adam_w. Throws RunError (a corrupted shard is named).
void loadCheckpointShard(const std::string &StepDir, const CheckpointMeta &M,
                         Executor &E, bool WithMoments);

} // namespace megac_rt

#endif // MEGAC_RT_CHECKPOINT_H
