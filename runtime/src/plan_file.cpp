//===- plan_file.cpp - Reading, writing and verifying .mgc plans ----------===//
//
// Implements plan_file.h. The verifier is the runtime's only line of defence
// against a bad plan: everything the executor later indexes or sizes without
// further checks (buffer ids, shapes, axis groups, collective sizes) is
// validated here, so a plan that verifies cannot make megac-run read out of
// bounds or deadlock in a mismatched collective.
//
// The compiler links this file into code built with -fno-exceptions, so no
// exception may leave the public functions: each catches everything and
// turns it into a message.
//
//===----------------------------------------------------------------------===//

#include "megac_rt/plan_file.h"
#include "megac_rt/kernel_image.h"
#include "plan_enums.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <sys/stat.h>
#include <unordered_map>
#include <unordered_set>

using namespace megac::plan;

namespace megac_rt {

//===----------------------------------------------------------------------===//
// CRC-32 and framing
//===----------------------------------------------------------------------===//

/// Slice-by-8 tables: Table[0] is the bytewise CRC table, Table[k][i] the
/// CRC of byte i followed by k zero bytes, so that eight bytes take eight
/// independent lookups (plans and checkpoints are megabytes to gigabytes).
static const std::array<std::array<uint32_t, 256>, 8> &crcTables() {
  static const std::array<std::array<uint32_t, 256>, 8> Tables = [] {
    std::array<std::array<uint32_t, 256>, 8> T{};
    for (uint32_t I = 0; I < 256; ++I) {
      uint32_t C = I;
      for (int K = 0; K < 8; ++K)
        C = (C & 1) ? 0xEDB88320u ^ (C >> 1) : C >> 1;
      T[0][I] = C;
    }
    for (size_t K = 1; K < 8; ++K)
      for (uint32_t I = 0; I < 256; ++I)
        T[K][I] = (T[K - 1][I] >> 8) ^ T[0][T[K - 1][I] & 0xFF];
    return T;
  }();
  return Tables;
}

uint32_t crc32Update(uint32_t crc, const uint8_t *data, size_t size) {
  const auto &T = crcTables();
  uint32_t C = crc ^ 0xFFFFFFFFu;
  auto word = [](const uint8_t *P) { // little-endian, on any host
    return uint32_t(P[0]) | uint32_t(P[1]) << 8 | uint32_t(P[2]) << 16 |
           uint32_t(P[3]) << 24;
  };
  size_t I = 0;
  for (; I + 8 <= size; I += 8) {
    const uint32_t One = word(data + I) ^ C, Two = word(data + I + 4);
    C = T[7][One & 0xFF] ^ T[6][(One >> 8) & 0xFF] ^ T[5][(One >> 16) & 0xFF] ^
        T[4][One >> 24] ^ T[3][Two & 0xFF] ^ T[2][(Two >> 8) & 0xFF] ^
        T[1][(Two >> 16) & 0xFF] ^ T[0][Two >> 24];
  }
  for (; I < size; ++I)
    C = T[0][(C ^ data[I]) & 0xFF] ^ (C >> 8);
  return C ^ 0xFFFFFFFFu;
}

uint32_t crc32(const uint8_t *data, size_t size) {
  return crc32Update(0, data, size);
}

std::vector<uint8_t> wrapProgram(const uint8_t *program, size_t size,
                                 const std::string &producer) {
  try {
    flatbuffers::FlatBufferBuilder FBB(size + 256);
    // The body is created first so that it ends the file (flatbuffers are
    // built back to front): a truncated file then always cuts into it or
    // into the tables before it, which the verifier detects. The nested
    // Program holds 64-bit scalars; aligning its bytes to 8 keeps them
    // naturally aligned inside the file as well as in a loaded copy.
    FBB.ForceVectorAlignment(size, 1, 8);
    auto Body = FBB.CreateVector(program, size);
    auto Producer = FBB.CreateString(producer);
    auto Root = CreatePlan(FBB, kPlanFormatVersion, Producer,
                           crc32(program, size), Body);
    FinishPlanBuffer(FBB, Root);
    return std::vector<uint8_t>(FBB.GetBufferPointer(),
                                FBB.GetBufferPointer() + FBB.GetSize());
  } catch (...) {
    return {};
  }
}

//===----------------------------------------------------------------------===//
// Formatting helpers
//===----------------------------------------------------------------------===//

namespace {

using Shape = std::vector<int64_t>;

Shape toShape(const flatbuffers::Vector<int64_t> *V) {
  Shape S;
  if (V)
    S.assign(V->begin(), V->end());
  return S;
}

/// "[4,64,96]": used in error messages, where shapes are compared.
std::string listStr(const Shape &S) {
  std::string R = "[";
  for (size_t I = 0; I < S.size(); ++I)
    R += (I ? "," : "") + std::to_string(S[I]);
  return R + "]";
}

/// "[4x64x96]": used in dumps, MLIR-tensor style.
std::string shapeStr(const Shape &S) {
  std::string R = "[";
  for (size_t I = 0; I < S.size(); ++I)
    R += (I ? "x" : "") + std::to_string(S[I]);
  return R + "]";
}

const char *dtypeStr(DType T) {
  switch (T) {
  case dt::F32:
    return "f32";
  case dt::I32:
    return "i32";
  }
  return "?";
}

std::string str(const flatbuffers::String *S) {
  return S ? S->str() : std::string();
}


std::string fmtDouble(double D) {
  char Buf[64];
  std::snprintf(Buf, sizeof(Buf), "%g", D);
  return Buf;
}

const Group *groupOf(const Program &P, unsigned AxisIdx, uint32_t Rank) {
  const Axis *A = P.axes()->Get(AxisIdx);
  if (!A->groups())
    return nullptr;
  for (const Group *G : *A->groups())
    if (G->ranks())
      for (uint32_t R : *G->ranks())
        if (R == Rank)
          return G;
  return nullptr;
}

bool isCollective(OpCode Op) {
  return Op == op::AllReduce || Op == op::AllGather ||
         Op == op::SliceShard || Op == op::ReduceScatter;
}

/// Ops whose output may be rounded to bf16 as it is written
/// (Instr.round_bf16).
bool roundsAsItWrites(OpCode Op) {
  return Op == op::Linear || Op == op::LinearBias || Op == op::LinearGeluGrad ||
         Op == op::Embedding || Op == op::LayerNorm ||
         Op == op::LayerNormGrad || Op == op::Attention ||
         Op == op::AttentionGrad || Op == op::CrossEntropyGrad;
}

/// Whether \p Op communicates (SliceShard only reads the coordinate).
bool communicates(OpCode Op) {
  return Op == op::AllReduce || Op == op::AllGather ||
         Op == op::ReduceScatter;
}

const Param *paramOfBuffer(const RankProgram &R, uint32_t B) {
  if (R.params())
    for (const Param *Pa : *R.params())
      if (Pa->buffer() == B)
        return Pa;
  return nullptr;
}

/// The parameter an adam_w updates (a slice of) and the slice's offset in
/// it: Instr.param_name/param_offset, or, when param_name is empty, input
/// 0's own parameter. False if neither is available.
bool adamParam(const RankProgram &R, const Instr &In, std::string &Name,
               Shape &Off) {
  Name = str(In.param_name());
  if (!Name.empty()) {
    Off = toShape(In.param_offset());
    return true;
  }
  if (!In.inputs() || In.inputs()->size() == 0)
    return false;
  const Param *Pa = paramOfBuffer(R, In.inputs()->Get(0));
  if (!Pa)
    return false;
  Name = str(Pa->name());
  Off = toShape(Pa->offset());
  return true;
}

} // namespace

std::string gridString(const Program &P) {
  if (!P.axes() || P.axes()->size() == 0)
    return "single";
  std::string R;
  for (const Axis *A : *P.axes()) {
    if (!R.empty())
      R += " x ";
    R += str(A->name()) + "=" + std::to_string(A->size());
  }
  return R;
}

const char *opcodeName(OpCode op) {
  switch (op) {
  case op::Embedding:
    return "embedding";
  case op::PositionEmbedding:
    return "position_embedding";
  case op::Linear:
    return "linear";
  case op::MatMul:
    return "matmul";
  case op::Add:
    return "add";
  case op::Mul:
    return "mul";
  case op::Gelu:
    return "gelu";
  case op::LayerNorm:
    return "layer_norm";
  case op::Attention:
    return "attention";
  case op::Softmax:
    return "softmax";
  case op::Reshape:
    return "reshape";
  case op::Transpose:
    return "transpose";
  case op::CrossEntropy:
    return "cross_entropy";
  case op::AllReduce:
    return "all_reduce";
  case op::AllGather:
    return "all_gather";
  case op::SliceShard:
    return "slice_shard";
  case op::LinearWeightGrad:
    return "linear_weight_grad";
  case op::GeluGrad:
    return "gelu_grad";
  case op::LayerNormGrad:
    return "layer_norm_grad";
  case op::Normalize:
    return "normalize";
  case op::AttentionGrad:
    return "attention_grad";
  case op::SoftmaxGrad:
    return "softmax_grad";
  case op::EmbeddingGrad:
    return "embedding_grad";
  case op::PositionEmbeddingGrad:
    return "position_embedding_grad";
  case op::CrossEntropyGrad:
    return "cross_entropy_grad";
  case op::CrossEntropyStats:
    return "cross_entropy_stats";
  case op::CrossEntropyFromStats:
    return "cross_entropy_from_stats";
  case op::Accumulate:
    return "accumulate";
  case op::StackMicroBatches:
    return "stack_micro_batches";
  case op::RoundBf16:
    return "round_bf16";
  case op::SumLeading:
    return "sum_leading";
  case op::SumSquares:
    return "sum_squares";
  case op::ClipCoefficient:
    return "clip_coefficient";
  case op::Fill:
    return "fill";
  case op::AdamW:
    return "adam_w";
  case op::ReduceScatter:
    return "reduce_scatter";
  case op::Assign:
    return "assign";
  case op::Dropout:
    return "dropout";
  case op::Send:
    return "send";
  case op::Recv:
    return "recv";
  case op::Fused:
    return "fused";
  case op::LinearBias:
    return "linear_bias";
  case op::LayerNormGainGrad:
    return "layer_norm_gain_grad";
  case op::LinearGeluGrad:
    return "linear_gelu_grad";
  }
  return "unknown";
}

//===----------------------------------------------------------------------===//
// Semantic verification
//===----------------------------------------------------------------------===//

namespace {

/// Element counts above this are rejected as nonsense rather than attempted.
constexpr int64_t kMaxElements = kMaxBufferElements;

/// Checks one Program. Each check returns false after storing a message, so
/// that the first problem found is the one reported.
class ProgramChecker {
public:
  explicit ProgramChecker(const Program &P) : P(P) {}

  std::string run() {
    if (!checkGrid() || !checkKernels() || !checkRanks() ||
        !checkCollectiveAgreement())
      return Err;
    return "";
  }

private:
  const Program &P;
  std::string Err;
  // State of the rank/instruction being checked, for message prefixes.
  const RankProgram *RP = nullptr;
  uint32_t RankIdx = 0;
  std::vector<Shape> Shapes;
  std::vector<DType> Types;

  bool fail(std::string M) {
    Err = std::move(M);
    return false;
  }

  size_t numAxes() const { return P.axes() ? P.axes()->size() : 0; }

  /// Generated kernels: elementwise steps over inputs and earlier steps.
  bool checkKernels() {
    if (!P.kernels())
      return true;
    for (uint32_t K = 0; K < P.kernels()->size(); ++K) {
      const Kernel *Kn = P.kernels()->Get(K);
      const std::string Where = "kernel " + std::to_string(K) + " (" +
                                str(Kn->name()) + ")";
      if (!Kn->steps() || Kn->steps()->size() == 0)
        return fail(Where + " has no steps");
      if (Kn->inputs() == 0 || Kn->inputs() > 64)
        return fail(Where + " takes " + std::to_string(Kn->inputs()) +
                    " inputs (1 to 64)");
      for (uint32_t J = 0; J < Kn->steps()->size(); ++J) {
        const FusedStep *St = Kn->steps()->Get(J);
        const OpCode Op = St->op();
        const size_t Arity = Op == op::Add || Op == op::Mul ||
                                     Op == op::GeluGrad
                                 ? 2
                             : Op == op::Gelu || Op == op::RoundBf16 ? 1
                                                                     : 0;
        if (Arity == 0)
          return fail(Where + ", step " + std::to_string(J) + ": " +
                      opcodeName(Op) + " cannot be a fused step");
        if (!St->args() || St->args()->size() != Arity)
          return fail(Where + ", step " + std::to_string(J) + ": " +
                      opcodeName(Op) + " takes " + std::to_string(Arity) +
                      " arguments");
        for (int32_t A : *St->args())
          if (A >= int32_t(Kn->inputs()) || (A < 0 && -A - 1 >= int32_t(J)))
            return fail(Where + ", step " + std::to_string(J) +
                        ": argument " + std::to_string(A) +
                        " is neither an input nor an earlier step");
      }
    }
    return true;
  }

