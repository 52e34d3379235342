//===- plan_builder.h - Mutable plan description for tests and demos -*- C++ -*-===//
//
// A plain-struct mirror of the Program schema plus a serializer. The unit
// tests and megac-plan-demo build plans through it instead of calling the
// flatbuffers builder directly; keeping the mirror here (rather than using
// flatc's object API) leaves plan_generated.h, which the compiler includes,
// as small as possible. Header-only on purpose: the demo tool does not link
// the runtime core.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_PLAN_BUILDER_H
#define MEGAC_RT_PLAN_BUILDER_H

#include "megac_rt/plan_file.h"
#include "plan_enums.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megac_rt {
namespace builder {

// The generated enums are unscoped (op::Linear, dt::F32, ...).
using namespace megac::plan;

struct BufferDesc {
  DType dtype = dt::F32;
  std::vector<int64_t> shape;
  std::string name;
  /// Leaves the shape field out, as a hand-made plan may (the verifier's
  /// tests; a scalar's shape is []).
  bool omitShape = false;
};

struct ParamDesc {
  std::string name;
  uint32_t buffer = 0;
  std::vector<int64_t> globalShape, offset;
  InitKind init = ik::Zeros;
  double std = 0;
  std::string hfName;
  std::vector<int64_t> hfOffset;
};

struct InstrDesc {
  InstrDesc() = default;
  InstrDesc(OpCode Op, std::vector<uint32_t> Inputs,
            std::vector<uint32_t> Outputs, std::vector<int64_t> Ints = {},
            std::vector<double> Floats = {}, int32_t Axis = -1,
            std::string Loc = "", std::string ParamName = "",
            std::vector<int64_t> ParamOffset = {})
      : op(Op), inputs(std::move(Inputs)), outputs(std::move(Outputs)),
        ints(std::move(Ints)), floats(std::move(Floats)), axis(Axis),
        loc(std::move(Loc)), paramName(std::move(ParamName)),
        paramOffset(std::move(ParamOffset)) {}

  OpCode op = op::Add;
  std::vector<uint32_t> inputs, outputs;
  /// Leaves the outputs field out, as a hand-made plan may (the verifier's
  /// tests).
  bool omitOutputs = false;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  int32_t axis = -1;
  std::string loc;
  // adam_w only (format 3): the parameter input 0 holds a slice of, and
  // where that slice starts; empty: input 0 is the parameter itself.
  std::string paramName;
  std::vector<int64_t> paramOffset;
  // Format 5: needed only for generation; training steps skip it.
  bool generationOnly = false;
  bool roundBf16 = false; // format 7: the output rounded as it is written
};

struct NamedBuffer {
  std::string name;
  uint32_t buffer = 0;
  std::string kind;        // inputs only
  int64_t batchOffset = 0; // inputs only
};

struct RankDesc {
  uint32_t rank = 0;
  std::vector<int64_t> coords;
  std::vector<BufferDesc> buffers;
  std::vector<ParamDesc> params;
  std::vector<NamedBuffer> inputs, outputs;
  std::vector<InstrDesc> instrs;
  int32_t forwardEnd = -1;
  int32_t accumulateEnd = -1; // format 5: gradient accumulation
  // Format 6: pipeline segments {begin, end, stage, backward} and the
  // schedule's tasks {segment, micro-batch}.
  struct SegmentDesc {
    uint32_t begin, end, stage;
    bool backward;
  };
  std::vector<SegmentDesc> segments;
  std::vector<std::pair<uint32_t, uint32_t>> schedule;

