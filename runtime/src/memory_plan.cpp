//===- memory_plan.cpp - Liveness-based static arena of a rank ------------===//

#include "megac_rt/memory_plan.h"
#include "plan_enums.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <optional>

namespace megac_rt {

using namespace megac::plan;

namespace {

uint64_t bufferBytes(const Buffer &B) {
  uint64_t N = 1;
  if (B.shape())
    for (int64_t D : *B.shape())
      N *= uint64_t(std::max<int64_t>(D, 0));
  return N * 4; // f32 and i32
}

uint64_t aligned(uint64_t Bytes) {
  return (std::max<uint64_t>(Bytes, 1) + kArenaAlign - 1) / kArenaAlign *
         kArenaAlign;
}

/// A buffer to place: its size and lifetime [First, Last] in instructions.
struct Interval {
  uint32_t Buffer;
  uint64_t Size;
  int64_t First, Last;
};

/// Greedy by size: the largest buffers first, each at the lowest offset
/// where it overlaps no placed buffer that is live at the same time. Near
/// optimal for the nested lifetimes of a training step, where allocating in
/// time order fragments the arena between long-lived gradients.
uint64_t placeBySize(std::vector<Interval> &Items, std::vector<int64_t> &Offset) {
  std::stable_sort(Items.begin(), Items.end(),
                   [](const Interval &A, const Interval &B) {
                     return A.Size > B.Size;
                   });
  std::vector<size_t> Placed;
  std::vector<std::pair<uint64_t, uint64_t>> Busy;
  uint64_t End = 0;
  for (size_t K = 0; K < Items.size(); ++K) {
    const Interval &It = Items[K];
    Busy.clear();
    for (size_t P : Placed) {
      const Interval &O = Items[P];
      if (O.First <= It.Last && It.First <= O.Last)
        Busy.push_back({uint64_t(Offset[O.Buffer]),
                        uint64_t(Offset[O.Buffer]) + O.Size});
    }
    std::sort(Busy.begin(), Busy.end());
    uint64_t At = 0;
    for (auto [Lo, Hi] : Busy) {
      if (Lo >= At + It.Size)
        break;
      At = std::max(At, Hi);
    }
    Offset[It.Buffer] = int64_t(At);
    End = std::max(End, At + It.Size);
    Placed.push_back(K);
  }
  return End;
}

bool isWeightGradientOp(OpCode Op) {
  return Op == op::LinearWeightGrad || Op == op::EmbeddingGrad ||
         Op == op::PositionEmbeddingGrad || Op == op::SumLeading ||
         Op == op::LayerNormGainGrad;
}

/// Instructions whose output gathers the step's micro-batches: accumulate,
/// weight gradients written straight into their sum, and the stacked rows
/// of a per-row output.
bool accumulates(const Instr &In) {
  if (In.op() == op::Accumulate || In.op() == op::StackMicroBatches)
    return true;
  const size_t Flag =
      In.op() == op::LinearWeightGrad ? 1
      : In.op() == op::SumLeading || In.op() == op::LayerNormGainGrad
          ? 0
          : size_t(-1);
  return Flag != size_t(-1) && In.ints() && In.ints()->size() > Flag &&
         In.ints()->Get(uint32_t(Flag)) != 0;
}

/// Ops that pass a weight gradient on when all their inputs are one.
bool carriesGradient(OpCode Op) {
  return Op == op::Add || Op == op::AllReduce || Op == op::ReduceScatter ||
         Op == op::Accumulate || Op == op::SliceShard;
}

/// Which part of the step each instruction belongs to: its pipeline
/// segment (an instruction in none, a part of its own), or (without a
/// pipeline) the forward (0) or backward (1) part.
std::vector<int64_t> partOfInstructions(const RankProgram &R, uint32_t NI) {
  std::vector<int64_t> Part(NI, 0);
  if (R.segments() && R.segments()->size() > 0) {
    // Instructions outside every segment (the step after the pipeline)
    // each form a part of their own.
    for (uint32_t I = 0; I < NI; ++I)
      Part[I] = -1 - int64_t(I);
    for (uint32_t K = 0; K < R.segments()->size(); ++K) {
      const Segment *S = R.segments()->Get(K);
      for (uint32_t I = S->begin(); I < S->end() && I < NI; ++I)
        Part[I] = K;
    }
    return Part;
  }
  const int64_t FwdEnd = R.forward_end() >= 0 ? R.forward_end() : NI;
  for (uint32_t I = 0; I < NI; ++I)
    Part[I] = int64_t(I) >= FwdEnd;
  return Part;
}

/// Ops whose output holds values of their first input, unchanged.
bool movesValues(OpCode Op) {
  return Op == op::AllGather || Op == op::SliceShard || Op == op::Reshape ||
         Op == op::Transpose || Op == op::Assign;
}

} // namespace

bool roundsToBf16(const Program &P, const Instr &In) {
  if (In.op() == op::RoundBf16 || In.round_bf16())
    return true;
  if (In.op() != op::Fused || !P.kernels() || !In.ints() ||
      !In.ints()->size() || uint32_t(In.ints()->Get(0)) >= P.kernels()->size())
    return false;
  const auto *Steps = P.kernels()->Get(uint32_t(In.ints()->Get(0)))->steps();
  return Steps && Steps->size() &&
         Steps->Get(Steps->size() - 1)->op() == op::RoundBf16;
}

std::vector<bool> bf16Values(const Program &P, const RankProgram &R) {
  const uint32_t NB = R.buffers() ? R.buffers()->size() : 0;
  std::vector<bool> Bf16(NB, false);
  if (!R.instrs())
    return Bf16;
  // A buffer holds bf16 values when every instruction writing it rounds,
  // or moves the bf16 values of its input unchanged (sequence parallelism
  // all-gathers the rounded activations the products read).
  for (bool Grew = true; Grew;) {
    Grew = false;
    std::vector<int> Yes(NB, 0), No(NB, 0);
    for (const Instr *In : *R.instrs()) {
      if (!In->outputs())
        continue;
      const bool Ok = roundsToBf16(P, *In) ||
                      (movesValues(In->op()) && In->inputs() &&
                       In->inputs()->size() && Bf16[In->inputs()->Get(0)]);
      for (uint32_t Y : *In->outputs())
        ++(Ok ? Yes : No)[Y];
    }
    for (uint32_t B = 0; B < NB; ++B)
      if (!Bf16[B] && Yes[B] > 0 && No[B] == 0)
        Bf16[B] = Grew = true;
  }
  return Bf16;
}

std::vector<uint32_t> tensorCoreOperands(const Instr &In,
                                         const std::vector<bool> &Bf16) {
  const unsigned Operands =
      In.op() == op::Linear || In.op() == op::LinearBias ||
              In.op() == op::LinearGeluGrad || In.op() == op::LinearWeightGrad
          ? 2
      : In.op() == op::Attention ? 3
                                 : 0;
  std::vector<uint32_t> Out;
  if (!In.inputs() || In.inputs()->size() < Operands)
    return Out;
  for (unsigned K = 0; K < Operands; ++K) {
    if (!Bf16[In.inputs()->Get(K)])
      return {};
    Out.push_back(In.inputs()->Get(K));
  }
  return Out;
}

namespace {
/// The inputs of \p In that read a bf16 copy where their writer made one:
/// the tensor-core operands, and the logits of a cross-entropy and of its
/// gradient over the whole vocabulary (the vocabulary-wide rows these two
/// read are most of what they cost).
std::vector<uint32_t> copyOperands(const Instr &In,
                                   const std::vector<bool> &Bf16) {
  const bool Loss =
      In.op() == op::CrossEntropy || (In.op() == op::CrossEntropyGrad &&
                                      In.inputs() && In.inputs()->size() != 4);
  if (Loss && In.inputs() && In.inputs()->size() > 0 &&
      Bf16[In.inputs()->Get(0)])
    return {In.inputs()->Get(0)};
  std::vector<uint32_t> Out = tensorCoreOperands(In, Bf16);
  // A product's C (format 15), read in bf16 beside its operands.
  if (In.op() == op::Linear && !Out.empty() && In.inputs()->size() == 3 &&
      Bf16[In.inputs()->Get(2)])
    Out.push_back(In.inputs()->Get(2));
  return Out;
}
} // namespace

CopyLifetimes bf16CopyLifetimes(const Program &P, const RankProgram &R) {
  const uint32_t NB = R.buffers() ? R.buffers()->size() : 0;
  const uint32_t NI = R.instrs() ? R.instrs()->size() : 0;
  CopyLifetimes Out{std::vector<int64_t>(NB, -1), std::vector<int64_t>(NB, -1)};
  if (!NI)
    return Out;
  const std::vector<bool> Bf16 = bf16Values(P, R);
  const std::vector<int64_t> Part = partOfInstructions(R, NI);
  // The one writer of each buffer (-2: several, or one that does not round).
  std::vector<int64_t> Writer(NB, -1);
  for (uint32_t I = 0; I < NI; ++I) {
    const Instr &In = *R.instrs()->Get(I);
    if (!In.outputs())
      continue;
    for (uint32_t Y : *In.outputs())
      Writer[Y] = Writer[Y] == -1 && roundsToBf16(P, In) ? int64_t(I) : -2;
  }
  for (uint32_t I = 0; I < NI; ++I) {
    // The loss's gradient opens the backward part, next to the loss.
    const bool AnyPart = R.instrs()->Get(I)->op() == op::CrossEntropyGrad;
    for (uint32_t X : copyOperands(*R.instrs()->Get(I), Bf16))
      if (Writer[X] >= 0 && Writer[X] < int64_t(I) &&
          (AnyPart || Part[size_t(Writer[X])] == Part[I])) {
        Out.first[X] = Writer[X];
        Out.last[X] = I;
      }
  }
  return Out;
}

namespace {

/// Whether \p In writes its output \p Y in bf16 alone when the CUDA
/// backend gives it no fp32 storage: the rounding writers whose kernels
/// store the bf16 bits as they round (the copy), or whose product cuBLAS
/// writes in bf16.
bool writesBf16Alone(const Program &P, const RankProgram &R, const Instr &In,
                     const std::vector<bool> &Bf16,
                     const AttentionInBf16 &Attention) {
  // One output, or linear_bias's kept GeLU input beside its result, or
  // an attention gradient's dk and dv.
  if (!In.outputs() || !roundsToBf16(P, In) ||
      (In.outputs()->size() != 1 && In.op() != op::LinearBias &&
       In.op() != op::AttentionGrad))
    return false;
  switch (In.op()) {
  case op::Attention:
  case op::AttentionGrad:
    return Attention(In);
  case op::RoundBf16:
  case op::Fused:
  case op::LayerNorm:
  case op::LayerNormGrad:
  case op::Embedding:
    return true;
  case op::CrossEntropyGrad: // not the vocabulary-parallel one (from stats)
    return In.inputs() && In.inputs()->size() != 4;
  case op::Linear:           // cuBLAS's bf16 result: a product of bf16 operands
  case op::LinearBias:       // (and of the bias, or kept GeLU input, or C, of
  case op::LinearGeluGrad: { // bf16 values its epilogue reads)
    if (!In.inputs())
      return false;
    const uint32_t Operands = In.op() == op::Linear ? In.inputs()->size() : 3;
    if (In.inputs()->size() < Operands)
      return false;
    for (uint32_t B :
         {In.inputs()->Get(0), In.inputs()->Get(1), In.outputs()->Get(0)})
      if (bufferBytes(*R.buffers()->Get(B)) == 0)
        return false; // the empty products memset their fp32 output
    for (uint32_t K = 0; K < Operands; ++K)
      if (!Bf16[In.inputs()->Get(K)])
        return false;
    return true;
  }
  default:
    return false;
  }
}

/// Whether \p In reads its input \p K from a bf16 copy when there is one:
/// the products of bf16 values (their two operands), the attentions on
/// bf16 kernels, the generated kernels, the plain adds and products, the
/// column sums, LayerNorm's input and gradients, and the embedding's table
/// and gradient.
bool readsBf16(const Instr &In, uint32_t K, const std::vector<bool> &Bf16,
               const AttentionInBf16 &Attention) {
  switch (In.op()) {
  case op::Attention: // q, k, v
    return K < 3 && Attention(In);
  case op::AttentionGrad: // q, k, v, dy
    return K < 4 && Attention(In);
  case op::LinearBias: // the bias and the residual (cuBLASLt's bias and
                       // C, or the fallback kernel's inputs) always
    if (K == 2 || K == 3)
      return true;
    [[fallthrough]];
  case op::Linear: // and C (format 15) always, as linear_bias's residual
    if (K == 2)
      return true;
    [[fallthrough]];
  case op::LinearWeightGrad:
    return K < 2 && Bf16[In.inputs()->Get(0)] && Bf16[In.inputs()->Get(1)];
  case op::LinearGeluGrad: // dy and w as a product's; the kept GeLU input
                           // (the epilogue's auxiliary input) always
    return K == 2 || (Bf16[In.inputs()->Get(0)] && Bf16[In.inputs()->Get(1)]);
  case op::Fused:
  case op::Add:
  case op::Mul:
    return true;
  case op::SumLeading:
  case op::LayerNorm: // x (not the gain and bias)
  case op::Normalize:
    return K == 0;
  case op::LayerNormGrad: // x, dy and the residual gradient (not the gain)
    return K != 1;
  case op::LayerNormGainGrad: // x and dy
    return K < 2;
  case op::Embedding: // the table (not the ids)
  case op::CrossEntropy: // the logits (not the labels)
    return K == 0;
  case op::CrossEntropyGrad: // the logits, over the whole vocabulary
    return K == 0 && In.inputs()->size() != 4;
  case op::EmbeddingGrad: // the table's shape, and dy
    return K == 0 || K == 2;
  default:
    return false;
  }
}

} // namespace

int64_t bf16AttentionHeadSize(const RankProgram &R, const Instr &In,
                              const std::vector<bool> &Bf16) {
  if (!In.inputs() || In.inputs()->size() < 3 || !In.ints() ||
      In.ints()->size() < 1)
    return 0;
  for (uint32_t K = 0; K < 3; ++K)
    if (!Bf16[In.inputs()->Get(K)])
      return 0;
  const auto *Shape = R.buffers()->Get(In.inputs()->Get(0))->shape();
  const int64_t NH = In.ints()->Get(0);
  if (!Shape || Shape->size() != 3 || NH <= 0 || Shape->Get(2) % NH)
    return 0;
  return Shape->Get(2) / NH;
}

bool attentionInBf16ByDefault(const RankProgram &R, const Instr &In,
                              const std::vector<bool> &Bf16) {
  const int64_t D = bf16AttentionHeadSize(R, In, Bf16);
  return D == 32 || D == 64 || D == 128;
}

std::vector<int64_t>
attentionOutputsOfGradients(const Program &P, const RankProgram &R,
                            const AttentionInBf16 &Attention) {
  const uint32_t NI = R.instrs() ? R.instrs()->size() : 0;
  std::vector<int64_t> Out(NI, -1);
  std::vector<bool> Bf16;
  AttentionInBf16 OnBf16 = Attention;
  if (!OnBf16) {
    Bf16 = bf16Values(P, R);
    OnBf16 = [&](const Instr &In) {
      return attentionInBf16ByDefault(R, In, Bf16);
    };
  }
  // The latest forward attention by (q, k, v, heads, causal).
  std::map<std::array<int64_t, 5>, uint32_t> Forward;
  auto KeyOf = [](const Instr &In) -> std::optional<std::array<int64_t, 5>> {
    if (!In.inputs() || In.inputs()->size() < 3 || !In.ints() ||
        In.ints()->size() < 2 || !In.outputs() || In.outputs()->size() < 1)
      return std::nullopt;
    return std::array<int64_t, 5>{In.inputs()->Get(0), In.inputs()->Get(1),
                                  In.inputs()->Get(2), In.ints()->Get(0),
                                  In.ints()->Get(1)};
  };
  for (uint32_t I = 0; I < NI; ++I) {
    const Instr &In = *R.instrs()->Get(I);
    if (In.op() != op::Attention && In.op() != op::AttentionGrad)
      continue;
    const auto Key = KeyOf(In);
    if (!Key)
      continue;
    if (In.op() == op::Attention) {
      Forward[*Key] = In.outputs()->Get(0);
      continue;
    }
    if (auto It = Forward.find(*Key); It != Forward.end() && OnBf16(In))
      Out[I] = It->second;
  }
  return Out;
}

std::vector<bool> bf16OnlyBuffers(const Program &P, const RankProgram &R,
                                  AttentionInBf16 Attention) {
  const uint32_t NB = R.buffers() ? R.buffers()->size() : 0;
  const uint32_t NI = R.instrs() ? R.instrs()->size() : 0;
  std::vector<bool> Only(NB, false);
  // A pipeline's micro-batch slots hold fp32 buffers only (for now).
  if (!NI || (R.segments() && R.segments()->size() > 0))
    return Only;
  const std::vector<bool> Bf16 = bf16Values(P, R);
  if (!Attention)
    Attention = [&](const Instr &In) {
      return attentionInBf16ByDefault(R, In, Bf16);
    };
  std::vector<int> Writers(NB, 0);
  std::vector<bool> Ok(NB, true);
  for (uint32_t I = 0; I < NI; ++I) {
    const Instr &In = *R.instrs()->Get(I);
    if (In.outputs())
      for (uint32_t Y : *In.outputs()) {
        ++Writers[Y];
        Ok[Y] = Ok[Y] && writesBf16Alone(P, R, In, Bf16, Attention);
      }
    if (In.inputs())
      for (uint32_t K = 0; K < In.inputs()->size(); ++K)
        Ok[In.inputs()->Get(K)] =
            Ok[In.inputs()->Get(K)] && readsBf16(In, K, Bf16, Attention);
  }
  // What the host writes stays fp32; what it only reads (the outputs: the
  // logits) the backend widens as it downloads them.
  if (R.params())
    for (const Param *Pa : *R.params())
      Ok[Pa->buffer()] = false;
  if (R.inputs())
    for (const Input *In : *R.inputs())
      Ok[In->buffer()] = false;
  for (uint32_t B = 0; B < NB; ++B)
    Only[B] = Ok[B] && Writers[B] == 1;
  return Only;
}

std::string formatBytes(uint64_t Bytes) {
  char Buf[32];
  if (Bytes >= (uint64_t(1) << 30))
    std::snprintf(Buf, sizeof(Buf), "%.2f GiB", double(Bytes) / (1 << 30));
  else if (Bytes >= (uint64_t(1) << 20))
    std::snprintf(Buf, sizeof(Buf), "%.2f MiB", double(Bytes) / (1 << 20));
  else if (Bytes >= 1024)
    std::snprintf(Buf, sizeof(Buf), "%.1f KiB", double(Bytes) / 1024);
  else
    std::snprintf(Buf, sizeof(Buf), "%llu B", (unsigned long long)Bytes);
  return Buf;
}

uint32_t pipelineSlots(const Program &P, const RankProgram &R) {
  if (!R.schedule() || R.schedule()->size() == 0)
    return 1;
  const size_t M = size_t(std::max<int64_t>(1, P.micro_batches()));
  std::vector<int64_t> First(M, -1), Last(M, -1);
  for (uint32_t T = 0; T < R.schedule()->size(); ++T) {
    const uint32_t K = R.schedule()->Get(T)->micro_batch();
    if (K >= M)
      continue;
    if (First[K] < 0)
      First[K] = T;
    Last[K] = T;
  }
  // Micro-batch K is live over entries [First[K], Last[K]]: the most live
  // at once, by a sweep over the entries' starts and ends.
  std::vector<int64_t> Change(R.schedule()->size() + 1, 0);
  for (size_t K = 0; K < M; ++K)
    if (First[K] >= 0) {
      ++Change[size_t(First[K])];
      --Change[size_t(Last[K]) + 1];
    }
  int64_t Live = 0, Most = 1;
  for (int64_t D : Change)
    Most = std::max(Most, Live += D);
  return uint32_t(Most);
}

std::vector<int64_t> parameterCopies(const RankProgram &R,
                                     const std::vector<bool> &Bf16Only) {
  const uint32_t NB = R.buffers() ? R.buffers()->size() : 0;
  const uint32_t NI = R.instrs() ? R.instrs()->size() : 0;
  std::vector<int64_t> Out(NB, -1);
  if (!NI || (R.segments() && R.segments()->size() > 0))
    return Out;
  std::vector<bool> IsParam(NB, false);
  if (R.params())
    for (const Param *Pa : *R.params())
      IsParam[Pa->buffer()] = true;
  // Per buffer: how many instructions write it, the parameter it is the
  // rounding of (-1: none), its last reader; per parameter, the AdamW
  // updating it in place (-2: several).
  std::vector<int> Writers(NB, 0);
  std::vector<int64_t> RoundingOf(NB, -1), LastRead(NB, -1), Update(NB, -1);
  for (uint32_t I = 0; I < NI; ++I) {
    const Instr &In = *R.instrs()->Get(I);
    if (In.inputs())
      for (uint32_t X : *In.inputs())
        LastRead[X] = I;
    if (!In.outputs())
      continue;
    for (uint32_t Y : *In.outputs())
      ++Writers[Y];
    const uint32_t X0 =
        In.inputs() && In.inputs()->size() > 0 ? In.inputs()->Get(0) : NB;
    if (X0 >= NB || !IsParam[X0] || In.outputs()->size() != 1)
      continue;
    const uint32_t Y = In.outputs()->Get(0);
    if (In.op() == op::RoundBf16)
      RoundingOf[Y] = X0;
    else if (In.op() == op::AdamW && Y == X0)
      Update[X0] = Update[X0] == -1 ? int64_t(I) : -2;
  }
  for (uint32_t B = 0; B < NB && B < Bf16Only.size(); ++B) {
    const int64_t Param = RoundingOf[B];
    if (Bf16Only[B] && Writers[B] == 1 && Param >= 0 &&
        Update[size_t(Param)] >= 0 && LastRead[B] < Update[size_t(Param)])
      Out[B] = Update[size_t(Param)];
  }
  return Out;
}

MemoryPlan planMemory(const Program &P, const RankProgram &R,
                      Bf16Storage Storage, const AttentionInBf16 &Attention) {
  MemoryPlan M;
  const uint32_t NB = R.buffers() ? R.buffers()->size() : 0;
  const uint32_t NI = R.instrs() ? R.instrs()->size() : 0;
  const int64_t FwdEnd = R.forward_end() >= 0 ? R.forward_end() : NI;
  const bool Pipelined = R.segments() && R.segments()->size() > 0;
  const bool Micro =
      (P.micro_batches() > 1 || Pipelined) && R.accumulate_end() > 0;
  M.perMicro.assign(NB, false);
  M.offset.assign(NB, -1);
  M.kind.assign(NB, MemoryKind::Workspace);
  // Lifetimes: [First, Last] in instructions; persistent buffers span all.
  std::vector<int64_t> First(NB, -1), Last(NB, -1);
  std::vector<bool> Persistent(NB, false);
  if (R.params())
    for (const Param *Pa : *R.params()) {
      M.kind[Pa->buffer()] = MemoryKind::Parameter;
      M.parameterBytes += bufferBytes(*R.buffers()->Get(Pa->buffer()));
    }
  // Inputs are filled before the run and (with micro-batches) reloaded;
  // outputs are read after it.
  if (R.inputs())
    for (const Input *In : *R.inputs()) {
      Persistent[In->buffer()] = true;
      M.kind[In->buffer()] = MemoryKind::Activation;
    }
  if (R.outputs())
    for (const Output *O : *R.outputs())
      Persistent[O->buffer()] = true;
  for (uint32_t I = 0; I < NI; ++I) {
    const Instr &In = *R.instrs()->Get(I);
    bool AllGradients = In.inputs() && In.inputs()->size() > 0;
    if (In.inputs())
      for (uint32_t X : *In.inputs()) {
        Last[X] = std::max<int64_t>(Last[X], I);
        AllGradients &= M.kind[X] == MemoryKind::Gradient;
      }
    if (In.op() == op::AdamW && In.inputs())
      M.optimizerBytes += 2 * bufferBytes(*R.buffers()->Get(In.inputs()->Get(0)));
    for (uint32_t Y : *In.outputs()) {
      if (M.kind[Y] == MemoryKind::Parameter)
        continue; // an in-place update
      if (First[Y] < 0)
        First[Y] = I;
      Last[Y] = std::max<int64_t>(Last[Y], I);
      if (isWeightGradientOp(In.op()) ||
          (carriesGradient(In.op()) && AllGradients))
        M.kind[Y] = MemoryKind::Gradient;
      else if (int64_t(I) < FwdEnd)
        M.kind[Y] = MemoryKind::Activation;
      // A sum over micro-batches is read by the next micro-batch.
      if (accumulates(In) && Micro)
        Persistent[Y] = true;
    }
  }
  // The CUDA backend's attention gradients read their forward's output
  // (each row's delta from it, attentionOutputsOfGradients).
  M.attentionOutputOf = Storage != Bf16Storage::Fp32
                            ? attentionOutputsOfGradients(P, R, Attention)
                            : std::vector<int64_t>(NI, -1);
  for (uint32_t I = 0; I < NI; ++I)
    if (const int64_t Y = M.attentionOutputOf[I];
        Y >= 0 && First[size_t(Y)] >= 0)
      Last[size_t(Y)] = std::max<int64_t>(Last[size_t(Y)], I);
  // A pipeline rank runs one segment at a time, but keeps several
  // micro-batches in flight: what one segment passes to a later one (saved
  // activations, received values, the inputs) needs a copy per micro-batch
  // in flight; what lives within one segment is dead when it ends and
  // shares the arena like any temporary.
  if (Pipelined) {
    std::vector<int64_t> SegmentOf(NI, -1);
    for (uint32_t K = 0; K < R.segments()->size(); ++K) {
      const Segment *S = R.segments()->Get(K);
      for (uint32_t I = S->begin(); I < S->end() && I < NI; ++I)
        SegmentOf[I] = K;
    }
    std::vector<int64_t> Segments(NB, -1); // -2: used in several
    for (uint32_t I = 0; I < uint32_t(R.accumulate_end()) && I < NI; ++I) {
      const Instr &In = *R.instrs()->Get(I);
      auto Note = [&](uint32_t B) {
        if (M.kind[B] == MemoryKind::Parameter)
          return;
        if (Segments[B] == -1)
          Segments[B] = SegmentOf[I];
        else if (Segments[B] != SegmentOf[I])
          Segments[B] = -2;
      };
      if (In.inputs())
        for (uint32_t X : *In.inputs())
          Note(X);
      if (!accumulates(In))
        for (uint32_t Y : *In.outputs())
          Note(Y);
    }
    for (uint32_t B = 0; B < NB; ++B)
      M.perMicro[B] = Segments[B] == -2; // outputs (the logits) too
    if (R.inputs())
      for (const Input *In : *R.inputs())
        M.perMicro[In->buffer()] = true;
    // Saved activations: written by a forward segment, read by a backward
    // one, once per micro-batch in flight.
    for (uint32_t B = 0; B < NB; ++B)
      if (M.perMicro[B] && First[B] >= 0 && SegmentOf[First[B]] >= 0 &&
          !R.segments()->Get(SegmentOf[First[B]])->backward() &&
          Last[B] >= 0 && SegmentOf[Last[B]] >= 0 &&
          R.segments()->Get(SegmentOf[Last[B]])->backward())
        M.savedActivationBytes += bufferBytes(*R.buffers()->Get(B));
  }
  // Saved activations: written by the forward part, read after it (in
  // bf16, where kept so).
  M.bf16Only = Storage == Bf16Storage::Bf16Only
                   ? bf16OnlyBuffers(P, R, Attention)
                   : std::vector<bool>(NB, false);
  // A parameter's rounding whose bits AdamW writes for the next step
  // lives from one step into the next: the whole run.
  M.parameterCopyUpdate = parameterCopies(R, M.bf16Only);
  for (uint32_t B = 0; B < NB; ++B)
    if (M.parameterCopyUpdate[B] >= 0)
      Persistent[B] = true;
  for (uint32_t B = 0; B < NB; ++B)
    if (M.kind[B] == MemoryKind::Activation && First[B] >= 0 &&
        First[B] < FwdEnd && Last[B] >= FwdEnd && FwdEnd < int64_t(NI))
      M.savedActivationBytes +=
          bufferBytes(*R.buffers()->Get(B)) / (M.bf16Only[B] ? 2 : 1);

  // Lifetimes; persistent buffers (and those never written) span the run.
  // A pipeline places one micro-batch's buffers apart (PerMicroItems):
  // the runtime keeps one copy of them per micro-batch in flight. A buffer
  // kept in bf16 only is placed as its copy (buffer NB + B), 2 bytes an
  // element over its whole lifetime.
  auto CopySize = [&](uint32_t B) {
    return aligned(bufferBytes(*R.buffers()->Get(B)) / 2);
  };
  M.copyOffset.assign(NB, -1);
  M.copyFirst.assign(NB, -1);
  M.copyLast.assign(NB, -1);
  std::vector<Interval> Items, PerMicroItems;
  std::vector<std::vector<uint32_t>> Starts(NI + 1), Ends(NI + 1);
  std::vector<uint64_t> Stored(NB, 0); // arena bytes of each buffer
  uint64_t Live[4] = {0, 0, 0, 0};
  for (uint32_t B = 0; B < NB; ++B) {
    if (M.kind[B] == MemoryKind::Parameter)
      continue;
    Stored[B] = aligned(bufferBytes(*R.buffers()->Get(B)));
    std::vector<Interval> &To = M.perMicro[B] ? PerMicroItems : Items;
    if (Persistent[B] || First[B] < 0) {
      // An output kept in bf16 alone: its copy, from its writer on, read
      // by the host after the run (and by the next micro-batch's loss).
      if (M.bf16Only[B] && First[B] >= 0) {
        Stored[B] = CopySize(B);
        To.push_back({NB + B, Stored[B], 0, int64_t(NI)});
        M.copyFirst[B] = First[B];
        M.copyLast[B] = int64_t(NI);
        M.bf16OnlyBytes += bufferBytes(*R.buffers()->Get(B)) / 2;
      } else {
        M.bf16Only[B] = false; // (inputs, accumulators: not bf16 alone)
        To.push_back({B, Stored[B], 0, int64_t(NI)});
      }
      Live[size_t(M.kind[B])] += Stored[B];
      continue;
    }
    const int64_t End = std::max(Last[B], First[B]);
    if (M.bf16Only[B]) {
      Stored[B] = CopySize(B);
      To.push_back({NB + B, Stored[B], First[B], End});
      M.copyFirst[B] = First[B];
      M.copyLast[B] = End;
      M.bf16OnlyBytes += bufferBytes(*R.buffers()->Get(B)) / 2;
    } else {
      To.push_back({B, Stored[B], First[B], End});
    }
    Starts[First[B]].push_back(B);
    Ends[End].push_back(B);
  }
  // bf16 copies beside fp32 buffers: 2 bytes an element, from their
  // writer to their last reader, placed as buffers NB + B among the
  // shared ones.
  std::vector<std::vector<uint32_t>> CopyStarts(NI + 1), CopyEnds(NI + 1);
  if (Storage != Bf16Storage::Fp32) {
    CopyLifetimes Copies = bf16CopyLifetimes(P, R);
    for (uint32_t B = 0; B < NB; ++B)
      if (Copies.last[B] >= 0 && !M.bf16Only[B]) {
        M.copyFirst[B] = Copies.first[B];
        M.copyLast[B] = Copies.last[B];
        Items.push_back({NB + B, CopySize(B), M.copyFirst[B], M.copyLast[B]});
        CopyStarts[M.copyFirst[B]].push_back(B);
        CopyEnds[M.copyLast[B]].push_back(B);
        M.copyBytes += CopySize(B);
      }
  }
  M.offset.resize(2 * size_t(NB), -1);
  M.arenaBytes = placeBySize(Items, M.offset);
  for (const Interval &It : Items)
    M.unsharedBytes += It.Size;
  for (uint32_t B = 0; B < NB; ++B)
    M.copyOffset[B] = M.offset[NB + B];
  M.offset.resize(NB);
  if (Pipelined) {
    M.slots = pipelineSlots(P, R);
    M.slotBase = aligned(M.arenaBytes);
    M.slotBytes = aligned(placeBySize(PerMicroItems, M.offset));
    M.arenaBytes = M.slotBase + uint64_t(M.slots) * M.slotBytes;
    for (const Interval &It : PerMicroItems)
      M.unsharedBytes += It.Size * M.slots;
  }

  // Live bytes by kind along the run; the peak is where their sum is largest.
  uint64_t PeakSum = 0;
  const size_t Workspace = size_t(MemoryKind::Workspace);
  for (uint32_t I = 0; I < NI; ++I) {
    for (uint32_t B : Starts[I])
      Live[size_t(M.kind[B])] += Stored[B];
    for (uint32_t B : CopyStarts[I])
      Live[Workspace] += CopySize(B);
    const uint64_t Sum = Live[1] + Live[2] + Live[3];
    if (Sum > PeakSum) {
      PeakSum = Sum;
      M.peakGradientBytes = Live[1];
      M.peakActivationBytes = Live[2];
      M.peakWorkspaceBytes = Live[3];
      M.peakInstruction = I;
    }
    for (uint32_t B : Ends[I])
      Live[size_t(M.kind[B])] -= Stored[B];
    for (uint32_t B : CopyEnds[I])
      Live[Workspace] -= CopySize(B);
  }
  return M;
}

} // namespace megac_rt