  bool checkGrid() {
    uint64_t Product = 1;
    for (size_t A = 0; A < numAxes(); ++A) {
      const Axis *Ax = P.axes()->Get(A);
      std::string Name = str(Ax->name());
      if (Name.empty())
        return fail("axis " + std::to_string(A) + " has no name");
      if (Ax->size() == 0)
        return fail("axis " + Name + " has size 0");
      Product *= Ax->size();
      if (Product > (1u << 24))
        return fail("grid is implausibly large");
    }
    if (P.world_size() == 0)
      return fail("world size is 0");
    if (Product != P.world_size())
      return fail("world size " + std::to_string(P.world_size()) +
                  " does not match the grid " + gridString(P) + " (" +
                  std::to_string(Product) + " ranks)");
    size_t NRanks = P.ranks() ? P.ranks()->size() : 0;
    if (NRanks != P.world_size())
      return fail("world size is " + std::to_string(P.world_size()) +
                  " but the plan holds " + std::to_string(NRanks) +
                  " rank programs");
    // A model may take no data at all (parameters only); with token inputs
    // the data shape and the vocabulary bound must be real.
    bool HasInputs = false;
    for (uint32_t R = 0; R < NRanks; ++R)
      HasInputs |= P.ranks()->Get(R)->inputs() &&
                   P.ranks()->Get(R)->inputs()->size() > 0;
    if (P.batch() < 0 || P.seq() < 0 || P.vocab_size() < 0 ||
        (HasInputs && (P.batch() == 0 || P.seq() == 0 || P.vocab_size() == 0)))
      return fail("batch, seq and vocab size must be positive when the plan "
                  "takes token inputs (got " +
                  std::to_string(P.batch()) + ", " + std::to_string(P.seq()) +
                  ", " + std::to_string(P.vocab_size()) + ")");
    if (P.seq() > 0 && P.batch() > kMaxElements / P.seq())
      return fail("batch x seq is implausibly large");
    if (P.global_batch() < 0 ||
        (P.seq() > 0 && P.global_batch() > kMaxElements / P.seq()))
      return fail("global batch " + std::to_string(P.global_batch()) +
                  " is invalid");
    if (P.micro_batches() < 0 || P.micro_batches() > (1 << 20) ||
        (P.micro_batches() > 1 &&
         (P.global_batch() <= 0 ||
          P.global_batch() % P.micro_batches() != 0)))
      return fail("micro_batches " + std::to_string(P.micro_batches()) +
                  " must be 0, 1 or divide the global batch " +
                  std::to_string(P.global_batch()));
    if (P.global_batch() > 0 && P.global_batch() < P.batch())
      return fail("global batch " + std::to_string(P.global_batch()) +
                  " is smaller than the per-rank batch " +
                  std::to_string(P.batch()));
    if (const TrainConfig *T = P.train()) {
      if (!(T->max_lr() >= 0) || !(T->min_lr() >= 0) ||
          !std::isfinite(T->max_lr()) || !std::isfinite(T->min_lr()))
        return fail("training config has invalid learning rates (max " +
                    fmtDouble(T->max_lr()) + ", min " +
                    fmtDouble(T->min_lr()) + ")");
      if (T->warmup_steps() < 0 || T->total_steps() < 0)
        return fail("training config has negative step counts (warmup " +
                    std::to_string(T->warmup_steps()) + ", total " +
                    std::to_string(T->total_steps()) + ")");
    }
    for (uint32_t R = 0; R < NRanks; ++R) {
      const RankProgram *Q = P.ranks()->Get(R);
      if (Q->rank() != R)
        return fail("rank program " + std::to_string(R) + " says it is rank " +
                    std::to_string(Q->rank()));
      size_t NC = Q->coords() ? Q->coords()->size() : 0;
      if (NC != numAxes())
        return fail("rank " + std::to_string(R) + " has " +
                    std::to_string(NC) + " coordinates but the grid has " +
                    std::to_string(numAxes()) + " axes");
      for (size_t A = 0; A < NC; ++A) {
        int64_t C = Q->coords()->Get(A);
        if (C < 0 || C >= int64_t(P.axes()->Get(A)->size()))
          return fail("rank " + std::to_string(R) + " has coordinate " +
                      std::to_string(C) + " on axis " +
                      str(P.axes()->Get(A)->name()) + " of size " +
                      std::to_string(P.axes()->Get(A)->size()));
      }
    }
    // Each axis's groups must partition the world into groups of the axis
    // size, and a rank's position in its group must be its coordinate: the
    // MPI sub-communicators are built from exactly this.
    for (size_t A = 0; A < numAxes(); ++A) {
      const Axis *Ax = P.axes()->Get(A);
      std::string Name = str(Ax->name());
      std::vector<int> Seen(P.world_size(), 0);
      size_t NG = Ax->groups() ? Ax->groups()->size() : 0;
      if (NG * Ax->size() != P.world_size())
        return fail("axis " + Name + " has " + std::to_string(NG) +
                    " groups of size " + std::to_string(Ax->size()) +
                    " for a world of " + std::to_string(P.world_size()));
      for (size_t G = 0; G < NG; ++G) {
        const Group *Gr = Ax->groups()->Get(G);
        size_t N = Gr->ranks() ? Gr->ranks()->size() : 0;
        if (N != Ax->size())
          return fail("axis " + Name + " group " + std::to_string(G) +
                      " has " + std::to_string(N) + " ranks, expected " +
                      std::to_string(Ax->size()));
        for (size_t I = 0; I < N; ++I) {
          uint32_t R = Gr->ranks()->Get(I);
          if (R >= P.world_size())
            return fail("axis " + Name + " group " + std::to_string(G) +
                        " names rank " + std::to_string(R) +
                        " outside the world of " +
                        std::to_string(P.world_size()));
          if (Seen[R]++)
            return fail("axis " + Name + ": rank " + std::to_string(R) +
                        " is in more than one group");
          int64_t C = P.ranks()->Get(R)->coords()->Get(A);
          if (C != int64_t(I))
            return fail("axis " + Name + ": rank " + std::to_string(R) +
                        " is at position " + std::to_string(I) +
                        " of its group but has coordinate " +
                        std::to_string(C));
        }
      }
    }
    return true;
  }

  std::string where() const {
    return "rank " + std::to_string(RankIdx);
  }

  bool checkShape(const Shape &S, const std::string &What) {
    int64_t N = 1;
    for (int64_t D : S) {
      if (D < 0)
        return fail(where() + ": " + What + " has negative shape " +
                    listStr(S));
      if (D != 0 && N > kMaxElements / D)
        return fail(where() + ": " + What + " has implausibly large shape " +
                    listStr(S));
      N *= D;
    }
    return true;
  }

  bool checkBufferIndex(uint32_t B, const std::string &What) {
    if (B >= Shapes.size())
      return fail(where() + ": " + What + " refers to buffer %" +
                  std::to_string(B) + " but the rank has " +
                  std::to_string(Shapes.size()) + " buffers");
    return true;
  }

  bool checkRanks() {
    for (RankIdx = 0; RankIdx < P.world_size(); ++RankIdx) {
      RP = P.ranks()->Get(RankIdx);
      indexParams();
      if (!checkRank())
        return false;
    }
    return true;
  }

  bool checkRank() {
    Shapes.clear();
    Types.clear();
    if (RP->buffers())
      for (uint32_t B = 0; B < RP->buffers()->size(); ++B) {
        const Buffer *Buf = RP->buffers()->Get(B);
        // (Every reader of a buffer's shape takes it as given.)
        if (!Buf->shape())
          return fail(where() + ": buffer %" + std::to_string(B) +
                      " has no shape (a scalar's is [])");
        Shapes.push_back(toShape(Buf->shape()));
        Types.push_back(Buf->dtype());
        if (Buf->dtype() != dt::F32 && Buf->dtype() != dt::I32)
          return fail(where() + ": buffer %" + std::to_string(B) +
                      " has unknown dtype " +
                      std::to_string(int(Buf->dtype())));
        if (!checkShape(Shapes.back(), "buffer %" + std::to_string(B)))
          return false;
      }
    // Buffers holding a value: params and inputs first, then each
    // instruction's results. Reading anything else is a compiler bug.
    std::vector<bool> Defined(Shapes.size(), false);

    if (RP->params())
      for (uint32_t I = 0; I < RP->params()->size(); ++I) {
        const Param *Pa = RP->params()->Get(I);
        std::string What = "param " + str(Pa->name());
        if (!checkBufferIndex(Pa->buffer(), What))
          return false;
        if (str(Pa->name()).empty())
          return fail(where() + ": param " + std::to_string(I) +
                      " has no name");
        if (Types[Pa->buffer()] != dt::F32)
          return fail(where() + ": " + What + " is not f32");
        if (Defined[Pa->buffer()])
          return fail(where() + ": " + What + " reuses buffer %" +
                      std::to_string(Pa->buffer()));
        Defined[Pa->buffer()] = true;
        const Shape &Local = Shapes[Pa->buffer()];
        Shape Global = toShape(Pa->global_shape());
        Shape Off = toShape(Pa->offset());
        if (Global.size() != Local.size() || Off.size() != Local.size())
          return fail(where() + ": " + What + " has local shape " +
                      listStr(Local) + ", global shape " + listStr(Global) +
                      " and offset " + listStr(Off) +
                      " of different ranks");
        if (!checkShape(Global, What + " global shape"))
          return false;
        for (size_t D = 0; D < Local.size(); ++D)
          if (Off[D] < 0 || Off[D] > Global[D] - Local[D]) // (no overflow)
            return fail(where() + ": " + What + " slice of shape " +
                        listStr(Local) + " at offset " + listStr(Off) +
                        " does not fit in its global shape " +
                        listStr(Global));
        if (Pa->init() > ik::Normal)
          return fail(where() + ": " + What + " has unknown init kind " +
                      std::to_string(int(Pa->init())));
        if (Pa->init() == ik::Normal && !(Pa->std() >= 0))
          return fail(where() + ": " + What + " has invalid std " +
                      fmtDouble(Pa->std()));
        if (!str(Pa->hf_name()).empty()) {
          Shape HOff = toShape(Pa->hf_offset());
          if (HOff.size() != Global.size())
            return fail(where() + ": " + What + " has hf_offset " +
                        listStr(HOff) + " but global shape " +
                        listStr(Global));
          for (int64_t O : HOff)
            if (O < 0 || O > kMaxElements)
              return fail(where() + ": " + What + " has invalid hf_offset " +
                          listStr(HOff));
          // A padded parameter: fewer rows in the file, nothing else
          // different.
          if (Pa->hf_shape()) {
            Shape HShape = toShape(Pa->hf_shape());
            bool Ok = HShape.size() == Global.size() && !HShape.empty() &&
                      HShape[0] > 0 && HShape[0] <= Global[0];
            for (size_t D = 1; Ok && D < HShape.size(); ++D)
              Ok = HShape[D] == Global[D];
            for (int64_t O : HOff)
              Ok = Ok && O == 0;
            if (!Ok)
              return fail(where() + ": " + What + " has hf_shape " +
                          listStr(HShape) + " for global shape " +
                          listStr(Global) +
                          " (expected fewer rows, the rest the same, and no "
                          "hf_offset)");
          }
        }
      }

    if (RP->inputs())
      for (const Input *In : *RP->inputs()) {
        std::string Kind = str(In->kind());
        std::string What = "input " + str(In->name());
        if (!checkBufferIndex(In->buffer(), What))
          return false;
        if (Kind != "tokens" && Kind != "labels")
          return fail(where() + ": " + What + " has kind \"" + Kind +
                      "\" (expected \"tokens\" or \"labels\")");
        Shape Want = {P.batch(), P.seq()};
        if (Types[In->buffer()] != dt::I32 ||
            Shapes[In->buffer()] != Want)
          return fail(where() + ": " + What + " must be i32 " +
                      listStr(Want) + " (batch, seq), got " +
                      dtypeStr(Types[In->buffer()]) + " " +
                      listStr(Shapes[In->buffer()]));
        // With micro-batches the offset is inside one micro-batch's rows.
        const int64_t GB =
            (P.global_batch() > 0 ? P.global_batch() : P.batch()) /
            std::max<int64_t>(1, P.micro_batches());
        if (In->batch_offset() < 0 || In->batch_offset() > GB - P.batch())
          return fail(where() + ": " + What + " has batch offset " +
                      std::to_string(In->batch_offset()) + ": rows [" +
                      std::to_string(In->batch_offset()) + ", +" +
                      std::to_string(P.batch()) +
                      ") do not fit in the global batch of " +
                      std::to_string(GB));
        Defined[In->buffer()] = true;
      }

    const uint32_t NInstrs = RP->instrs() ? RP->instrs()->size() : 0;
    const int32_t FwdEnd = RP->forward_end();
    if (FwdEnd < -1 || (FwdEnd >= 0 && uint32_t(FwdEnd) > NInstrs))
      return fail(where() + ": forward_end " + std::to_string(FwdEnd) +
                  " is outside [-1, " + std::to_string(NInstrs) + "]");
    const int32_t AccEnd = RP->accumulate_end();
    if (AccEnd < -1 || (AccEnd >= 0 && uint32_t(AccEnd) > NInstrs))
      return fail(where() + ": accumulate_end " + std::to_string(AccEnd) +
                  " is outside [-1, " + std::to_string(NInstrs) + "]");
    if (P.micro_batches() > 1 && AccEnd <= 0)
      return fail(where() + ": the plan has " +
                  std::to_string(P.micro_batches()) +
                  " micro-batches but no accumulate_end");
    if (!checkPipeline(AccEnd))
      return false;
    AdamParams.clear();
    AdamNames.clear();
    // Outputs must be computed by the forward part ([0, forward_end)).
    std::vector<bool> DefinedFwd;
    if (FwdEnd == 0)
      DefinedFwd = Defined;
    // Buffers written by generation-only instructions (training skips them).
    std::vector<bool> GenOnly(Shapes.size(), false);
    for (uint32_t I = 0; I < NInstrs; ++I) {
      const Instr *In = RP->instrs()->Get(I);
      if (!checkInstr(I, *In, Defined))
        return false;
      if (In->inputs() && !In->generation_only())
        for (uint32_t X : *In->inputs())
          if (GenOnly[X])
            return fail(where() + ", instruction " + std::to_string(I) +
                        " (" + opcodeName(In->op()) + "): reads %" +
                        std::to_string(X) + ", which only a generation-only "
                        "instruction writes (training steps skip those)");
      if (In->generation_only() && In->outputs())
        for (uint32_t X : *In->outputs())
          GenOnly[X] = true;
      if (FwdEnd >= 0 && I + 1 == uint32_t(FwdEnd))
        DefinedFwd = Defined;
    }
    if (FwdEnd < 0)
      DefinedFwd = Defined;

    if (RP->outputs())
      for (const Output *O : *RP->outputs()) {
        std::string What = "output " + str(O->name());
        if (!checkBufferIndex(O->buffer(), What))
          return false;
        if (!Defined[O->buffer()])
          return fail(where() + ": " + What + " (buffer %" +
                      std::to_string(O->buffer()) +
                      ") is never computed");
        if (!DefinedFwd[O->buffer()])
          return fail(where() + ": " + What + " (buffer %" +
                      std::to_string(O->buffer()) +
                      ") is not computed before forward_end " +
                      std::to_string(FwdEnd));
        // The runtime reads these two as numbers: the loss its first.
        const std::string Name = str(O->name());
        if ((Name == "loss" || Name == "logits") &&
            (Types[O->buffer()] != dt::F32 ||
             std::count(Shapes[O->buffer()].begin(), Shapes[O->buffer()].end(),
                        0) > 0))
          return fail(where() + ": " + What + " (buffer %" +
                      std::to_string(O->buffer()) +
                      ") must be f32, with at least one element");
      }
    return true;
  }