  uint32_t addBuffer(DType T, std::vector<int64_t> Shape, std::string Name) {
    buffers.push_back({T, std::move(Shape), std::move(Name)});
    return uint32_t(buffers.size() - 1);
  }
  /// Appends an instruction with a fresh f32 (or \p T) result buffer.
  uint32_t emit(OpCode Op, std::vector<uint32_t> Ins,
                std::vector<int64_t> OutShape, std::vector<int64_t> Ints = {},
                std::vector<double> Floats = {}, int32_t Axis = -1,
                std::string Loc = "", DType T = dt::F32) {
    uint32_t Out = addBuffer(T, std::move(OutShape), Loc);
    instrs.push_back({Op, std::move(Ins), {Out}, std::move(Ints),
                      std::move(Floats), Axis, std::move(Loc)});
    return Out;
  }
};

struct AxisDesc {
  std::string name;
  uint32_t size = 1;
  std::vector<std::vector<uint32_t>> groups;
};

struct ProgramDesc {
  std::string modelName = "test";
  uint64_t modelHash = 0;
  uint32_t worldSize = 1;
  std::vector<AxisDesc> axes;
  int64_t batch = 1, seq = 1, vocabSize = 1;
  uint64_t seed = 0;
  std::vector<RankDesc> ranks;
  // Training plans.
  bool hasTrain = false;
  double maxLr = 0, minLr = 0;
  int64_t warmupSteps = 0, totalSteps = 0;
  int64_t globalBatch = 0;
  int64_t microBatches = 0; // format 5: gradient accumulation
  uint32_t pipelineStages = 0; // format 6
  std::string pipelineSchedule;
  // Format 6: generated kernels (their steps; no binaries).
  struct KernelDesc {
    std::string name;
    std::vector<std::pair<OpCode, std::vector<int32_t>>> steps;
    uint32_t inputs = 0;
  };
  std::string target;
  std::vector<KernelDesc> kernels;
};

/// Serializes \p P into the bytes of a finished Program flatbuffer.
inline std::vector<uint8_t> serializeProgram(const ProgramDesc &P) {
  namespace fb = megac::plan;
  flatbuffers::FlatBufferBuilder B;
  std::vector<flatbuffers::Offset<fb::Axis>> Axes;
  for (const AxisDesc &A : P.axes) {
    std::vector<flatbuffers::Offset<fb::Group>> Groups;
    for (const auto &G : A.groups)
      Groups.push_back(fb::CreateGroupDirect(B, &G));
    Axes.push_back(fb::CreateAxisDirect(B, A.name.c_str(), A.size, &Groups));
  }
  std::vector<flatbuffers::Offset<fb::RankProgram>> Ranks;
  for (const RankDesc &R : P.ranks) {
    std::vector<flatbuffers::Offset<fb::Buffer>> Bufs;
    for (const BufferDesc &D : R.buffers)
      Bufs.push_back(fb::CreateBufferDirect(
          B, D.dtype, D.omitShape ? nullptr : &D.shape, D.name.c_str()));
    std::vector<flatbuffers::Offset<fb::Param>> Params;
    for (const ParamDesc &D : R.params)
      Params.push_back(fb::CreateParamDirect(
          B, D.name.c_str(), D.buffer, &D.globalShape, &D.offset, D.init,
          D.std, D.hfName.c_str(), &D.hfOffset));
    std::vector<flatbuffers::Offset<fb::Input>> Inputs;
    for (const NamedBuffer &D : R.inputs)
      Inputs.push_back(fb::CreateInputDirect(B, D.name.c_str(), D.buffer,
                                             D.kind.c_str(), D.batchOffset));
    std::vector<flatbuffers::Offset<fb::Output>> Outputs;
    for (const NamedBuffer &D : R.outputs)
      Outputs.push_back(fb::CreateOutputDirect(B, D.name.c_str(), D.buffer));
    std::vector<flatbuffers::Offset<fb::Instr>> Instrs;
    for (const InstrDesc &D : R.instrs)
      Instrs.push_back(fb::CreateInstrDirect(
          B, D.op, &D.inputs, D.omitOutputs ? nullptr : &D.outputs, &D.ints,
          &D.floats, D.axis, D.loc.c_str(),
          D.paramName.empty() ? nullptr : D.paramName.c_str(),
          D.paramOffset.empty() ? nullptr : &D.paramOffset, D.generationOnly,
          D.roundBf16));
    std::vector<flatbuffers::Offset<fb::Segment>> Segments;
    for (const auto &S : R.segments)
      Segments.push_back(
          fb::CreateSegment(B, S.begin, S.end, S.stage, S.backward));
    std::vector<flatbuffers::Offset<fb::Task>> Tasks;
    for (auto [Segment, Micro] : R.schedule)
      Tasks.push_back(fb::CreateTask(B, Segment, Micro));
    Ranks.push_back(fb::CreateRankProgramDirect(
        B, R.rank, &R.coords, &Bufs, &Params, &Inputs, &Outputs, &Instrs,
        R.forwardEnd, R.accumulateEnd, Segments.empty() ? nullptr : &Segments,
        Tasks.empty() ? nullptr : &Tasks));
  }
  flatbuffers::Offset<fb::TrainConfig> Train = 0;
  if (P.hasTrain)
    Train = fb::CreateTrainConfig(B, P.maxLr, P.minLr, P.warmupSteps,
                                  P.totalSteps);
  std::vector<flatbuffers::Offset<fb::Kernel>> Kernels;
  for (const auto &K : P.kernels) {
    std::vector<flatbuffers::Offset<fb::FusedStep>> Steps;
    for (const auto &[Op, Args] : K.steps)
      Steps.push_back(fb::CreateFusedStepDirect(B, Op, &Args));
    Kernels.push_back(fb::CreateKernelDirect(B, K.name.c_str(), &Steps,
                                             K.inputs, "", nullptr));
  }
  auto Root = fb::CreateProgramDirect(B, P.modelName.c_str(), P.modelHash,
                                      P.worldSize, &Axes, P.batch, P.seq,
                                      P.vocabSize, P.seed, &Ranks, Train,
                                      P.globalBatch, P.microBatches,
                                      P.pipelineStages,
                                      P.pipelineSchedule.empty()
                                          ? nullptr
                                          : P.pipelineSchedule.c_str(),
                                      P.target.empty() ? nullptr
                                                       : P.target.c_str(),
                                      Kernels.empty() ? nullptr : &Kernels);
  B.Finish(Root);
  return std::vector<uint8_t>(B.GetBufferPointer(),
                              B.GetBufferPointer() + B.GetSize());
}

/// Serializes and frames \p P into the bytes of a plan file.
inline std::vector<uint8_t> buildPlanBytes(const ProgramDesc &P,
                                           const std::string &Producer =
                                               "megac-rt test") {
  std::vector<uint8_t> Body = serializeProgram(P);
  return wrapProgram(Body.data(), Body.size(), Producer);
}

/// Options of the demo GPT-2 plan (Megatron-style tensor parallelism).
struct Gpt2DemoOptions {
  int64_t nLayer = 2, nEmbd = 64, nHead = 4, vocab = 128, nPositions = 64;
  int64_t batch = 2, seq = 16;
  uint32_t tp = 1;
  uint64_t seed = 1234;
  double eps = 1e-5;
  bool loss = true;
};

/// Builds a GPT-2 forward plan sharded over a `tp` axis the way Megatron-LM
/// does: vocab-parallel embedding (+ all_reduce), column-parallel q/k/v and
/// c_fc, row-parallel projections (+ all_reduce), vocab-parallel tied
/// logits gathered along the vocabulary. Parameter names and HF mappings are
/// identical for every tp, so a seeded init is the same model at any tp.
inline ProgramDesc buildGpt2Demo(const Gpt2DemoOptions &O) {
  ProgramDesc P;
  P.modelName = "gpt2";
  P.modelHash = 0x6d65676163677074ull;
  P.worldSize = O.tp;
  P.batch = O.batch;
  P.seq = O.seq;
  P.vocabSize = O.vocab;
  P.seed = O.seed;
  AxisDesc Tp{"tp", O.tp, {{}}};
  for (uint32_t R = 0; R < O.tp; ++R)
    Tp.groups[0].push_back(R);
  P.axes.push_back(Tp);

  const int64_t H = O.nEmbd, T = O.tp, B = O.batch, S = O.seq;
  for (uint32_t C = 0; C < O.tp; ++C) {
    RankDesc R;
    R.rank = C;
    R.coords = {C};
    auto Param = [&](const std::string &Name, std::vector<int64_t> Global,
                     std::vector<int64_t> Local, std::vector<int64_t> Off,
                     InitKind Init, const std::string &Hf,
                     std::vector<int64_t> HfOff) {
      uint32_t Buf = R.addBuffer(dt::F32, Local, Name);
      R.params.push_back({Name, Buf, std::move(Global), std::move(Off), Init,
                          Init == ik::Normal ? 0.02 : 0.0, Hf,
                          std::move(HfOff)});
      return Buf;
    };
    auto Full = [&](const std::string &Name, std::vector<int64_t> Shape,
                    InitKind Init) {
      std::vector<int64_t> Zero(Shape.size(), 0);
      return Param(Name, Shape, Shape, Zero, Init, Name, Zero);
    };
    const int64_t Vl = O.vocab / T, Hl = H / T, Fl = 4 * H / T;
    uint32_t Wte = Param("wte.weight", {O.vocab, H}, {Vl, H}, {C * Vl, 0},
                         ik::Normal, "wte.weight", {0, 0});
    uint32_t Wpe = Full("wpe.weight", {O.nPositions, H}, ik::Normal);
    uint32_t Tok = R.addBuffer(dt::I32, {B, S}, "tokens");
    R.inputs.push_back({"tokens", Tok, "tokens"});
    uint32_t Lab = 0;
    if (O.loss) {
      Lab = R.addBuffer(dt::I32, {B, S}, "labels");
      R.inputs.push_back({"labels", Lab, "labels"});
    }
    const int32_t Ax = 0;
    uint32_t E = R.emit(op::Embedding, {Wte, Tok}, {B, S, H}, {C * Vl},
                        {}, -1, "wte");
    E = R.emit(op::AllReduce, {E}, {B, S, H}, {}, {}, Ax, "wte.reduce");
    uint32_t Pe = R.emit(op::PositionEmbedding, {Wpe, Tok}, {S, H}, {},
                         {}, -1, "wpe");
    uint32_t X = R.emit(op::Add, {E, Pe}, {B, S, H}, {}, {}, -1, "embed");

    auto LN = [&](uint32_t In, const std::string &Name) {
      uint32_t G = Full(Name + ".weight", {H}, ik::Ones);
      uint32_t Bb = Full(Name + ".bias", {H}, ik::Zeros);
      return R.emit(op::LayerNorm, {In, G, Bb}, {B, S, H}, {}, {O.eps},
                    -1, Name);
    };
    for (int64_t L = 0; L < O.nLayer; ++L) {
      std::string Pfx = "h." + std::to_string(L) + ".";
      uint32_t A = LN(X, Pfx + "ln_1");
      uint32_t QKV[3];
      const char *Names[3] = {"q", "k", "v"};
      for (int I = 0; I < 3; ++I) {
        std::string N = Pfx + "attn." + Names[I];
        uint32_t W = Param(N + ".weight", {H, H}, {H, Hl}, {0, C * Hl},
                           ik::Normal, Pfx + "attn.c_attn.weight",
                           {0, I * H});
        uint32_t Bi = Param(N + ".bias", {H}, {Hl}, {C * Hl}, ik::Zeros,
                            Pfx + "attn.c_attn.bias", {I * H});
        uint32_t Y =
            R.emit(op::Linear, {A, W}, {B, S, Hl}, {0}, {}, -1, N);
        QKV[I] = R.emit(op::Add, {Y, Bi}, {B, S, Hl}, {}, {}, -1, N);
      }
      uint32_t At = R.emit(op::Attention, {QKV[0], QKV[1], QKV[2]},
                           {B, S, Hl}, {O.nHead / T, 1}, {}, -1,
                           Pfx + "attn");
      uint32_t Wo = Param(Pfx + "attn.c_proj.weight", {H, H}, {Hl, H},
                          {C * Hl, 0}, ik::Normal,
                          Pfx + "attn.c_proj.weight", {0, 0});
      uint32_t Bo = Full(Pfx + "attn.c_proj.bias", {H}, ik::Zeros);
      uint32_t Y = R.emit(op::Linear, {At, Wo}, {B, S, H}, {0}, {}, -1,
                          Pfx + "attn.c_proj");
      Y = R.emit(op::AllReduce, {Y}, {B, S, H}, {}, {}, Ax,
                 Pfx + "attn.reduce");
      Y = R.emit(op::Add, {Y, Bo}, {B, S, H}, {}, {}, -1,
                 Pfx + "attn.c_proj.bias");
      X = R.emit(op::Add, {X, Y}, {B, S, H}, {}, {}, -1,
                 Pfx + "residual1");

      uint32_t M = LN(X, Pfx + "ln_2");
      uint32_t Wf = Param(Pfx + "mlp.c_fc.weight", {H, 4 * H}, {H, Fl},
                          {0, C * Fl}, ik::Normal,
                          Pfx + "mlp.c_fc.weight", {0, 0});
      uint32_t Bf = Param(Pfx + "mlp.c_fc.bias", {4 * H}, {Fl}, {C * Fl},
                          ik::Zeros, Pfx + "mlp.c_fc.bias", {0});
      uint32_t F = R.emit(op::Linear, {M, Wf}, {B, S, Fl}, {0}, {}, -1,
                          Pfx + "mlp.c_fc");
      F = R.emit(op::Add, {F, Bf}, {B, S, Fl}, {}, {}, -1,
                 Pfx + "mlp.c_fc.bias");
      F = R.emit(op::Gelu, {F}, {B, S, Fl}, {}, {}, -1, Pfx + "mlp.gelu");
      uint32_t Wp = Param(Pfx + "mlp.c_proj.weight", {4 * H, H}, {Fl, H},
                          {C * Fl, 0}, ik::Normal,
                          Pfx + "mlp.c_proj.weight", {0, 0});
      uint32_t Bp = Full(Pfx + "mlp.c_proj.bias", {H}, ik::Zeros);
      Y = R.emit(op::Linear, {F, Wp}, {B, S, H}, {0}, {}, -1,
                 Pfx + "mlp.c_proj");
      Y = R.emit(op::AllReduce, {Y}, {B, S, H}, {}, {}, Ax,
                 Pfx + "mlp.reduce");
      Y = R.emit(op::Add, {Y, Bp}, {B, S, H}, {}, {}, -1,
                 Pfx + "mlp.c_proj.bias");
      X = R.emit(op::Add, {X, Y}, {B, S, H}, {}, {}, -1,
                 Pfx + "residual2");
    }
    X = LN(X, "ln_f");
    uint32_t Lg = R.emit(op::Linear, {X, Wte}, {B, S, Vl}, {1}, {}, -1,
                         "lm_head");
    Lg = R.emit(op::AllGather, {Lg}, {B, S, O.vocab}, {2}, {}, Ax,
                "lm_head.gather");
    R.outputs.push_back({"logits", Lg, ""});
    if (O.loss) {
      uint32_t Loss = R.emit(op::CrossEntropy, {Lg, Lab}, {}, {}, {}, -1,
                             "loss");
      R.outputs.push_back({"loss", Loss, ""});
    }
    P.ranks.push_back(std::move(R));
  }
  return P;
}

/// Options of the hand-built training plan.
struct TrainDemoOptions {
  int64_t vocab = 16, nEmbd = 32, nFf = 64, nPositions = 16;
  int64_t batch = 4, seq = 16; // batch = global batch rows
  uint32_t dp = 1;             // data-parallel degree (= world size)
  uint64_t seed = 1234;
  double eps = 1e-5;
  double maxLr = 1e-2, minLr = 1e-3;
  int64_t warmup = 5, totalSteps = 50;
  double clip = 1.0; // 0: no clipping (coefficient = fill 1.0)
  double beta1 = 0.9, beta2 = 0.95, adamEps = 1e-8, weightDecay = 0.0;
  // ZeRO stage 1: gradients are reduce-scattered along dim 0 over "dp",
  // each rank updates its dim-0 slice of every parameter (moments for that
  // slice only) and the slices are all-gathered back into the parameters.
  // Every parameter's dim 0 must be divisible by dp.
  bool zero = false;
};

/// A small model trained end to end without the compiler, so that the
/// runtime's training loop, checkpoints and generation are testable on
/// their own:
///
///   x = wte[tokens] + wpe[:S];  h = layer_norm(x)
///   r = x + gelu(h @ fc.w + fc.b) @ proj.w;  logits = r @ wte^T (tied)
///   loss = cross_entropy(logits, labels) normalized by the global tokens
///
/// followed by the hand-derived backward pass, optional global-norm
/// clipping and AdamW on every parameter. With dp > 1 each rank takes
/// batch/dp rows (batch_offset) and gradients and loss are all-reduced over
/// the "dp" axis. With `zero`, the optimizer follows ZeRO stage 1 instead:
///
///   g_shard = reduce_scatter(g, dim 0)          (instead of all_reduce)
///   p_shard = slice_shard(p, dim 0)
///   adam_w(p_shard, g_shard, coef) {param_name = p, param_offset = shard}
///   p = assign(all_gather(p_shard, dim 0))
///
/// and the clipping norm sums the shards' squares and all-reduces the total.
inline ProgramDesc buildTrainDemo(const TrainDemoOptions &O) {
  ProgramDesc P;
  P.modelName = "train-demo";
  // The hash identifies the architecture (shapes), not the data layout.
  std::string Desc = "train-demo v" + std::to_string(O.vocab) + " h" +
                     std::to_string(O.nEmbd) + " f" + std::to_string(O.nFf) +
                     " p" + std::to_string(O.nPositions);
  uint64_t Hash = 0xcbf29ce484222325ull;
  for (unsigned char C : Desc)
    Hash = (Hash ^ C) * 0x100000001b3ull;
  P.modelHash = Hash;
  P.worldSize = O.dp;
  const int64_t Bl = O.batch / int64_t(O.dp);
  P.batch = Bl;
  P.seq = O.seq;
  P.vocabSize = O.vocab;
  P.seed = O.seed;
  P.hasTrain = true;
  P.maxLr = O.maxLr;
  P.minLr = O.minLr;
  P.warmupSteps = O.warmup;
  P.totalSteps = O.totalSteps;
  P.globalBatch = O.batch;
  AxisDesc Dp{"dp", O.dp, {{}}};
  for (uint32_t R = 0; R < O.dp; ++R)
    Dp.groups[0].push_back(R);
  P.axes.push_back(Dp);

  const int64_t V = O.vocab, H = O.nEmbd, F = O.nFf, S = O.seq,
                Pn = O.nPositions;
  const int64_t Tokens = O.batch * O.seq; // cross-entropy normalizer
  for (uint32_t C = 0; C < O.dp; ++C) {
    RankDesc R;
    R.rank = C;
    R.coords = {C};
    std::vector<std::pair<std::string, uint32_t>> Params;
    auto Param = [&](const std::string &Name, std::vector<int64_t> Shape,
                     InitKind Init, double Std) {
      uint32_t Buf = R.addBuffer(dt::F32, Shape, Name);
      std::vector<int64_t> Zero(Shape.size(), 0);
      R.params.push_back({Name, Buf, Shape, Zero, Init, Std, "", {}});
      Params.push_back({Name, Buf});
      return Buf;
    };
    uint32_t Wte = Param("wte.weight", {V, H}, ik::Normal, 0.1);
    uint32_t Wpe = Param("wpe.weight", {Pn, H}, ik::Normal, 0.1);
    uint32_t G = Param("ln.weight", {H}, ik::Ones, 0);
    uint32_t Be = Param("ln.bias", {H}, ik::Zeros, 0);
    uint32_t Wfc = Param("fc.weight", {H, F}, ik::Normal, 0.1);
    uint32_t Bfc = Param("fc.bias", {F}, ik::Zeros, 0);
    uint32_t Wpr = Param("proj.weight", {F, H}, ik::Normal, 0.1);
    uint32_t Tok = R.addBuffer(dt::I32, {Bl, S}, "tokens");
    uint32_t Lab = R.addBuffer(dt::I32, {Bl, S}, "labels");
    R.inputs.push_back({"tokens", Tok, "tokens", int64_t(C) * Bl});
    R.inputs.push_back({"labels", Lab, "labels", int64_t(C) * Bl});

    // Forward.
    uint32_t E = R.emit(op::Embedding, {Wte, Tok}, {Bl, S, H}, {0}, {}, -1,
                        "wte");
    uint32_t Pe = R.emit(op::PositionEmbedding, {Wpe, Tok}, {S, H}, {}, {},
                         -1, "wpe");
    uint32_t X = R.emit(op::Add, {E, Pe}, {Bl, S, H}, {}, {}, -1, "embed");
    uint32_t Hn = R.emit(op::LayerNorm, {X, G, Be}, {Bl, S, H}, {}, {O.eps},
                         -1, "ln");
    uint32_t Fc = R.emit(op::Linear, {Hn, Wfc}, {Bl, S, F}, {0}, {}, -1,
                         "fc");
    uint32_t Fb = R.emit(op::Add, {Fc, Bfc}, {Bl, S, F}, {}, {}, -1,
                         "fc.bias");
    uint32_t A = R.emit(op::Gelu, {Fb}, {Bl, S, F}, {}, {}, -1, "gelu");
    uint32_t M = R.emit(op::Linear, {A, Wpr}, {Bl, S, H}, {0}, {}, -1,
                        "proj");
    uint32_t Rs = R.emit(op::Add, {X, M}, {Bl, S, H}, {}, {}, -1,
                         "residual");
    uint32_t Lg = R.emit(op::Linear, {Rs, Wte}, {Bl, S, V}, {1}, {}, -1,
                         "lm_head");
    uint32_t Loss = R.emit(op::CrossEntropy, {Lg, Lab}, {}, {Tokens}, {},
                           -1, "loss");
    if (O.dp > 1)
      Loss = R.emit(op::AllReduce, {Loss}, {}, {}, {}, 0, "loss.reduce");
    R.outputs.push_back({"logits", Lg, ""});
    R.outputs.push_back({"loss", Loss, ""});
    R.forwardEnd = int32_t(R.instrs.size());

    // Backward.
    uint32_t One = R.emit(op::Fill, {}, {}, {}, {1.0}, -1, "dloss");
    uint32_t DLg = R.emit(op::CrossEntropyGrad, {Lg, Lab, One}, {Bl, S, V},
                          {Tokens}, {}, -1, "loss.grad");
    uint32_t DWte1 = R.emit(op::LinearWeightGrad, {Rs, DLg}, {V, H}, {1}, {},
                            -1, "lm_head.grad_w");
    uint32_t DRs = R.emit(op::Linear, {DLg, Wte}, {Bl, S, H}, {0}, {}, -1,
                          "lm_head.grad_x");
    uint32_t DWpr = R.emit(op::LinearWeightGrad, {A, DRs}, {F, H}, {0}, {},
                           -1, "proj.grad_w");
    uint32_t DA = R.emit(op::Linear, {DRs, Wpr}, {Bl, S, F}, {1}, {}, -1,
                         "proj.grad_x");
    uint32_t DFb = R.emit(op::GeluGrad, {Fb, DA}, {Bl, S, F}, {}, {}, -1,
                          "gelu.grad");
    uint32_t DBfc = R.emit(op::SumLeading, {DFb}, {F}, {}, {}, -1,
                           "fc.grad_b");
    uint32_t DWfc = R.emit(op::LinearWeightGrad, {Hn, DFb}, {H, F}, {0}, {},
                           -1, "fc.grad_w");
    uint32_t DHn = R.emit(op::Linear, {DFb, Wfc}, {Bl, S, H}, {1}, {}, -1,
                          "fc.grad_x");
    uint32_t DXl = R.emit(op::LayerNormGrad, {X, G, DHn}, {Bl, S, H}, {},
                          {O.eps}, -1, "ln.grad_x");
    uint32_t Xh = R.emit(op::Normalize, {X}, {Bl, S, H}, {}, {O.eps}, -1,
                         "ln.xhat");
    uint32_t DHx = R.emit(op::Mul, {DHn, Xh}, {Bl, S, H}, {}, {}, -1,
                          "ln.grad_w_terms");
    uint32_t DG = R.emit(op::SumLeading, {DHx}, {H}, {}, {}, -1,
                         "ln.grad_w");
    uint32_t DBe = R.emit(op::SumLeading, {DHn}, {H}, {}, {}, -1,
                          "ln.grad_b");
    uint32_t DX = R.emit(op::Add, {DRs, DXl}, {Bl, S, H}, {}, {}, -1,
                         "embed.grad");
    uint32_t DWte2 = R.emit(op::EmbeddingGrad, {Wte, Tok, DX}, {V, H}, {0},
                            {}, -1, "wte.grad");
    uint32_t DPos = R.emit(op::SumLeading, {DX}, {S, H}, {}, {}, -1,
                           "wpe.grad_rows");
    uint32_t DWpe = R.emit(op::PositionEmbeddingGrad, {Wpe, DPos}, {Pn, H},
                           {}, {}, -1, "wpe.grad");
    uint32_t DWte = R.emit(op::Add, {DWte1, DWte2}, {V, H}, {}, {}, -1,
                           "wte.grad_total");
    std::vector<uint32_t> Grads = {DWte, DWpe, DG, DBe, DWfc, DBfc, DWpr};
    const int64_t Dp = int64_t(O.dp);
    for (size_t I = 0; I < Grads.size(); ++I) {
      if (O.zero) {
        std::vector<int64_t> Shard = R.buffers[Grads[I]].shape;
        Shard[0] /= Dp;
        Grads[I] = R.emit(op::ReduceScatter, {Grads[I]}, Shard, {0}, {}, 0,
                          Params[I].first + ".grad_scatter");
      } else if (O.dp > 1) {
        Grads[I] = R.emit(op::AllReduce, {Grads[I]},
                          R.buffers[Grads[I]].shape, {}, {}, 0,
                          Params[I].first + ".grad_reduce");
      }
      R.buffers[Grads[I]].name = "grad/" + Params[I].first;
    }
    uint32_t Coef;
    if (O.clip > 0) {
      uint32_t Total = 0;
      for (size_t I = 0; I < Grads.size(); ++I) {
        uint32_t Sq = R.emit(op::SumSquares, {Grads[I]}, {}, {}, {}, -1,
                             Params[I].first + ".grad_sq");
        Total = I ? R.emit(op::Add, {Total, Sq}, {}, {}, {}, -1,
                           "grad_norm_sq")
                  : Sq;
      }
      // Under ZeRO each rank holds the squares of its gradient shards only.
      if (O.zero && O.dp > 1)
        Total = R.emit(op::AllReduce, {Total}, {}, {}, {}, 0,
                       "grad_norm_sq.reduce");
      Coef = R.emit(op::ClipCoefficient, {Total}, {}, {}, {O.clip}, -1,
                    "clip");
    } else {
      Coef = R.emit(op::Fill, {}, {}, {}, {1.0}, -1, "no_clip");
    }
    const std::vector<double> Hyper = {O.beta1, O.beta2, O.adamEps,
                                       O.weightDecay};
    for (size_t I = 0; I < Grads.size(); ++I) {
      const std::string &Name = Params[I].first;
      const uint32_t Buf = Params[I].second;
      if (!O.zero) {
        R.instrs.push_back({op::AdamW, {Buf, Grads[I], Coef}, {Buf}, {},
                            Hyper, -1, Name + ".adamw"});
        continue;
      }
      std::vector<int64_t> Full = R.buffers[Buf].shape, Shard = Full;
      Shard[0] /= Dp;
      std::vector<int64_t> Off(Full.size(), 0);
      Off[0] = int64_t(C) * Shard[0];
      uint32_t Sl = R.emit(op::SliceShard, {Buf}, Shard, {0}, {}, 0,
                           Name + ".shard");
      R.instrs.push_back({op::AdamW, {Sl, Grads[I], Coef}, {Sl}, {}, Hyper,
                          -1, Name + ".adamw", Name, Off});
      uint32_t G = R.emit(op::AllGather, {Sl}, Full, {0}, {}, 0,
                          Name + ".gather");
      R.instrs.push_back({op::Assign, {G}, {Buf}, {}, {}, -1,
                          Name + ".assign"});
    }
    P.ranks.push_back(std::move(R));
  }
  return P;
}

/// A program for collective tests: `World` ranks on one axis "x", no data.
inline ProgramDesc singleAxisProgram(const std::string &Name, uint64_t Hash,
                                     uint32_t World, uint64_t Seed) {
  ProgramDesc P;
  P.modelName = Name;
  P.modelHash = Hash;
  P.worldSize = World;
  P.batch = P.seq = P.vocabSize = 1;
  P.seed = Seed;
  AxisDesc X{"x", World, {{}}};
  for (uint32_t R = 0; R < World; ++R)
    X.groups[0].push_back(R);
  P.axes.push_back(X);
  return P;
}

/// A forward plan that exercises the collectives on a group of \p World
/// ranks (axis "x"): every rank holds the same parameter "x" of shape
/// [2W, 4W, 6W] (seeded normal, std 1) and contributes y = x * (rank + 1),
/// so the group's sum is x * W(W+1)/2. For each dim d it computes
/// rs<d> = reduce_scatter(y, d) and ag<d> = all_gather(rs<d>, d) (= the
/// whole sum), and assigns ag1 into a second parameter "z" (zeros). Outputs:
/// x, rs0..rs2 (rank 0's chunks), ag0..ag2, z.
inline ProgramDesc buildCollectiveTest(uint32_t World, uint64_t Seed = 1) {
  ProgramDesc P =
      singleAxisProgram("collective-test", 0x636f6c6cull, World, Seed);
  const int64_t W = World;
  const std::vector<int64_t> Shape = {2 * W, 4 * W, 6 * W};
  for (uint32_t C = 0; C < World; ++C) {
    RankDesc R;
    R.rank = C;
    R.coords = {C};
    uint32_t Px = R.addBuffer(dt::F32, Shape, "x");
    R.params.push_back({"x", Px, Shape, {0, 0, 0}, ik::Normal, 1.0, "", {}});
    uint32_t Pz = R.addBuffer(dt::F32, Shape, "z");
    R.params.push_back({"z", Pz, Shape, {0, 0, 0}, ik::Zeros, 0.0, "", {}});
    uint32_t F = R.emit(op::Fill, {}, Shape, {}, {double(C + 1)}, -1,
                        "rank_factor");
    uint32_t Y = R.emit(op::Mul, {Px, F}, Shape, {}, {}, -1, "y");
    R.outputs.push_back({"x", Px, ""});
    uint32_t Ag1 = 0;
    for (int64_t D = 0; D < 3; ++D) {
      std::vector<int64_t> Chunk = Shape;
      Chunk[size_t(D)] /= W;
      std::string Ds = std::to_string(D);
      uint32_t Rs = R.emit(op::ReduceScatter, {Y}, Chunk, {D}, {}, 0,
                           "rs" + Ds);
      uint32_t Ag = R.emit(op::AllGather, {Rs}, Shape, {D}, {}, 0, "ag" + Ds);
      R.outputs.push_back({"rs" + Ds, Rs, ""});
      R.outputs.push_back({"ag" + Ds, Ag, ""});
      if (D == 1)
        Ag1 = Ag;
    }
    R.instrs.push_back({op::Assign, {Ag1}, {Pz}, {}, {}, -1, "assign_z"});
    R.outputs.push_back({"z", Pz, ""});
    P.ranks.push_back(std::move(R));
  }
  return P;
}

/// ints of a dropout (format 4) of the block at \p Offset of a \p Global
/// tensor: [stream, r, global_shape..., offset...].
inline std::vector<int64_t> dropoutInts(int64_t Stream,
                                        const std::vector<int64_t> &Global,
                                        const std::vector<int64_t> &Offset) {
  std::vector<int64_t> I = {Stream, int64_t(Global.size())};
  I.insert(I.end(), Global.begin(), Global.end());
  I.insert(I.end(), Offset.begin(), Offset.end());
  return I;
}

/// Shape of the tensor buildDropoutTest drops out (divisible by 1, 2, 4, 8).
inline std::vector<int64_t> dropoutTestShape() { return {8, 16, 24}; }

/// A forward plan that checks that dropout masks do not depend on the
/// sharding, on a group of \p World ranks (axis "x"; World must divide
/// every dim of dropoutTestShape()). Every rank holds the whole parameter
/// "x" (seeded normal, std 1). For each dim d it takes its block
/// slice_shard(x, d), applies dropout (rate \p Rate, stream 7) with the
/// block's offset in x, and all-gathers the blocks along d into y<d>; so
/// y0, y1 and y2 must all equal the dropout of the whole x, bit for bit,
/// and equal the single-rank plan's. "w" is the dropout of the whole x
/// with stream 8 (a different mask). Outputs: x, y0, y1, y2, w.
inline ProgramDesc buildDropoutTest(uint32_t World, uint64_t Seed = 1,
                                    double Rate = 0.25) {
  ProgramDesc P = singleAxisProgram("dropout-test", 0x64726f70ull, World, Seed);
  const std::vector<int64_t> Shape = dropoutTestShape();
  const std::vector<int64_t> Zero(Shape.size(), 0);
  for (uint32_t C = 0; C < World; ++C) {
    RankDesc R;
    R.rank = C;
    R.coords = {C};
    uint32_t Px = R.addBuffer(dt::F32, Shape, "x");
    R.params.push_back({"x", Px, Shape, Zero, ik::Normal, 1.0, "", {}});
    R.outputs.push_back({"x", Px, ""});
    for (int64_t D = 0; D < 3; ++D) {
      std::vector<int64_t> Block = Shape, Off = Zero;
      Block[size_t(D)] /= int64_t(World);
      Off[size_t(D)] = int64_t(C) * Block[size_t(D)];
      std::string Ds = std::to_string(D);
      uint32_t Xb = R.emit(op::SliceShard, {Px}, Block, {D}, {}, 0,
                           "x_block" + Ds);
      uint32_t Yb = R.emit(op::Dropout, {Xb}, Block,
                           dropoutInts(7, Shape, Off), {Rate}, -1,
                           "dropout" + Ds);
      uint32_t Y = R.emit(op::AllGather, {Yb}, Shape, {D}, {}, 0, "y" + Ds);
      R.outputs.push_back({"y" + Ds, Y, ""});
    }
    uint32_t W = R.emit(op::Dropout, {Px}, Shape, dropoutInts(8, Shape, Zero),
                        {Rate}, -1, "w");
    R.outputs.push_back({"w", W, ""});
    P.ranks.push_back(std::move(R));
  }
  return P;
}

} // namespace builder
} // namespace megac_rt

#endif // MEGAC_RT_PLAN_BUILDER_H
