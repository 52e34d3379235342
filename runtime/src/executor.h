//===- executor.h - Runs one rank's instruction stream --------*- C++ -*-===//
//
// The executor owns a rank's buffers and interprets its instructions with
// the CPU kernels. Communication is behind the Collectives interface so the
// executor (and its tests) do not depend on MPI; megac-run supplies an MPI
// implementation, single-rank tests use LocalCollectives.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_EXECUTOR_H
#define MEGAC_RT_EXECUTOR_H

#include "megac_rt/plan_file.h"
#include "plan_enums.h"
#include "safetensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megac_rt {

/// One buffer: fp32 or int32 data in row-major order.
struct Tensor {
  megac::plan::DType dtype = dt::F32;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;

  int64_t numel() const;
  bool isF32() const { return dtype == dt::F32; }
  void *data() { return isF32() ? (void *)f.data() : (void *)i.data(); }
  const void *data() const {
    return isF32() ? (const void *)f.data() : (const void *)i.data();
  }
  size_t bytes() const { return size_t(numel()) * 4; }
};

/// Communication along the axes of the grid. Every call is collective over
/// this rank's group on \p Axis.
class Collectives {
public:
  virtual ~Collectives();
  /// In-place sum of \p N floats over the group.
  virtual void allReduceSum(int Axis, float *Data, size_t N) = 0;
  /// Concatenates every member's \p Bytes from \p Send into \p Recv in group
  /// order (Recv holds group size * Bytes).
  virtual void allGather(int Axis, const void *Send, size_t Bytes,
                         void *Recv) = 0;
};

/// Collectives for a plan whose groups all have one member.
class LocalCollectives : public Collectives {
public:
  void allReduceSum(int, float *, size_t) override {}
  void allGather(int, const void *Send, size_t Bytes, void *Recv) override;
};

struct RunStats {
  size_t instructions = 0;
  size_t collectives = 0;
  double seconds = 0;
};

class Executor {
public:
  Executor(const megac::plan::Program &P, uint32_t Rank);

  /// Allocates every buffer; throws RunError if memory runs out.
  void allocate();
  /// Total parameter elements of this rank.
  uint64_t paramElements() const;
  /// Initializes every parameter from its init kind and \p Seed.
  void initParams(uint64_t Seed);
  /// Loads every parameter with an hf_name from \p File (others are
  /// initialized from \p Seed); returns how many were loaded.
  size_t loadParams(const SafetensorsFile &File, uint64_t Seed);
  /// Whether the plan has a "labels" input (needs one more token).
  bool needsLabels() const;
  /// Number of tokens setInputs needs: batch * seq (+1 with labels).
  size_t tokensNeeded() const;
  /// Fills tokens[b,s] = T[b*S+s] and labels[b,s] = T[b*S+s+1].
  void setInputs(const std::vector<int32_t> &Stream);
  /// Executes the instruction stream once.
  RunStats run(Collectives &C);

  const Tensor &buffer(uint32_t Id) const { return Bufs[Id]; }
  const megac::plan::RankProgram &rankProgram() const { return RP; }

private:
  const megac::plan::Program &P;
  const megac::plan::RankProgram &RP;
  std::vector<Tensor> Bufs;

  void exec(const megac::plan::Instr &In, Collectives &C, Tensor &Out);
};

/// "[4x64x512]".
std::string shapeString(const std::vector<int64_t> &Shape);

} // namespace megac_rt

#endif // MEGAC_RT_EXECUTOR_H