  /// Segments cover [0, accumulate_end) in order; the schedule runs each
  /// segment once per micro-batch.
  bool checkPipeline(int32_t AccEnd) {
    const size_t NSeg = RP->segments() ? RP->segments()->size() : 0;
    const size_t NTask = RP->schedule() ? RP->schedule()->size() : 0;
    if (NSeg == 0 && NTask == 0)
      return true;
    if (P.pipeline_stages() < 2)
      return fail(where() + ": has pipeline segments but the plan has no "
                            "pipeline (pipeline_stages < 2)");
    if (AccEnd < 0)
      return fail(where() + ": has pipeline segments but no accumulate_end "
                            "(where they end)");
    uint32_t Next = 0;
    for (size_t K = 0; K < NSeg; ++K) {
      const Segment *S = RP->segments()->Get(uint32_t(K));
      if (S->begin() != Next || S->end() < S->begin() ||
          S->stage() >= P.pipeline_stages())
        return fail(where() + ": segment " + std::to_string(K) + " [" +
                    std::to_string(S->begin()) + ", " +
                    std::to_string(S->end()) + ") of stage " +
                    std::to_string(S->stage()) +
                    " does not continue the previous one at " +
                    std::to_string(Next) + " or names no stage");
      Next = S->end();
    }
    if (Next != uint32_t(AccEnd))
      return fail(where() + ": the segments end at instruction " +
                  std::to_string(Next) + ", not at accumulate_end " +
                  std::to_string(AccEnd));
    const int64_t M = std::max<int64_t>(1, P.micro_batches());
    // (Every segment runs once per micro-batch: a schedule too short for
    // that is wrong whatever it holds, and the count bounds what follows.)
    if (NTask < NSeg * size_t(M))
      return fail(where() + ": the schedule has " + std::to_string(NTask) +
                  (NTask == 1 ? " entry" : " entries") + ", but " +
                  std::to_string(NSeg) + " segments on " + std::to_string(M) +
                  " micro-batches take " + std::to_string(NSeg * size_t(M)));
    std::vector<int> Runs(NSeg * size_t(M), 0);
    // Per segment, the first micro-batch it has not yet run.
    std::vector<int64_t> NextMicro(NSeg, 0);
    for (size_t T = 0; T < NTask; ++T) {
      const Task *Tk = RP->schedule()->Get(uint32_t(T));
      if (Tk->segment() >= NSeg || int64_t(Tk->micro_batch()) >= M)
        return fail(where() + ": schedule entry " + std::to_string(T) +
                    " names segment " + std::to_string(Tk->segment()) +
                    " and micro-batch " + std::to_string(Tk->micro_batch()) +
                    " (the rank has " + std::to_string(NSeg) +
                    " segments, the plan " + std::to_string(M) +
                    " micro-batches)");
      ++Runs[Tk->segment() * size_t(M) + Tk->micro_batch()];
      // Sums over micro-batches start at micro-batch 0 (accumulate and the
      // accumulating gradients overwrite on it, add on the others): each
      // segment takes the micro-batches in order.
      int64_t &Next = NextMicro[Tk->segment()];
      if (int64_t(Tk->micro_batch()) == Next)
        ++Next;
      else if (int64_t(Tk->micro_batch()) > Next)
        return fail(where() + ": schedule entry " + std::to_string(T) +
                    " runs segment " + std::to_string(Tk->segment()) +
                    " on micro-batch " + std::to_string(Tk->micro_batch()) +
                    " before all earlier micro-batches (each segment takes "
                    "them in order)");
    }
    for (size_t K = 0; K < Runs.size(); ++K)
      if (Runs[K] != 1)
        return fail(where() + ": the schedule runs segment " +
                    std::to_string(K / size_t(M)) + " on micro-batch " +
                    std::to_string(K % size_t(M)) + " " +
                    std::to_string(Runs[K]) + " times (expected once)");
    return true;
  }

  // Buffers already updated by an adam_w instruction of this rank, and the
  // parameter names those instructions update (each at most once).
  // (Sets: a deep model's plan has tens of thousands of updates.)
  std::unordered_set<uint32_t> AdamParams;
  std::unordered_set<std::string> AdamNames;

  /// The rank's parameters by buffer and by name: instruction checks ask
  /// for every output, so a scan of the parameters would make verifying a
  /// plan quadratic in the layers.
  void indexParams() {
    ParamOfBuf.assign(RP->buffers() ? RP->buffers()->size() : 0, nullptr);
    ParamByName.clear();
    if (RP->params())
      for (const Param *Pa : *RP->params()) {
        if (Pa->buffer() < ParamOfBuf.size() && !ParamOfBuf[Pa->buffer()])
          ParamOfBuf[Pa->buffer()] = Pa;
        ParamByName.emplace(str(Pa->name()), Pa);
      }
  }
  const Param *paramOf(uint32_t B) const {
    return B < ParamOfBuf.size() ? ParamOfBuf[B] : nullptr;
  }
  bool isParamBuffer(uint32_t B) const { return paramOf(B) != nullptr; }
  std::vector<const Param *> ParamOfBuf;
  std::unordered_map<std::string, const Param *> ParamByName;

  // Per-instruction state used by the opcode checks below.
  std::string Pfx;
  std::vector<uint32_t> Ins, Outs;
  std::vector<int64_t> Ints;
  std::vector<double> Floats;

  const Shape &in(size_t I) const { return Shapes[Ins[I]]; }
  const Shape &out(size_t I) const { return Shapes[Outs[I]]; }

  bool expectCounts(size_t NIn, size_t NOut) {
    if (Ins.size() != NIn || Outs.size() != NOut)
      return fail(Pfx + "expects " + std::to_string(NIn) + " inputs and " +
                  std::to_string(NOut) + " outputs, got " +
                  std::to_string(Ins.size()) + " and " +
                  std::to_string(Outs.size()));
    return true;
  }
  bool expectInts(size_t N, const char *Names) {
    if (Ints.size() != N)
      return fail(Pfx + "expects " + std::to_string(N) + " integer attributes (" +
                  Names + "), got " + std::to_string(Ints.size()));
    return true;
  }
  bool expectType(bool IsInput, size_t I, DType T) {
    uint32_t B = IsInput ? Ins[I] : Outs[I];
    if (Types[B] != T)
      return fail(Pfx + (IsInput ? "input " : "output ") + std::to_string(I) +
                  " is " + dtypeStr(Types[B]) + ", expected " + dtypeStr(T));
    return true;
  }
  bool allF32() {
    for (size_t I = 0; I < Ins.size(); ++I)
      if (!expectType(true, I, dt::F32))
        return false;
    for (size_t I = 0; I < Outs.size(); ++I)
      if (!expectType(false, I, dt::F32))
        return false;
    return true;
  }
  bool expectRank(bool IsInput, size_t I, size_t MinRank, size_t MaxRank) {
    const Shape &S = IsInput ? in(I) : out(I);
    if (S.size() < MinRank || S.size() > MaxRank) {
      std::string Want = MinRank == MaxRank
                             ? std::to_string(MinRank)
                             : "at least " + std::to_string(MinRank);
      return fail(Pfx + (IsInput ? "input " : "output ") + std::to_string(I) +
                  " has shape " + listStr(S) + " but must have rank " + Want);
    }
    return true;
  }
  /// Exactly one float attribute, positive (an epsilon, a max norm).
  bool expectPositiveFloat(const char *Name) {
    if (Floats.size() != 1 || !(Floats[0] > 0))
      return fail(Pfx + "expects one positive float attribute (" + Name + ")");
    return true;
  }
  /// The output is the input divided along dim D by the group size G
  /// (slice_shard keeps a chunk, reduce_scatter a summed chunk).
  bool expectSplitAlong(int64_t D, int64_t G) {
    if (in(0)[D] % G != 0)
      return fail(Pfx + "dimension " + std::to_string(D) + " of " +
                  listStr(in(0)) + " is not divisible by the group size " +
                  std::to_string(G));
    Shape Want = in(0);
    Want[D] /= G;
    return expectOutShape(Want);
  }
  /// The shape of the product of input 0 and the weight, input 1 (ints[0]:
  /// read transposed): input 0's with its last dimension K made the
  /// weight's N. False, and the failure, where input 0 does not end in K.
  bool productShape(Shape &Want) {
    const bool T = Ints[0] != 0;
    const int64_t K = T ? in(1)[1] : in(1)[0], N = T ? in(1)[0] : in(1)[1];
    if (in(0).back() != K)
      return fail(Pfx + "input 0 has shape " + listStr(in(0)) +
                  " but weight expects K=" + std::to_string(K));
    Want = in(0);
    Want.back() = N;
    return true;
  }
  bool expectOutShape(const Shape &Want) {
    if (out(0) != Want)
      return fail(Pfx + "output has shape " + listStr(out(0)) +
                  " but the inputs imply " + listStr(Want));
    return true;
  }
  /// A second output, where there is one, of \p Columns elements: a bias
  /// gradient, the column sums of a gradient's dy.
  bool expectBiasGradient(int64_t Columns) {
    if (Outs.size() == 2 && out(1) != Shape{Columns})
      return fail(Pfx + "output 1 (the bias gradient) has shape " +
                  listStr(out(1)) + ", expected " + listStr(Shape{Columns}));
    return true;
  }
  bool checkAxis(const Instr &In, int64_t &GroupSize) {
    if (In.axis() < 0 || size_t(In.axis()) >= numAxes())
      return fail(Pfx + "axis " + std::to_string(In.axis()) +
                  " is not an axis of the grid (which has " +
                  std::to_string(numAxes()) + ")");
    GroupSize = P.axes()->Get(In.axis())->size();
    return true;
  }
  bool checkDim(const Shape &S, int64_t &D) {
    if (!expectInts(1, "dim"))
      return false;
    D = Ints[0];
    if (D < 0 || D >= int64_t(S.size()))
      return fail(Pfx + "dim " + std::to_string(D) +
                  " is out of range for shape " + listStr(S));
    return true;
  }

  /// Format 6: a weight gradient written straight into its micro-batch
  /// sum needs micro-batches (or a pipeline) and an output that is no
  /// parameter.
  bool checkAccumulating(bool Accumulating) {
    if (!Accumulating)
      return true;
    if (P.micro_batches() < 1 || RP->accumulate_end() < 0)
      return fail(Pfx + "accumulates over micro-batches, but the plan has "
                        "no accumulate_end");
    if (isParamBuffer(Outs[0]))
      return fail(Pfx + "accumulates into the parameter " +
                  str(paramOf(Outs[0])->name()));
    return true;
  }

  bool checkInstr(uint32_t Idx, const Instr &In, std::vector<bool> &Defined) {
    Pfx = where() + ", instruction " + std::to_string(Idx) + " (" +
          opcodeName(In.op()) + "): ";
    if (In.op() > op::LastOpCode)
      return fail(where() + ", instruction " + std::to_string(Idx) +
                  ": unknown opcode " + std::to_string(int(In.op())));
    // Stacked rows are written once per micro-batch, so in the part that
    // runs once per micro-batch.
    if (In.op() == op::StackMicroBatches && P.micro_batches() > 1 &&
        (RP->accumulate_end() < 0 || int64_t(Idx) >= RP->accumulate_end()))
      return fail(Pfx +
                  "stacks micro-batches' rows outside the part run "
                  "once per micro-batch (accumulate_end " +
                  std::to_string(RP->accumulate_end()) + ")");
    // (Any instruction's axis names one or is -1: the dumps show the
    // group of any axis set.)
    if (In.axis() < -1 || In.axis() >= int64_t(numAxes()))
      return fail(Pfx + "axis " + std::to_string(In.axis()) +
                  " is not an axis of the grid (which has " +
                  std::to_string(numAxes()) + ")");
    Ins.clear();
    if (In.inputs())
      Ins.assign(In.inputs()->begin(), In.inputs()->end());
    Outs.clear();
    if (In.outputs())
      Outs.assign(In.outputs()->begin(), In.outputs()->end());
    Ints.clear();
    if (In.ints())
      Ints.assign(In.ints()->begin(), In.ints()->end());
    Floats.clear();
    if (In.floats())
      Floats.assign(In.floats()->begin(), In.floats()->end());

    for (size_t I = 0; I < Ins.size(); ++I) {
      if (Ins[I] >= Shapes.size())
        return fail(Pfx + "input " + std::to_string(I) + " refers to buffer %" +
                    std::to_string(Ins[I]) + " but the rank has " +
                    std::to_string(Shapes.size()) + " buffers");
      if (!Defined[Ins[I]])
        return fail(Pfx + "input " + std::to_string(I) + " (%" +
                    std::to_string(Ins[I]) +
                    ") is read before anything defines it");
    }
    for (size_t I = 0; I < Outs.size(); ++I)
      if (Outs[I] >= Shapes.size())
        return fail(Pfx + "output " + std::to_string(I) +
                    " refers to buffer %" + std::to_string(Outs[I]) +
                    " but the rank has " + std::to_string(Shapes.size()) +
                    " buffers");
    // A rounded output (format 7): only on the ops the compiler rounds
    // that way, whose one output is f32 (linear_bias's two, format 10;
    // attention_grad's two, format 11, or three, format 12).
    if (In.round_bf16()) {
      bool Ok = roundsAsItWrites(In.op()) &&
                (Outs.size() == 1 ||
                 (In.op() == op::LinearBias && Outs.size() == 2) ||
                 (In.op() == op::AttentionGrad && Outs.size() <= 3));
      for (uint32_t Y : Outs)
        Ok = Ok && Y < Types.size() && Types[Y] == dt::F32;
      if (!Ok)
        return fail(Pfx + "round_bf16 is only for the f32 outputs of linear, "
                          "linear_bias, linear_gelu_grad, embedding, "
                          "layer_norm, layer_norm_grad, attention, "
                          "attention_grad or cross_entropy_grad");
    }
    // Only the inputs updatesInPlace names may be an output's buffer, and
    // then only that input (adam_w's output is its input 0 always: its
    // own rules below).
    if (In.op() != op::AdamW)
      for (size_t I = 0; I < Outs.size(); ++I) {
        auto It = std::find(Ins.begin(), Ins.end(), Outs[I]);
        if (It == Ins.end())
          continue;
        if (updatesInPlace(In.op(), size_t(It - Ins.begin()), I) &&
            std::count(Ins.begin(), Ins.end(), Outs[I]) == 1)
          continue;
        return fail(Pfx + "output " + std::to_string(I) + " (%" +
                    std::to_string(Outs[I]) +
                    ") is also an input (only adam_w, all_reduce on its "
                    "own input and embedding_grad on the gradient it adds "
                    "to update in place)");
      }
    // Parameters change only through adam_w (in place) and assign.
    if (In.op() != op::AdamW && In.op() != op::Assign)
      for (size_t I = 0; I < Outs.size(); ++I)
        if (isParamBuffer(Outs[I]))
          return fail(Pfx + "output " + std::to_string(I) + " (%" +
                      std::to_string(Outs[I]) + ") is the parameter " +
                      str(paramOf(Outs[I])->name()) +
                      " (only adam_w and assign write parameters)");
    if (!checkOp(In))
      return false;
    for (uint32_t O : Outs)
      Defined[O] = true;
    return true;
  }

  bool checkOp(const Instr &In) {
    switch (In.op()) {
    case op::Embedding:
    case op::PositionEmbedding: {
      bool Pos = In.op() == op::PositionEmbedding;
      if (!expectCounts(2, 1) || !expectType(true, 0, dt::F32) ||
          !expectType(true, 1, dt::I32) ||
          !expectType(false, 0, dt::F32) || !expectRank(true, 0, 2, 2) ||
          !expectRank(true, 1, 2, 2))
        return false;
      if (!Pos) {
        if (!expectInts(1, "vocab_start"))
          return false;
        if (Ints[0] < 0)
          return fail(Pfx + "vocab_start " + std::to_string(Ints[0]) +
                      " is negative");
        return expectOutShape({in(1)[0], in(1)[1], in(0)[1]});
      }
      if (in(1)[1] > in(0)[0])
        return fail(Pfx + "sequence length " + std::to_string(in(1)[1]) +
                    " exceeds the " + std::to_string(in(0)[0]) +
                    " positions of the table");
      return expectOutShape({in(1)[1], in(0)[1]});
    }
    case op::Linear: {
      // A third input (format 15): a tensor added to the product (C).
      const bool Into = Ins.size() == 3;
      Shape Want;
      if (!expectCounts(Into ? 3 : 2, 1) || !allF32() ||
          !expectRank(true, 0, 1, 64) || !expectRank(true, 1, 2, 2) ||
          !expectInts(1, "transpose_w") || !productShape(Want) ||
          !expectOutShape(Want))
        return false;
      if (Into && in(2) != Want)
        return fail(Pfx + "input 2 (added to the product) has shape " +
                    listStr(in(2)) + ", expected the product's " +
                    listStr(Want));
      return true;
    }
    case op::LinearBias: {
      // A second output (format 10): the GeLU's input, kept. A fourth
      // input (format 11): a residual added to the sum.
      const bool Residual = Ins.size() == 4;
      if (!expectCounts(Residual ? 4 : 3, Outs.size() == 2 ? 2 : 1) ||
          !allF32() || !expectRank(true, 0, 1, 64) ||
          !expectRank(true, 1, 2, 2) || !expectRank(true, 2, 1, 1) ||
          !expectInts(2, "transpose_w, gelu"))
        return false;
      if (Outs.size() == 2 && Ints[1] == 0)
        return fail(Pfx + "has a second output (the GeLU's input) but no "
                          "GeLU");
      Shape Want;
      if (!productShape(Want))
        return false;
      if (in(2)[0] != Want.back())
        return fail(Pfx + "input " + listStr(in(0)) + ", weight " +
                    listStr(in(1)) + " and bias " + listStr(in(2)) +
                    " do not fit together");
      if (Outs.size() == 2 && out(1) != Want)
        return fail(Pfx + "output 1 has shape " + listStr(out(1)) +
                    ", expected " + listStr(Want));
      if (Residual && Ints[1] != 0)
        return fail(Pfx + "has a residual (input 3) and a GeLU");
      if (Residual && in(3) != Want)
        return fail(Pfx + "input 3 (the residual) has shape " + listStr(in(3)) +
                    ", expected the product's " + listStr(Want));
      return expectOutShape(Want);
    }
    case op::LinearGeluGrad: {
      // dy [..., K], w, x of the product's shape (format 10).
      if (!expectCounts(3, 1) || !allF32() || !expectRank(true, 0, 1, 64) ||
          !expectRank(true, 1, 2, 2) || !expectInts(1, "transpose_w"))
        return false;
      Shape Want;
      if (!productShape(Want))
        return false;
      if (in(2) != Want)
        return fail(Pfx + "input 2 (the GeLU's input) has shape " +
                    listStr(in(2)) + ", expected the product's " +
                    listStr(Want));
      return expectOutShape(Want);
    }
    case op::Fused: {
      if (!expectInts(1, "kernel") || !allF32())
        return false;
      if (Outs.size() != 1)
        return fail(Pfx + "expects one output");
      if (!P.kernels() || Ints[0] < 0 ||
          Ints[0] >= int64_t(P.kernels()->size()))
        return fail(Pfx + "kernel " + std::to_string(Ints[0]) +
                    " is not one of the plan's " +
                    std::to_string(P.kernels() ? P.kernels()->size() : 0));
      const Kernel *Kn = P.kernels()->Get(uint32_t(Ints[0]));
      if (Ins.size() != Kn->inputs())
        return fail(Pfx + "kernel " + str(Kn->name()) + " takes " +
                    std::to_string(Kn->inputs()) + " inputs, got " +
                    std::to_string(Ins.size()));
      int64_t N = 1;
      for (int64_t D : out(0))
        N *= D;
      for (size_t K = 0; K < Ins.size(); ++K) {
        int64_t M = 1;
        for (int64_t D : in(K))
          M *= D;
        const bool Row = in(K).size() == 1 && !out(0).empty() &&
                         in(K)[0] == out(0).back();
        if (M != N && !Row)
          return fail(Pfx + "input " + std::to_string(K) + " " +
                      listStr(in(K)) + " is neither the shape of the output " +
                      listStr(out(0)) + " nor a row of it");
      }
      return true;
    }
    case op::MatMul: {
      if (!expectCounts(2, 1) || !allF32() || !expectRank(true, 0, 2, 64) ||
          !expectRank(true, 1, 2, 64))
        return false;
      const Shape &A = in(0), &B = in(1);
      if (A.size() != B.size() ||
          !std::equal(A.begin(), A.end() - 2, B.begin()))
        return fail(Pfx + "batch dimensions of " + listStr(A) + " and " +
                    listStr(B) + " differ");
      if (A[A.size() - 1] != B[B.size() - 2])
        return fail(Pfx + "contracting dimensions of " + listStr(A) +
                    " and " + listStr(B) + " differ");
      Shape Want = A;
      Want.back() = B.back();
      return expectOutShape(Want);
    }
    case op::Add:
    case op::Mul: {
      if (!expectCounts(2, 1) || !allF32())
        return false;
      const Shape &A = in(0), &B = in(1);
      if (B.size() > A.size() ||
          !std::equal(B.begin(), B.end(), A.end() - B.size()))
        return fail(Pfx + "shape " + listStr(B) + " of input 1 is not a " +
                    "suffix of input 0's shape " + listStr(A));
      return expectOutShape(A);
    }
    case op::Gelu:
    case op::Softmax:
      if (!expectCounts(1, 1) || !allF32() || !expectRank(true, 0, 1, 64))
        return false;
      return expectOutShape(in(0));
    case op::LayerNorm: {
      if (!expectCounts(3, 1) || !allF32() || !expectRank(true, 0, 1, 64))
        return false;
      Shape H = {in(0).back()};
      if (in(1) != H || in(2) != H)
        return fail(Pfx + "gamma " + listStr(in(1)) + " and beta " +
                    listStr(in(2)) + " must both have shape " + listStr(H));
      return expectPositiveFloat("epsilon") && expectOutShape(in(0));
    }
    case op::Attention: {
      if (!expectCounts(3, 1) || !allF32() || !expectRank(true, 0, 3, 3) ||
          !checkAttentionDropout(2, "num_heads_local, causal"))
        return false;
      if (in(1) != in(0) || in(2) != in(0))
        return fail(Pfx + "q " + listStr(in(0)) + ", k " + listStr(in(1)) +
                    " and v " + listStr(in(2)) + " must have the same shape");
      if (Ints[0] <= 0 || in(0)[2] % Ints[0] != 0)
        return fail(Pfx + "hidden size " + std::to_string(in(0)[2]) +
                    " is not divisible by " + std::to_string(Ints[0]) +
                    " heads");
      return expectOutShape(in(0));
    }
    case op::Reshape: {
      if (!expectCounts(1, 1))
        return false;
      if (Types[Ins[0]] != Types[Outs[0]])
        return fail(Pfx + "changes the dtype");
      int64_t NI = 1, NO = 1;
      for (int64_t D : in(0))
        NI *= D;
      for (int64_t D : out(0))
        NO *= D;
      if (NI != NO)
        return fail(Pfx + "cannot reshape " + listStr(in(0)) + " (" +
                    std::to_string(NI) + " elements) into " +
                    listStr(out(0)) + " (" + std::to_string(NO) + ")");
      return true;
    }
    case op::Transpose: {
      if (!expectCounts(1, 1))
        return false;
      if (Types[Ins[0]] != Types[Outs[0]])
        return fail(Pfx + "changes the dtype");
      const Shape &X = in(0);
      std::vector<bool> Seen(X.size(), false);
      if (Ints.size() != X.size())
        return fail(Pfx + "permutation " + listStr(Ints) +
                    " does not match rank " + std::to_string(X.size()));
      Shape Want;
      for (int64_t D : Ints) {
        if (D < 0 || D >= int64_t(X.size()) || Seen[D])
          return fail(Pfx + listStr(Ints) + " is not a permutation");
        Seen[D] = true;
        Want.push_back(X[D]);
      }
      return expectOutShape(Want);
    }
    case op::CrossEntropy: {
      if (!expectCounts(2, 1) || !expectType(true, 0, dt::F32) ||
          !expectType(true, 1, dt::I32) ||
          !expectType(false, 0, dt::F32) || !expectRank(true, 0, 2, 64) ||
          !checkNormalizer(1, in(0).back()))
        return false;
      Shape Lab(in(0).begin(), in(0).end() - 1);
      if (in(1) != Lab)
        return fail(Pfx + "labels have shape " + listStr(in(1)) +
                    " but logits " + listStr(in(0)) + " need " +
                    listStr(Lab));
      if (in(0).back() <= 0)
        return fail(Pfx + "logits have an empty class dimension");
      return expectOutShape({});
    }
    case op::AllReduce: {
      // One tensor, or a bucket of several (format 5): output k is the sum
      // of input k.
      int64_t G;
      if (Ins.empty() || Ins.size() != Outs.size())
        return fail(Pfx + "expects as many outputs as inputs (at least one), "
                          "got " + std::to_string(Ins.size()) + " inputs and " +
                    std::to_string(Outs.size()) + " outputs");
      if (!allF32() || !checkAxis(In, G))
        return false;
      for (size_t K = 0; K < Ins.size(); ++K)
        if (in(K) != out(K))
          return fail(Pfx + "output " + std::to_string(K) + " has shape " +
                      listStr(out(K)) + " but input " + std::to_string(K) +
                      " has " + listStr(in(K)));
      return true;
    }
    case op::AllGather:
    case op::SliceShard: {
      int64_t G, D;
      bool Gather = In.op() == op::AllGather;
      if (!expectCounts(1, 1) || !checkAxis(In, G) || !checkDim(in(0), D))
        return false;
      if (Types[Ins[0]] != Types[Outs[0]])
        return fail(Pfx + "changes the dtype");
      if (Gather) {
        Shape Want = in(0);
        Want[D] *= G;
        return expectOutShape(Want);
      }
      return expectSplitAlong(D, G);
    }
    case op::LinearWeightGrad: {
      // A second output (format 13): the bias gradient, dy's column sums.
      const bool BiasGrad = Outs.size() == 2;
      if (!expectCounts(2, BiasGrad ? 2 : 1) || !allF32() ||
          !expectRank(true, 0, 1, 64) || !expectRank(true, 1, 1, 64))
        return false;
      if (Ints.size() != 1 && Ints.size() != 2)
        return expectInts(1, "transpose_w[, accumulate]");
      const bool Accumulate = Ints.size() == 2 && Ints[1] != 0;
      if (!checkAccumulating(Accumulate))
        return false;
      const Shape &X = in(0), &DY = in(1);
      if (X.size() != DY.size() ||
          !std::equal(X.begin(), X.end() - 1, DY.begin()))
        return fail(Pfx + "leading dimensions of x " + listStr(X) +
                    " and dy " + listStr(DY) + " differ");
      if (BiasGrad && Accumulate)
        return fail(Pfx + "writes a bias gradient and adds into a "
                          "micro-batch sum: the compiler never groups a "
                          "micro-batch sum's gradient");
      if (!expectBiasGradient(DY.back()))
        return false;
      if (Ints[0] != 0)
        return expectOutShape({DY.back(), X.back()});
      return expectOutShape({X.back(), DY.back()});
    }
    case op::GeluGrad:
    case op::SoftmaxGrad: {
      if (!expectCounts(2, 1) || !allF32() || !expectRank(true, 0, 1, 64))
        return false;
      if (in(1) != in(0))
        return fail(Pfx + "inputs have shapes " + listStr(in(0)) + " and " +
                    listStr(in(1)) + " (must be equal)");
      return expectOutShape(in(0));
    }
    case op::LayerNormGrad: {
      // A fourth input (format 11): a residual gradient added to dx.
      const bool Residual = Ins.size() == 4;
      if (!expectCounts(Residual ? 4 : 3, 1) || !allF32() ||
          !expectRank(true, 0, 1, 64))
        return false;
      if (Residual && in(3) != in(0))
        return fail(Pfx + "input 3 (the residual gradient) " + listStr(in(3)) +
                    " must have x's shape " + listStr(in(0)));
      Shape H = {in(0).back()};
      if (in(1) != H)
        return fail(Pfx + "gamma " + listStr(in(1)) + " must have shape " +
                    listStr(H));
      if (in(2) != in(0))
        return fail(Pfx + "dy " + listStr(in(2)) + " must have x's shape " +
                    listStr(in(0)));
      return expectPositiveFloat("epsilon") && expectOutShape(in(0));
    }
    case op::Normalize:
      if (!expectCounts(1, 1) || !allF32() || !expectRank(true, 0, 1, 64))
        return false;
      return expectPositiveFloat("epsilon") && expectOutShape(in(0));
    case op::LayerNormGainGrad: {
      // A second output (format 11): the bias gradient, dy's column sums.
      if (!expectCounts(2, Outs.size() == 2 ? 2 : 1) || !allF32() ||
          !expectRank(true, 0, 1, 64))
        return false;
      if (!expectBiasGradient(in(0).back()))
        return false;
      if (in(1) != in(0))
        return fail(Pfx + "dy " + listStr(in(1)) + " must have x's shape " +
                    listStr(in(0)));
      if (Ints.size() > 1)
        return expectInts(1, "accumulate");
      if (!checkAccumulating(Ints.size() == 1 && Ints[0] != 0))
        return false;
      return expectPositiveFloat("epsilon") && expectOutShape({in(0).back()});
    }
    case op::AttentionGrad: {
      // which = 3 (format 11): dk and dv, two outputs; 4 (format 12): dq,
      // dk and dv, three.
      const AttentionGradSteps Steps =
          attentionGradSteps(Ints.size() > 2 ? Ints[2] : -1);
      if (!expectCounts(4, std::max(Steps.Count, 1)) || !allF32() ||
          !expectRank(true, 0, 3, 3) ||
          !checkAttentionDropout(3, "num_heads_local, causal, which"))
        return false;
      for (size_t I = 1; I < 4; ++I)
        if (in(I) != in(0))
          return fail(Pfx + "q, k, v and dy must have the same shape (input " +
                      std::to_string(I) + " is " + listStr(in(I)) +
                      ", q is " + listStr(in(0)) + ")");
      if (Ints[0] <= 0 || in(0)[2] % Ints[0] != 0)
        return fail(Pfx + "hidden size " + std::to_string(in(0)[2]) +
                    " is not divisible by " + std::to_string(Ints[0]) +
                    " heads");
      if (!Steps.Count)
        return fail(Pfx + "which = " + std::to_string(Ints[2]) +
                    " (expected 0 for q, 1 for k, 2 for v, 3 for k and v, 4 "
                    "for q, k and v)");
      for (int K = 1; K < Steps.Count; ++K)
        if (out(K) != in(0))
          return fail(Pfx + "output " + std::to_string(K) + " (d" +
                      "qkv"[Steps.First + K] + ") has shape " +
                      listStr(out(K)) + ", expected " + listStr(in(0)));
      return expectOutShape(in(0));
    }
    case op::EmbeddingGrad: {
      // A fourth input (format 13): a gradient of the table added to the
      // embedding's (a "t" group), of its shape; the output may be it.
      const bool Into = Ins.size() == 4;
      if (!expectCounts(Into ? 4 : 3, 1) || !expectType(true, 0, dt::F32) ||
          !expectType(true, 1, dt::I32) || !expectType(true, 2, dt::F32) ||
          !expectType(false, 0, dt::F32) || !expectRank(true, 0, 2, 2) ||
          !expectRank(true, 1, 2, 2) || !expectInts(1, "vocab_start"))
        return false;
      if (Ints[0] < 0)
        return fail(Pfx + "vocab_start " + std::to_string(Ints[0]) +
                    " is negative");
      Shape DY = {in(1)[0], in(1)[1], in(0)[1]};
      if (in(2) != DY)
        return fail(Pfx + "dy has shape " + listStr(in(2)) + " but ids " +
                    listStr(in(1)) + " and the table need " + listStr(DY));
      if (Into && (in(3) != in(0) || !expectType(true, 3, dt::F32)))
        return fail(Pfx + "input 3 (the gradient added) has shape " +
                    listStr(in(3)) + ", expected the table's " +
                    listStr(in(0)));
      return expectOutShape(in(0));
    }
    case op::PositionEmbeddingGrad: {
      if (!expectCounts(2, 1) || !allF32() || !expectRank(true, 0, 2, 2) ||
          !expectRank(true, 1, 2, 2))
        return false;
      if (in(1)[1] != in(0)[1] || in(1)[0] > in(0)[0])
        return fail(Pfx + "dy " + listStr(in(1)) +
                    " does not fit in the position table " + listStr(in(0)));
      return expectOutShape(in(0));
    }
    case op::CrossEntropyGrad: {
      // With a fourth input (the statistics of all vocabulary blocks) the
      // logits are one block, and ints[1] says where it starts.
      const bool FromStats = Ins.size() == 4;
      if (!expectCounts(FromStats ? 4 : 3, 1) ||
          !expectType(true, 0, dt::F32) || !expectType(true, 1, dt::I32) ||
          !expectType(true, 2, dt::F32) || !expectType(false, 0, dt::F32) ||
          !expectRank(true, 0, 2, 64) || !expectRank(true, 2, 0, 0))
        return false;
      if (FromStats ? !checkStats(3, in(1)) || !checkVocabBlock()
                    : !checkNormalizer(2, in(0).back()))
        return false;
      Shape Lab(in(0).begin(), in(0).end() - 1);
      if (in(1) != Lab)
        return fail(Pfx + "labels have shape " + listStr(in(1)) +
                    " but logits " + listStr(in(0)) + " need " +
                    listStr(Lab));
      if (in(0).back() <= 0)
        return fail(Pfx + "logits have an empty class dimension");
      return expectOutShape(in(0));
    }
    case op::CrossEntropyStats: {
      if (!expectCounts(2, 1) || !expectType(true, 0, dt::F32) ||
          !expectType(true, 1, dt::I32) || !expectType(false, 0, dt::F32) ||
          !expectRank(true, 0, 2, 64) ||
          (Ints.size() != 2 && !expectInts(1, "vocab_start")) ||
          !checkClasses(1, -1))
        return false;
      if (Ints[0] < 0)
        return fail(Pfx + "vocab_start " + std::to_string(Ints[0]) +
                    " is negative");
      Shape Lab(in(0).begin(), in(0).end() - 1);
      if (in(1) != Lab)
        return fail(Pfx + "labels have shape " + listStr(in(1)) +
                    " but logits " + listStr(in(0)) + " need " +
                    listStr(Lab));
      const Shape &Y = out(0);
      const int64_t V = in(0).back();
      if (Y.empty() || Y.back() <= 0 || Y.back() % 3 != 0 || V <= 0 ||
          V % (Y.back() / 3) != 0)
        return fail(Pfx + "output " + listStr(Y) + " must hold 3 numbers per "
                    "block for a number of blocks dividing the " +
                    std::to_string(V) + " logits");
      Shape Want = Lab;
      Want.push_back(Y.back());
      return expectOutShape(Want);
    }
    case op::CrossEntropyFromStats:
      if (!expectCounts(1, 1) || !allF32() || !checkTokenCount() ||
          !checkStats(0, Shape(in(0).begin(), in(0).end() - (in(0).empty() ? 0 : 1))))
        return false;
      return expectOutShape({});
    case op::SumLeading: {
      if (!expectCounts(1, 1) || !allF32())
        return false;
      if (Ints.size() > 1)
        return expectInts(1, "accumulate");
      if (!checkAccumulating(Ints.size() == 1 && Ints[0] != 0))
        return false;
      const Shape &X = in(0), &Y = out(0);
      if (Y.size() > X.size() ||
          !std::equal(Y.begin(), Y.end(), X.end() - Y.size()))
        return fail(Pfx + "output shape " + listStr(Y) +
                    " is not a suffix of the input shape " + listStr(X));
      return true;
    }
    case op::SumSquares:
      if (!expectCounts(1, 1) || !allF32())
        return false;
      return expectOutShape({});
    case op::ClipCoefficient:
      if (!expectCounts(1, 1) || !allF32() || !expectRank(true, 0, 0, 0))
        return false;
      return expectPositiveFloat("max_norm") && expectOutShape({});
    case op::Fill:
      if (!expectCounts(0, 1) || !allF32())
        return false;
      if (Floats.size() != 1 || !std::isfinite(Floats[0]))
        return fail(Pfx + "expects one finite float attribute (value)");
      return true;
    case op::AdamW: {
      if (!expectCounts(3, 1) || !allF32() || !expectRank(true, 2, 0, 0))
        return false;
      if (Outs[0] != Ins[0])
        return fail(Pfx + "output %" + std::to_string(Outs[0]) +
                    " must be the parameter buffer %" +
                    std::to_string(Ins[0]) + " (input 0, updated in place)");
      if (!checkAdamParam(In))
        return false;
      if (in(1) != in(0))
        return fail(Pfx + "gradient " + listStr(in(1)) +
                    " does not match the parameter " + listStr(in(0)));
      if (Floats.size() != 4)
        return fail(Pfx + "expects 4 float attributes (beta1, beta2, "
                          "epsilon, weight_decay), got " +
                    std::to_string(Floats.size()));
      if (!(Floats[0] >= 0 && Floats[0] < 1) ||
          !(Floats[1] >= 0 && Floats[1] < 1) || !(Floats[2] > 0) ||
          !(Floats[3] >= 0) || !std::isfinite(Floats[3]))
        return fail(Pfx + "invalid hyper-parameters (beta1 " +
                    fmtDouble(Floats[0]) + ", beta2 " + fmtDouble(Floats[1]) +
                    ", epsilon " + fmtDouble(Floats[2]) + ", weight_decay " +
                    fmtDouble(Floats[3]) + ")");
      if (!P.train())
        return fail(Pfx + "the plan has no training config (Program.train)");
      return true;
    }
    case op::ReduceScatter: {
      int64_t G, D;
      if (!expectCounts(1, 1) || !allF32() || !checkAxis(In, G) ||
          !checkDim(in(0), D))
        return false;
      return expectSplitAlong(D, G);
    }
    case op::Dropout:
      return checkDropout();
    case op::Send:
    case op::Recv: {
      const bool IsSend = In.op() == op::Send;
      if (!expectCounts(IsSend ? 1 : 0, IsSend ? 0 : 1) ||
          !expectInts(2, "peer, transfer"))
        return false;
      if (Ints[0] < 0 || Ints[0] >= int64_t(P.world_size()) ||
          Ints[0] == int64_t(RP->rank()))
        return fail(Pfx + "peer rank " + std::to_string(Ints[0]) +
                    " is not another rank of the " +
                    std::to_string(P.world_size()));
      if (Ints[1] < 0 || Ints[1] > (int64_t(1) << 20))
        return fail(Pfx + "transfer id " + std::to_string(Ints[1]) +
                    " is out of range");
      if (P.pipeline_stages() < 2)
        return fail(Pfx + "point-to-point transfers need a pipeline "
                          "(Program.pipeline_stages > 1)");
      return true;
    }
    case op::RoundBf16:
      if (!expectCounts(1, 1) || !allF32())
        return false;
      return expectOutShape(in(0));
    case op::Accumulate:
      if (!expectCounts(1, 1) || !allF32())
        return false;
      if (isParamBuffer(Outs[0]))
        return fail(Pfx + "output %" + std::to_string(Outs[0]) +
                    " is a parameter (accumulate sums into its own buffer)");
      return expectOutShape(in(0));
    case op::StackMicroBatches: {
      if (!expectCounts(1, 1))
        return false;
      if (Types[Ins[0]] != Types[Outs[0]])
        return fail(Pfx + "changes the dtype");
      if (in(0).empty())
        return fail(Pfx + "input " + listStr(in(0)) + " has no rows");
      Shape Want = in(0);
      Want[0] *= std::max<int64_t>(1, P.micro_batches());
      return expectOutShape(Want);
    }
    case op::Assign: {
      if (!expectCounts(1, 1) || !allF32())
        return false;
      if (!isParamBuffer(Outs[0]))
        return fail(Pfx + "output %" + std::to_string(Outs[0]) +
                    " is not a parameter (assign writes a parameter's "
                    "buffer)");
      if (in(0) != out(0))
        return fail(Pfx + "source " + listStr(in(0)) +
                    " does not match the parameter " +
                    str(paramOf(Outs[0])->name()) + " " +
                    listStr(out(0)));
      return true;
    }
    }
    return fail(Pfx + "unknown opcode");
  }

  /// adam_w's input 0 is a parameter (param_name empty, or naming that same
  /// parameter at its own offset) or a slice of the parameter named by
  /// param_name starting at param_offset (ZeRO). Each parameter name and
  /// each buffer is updated by at most one adam_w.
  bool checkAdamParam(const Instr &In) {
    const Param *Own = paramOf(Ins[0]);
    std::string Name = str(In.param_name());
    Shape Off = toShape(In.param_offset());
    if (Name.empty()) {
      if (!Off.empty())
        return fail(Pfx + "has param_offset " + listStr(Off) +
                    " but no param_name");
      if (!Own)
        return fail(Pfx + "input 0 (%" + std::to_string(Ins[0]) +
                    ") is not a parameter (an update of a slice of one "
                    "needs param_name)");
      Name = str(Own->name());
    } else {
      auto Found = ParamByName.find(Name);
      const Param *Named = Found == ParamByName.end() ? nullptr : Found->second;
      if (!Named)
        return fail(Pfx + "param_name " + Name +
                    " is not a parameter of this rank");
      if (Own && Own != Named)
        return fail(Pfx + "input 0 (%" + std::to_string(Ins[0]) +
                    ") is the parameter " + str(Own->name()) +
                    " but param_name says " + Name);
      Shape Global = toShape(Named->global_shape());
      if (Off.size() != Global.size() || in(0).size() != Global.size())
        return fail(Pfx + "param_offset " + listStr(Off) + " and input 0 " +
                    listStr(in(0)) + " must have the rank of " + Name +
                    "'s global shape " + listStr(Global));
      for (size_t D = 0; D < Global.size(); ++D)
        if (Off[D] < 0 || Off[D] > Global[D] - in(0)[D])
          return fail(Pfx + "slice " + listStr(in(0)) + " at param_offset " +
                      listStr(Off) + " does not fit in " + Name +
                      "'s global shape " + listStr(Global));
      if (Own && Off != toShape(Own->offset()))
        return fail(Pfx + "param_offset " + listStr(Off) +
                    " differs from the offset " +
                    listStr(toShape(Own->offset())) + " of the parameter " +
                    Name + " it updates");
    }
    if (!AdamNames.insert(Name).second)
      return fail(Pfx + "parameter " + Name +
                  " is already updated by another adam_w");
    if (!AdamParams.insert(Ins[0]).second)
      return fail(Pfx + "buffer %" + std::to_string(Ins[0]) +
                  " is already updated by another adam_w");
    return true;
  }

  /// dropout: x -> x's shape (f32); floats [rate], 0 <= rate < 1; ints
  /// [stream, r, global_shape (r), offset (r)] with r = rank of x and the
  /// block x at offset inside global_shape.
  bool checkDropout() {
    if (!expectCounts(1, 1) || !allF32())
      return false;
    const Shape &X = in(0);
    const size_t R = X.size();
    if (Ints.size() != 2 + 2 * R || Ints[1] != int64_t(R))
      return fail(Pfx + "expects " + std::to_string(2 + 2 * R) +
                  " integer attributes (stream, r = " + std::to_string(R) +
                  " = the rank of input 0 " + listStr(X) +
                  ", global_shape, offset), got " + listStr(Ints));
    Shape Global(Ints.begin() + 2, Ints.begin() + 2 + long(R));
    Shape Off(Ints.begin() + 2 + long(R), Ints.end());
    int64_t N = 1;
    for (size_t D = 0; D < R; ++D) {
      if (Global[D] < 0 || (Global[D] != 0 && N > kMaxElements / Global[D]))
        return fail(Pfx + "invalid global shape " + listStr(Global));
      N *= Global[D];
    }
    for (size_t D = 0; D < R; ++D)
      if (Off[D] < 0 || Off[D] > Global[D] - X[D])
        return fail(Pfx + "block " + listStr(X) + " at offset " +
                    listStr(Off) + " does not fit in the global shape " +
                    listStr(Global));
    if (Floats.size() != 1 || !(Floats[0] >= 0 && Floats[0] < 1))
      return fail(Pfx + "expects one float attribute (rate) in [0, 1)" +
                  (Floats.size() == 1 ? ", got " + fmtDouble(Floats[0])
                                      : std::string()));
    return expectOutShape(X);
  }

  /// attention(_grad): \p First ints named \p Names, then optionally
  /// probability dropout: [stream, global batch, global heads, batch
  /// offset, head offset] with floats [rate], 0 < rate < 1, and this rank's
  /// block inside the global [batch, heads].
  bool checkAttentionDropout(size_t First, const char *Names) {
    if (Ints.size() == First)
      return Floats.empty() ||
             fail(Pfx + "has a dropout rate but no dropout attributes");
    if (Ints.size() != First + 5)
      return fail(Pfx + "expects " + std::to_string(First) + " (" + Names +
                  ") or " + std::to_string(First + 5) +
                  " integer attributes (with stream, global batch, global "
                  "heads, batch offset, head offset), got " +
                  std::to_string(Ints.size()));
    if (Floats.size() != 1 || !(Floats[0] > 0 && Floats[0] < 1))
      return fail(Pfx + "expects one dropout rate in (0, 1)");
    const int64_t B = in(0)[0], Heads = Ints[0];
    const int64_t GB = Ints[First + 1], GH = Ints[First + 2];
    const int64_t BOff = Ints[First + 3], HOff = Ints[First + 4];
    if (BOff < 0 || HOff < 0 || GB > kMaxElements || GH > kMaxElements ||
        BOff > GB - B || HOff > GH - Heads) // (no overflow)
      return fail(Pfx + "dropout block at batch " + std::to_string(BOff) +
                  ", head " + std::to_string(HOff) + " does not fit in the " +
                  "global " + std::to_string(GB) + " x " + std::to_string(GH) +
                  " heads");
    return true;
  }

  /// Input I holds cross-entropy statistics: [tokens..., 3n], n >= 1.
  bool checkStats(size_t I, const Shape &Tokens) {
    const Shape &St = in(I);
    Shape Want = Tokens;
    if (!St.empty())
      Want.push_back(St.back());
    if (St.empty() || St != Want || St.back() <= 0 || St.back() % 3 != 0)
      return fail(Pfx + "statistics " + listStr(St) + " must be " +
                  listStr(Tokens) + " followed by 3 numbers per vocabulary "
                  "block");
    return true;
  }

  /// cross_entropy_grad over a vocabulary block: [normalizer, vocab_start].
  bool checkVocabBlock() {
    if (Ints.size() < 2 || Ints.size() > 3 || Ints[0] <= 0 || Ints[1] < 0)
      return fail(Pfx + "expects two integer attributes (a positive "
                        "normalizer and a non-negative vocab_start), and "
                        "optionally the classes");
    return checkClasses(2, -1);
  }

  /// cross_entropy(_grad): no ints (local token count) or one positive
  /// normalizer, then (format 14) optionally the classes of a padded
  /// vocabulary (cross_entropy_grad: after a 0 where the block's start
  /// would be).
  bool checkNormalizer(size_t ClassesAt = 1, int64_t Vocab = -1) {
    if (Ints.size() > ClassesAt + 1 || (Ints.size() >= 1 && Ints[0] <= 0) ||
        (Ints.size() > 1 && Ints.size() <= ClassesAt))
      return fail(Pfx + "expects no integer attribute, or a positive "
                        "normalizer (token count) and optionally the "
                        "classes");
    for (size_t I = 1; I < ClassesAt && I < Ints.size(); ++I)
      if (Ints[I] != 0)
        return fail(Pfx + "integer attribute " + std::to_string(I) +
                    " must be 0 without statistics");
    return checkClasses(ClassesAt, Vocab);
  }

  /// cross_entropy_from_stats: no ints or one positive normalizer.
  bool checkTokenCount() {
    if (Ints.size() > 1 || (Ints.size() == 1 && Ints[0] <= 0))
      return fail(Pfx + "expects no integer attribute or one positive "
                        "normalizer (token count)");
    return true;
  }

  /// A padded vocabulary's class count at ints[Index], if present:
  /// positive, and at most \p Vocab where known.
  bool checkClasses(size_t Index, int64_t Vocab) {
    if (Ints.size() <= Index)
      return true;
    if (Ints[Index] <= 0 || (Vocab >= 0 && Ints[Index] > Vocab))
      return fail(Pfx + "classes " + std::to_string(Ints[Index]) +
                  " must be positive" +
                  (Vocab >= 0 ? " and at most the " + std::to_string(Vocab) +
                                    " logits"
                              : std::string()));
    return true;
  }

  static std::string dimStr(OpCode Op, int64_t Dim) {
    return Op == op::AllReduce ? std::string()
                               : " along dim " + std::to_string(Dim);
  }

  /// Ranks of one group must issue the same collectives on that axis in the
  /// same order with the same sizes, or MPI would hang or corrupt data.
  bool checkCollectiveAgreement() {
    struct Coll {
      OpCode Op;
      int64_t Elems;
      int64_t Dim;
      uint32_t Instr;
    };
    for (size_t A = 0; A < numAxes(); ++A) {
      std::vector<std::vector<Coll>> Per(P.world_size());
      // Collectives issued by the forward part [0, forward_end): generation
      // runs only that part, so it must end at the same collective on every
      // member of a group.
      std::vector<size_t> FwdCount(P.world_size(), 0);
      for (uint32_t R = 0; R < P.world_size(); ++R) {
        const RankProgram *Q = P.ranks()->Get(R);
        if (!Q->instrs())
          continue;
        for (uint32_t I = 0; I < Q->instrs()->size(); ++I) {
          if (Q->forward_end() >= 0 && I == uint32_t(Q->forward_end()))
            FwdCount[R] = Per[R].size();
          const Instr *In = Q->instrs()->Get(I);
          if (!communicates(In->op()))
            continue;
          if (In->axis() != int64_t(A))
            continue;
          int64_t N = 0; // all inputs (a bucket of all-reduces has several)
          for (uint32_t Buf : *In->inputs()) {
            int64_t Elems = 1;
            for (int64_t D : *Q->buffers()->Get(Buf)->shape())
              Elems *= D;
            N += Elems;
          }
          int64_t Dim = In->ints() && In->ints()->size() ? In->ints()->Get(0)
                                                          : -1;
          Per[R].push_back({In->op(), N, Dim, I});
        }
        if (Q->forward_end() < 0 ||
            uint32_t(Q->forward_end()) >= Q->instrs()->size())
          FwdCount[R] = Per[R].size();
      }
      const Axis *Ax = P.axes()->Get(A);
      for (const Group *G : *Ax->groups()) {
        uint32_t R0 = G->ranks()->Get(0);
        for (uint32_t R : *G->ranks()) {
          const auto &X = Per[R0], &Y = Per[R];
          std::string Who = "ranks " + std::to_string(R0) + " and " +
                            std::to_string(R) + " disagree on their " +
                            str(Ax->name()) + " collectives: ";
          if (X.size() != Y.size())
            return fail(Who + "rank " + std::to_string(R0) + " issues " +
                        std::to_string(X.size()) + ", rank " +
                        std::to_string(R) + " issues " +
                        std::to_string(Y.size()));
          for (size_t K = 0; K < X.size(); ++K)
            if (X[K].Op != Y[K].Op || X[K].Elems != Y[K].Elems ||
                (X[K].Op != op::AllReduce && X[K].Dim != Y[K].Dim))
              return fail(Who + "collective " + std::to_string(K) + " is " +
                          opcodeName(X[K].Op) + " of " +
                          std::to_string(X[K].Elems) + " elements" +
                          dimStr(X[K].Op, X[K].Dim) + " (instruction " +
                          std::to_string(X[K].Instr) + ") on rank " +
                          std::to_string(R0) + " but " + opcodeName(Y[K].Op) +
                          " of " + std::to_string(Y[K].Elems) + " elements" +
                          dimStr(Y[K].Op, Y[K].Dim) + " (instruction " +
                          std::to_string(Y[K].Instr) + ") on rank " +
                          std::to_string(R));
          if (FwdCount[R0] != FwdCount[R])
            return fail(Who + "rank " + std::to_string(R0) + " issues " +
                        std::to_string(FwdCount[R0]) +
                        " before its forward_end, rank " + std::to_string(R) +
                        " issues " + std::to_string(FwdCount[R]));
        }
      }
    }
    return true;
  }
};

std::string hex32(uint32_t V) {
  char Buf[16];
  std::snprintf(Buf, sizeof(Buf), "0x%08" PRIx32, V);
  return Buf;
}

std::string verifyImpl(std::vector<uint8_t> &&Bytes, LoadedPlan &Out) {
  Out = LoadedPlan();
  if (Bytes.size() < 8)
    return "file too small to be a megac plan (" +
           std::to_string(Bytes.size()) + " bytes)";
  if (!hasPlanIdentifier(reinterpret_cast<const char *>(Bytes.data()),
                         Bytes.size()))
    return "not a megac plan (missing \"MGCP\" file identifier)";
  if (Bytes.size() >= FLATBUFFERS_MAX_BUFFER_SIZE)
    return "file too large to be a megac plan";

  // The body is checked separately after its CRC, so that a corrupted body
  // is reported as corruption rather than as a malformed nested buffer.
  flatbuffers::Verifier::Options Opts;
  Opts.check_nested_flatbuffers = false;
  flatbuffers::Verifier V(Bytes.data(), Bytes.size(), Opts);
  if (!VerifyPlanBuffer(V))
    return "malformed plan file (flatbuffer structure check failed; "
           "truncated or not written by megac?)";
  const Plan *Pl = GetPlan(Bytes.data());
  if (Pl->format_version() != kPlanFormatVersion)
    return "plan format version " + std::to_string(Pl->format_version()) +
           " is not supported (this runtime reads version " +
           std::to_string(kPlanFormatVersion) + ")";
  if (!Pl->body() || Pl->body()->size() == 0)
    return "plan has no body";
  // The producer sits outside the checksummed body: printed by inspect
  // and run, it must at least be text (megac writes ASCII).
  if (Pl->producer())
    for (unsigned char C : Pl->producer()->string_view())
      if (C < 0x20 || C >= 0x7f)
        return "plan header damaged (its producer string is not text)";
  uint32_t Crc = crc32(Pl->body()->data(), Pl->body()->size());
  if (Crc != Pl->body_crc32())
    return "plan body checksum mismatch (file is corrupted: expected " +
           hex32(Pl->body_crc32()) + ", got " + hex32(Crc) + ")";
  // The emitter writes a table the ranks share once, and the verifier
  // visits it once per rank that refers to it: a grid of thousands of ranks
  // visits millions of tables, past flatbuffers' default limit of 10^6. The
  // body passed its checksum, so the limit here only bounds the time a
  // maliciously shared body could take.
  flatbuffers::Verifier::Options BodyOpts;
  BodyOpts.max_tables = 1u << 30;
  flatbuffers::Verifier BV(Pl->body()->data(), Pl->body()->size(), BodyOpts);
  if (!BV.VerifyBuffer<Program>(nullptr))
    return "malformed plan body (program flatbuffer structure check failed)";
  const Program *Prog = Pl->body_nested_root();
  std::string Err = ProgramChecker(*Prog).run();
  if (Err.empty())
    Err = checkPipelineTransfers(*Prog);
  if (!Err.empty())
    return Err;
  // The views stay valid when the vector is moved: its heap block moves
  // with it.
  Out.bytes = std::move(Bytes);
  Out.plan = GetPlan(Out.bytes.data());
  Out.program = Out.plan->body_nested_root();
  return "";
}

} // namespace

std::string verifyPlanBytes(std::vector<uint8_t> bytes, LoadedPlan &out) {
  try {
    return verifyImpl(std::move(bytes), out);
  } catch (const std::exception &E) {
    out = LoadedPlan();
    return std::string("internal error while verifying the plan: ") + E.what();
  } catch (...) {
    out = LoadedPlan();
    return "internal error while verifying the plan";
  }
}

/// Reads \p In to its end (a pipe has no size to ask for) into \p Bytes;
/// "" or why not.
static std::string readStream(std::istream &In, std::vector<uint8_t> &Bytes) {
  char Chunk[1 << 16];
  while (In.read(Chunk, sizeof(Chunk)) || In.gcount() > 0) {
    Bytes.insert(Bytes.end(), Chunk, Chunk + In.gcount());
    if (Bytes.size() >= FLATBUFFERS_MAX_BUFFER_SIZE)
      return "too large to be a megac plan";
  }
  return In.bad() ? "error reading the plan" : "";
}

std::string loadPlanFile(const std::string &path, LoadedPlan &out) {
  try {
    out = LoadedPlan();
    std::vector<uint8_t> Bytes;
    // "-": the plan on standard input (`megac compile ... -o - | megac
    // inspect -`).
    if (path == "-") {
      if (std::string Err = readStream(std::cin, Bytes); !Err.empty())
        return "<stdin>: " + Err;
      std::string Err = verifyPlanBytes(std::move(Bytes), out);
      return Err.empty() ? Err : "<stdin>: " + Err;
    }
    // (An ifstream opens a directory and reports a nonsense size; a
    // device such as /dev/zero reads as empty, or for ever. A pipe is
    // read to its end.)
    struct stat St;
    if (::stat(path.c_str(), &St) == 0) {
      if (S_ISDIR(St.st_mode))
        return path + ": is a directory, not a plan file";
      if (S_ISCHR(St.st_mode) || S_ISBLK(St.st_mode) || S_ISSOCK(St.st_mode))
        return path + ": is a device, not a plan file";
    }
    std::ifstream F(path, std::ios::binary);
    if (!F)
      return path + ": cannot open plan file: " + std::strerror(errno);
    F.seekg(0, std::ios::end);
    std::streamoff Size = F ? std::streamoff(F.tellg()) : -1;
    if (Size < 0) { // a pipe (/dev/stdin, <(...)): read to its end
      F.clear();
      if (std::string Err = readStream(F, Bytes); !Err.empty())
        return path + ": " + Err;
    } else {
      if (uint64_t(Size) >= FLATBUFFERS_MAX_BUFFER_SIZE)
        return path + ": file too large to be a megac plan";
      Bytes.resize(static_cast<size_t>(Size));
      F.seekg(0);
      if (Size && !F.read(reinterpret_cast<char *>(Bytes.data()), Size))
        return path + ": error reading the plan file";
    }
    std::string Err = verifyPlanBytes(std::move(Bytes), out);
    return Err.empty() ? Err : path + ": " + Err;
  } catch (const std::exception &E) {
    out = LoadedPlan();
    return path + ": cannot read plan file: " + E.what();
  } catch (...) {
    out = LoadedPlan();
    return path + ": cannot read plan file";
  }
}

//===----------------------------------------------------------------------===//
// Dumps
//===----------------------------------------------------------------------===//

namespace {

std::string initStr(const Param &Pa) {
  switch (Pa.init()) {
  case ik::Zeros:
    return "zeros";
  case ik::Ones:
    return "ones";
  case ik::Normal:
    return "normal(std=" + fmtDouble(Pa.std()) + ")";
  }
  return "?";
}

/// Attribute text for the instruction line, e.g. "{vocab_start = 0}".
std::string attrStr(const RankProgram &R, const Instr &In) {
  std::vector<int64_t> I;
  if (In.ints())
    I.assign(In.ints()->begin(), In.ints()->end());
  auto Get = [&](size_t K) {
    return K < I.size() ? std::to_string(I[K]) : std::string("?");
  };
  auto Eps = [&]() {
    return In.floats() && In.floats()->size() ? fmtDouble(In.floats()->Get(0))
                                              : std::string("?");
  };
  switch (In.op()) {
  case op::Fused:
    return "{kernel = " + Get(0) + "}";
  case op::LinearBias:
    return "{transpose_w = " + Get(0) + ", gelu = " + Get(1) + "}";
  case op::LinearGeluGrad:
    return "{transpose_w = " + Get(0) + "}";
  case op::Send:
    return "to rank " + Get(0) + " (transfer " + Get(1) + ")";
  case op::Recv:
    return "from rank " + Get(0) + " (transfer " + Get(1) + ")";
  case op::Embedding:
  case op::EmbeddingGrad:
    return "{vocab_start = " + Get(0) + "}";
  case op::LinearWeightGrad:
    return "{transpose_w = " + Get(0) +
           (I.size() > 1 && I[1] ? ", into the micro-batch sum" : "") + "}";
  case op::SumLeading:
    return !I.empty() && I[0] ? "{into the micro-batch sum}" : "";
  case op::LayerNormGainGrad:
    return "{epsilon = " + Eps() +
           (!I.empty() && I[0] ? ", into the micro-batch sum}" : "}");
  case op::LayerNormGrad:
  case op::Normalize:
    return "{epsilon = " + Eps() + "}";
  case op::AttentionGrad:
    return "{num_heads = " + Get(0) + ", causal = " + Get(1) + ", which = " +
           (I.size() > 2 && I[2] >= 0 && I[2] <= 2 ? std::string(1, "qkv"[I[2]])
            : I.size() > 2 && I[2] == 3            ? std::string("kv")
            : I.size() > 2 && I[2] == 4            ? std::string("qkv")
                                                   : Get(2)) +
           (I.size() == 8 ? ", dropout = " + Eps() + ", stream = " + Get(3)
                          : std::string()) +
           "}";
  case op::CrossEntropy:
    if (I.size() > 1) // a padded vocabulary (format 14)
      return "{normalizer = " + Get(0) + ", classes = " + Get(1) + "}";
    return I.empty() ? "" : "{normalizer = " + Get(0) + "}";
  case op::CrossEntropyFromStats:
    return I.empty() ? "" : "{normalizer = " + Get(0) + "}";
  case op::CrossEntropyGrad:
    if (I.size() > 2)
      return "{normalizer = " + Get(0) +
             (In.inputs() && In.inputs()->size() == 4
                  ? ", vocab_start = " + Get(1)
                  : std::string()) +
             ", classes = " + Get(2) + "}";
    if (I.size() > 1)
      return "{normalizer = " + Get(0) + ", vocab_start = " + Get(1) + "}";
    return I.empty() ? "" : "{normalizer = " + Get(0) + "}";
  case op::CrossEntropyStats:
    return "{vocab_start = " + Get(0) +
           (I.size() > 1 ? ", classes = " + Get(1) : std::string()) + "}";
  case op::ClipCoefficient:
    return "{max_norm = " + Eps() + "}";
  case op::Fill:
    return "{value = " + Eps() + "}";
  case op::Dropout:
    return "{rate = " + Eps() + ", stream = " + Get(0) + "}";
  case op::AdamW: {
    auto F = [&](unsigned K) {
      return In.floats() && In.floats()->size() > K
                 ? fmtDouble(In.floats()->Get(K))
                 : std::string("?");
    };
    std::string Name;
    Shape Off;
    std::string Param = adamParam(R, In, Name, Off)
                            ? ", param = " + Name + " @ " + listStr(Off)
                            : std::string();
    return "{beta1 = " + F(0) + ", beta2 = " + F(1) + ", epsilon = " + F(2) +
           ", weight_decay = " + F(3) + Param + "}";
  }
  case op::Linear:
    return "{transpose_w = " + Get(0) + "}";
  case op::LayerNorm:
    return "{epsilon = " +
           (In.floats() && In.floats()->size()
                ? fmtDouble(In.floats()->Get(0))
                : std::string("?")) +
           "}";
  case op::Attention:
    return "{num_heads = " + Get(0) + ", causal = " + Get(1) +
           (I.size() == 7 ? ", dropout = " + Eps() + ", stream = " + Get(2)
                          : std::string()) +
           "}";
  case op::Transpose:
    return "{perm = " + listStr(I) + "}";
  case op::AllGather:
  case op::SliceShard:
  case op::ReduceScatter:
    return "{dim = " + Get(0) + "}";
  default:
    return "";
  }
}

std::string groupStr(const Group *G) {
  std::string R = "[";
  if (G && G->ranks())
    for (uint32_t I = 0; I < G->ranks()->size(); ++I)
      R += (I ? " " : "") + std::to_string(G->ranks()->Get(I));
  return R + "]";
}

std::string coordsStr(const Program &P, const RankProgram &R) {
  std::string S;
  for (size_t A = 0; A < (P.axes() ? P.axes()->size() : 0); ++A) {
    if (A)
      S += ", ";
    S += str(P.axes()->Get(A)->name()) + "=" +
         std::to_string(R.coords()->Get(A));
  }
  return S;
}

std::string bufStr(const RankProgram &R, uint32_t B) {
  const Buffer *Buf = R.buffers()->Get(B);
  return shapeStr(toShape(Buf->shape())) + " " + dtypeStr(Buf->dtype());
}

/// How many instruction tables the plan holds: the compiler writes an
/// instruction once and every rank whose stream has it refers to that copy.
size_t distinctInstrCount(const Program &P) {
  std::unordered_set<const Instr *> Seen;
  for (const RankProgram *R : *P.ranks())
    if (R->instrs())
      Seen.insert(R->instrs()->begin(), R->instrs()->end());
  return Seen.size();
}

size_t instrCount(const Program &P) {
  size_t N = 0;
  for (const RankProgram *R : *P.ranks())
    N += R->instrs() ? R->instrs()->size() : 0;
  return N;
}

void dumpRankText(std::ostringstream &OS, const Program &P,
                  const RankProgram &R) {
  std::string Coords = coordsStr(P, R);
  auto Count = [](auto *V) { return V ? V->size() : 0u; };
  OS << "rank " << R.rank() << (Coords.empty() ? "" : " (" + Coords + ")")
     << ": " << Count(R.buffers()) << " buffers, " << Count(R.params())
     << " params, " << Count(R.instrs()) << " instructions";
  if (R.forward_end() >= 0)
    OS << " (forward: 0.." << R.forward_end() << ")";
  const bool Pipelined = R.segments() && R.segments()->size() > 0;
  if (P.micro_batches() > 1 && R.accumulate_end() >= 0 && !Pipelined)
    OS << " (per micro-batch: 0.." << R.accumulate_end() << ", "
       << P.micro_batches() << " micro-batches)";
  OS << "\n";
  if (Pipelined) {
    // Segments as F<stage> / B<stage>, tasks as F<micro>.<stage>.
    auto SegName = [&](uint32_t K) {
      const Segment *S = R.segments()->Get(K);
      return std::string(S->backward() ? "B" : "F");
    };
    OS << "  pipeline (" << P.pipeline_stages() << " stages, schedule "
       << str(P.pipeline_schedule()) << "): segments";
    for (uint32_t K = 0; K < R.segments()->size(); ++K) {
      const Segment *S = R.segments()->Get(K);
      OS << " " << SegName(K) << "(stage " << S->stage() << ") " << S->begin()
         << ".." << S->end();
    }
    OS << ", once per step " << R.accumulate_end() << ".."
       << Count(R.instrs()) << "\n  schedule:";
    if (R.schedule())
      for (const Task *T : *R.schedule())
        OS << " " << SegName(T->segment()) << T->micro_batch() << "."
           << R.segments()->Get(T->segment())->stage();
    OS << "\n";
  }
  if (R.params()) {
    OS << "  params:\n";
    for (const Param *Pa : *R.params()) {
      Shape Local = toShape(R.buffers()->Get(Pa->buffer())->shape());
      Shape Global = toShape(Pa->global_shape());
      OS << "    " << str(Pa->name()) << " %" << Pa->buffer() << " "
         << bufStr(R, Pa->buffer());
      if (Local != Global)
        OS << ", slice at " << listStr(toShape(Pa->offset())) << " of "
           << shapeStr(Global);
      OS << ", init " << initStr(*Pa);
      if (!str(Pa->hf_name()).empty())
        OS << ", hf " << str(Pa->hf_name()) << "@"
           << listStr(toShape(Pa->hf_offset()));
      if (Pa->hf_shape()) // a padded vocabulary
        OS << ", hf shape " << listStr(toShape(Pa->hf_shape()))
           << " (padding rows zero)";
      OS << "\n";
    }
  }
  if (R.inputs()) {
    OS << "  inputs:\n";
    for (const Input *In : *R.inputs())
      OS << "    " << str(In->name()) << " %" << In->buffer() << " "
         << bufStr(R, In->buffer()) << " (" << str(In->kind()) << ")"
         << (In->batch_offset() ? ", batch rows from " +
                                      std::to_string(In->batch_offset())
                                : std::string())
         << "\n";
  }
  if (R.outputs()) {
    OS << "  outputs:\n";
    for (const Output *O : *R.outputs())
      OS << "    " << str(O->name()) << " %" << O->buffer() << " "
         << bufStr(R, O->buffer()) << "\n";
  }
  if (R.instrs()) {
    OS << "  instructions:\n";
    for (uint32_t I = 0; I < R.instrs()->size(); ++I) {
      const Instr *In = R.instrs()->Get(I);
      OS << "    " << I << ": ";
      std::vector<uint32_t> Outs;
      if (In->outputs())
        Outs.assign(In->outputs()->begin(), In->outputs()->end());
      for (size_t K = 0; K < Outs.size(); ++K)
        OS << (K ? ", " : "") << "%" << Outs[K];
      OS << (Outs.empty() ? "" : " = ") << opcodeName(In->op());
      if (In->inputs())
        for (uint32_t K = 0; K < In->inputs()->size(); ++K)
          OS << (K ? ", %" : " %") << In->inputs()->Get(K);
      if (isCollective(In->op()) && In->axis() >= 0)
        OS << " over " << str(P.axes()->Get(In->axis())->name()) << " group "
           << groupStr(groupOf(P, In->axis(), R.rank()));
      std::string Attrs = attrStr(R, *In);
      if (!Attrs.empty())
        OS << " " << Attrs;
      if (!Outs.empty()) {
        OS << " :";
        for (size_t K = 0; K < Outs.size(); ++K)
          OS << (K ? ", " : " ") << bufStr(R, Outs[K]);
      }
      if (In->round_bf16())
        OS << "   [rounded to bf16]";
      if (In->generation_only())
        OS << "   [generation only]";
      if (!str(In->loc()).empty())
        OS << "   " << str(In->loc());
      OS << "\n";
    }
  }
}

std::string hex64(uint64_t V) {
  char Buf[32];
  std::snprintf(Buf, sizeof(Buf), "0x%016" PRIx64, V);
  return Buf;
}

} // namespace

bool writePlanText(const LoadedPlan &plan, int rank,
                   const std::function<bool(std::string_view)> &write) {
  bool Wrote = false;
  auto Write = [&](const std::string &Text) {
    Wrote = true;
    return write(Text);
  };
  try {
    if (!plan.plan || !plan.program)
      return write("<no plan loaded>\n");
    const Program &P = *plan.program;
    std::ostringstream OS;
    OS << "megac plan (format " << plan.plan->format_version()
       << ", producer \"" << str(plan.plan->producer()) << "\")\n";
    OS << "model " << str(P.model_name()) << " (hash " << hex64(P.model_hash())
       << "), world size " << P.world_size() << ", grid " << gridString(P)
       << ", batch " << P.batch() << ", seq " << P.seq() << ", vocab "
       << P.vocab_size() << ", seed " << P.seed();
    if (P.global_batch())
      OS << ", global batch " << P.global_batch();
    if (P.micro_batches() > 1)
      OS << " in " << P.micro_batches() << " micro-batches";
    OS << "\n";
    OS << "instructions: " << instrCount(P) << " in " << P.ranks()->size()
       << (P.ranks()->size() == 1 ? " rank's stream, " : " ranks' streams, ")
       << distinctInstrCount(P) << " distinct\n";
    if (const TrainConfig *T = P.train())
      OS << "train: lr " << fmtDouble(T->max_lr()) << " -> "
         << fmtDouble(T->min_lr()) << ", warmup " << T->warmup_steps()
         << " steps, total " << T->total_steps() << " steps\n";
    if (P.axes())
      for (const Axis *A : *P.axes()) {
        OS << "axis " << str(A->name()) << " (size " << A->size()
           << "): groups";
        for (const Group *G : *A->groups())
          OS << " " << groupStr(G);
        OS << "\n";
      }
    if (P.target() && P.target()->size())
      OS << "target " << str(P.target()) << "\n";
    if (P.kernels())
      for (uint32_t K = 0; K < P.kernels()->size(); ++K) {
        const Kernel *Kn = P.kernels()->Get(K);
        OS << "kernel " << K << " " << str(Kn->name()) << ": "
           << Kn->inputs() << " inputs,";
        for (const FusedStep *St : *Kn->steps()) {
          OS << " " << opcodeName(St->op());
        }
        if (Kn->binaries())
          for (const KernelBinary *B : *Kn->binaries())
            OS << "; " << str(B->arch())
               << (parseArch(str(B->arch())).Ptx ? " ptx " : " cubin ")
               << (B->cubin() ? B->cubin()->size() : 0) << " bytes";
        OS << "\n";
      }
    // The ranks are written one at a time (a plan of hundreds of ranks
    // prints hundreds of MB).
    if (!Write(OS.str()))
      return false;
    for (const RankProgram *R : *P.ranks())
      if (rank < 0 || uint32_t(rank) == R->rank()) {
        std::ostringstream RankText;
        dumpRankText(RankText, P, *R);
        if (!Write(RankText.str()))
          return false;
      }
    return true;
  } catch (...) {
    if (Wrote)
      return false;
    return write("<error while printing the plan>\n");
  }
}

namespace {
/// The whole text \p writeDump (writePlanText or writePlanJson) gives of
/// rank \p rank, or \p failed where it is not whole.
std::string
wholeDump(bool (*writeDump)(const LoadedPlan &, int,
                            const std::function<bool(std::string_view)> &),
          const LoadedPlan &plan, int rank, const char *failed) {
  std::string Out;
  if (!writeDump(plan, rank, [&Out](std::string_view Text) {
        Out += Text;
        return true;
      }))
    return failed;
  return Out;
}
} // namespace

std::string dumpPlanText(const LoadedPlan &plan, int rank) {
  return wholeDump(writePlanText, plan, rank,
                   "<error while printing the plan>\n");
}

namespace {

nlohmann::json jsonList(const flatbuffers::Vector<int64_t> *V) {
  nlohmann::json J = nlohmann::json::array();
  if (V)
    for (int64_t X : *V)
      J.push_back(X);
  return J;
}

nlohmann::json rankJson(const Program &P, const RankProgram &R) {
  using nlohmann::json;
  json J;
  J["rank"] = R.rank();
  json Coords = json::object();
  for (size_t A = 0; A < (P.axes() ? P.axes()->size() : 0); ++A)
    Coords[str(P.axes()->Get(A)->name())] = R.coords()->Get(A);
  J["coords"] = Coords;
  json Bufs = json::array();
  if (R.buffers())
    for (uint32_t B = 0; B < R.buffers()->size(); ++B) {
      const Buffer *Buf = R.buffers()->Get(B);
      Bufs.push_back({{"id", B},
                      {"dtype", dtypeStr(Buf->dtype())},
                      {"shape", jsonList(Buf->shape())},
                      {"name", str(Buf->name())}});
    }
  J["buffers"] = Bufs;
  json Params = json::array();
  if (R.params())
    for (const Param *Pa : *R.params()) {
      json Q = {{"name", str(Pa->name())},
                {"buffer", Pa->buffer()},
                {"shape", jsonList(R.buffers()->Get(Pa->buffer())->shape())},
                {"global_shape", jsonList(Pa->global_shape())},
                {"offset", jsonList(Pa->offset())},
                {"init", Pa->init() == ik::Zeros  ? "zeros"
                         : Pa->init() == ik::Ones ? "ones"
                                                        : "normal"},
                {"std", Pa->std()},
                {"hf_name", str(Pa->hf_name())},
                {"hf_offset", jsonList(Pa->hf_offset())}};
      if (Pa->hf_shape())
        Q["hf_shape"] = jsonList(Pa->hf_shape());
      Params.push_back(Q);
    }
  J["params"] = Params;
  json Inputs = json::array();
  if (R.inputs())
    for (const Input *In : *R.inputs())
      Inputs.push_back({{"name", str(In->name())},
                        {"buffer", In->buffer()},
                        {"kind", str(In->kind())},
                        {"batch_offset", In->batch_offset()}});
  J["inputs"] = Inputs;
  json Outputs = json::array();
  if (R.outputs())
    for (const Output *O : *R.outputs())
      Outputs.push_back({{"name", str(O->name())}, {"buffer", O->buffer()}});
  J["outputs"] = Outputs;
  json Instrs = json::array();
  if (R.instrs())
    for (uint32_t I = 0; I < R.instrs()->size(); ++I) {
      const Instr *In = R.instrs()->Get(I);
      json X;
      X["index"] = I;
      X["op"] = opcodeName(In->op());
      json Ins = json::array(), Outs = json::array(), Fl = json::array();
      if (In->inputs())
        for (uint32_t B : *In->inputs())
          Ins.push_back(B);
      if (In->outputs())
        for (uint32_t B : *In->outputs())
          Outs.push_back(B);
      if (In->floats())
        for (double F : *In->floats())
          Fl.push_back(F);
      X["inputs"] = Ins;
      X["outputs"] = Outs;
      X["ints"] = jsonList(In->ints());
      X["floats"] = Fl;
      X["axis"] = In->axis();
      json G = nullptr;
      if (In->axis() >= 0) {
        G = json::array();
        if (const Group *Gr = groupOf(P, In->axis(), R.rank()))
          for (uint32_t Rk : *Gr->ranks())
            G.push_back(Rk);
      }
      X["group"] = G;
      X["loc"] = str(In->loc());
      if (In->generation_only())
        X["generation_only"] = true;
      if (In->round_bf16())
        X["round_bf16"] = true;
      if (In->op() == op::AdamW) {
        // The effective values: from the param input 0 is when not set.
        std::string Name;
        Shape Off;
        if (adamParam(R, *In, Name, Off)) {
          X["param_name"] = Name;
          X["param_offset"] = Off;
        }
      }
      if (In->op() == op::Dropout && In->ints() && In->ints()->size() >= 2 &&
          In->floats() && In->floats()->size() == 1) {
        // The attributes by name (the verifier checked their layout).
        const size_t Rk = size_t(In->ints()->Get(1));
        if (In->ints()->size() == 2 + 2 * Rk) {
          X["rate"] = In->floats()->Get(0);
          X["stream"] = In->ints()->Get(0);
          X["global_shape"] = Shape(In->ints()->begin() + 2,
                                    In->ints()->begin() + 2 + long(Rk));
          X["offset"] = Shape(In->ints()->begin() + 2 + long(Rk),
                              In->ints()->end());
        }
      }
      Instrs.push_back(X);
    }
  J["instructions"] = Instrs;
  J["forward_end"] = R.forward_end();
  J["accumulate_end"] = R.accumulate_end();
  if (R.segments()) {
    json Segs = json::array(), Tasks = json::array();
    for (const Segment *S : *R.segments())
      Segs.push_back({{"begin", S->begin()},
                      {"end", S->end()},
                      {"stage", S->stage()},
                      {"backward", S->backward()}});
    if (R.schedule())
      for (const Task *T : *R.schedule())
        Tasks.push_back(
            {{"segment", T->segment()}, {"micro_batch", T->micro_batch()}});
    J["segments"] = Segs;
    J["schedule"] = Tasks;
  }
  return J;
}

} // namespace

bool writePlanJson(const LoadedPlan &plan, int rank,
                   const std::function<bool(std::string_view)> &write) {
  // Stops at the first piece the writer refuses.
  bool Wrote = false, Refused = false;
  auto Write = [&](std::string_view Text) {
    Wrote = true;
    Refused = Refused || !write(Text);
  };
  try {
    using nlohmann::json;
    if (!plan.plan || !plan.program)
      return write("{}");
    const Program &P = *plan.program;
    json J;
    J["format_version"] = plan.plan->format_version();
    J["producer"] = str(plan.plan->producer());
    J["model"] = str(P.model_name());
    J["model_hash"] = P.model_hash();
    J["world_size"] = P.world_size();
    J["instructions"] = instrCount(P);
    J["distinct_instructions"] = distinctInstrCount(P);
    json Axes = json::array();
    if (P.axes())
      for (const Axis *A : *P.axes()) {
        json Groups = json::array();
        for (const Group *G : *A->groups()) {
          json Rs = json::array();
          for (uint32_t R : *G->ranks())
            Rs.push_back(R);
          Groups.push_back(Rs);
        }
        Axes.push_back(
            {{"name", str(A->name())}, {"size", A->size()}, {"groups", Groups}});
      }
    J["axes"] = Axes;
    J["batch"] = P.batch();
    J["seq"] = P.seq();
    J["vocab_size"] = P.vocab_size();
    J["seed"] = P.seed();
    J["global_batch"] = P.global_batch();
    J["micro_batches"] = P.micro_batches();
    if (P.pipeline_stages() > 1) {
      J["pipeline_stages"] = P.pipeline_stages();
      J["pipeline_schedule"] = str(P.pipeline_schedule());
    }
    if (const TrainConfig *T = P.train())
      J["train"] = {{"max_lr", T->max_lr()},
                    {"min_lr", T->min_lr()},
                    {"warmup_steps", T->warmup_steps()},
                    {"total_steps", T->total_steps()}};
    else
      J["train"] = nullptr;
    // What the text dump says of the target and its kernels, which the
    // fused instructions name by index.
    J["target"] = P.target() && P.target()->size() ? str(P.target()) : "cpu";
    json Kernels = json::array();
    if (P.kernels())
      for (const Kernel *Kn : *P.kernels()) {
        json Steps = json::array(), Binaries = json::array();
        for (const FusedStep *St : *Kn->steps())
          Steps.push_back(opcodeName(St->op()));
        if (Kn->binaries())
          for (const KernelBinary *B : *Kn->binaries())
            Binaries.push_back(
                {{"arch", str(B->arch())},
                 {"kind", parseArch(str(B->arch())).Ptx ? "ptx" : "cubin"},
                 {"bytes", B->cubin() ? B->cubin()->size() : 0}});
        Kernels.push_back({{"name", str(Kn->name())},
                           {"inputs", Kn->inputs()},
                           {"steps", Steps},
                           {"binaries", Binaries}});
      }
    J["kernels"] = Kernels;
    // The ranks are written one at a time where a placeholder stands, as
    // the whole document would print them (elements at 4 spaces): the
    // JSON of a plan of hundreds of ranks once took 1.8 GB to print.
    const std::string Placeholder = "megac-ranks-placeholder";
    J["ranks"] = Placeholder;
    // Invalid UTF-8 in names must not throw: replace it.
    auto Dump = [](const json &Value) {
      return Value.dump(2, ' ', false, json::error_handler_t::replace);
    };
    const std::string Head = Dump(J);
    // (Found as the top-level key's value: a name in the plan cannot hold
    // a raw line break, so the text cannot appear elsewhere.)
    const std::string Key = "\n  \"ranks\": ";
    const size_t At =
        Head.find(Key + '"' + Placeholder + '"') + Key.size();
    Write(std::string_view(Head).substr(0, At));
    bool First = true;
    for (const RankProgram *R : *P.ranks()) {
      if (Refused)
        return false;
      if (rank >= 0 && uint32_t(rank) != R->rank())
        continue;
      std::string Element = Dump(rankJson(P, *R));
      std::string Indented;
      Indented.reserve(Element.size() + Element.size() / 8);
      for (char C : Element) {
        Indented += C;
        if (C == '\n')
          Indented += "    ";
      }
      Write(First ? "[\n    " : ",\n    ");
      Write(Indented);
      First = false;
    }
    Write(First ? "[]" : "\n  ]");
    Write(std::string_view(Head).substr(At + Placeholder.size() + 2));
    Write("\n");
    return !Refused;
  } catch (...) {
    // (Out of memory, say: what was written is cut short, and said so.)
    if (Wrote)
      return false;
    return write("{}");
  }
}

std::string dumpPlanJson(const LoadedPlan &plan, int rank) {
  return wholeDump(writePlanJson, plan, rank, "{}");
}

} // namespace megac_rt
