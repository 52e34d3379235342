//===- PlanFileTest.cpp - Plan framing, verification and dumps ------------===//
//
// The verifier is what stands between a bad file and the executor, so these
// tests corrupt plans in the ways that matter (truncation, bit flips,
// framing, semantics) and check both that they are rejected and that the
// message points at the problem.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace megac_rt;
using namespace megac_rt::builder;

namespace {

std::string verify(const ProgramDesc &P) {
  LoadedPlan L;
  return verifyPlanBytes(buildPlanBytes(P), L);
}

TEST(PlanFile, Crc32KnownVector) {
  const char *S = "123456789";
  EXPECT_EQ(crc32(reinterpret_cast<const uint8_t *>(S), 9), 0xCBF43926u);
  EXPECT_EQ(crc32(nullptr, 0), 0u);
  // In two pieces, continued: the same CRC.
  EXPECT_EQ(crc32Update(crc32(reinterpret_cast<const uint8_t *>(S), 4),
                        reinterpret_cast<const uint8_t *>(S) + 4, 5),
            0xCBF43926u);
  // Long enough for the 8-byte steps, with a tail: zlib.crc32 of bytes
  // (7 i + 3) mod 256, i < 1000, whole and from every split point.
  std::vector<uint8_t> Long(1000);
  for (size_t I = 0; I < Long.size(); ++I)
    Long[I] = uint8_t((7 * I + 3) % 256);
  EXPECT_EQ(crc32(Long.data(), Long.size()), 0x17bc2a46u);
  for (size_t Cut = 0; Cut <= Long.size(); Cut += 37)
    EXPECT_EQ(crc32Update(crc32(Long.data(), Cut), Long.data() + Cut,
                          Long.size() - Cut),
              0x17bc2a46u)
        << Cut;
}

TEST(PlanFile, RoundTrip) {
  std::vector<uint8_t> Bytes = buildPlanBytes(test::tinyProgram(), "unit");
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(Bytes, L), "");
  ASSERT_NE(L.program, nullptr);
  EXPECT_EQ(L.plan->format_version(), kPlanFormatVersion);
  EXPECT_EQ(L.plan->producer()->str(), "unit");
  EXPECT_EQ(L.program->model_name()->str(), "tiny");
  EXPECT_EQ(L.program->ranks()->Get(0)->instrs()->size(), 2u);
  // The views must point into the LoadedPlan's own bytes.
  const uint8_t *Begin = L.bytes.data(), *End = Begin + L.bytes.size();
  auto *PP = reinterpret_cast<const uint8_t *>(L.program);
  EXPECT_TRUE(PP >= Begin && PP < End);
}

TEST(PlanFile, RejectsTruncated) {
  std::vector<uint8_t> Bytes = buildPlanBytes(test::tinyProgram());
  LoadedPlan Whole;
  ASSERT_EQ(verifyPlanBytes(Bytes, Whole), "");
  // Everything up to the last byte of the body is data; only alignment
  // padding (< 8 bytes) may follow it.
  size_t BodyEnd = size_t(Whole.plan->body()->data() - Whole.bytes.data()) +
                   Whole.plan->body()->size();
  EXPECT_GT(BodyEnd + 8, Bytes.size());
  for (size_t N = 0; N < BodyEnd; ++N) {
    LoadedPlan L;
    std::vector<uint8_t> Cut(Bytes.begin(), Bytes.begin() + N);
    ASSERT_NE(verifyPlanBytes(Cut, L), "") << "prefix of " << N << " bytes";
    EXPECT_EQ(L.program, nullptr);
  }
  LoadedPlan L;
  EXPECT_NE(verifyPlanBytes({}, L).find("too small"), std::string::npos);
}

TEST(PlanFile, RejectsEveryBodyByteFlip) {
  std::vector<uint8_t> Bytes = buildPlanBytes(test::tinyProgram());
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(Bytes, L), "");
  size_t Start = size_t(L.plan->body()->data() - L.bytes.data());
  size_t Len = L.plan->body()->size();
  for (size_t I = Start; I < Start + Len; ++I) {
    std::vector<uint8_t> B = Bytes;
    B[I] ^= 0x01;
    LoadedPlan L2;
    std::string Err = verifyPlanBytes(B, L2);
    ASSERT_NE(Err.find("checksum mismatch"), std::string::npos)
        << "byte " << I << ": " << Err;
  }
}

TEST(PlanFile, RejectsWrongIdentifier) {
  std::vector<uint8_t> Bytes = buildPlanBytes(test::tinyProgram());
  Bytes[4] = 'X';
  LoadedPlan L;
  EXPECT_NE(verifyPlanBytes(Bytes, L).find("not a megac plan"),
            std::string::npos);
}

TEST(PlanFile, RejectsWrongVersion) {
  std::vector<uint8_t> Body = serializeProgram(test::tinyProgram());
  flatbuffers::FlatBufferBuilder FBB;
  auto Root = megac::plan::CreatePlan(
      FBB, kPlanFormatVersion + 1, FBB.CreateString("future"),
      crc32(Body.data(), Body.size()), FBB.CreateVector(Body));
  megac::plan::FinishPlanBuffer(FBB, Root);
  std::vector<uint8_t> Bytes(FBB.GetBufferPointer(),
                             FBB.GetBufferPointer() + FBB.GetSize());
  LoadedPlan L;
  EXPECT_EQ(verifyPlanBytes(Bytes, L),
            "plan format version " + std::to_string(kPlanFormatVersion + 1) +
                " is not supported (this runtime reads version " +
                std::to_string(kPlanFormatVersion) + ")");
}

TEST(PlanFile, RoundsOnlyWhereItMayRound) {
  // An add (after tinyProgram's product) may not round its output as it
  // writes it; the embedding and the product may.
  ProgramDesc P = test::tinyProgram();
  auto &R = P.ranks[0];
  const uint32_t Logits = R.outputs[0].buffer;
  R.outputs[0].buffer = R.emit(op::Add, {Logits, Logits}, {2, 3, 8});
  R.instrs[2].roundBf16 = true;
  LoadedPlan L;
  EXPECT_EQ(verifyPlanBytes(buildPlanBytes(P), L),
            "rank 0, instruction 2 (add): round_bf16 is only for the f32 "
            "outputs of linear, linear_bias, linear_gelu_grad, embedding, "
            "layer_norm, layer_norm_grad, attention, attention_grad or "
            "cross_entropy_grad");
  R.instrs[2].roundBf16 = false;
  R.instrs[0].roundBf16 = R.instrs[1].roundBf16 = true;
  EXPECT_EQ(verifyPlanBytes(buildPlanBytes(P), L), "");
}

TEST(PlanFile, RejectsBadBufferIndex) {
  ProgramDesc P = test::tinyProgram();
  P.ranks[0].instrs[1].inputs[1] = 99;
  EXPECT_EQ(verify(P), "rank 0, instruction 1 (linear): input 1 refers to "
                       "buffer %99 but the rank has 5 buffers");
}

TEST(PlanFile, RejectsLinearShapeMismatch) {
  ProgramDesc P = test::tinyProgram();
  P.ranks[0].buffers[1].shape = {5, 8};
  P.ranks[0].params[1].globalShape = {5, 8};
  EXPECT_EQ(verify(P), "rank 0, instruction 1 (linear): input 0 has shape "
                       "[2,3,4] but weight expects K=5");
}

TEST(PlanFile, RejectsUseBeforeDefinition) {
  ProgramDesc P = test::tinyProgram();
  std::swap(P.ranks[0].instrs[0], P.ranks[0].instrs[1]);
  EXPECT_NE(verify(P).find("is read before anything defines it"),
            std::string::npos);
}

TEST(PlanFile, RejectsSemanticErrors) {
  {
    ProgramDesc P = test::tinyProgram();
    P.worldSize = 2;
    EXPECT_NE(verify(P).find("world size"), std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].params[0].offset = {1, 0}; // 1 + 8 rows > 8
    EXPECT_NE(verify(P).find("does not fit"), std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].instrs[0].ints = {-1};
    EXPECT_NE(verify(P).find("vocab_start -1 is negative"), std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].buffers[3].shape = {2, 3, 5}; // embedding result
    EXPECT_NE(verify(P).find("rank 0, instruction 0 (embedding): output has "
                             "shape [2,3,5]"),
              std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].buffers[0].shape = {8, -4};
    EXPECT_NE(verify(P).find("negative shape"), std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].instrs[0].op = op::AllReduce;
    P.ranks[0].instrs[0].inputs = {0};
    EXPECT_NE(verify(P).find("axis -1 is not an axis"), std::string::npos);
  }
}

TEST(PlanFile, VerifiesDemoGpt2AtSeveralTp) {
  for (uint32_t Tp : {1u, 2u, 4u}) {
    Gpt2DemoOptions O;
    O.tp = Tp;
    EXPECT_EQ(verify(buildGpt2Demo(O)), "") << "tp=" << Tp;
  }
}

TEST(PlanFile, RejectsBadGroups) {
  Gpt2DemoOptions O;
  O.tp = 2;
  ProgramDesc P = buildGpt2Demo(O);
  P.axes[0].groups[0] = {1, 0};
  EXPECT_NE(verify(P).find("is at position 0 of its group but has coordinate 1"),
            std::string::npos);
}

TEST(PlanFile, RejectsMismatchedCollectives) {
  Gpt2DemoOptions O;
  O.tp = 2;
  ProgramDesc P = buildGpt2Demo(O);
  // Rank 1 skips its first all_reduce: in MPI this would hang.
  auto &Instrs = P.ranks[1].instrs;
  Instrs[1].op = op::Reshape;
  Instrs[1].axis = -1;
  EXPECT_NE(verify(P).find("disagree on their tp collectives"),
            std::string::npos);
}

TEST(PlanFile, TextAndJsonDumps) {
  Gpt2DemoOptions O;
  O.tp = 2;
  O.nLayer = 1;
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildGpt2Demo(O), "megac 0.1"), L),
            "");
  std::string T = dumpPlanText(L, 1);
  EXPECT_NE(T.find("megac plan (format " +
                   std::to_string(kPlanFormatVersion) +
                   ", producer \"megac 0.1\")"),
            std::string::npos);
  EXPECT_NE(T.find("world size 2, grid tp=2, batch 2, seq 16, vocab 128"),
            std::string::npos);
  EXPECT_NE(T.find("axis tp (size 2): groups [0 1]"), std::string::npos);
  EXPECT_NE(T.find("rank 1 (tp=1):"), std::string::npos);
  EXPECT_EQ(T.find("rank 0 (tp=0):"), std::string::npos);
  EXPECT_NE(T.find("wte.weight %0 [64x64] f32, slice at [64,0] of [128x64], "
                   "init normal(std=0.02), hf wte.weight@[0,0]"),
            std::string::npos)
      << T;
  EXPECT_NE(T.find("= embedding %0, %2 {vocab_start = 64} : [2x16x64] f32"),
            std::string::npos);
  EXPECT_NE(T.find("= all_reduce %"), std::string::npos);
  EXPECT_NE(T.find(" over tp group [0 1] : [2x16x64] f32"), std::string::npos);

  // The text dump too is written a piece at a time: the header, then each
  // rank.
  std::string TextPieces;
  size_t TextCalls = 0;
  EXPECT_TRUE(writePlanText(L, -1, [&](std::string_view Piece) {
    TextPieces += Piece;
    ++TextCalls;
    return true;
  }));
  EXPECT_EQ(TextPieces, dumpPlanText(L));
  EXPECT_EQ(TextCalls, 3u);
  EXPECT_FALSE(writePlanText(L, -1, [](std::string_view) { return false; }));

  const std::string Text = dumpPlanJson(L);
  nlohmann::json J = nlohmann::json::parse(Text);
  // Written a rank at a time, it is the text the whole document prints
  // (the ranks spliced in at their place, indented as its elements).
  EXPECT_EQ(Text, J.dump(2) + "\n");
  std::string Pieces;
  size_t Calls = 0;
  EXPECT_TRUE(writePlanJson(L, -1, [&](std::string_view Piece) {
    Pieces += Piece;
    ++Calls;
    return true;
  }));
  EXPECT_EQ(Pieces, Text);
  EXPECT_GT(Calls, 2u); // (not one string)
  // A writer that fails stops it: nothing after the refused piece.
  size_t Offered = 0;
  EXPECT_FALSE(writePlanJson(L, -1, [&](std::string_view) {
    ++Offered;
    return false;
  }));
  EXPECT_EQ(Offered, 1u);
  EXPECT_EQ(dumpPlanJson(L, 1),
            nlohmann::json::parse(dumpPlanJson(L, 1)).dump(2) + "\n");
  EXPECT_EQ(J["format_version"], kPlanFormatVersion);
  EXPECT_EQ(J["world_size"], 2);
  EXPECT_EQ(J["axes"][0]["name"], "tp");
  EXPECT_EQ(J["ranks"].size(), 2u);
  EXPECT_EQ(J["ranks"][1]["coords"]["tp"], 1);
  EXPECT_EQ(J["ranks"][0]["instructions"][0]["op"], "embedding");
  EXPECT_EQ(J["ranks"][0]["instructions"][1]["group"],
            nlohmann::json::parse("[0,1]"));
  EXPECT_TRUE(J["ranks"][0]["instructions"][0]["group"].is_null());
}

TEST(PlanFile, OpcodeNames) {
  EXPECT_STREQ(opcodeName(op::AllReduce), "all_reduce");
  EXPECT_STREQ(opcodeName(op::PositionEmbedding), "position_embedding");
  EXPECT_STREQ(opcodeName(op::SliceShard), "slice_shard");
  EXPECT_STREQ(opcodeName(op::ReduceScatter), "reduce_scatter");
  EXPECT_STREQ(opcodeName(op::Assign), "assign");
  EXPECT_STREQ(opcodeName(op::LayerNormGainGrad), "layer_norm_gain_grad");
}

TEST(PlanFile, ChecksLayerNormGainGrad) {
  // x [2,4,8] and dy give dgamma [8]; epsilon > 0; at most one int.
  auto Plan = [](std::vector<int64_t> DyShape, std::vector<int64_t> OutShape,
                 std::vector<double> Floats, std::vector<int64_t> Ints) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4, 8}, "x");
    uint32_t DY = R.addBuffer(dt::F32, DyShape, "dy");
    for (uint32_t Id : {X, DY})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    R.emit(op::LayerNormGainGrad, {X, DY}, OutShape, Ints, Floats);
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Plan({2, 4, 8}, {8}, {1e-5}, {})), "");
  EXPECT_NE(verify(Plan({2, 4, 7}, {8}, {1e-5}, {}))
                .find("(layer_norm_gain_grad): dy [2,4,7] must have x's "
                      "shape [2,4,8]"),
            std::string::npos);
  EXPECT_NE(verify(Plan({2, 4, 8}, {2, 8}, {1e-5}, {}))
                .find("(layer_norm_gain_grad): output has shape [2,8]"),
            std::string::npos);
  EXPECT_NE(verify(Plan({2, 4, 8}, {8}, {0.0}, {})).find("epsilon"),
            std::string::npos);
  EXPECT_NE(verify(Plan({2, 4, 8}, {8}, {1e-5}, {1, 1})).find("accumulate"),
            std::string::npos);
  // Into a micro-batch sum only where the plan has micro-batches.
  EXPECT_NE(verify(Plan({2, 4, 8}, {8}, {1e-5}, {1}))
                .find("accumulates over micro-batches, but the plan has "
                      "no accumulate_end"),
            std::string::npos);
}

TEST(PlanFile, LoadMissingFileNamesPath) {
  LoadedPlan L;
  std::string Err = loadPlanFile("/nonexistent/x.mgc", L);
  EXPECT_EQ(Err.rfind("/nonexistent/x.mgc: cannot open", 0), 0u) << Err;
}

} // namespace

namespace {

/// Two pipeline ranks: rank 0 makes x and sends it, rank 1 receives it,
/// once per micro-batch (two), each in one forward segment.
ProgramDesc pipelinePair() {
  ProgramDesc P;
  P.modelName = "pair";
  P.worldSize = 2;
  P.axes = {{"pp", 2, {{0, 1}}}};
  P.microBatches = 2;
  P.globalBatch = 2;
  P.pipelineStages = 2;
  P.pipelineSchedule = "test";
  for (uint32_t Rank = 0; Rank < 2; ++Rank) {
    RankDesc R;
    R.rank = Rank;
    R.coords = {int64_t(Rank)};
    uint32_t X = R.addBuffer(dt::F32, {2}, "x");
    if (Rank == 0) {
      R.instrs.push_back({op::Fill, {}, {X}, {}, {1.0}});
      R.instrs.push_back({op::Send, {X}, {}, {1, 0}});
    } else {
      R.instrs.push_back({op::Recv, {}, {X}, {0, 0}});
    }
    R.accumulateEnd = int32_t(R.instrs.size());
    R.segments = {{0, uint32_t(R.instrs.size()), Rank, false}};
    R.schedule = {{0, 0}, {0, 1}};
    P.ranks.push_back(R);
  }
  return P;
}

} // namespace

TEST(PlanFile, PipelineTransfersMatch) {
  EXPECT_EQ(verify(pipelinePair()), "");
}

TEST(PlanFile, RejectsPipelineDeadlock) {
  // Each rank first waits for what the other sends only afterwards.
  ProgramDesc P = pipelinePair();
  RankDesc &R0 = P.ranks[0], &R1 = P.ranks[1];
  uint32_t Y0 = R0.addBuffer(dt::F32, {2}, "y");
  R0.instrs.insert(R0.instrs.begin(), {op::Recv, {}, {Y0}, {1, 1}});
  uint32_t Y1 = R1.addBuffer(dt::F32, {2}, "y");
  R1.instrs.push_back({op::Fill, {}, {Y1}, {}, {2.0}});
  R1.instrs.push_back({op::Send, {Y1}, {}, {0, 1}});
  for (RankDesc *R : {&R0, &R1}) {
    R->accumulateEnd = int32_t(R->instrs.size());
    R->segments[0].end = uint32_t(R->instrs.size());
  }
  std::string Err = verify(P);
  EXPECT_NE(Err.find("the pipeline schedule deadlocks: rank 0 waits in the "
                     "forward pass of stage 0 on micro-batch 0 (instruction "
                     "0) for transfer 1 of micro-batch 0 from rank 1; rank 1 "
                     "waits in the forward pass of stage 1 on micro-batch 0 "
                     "(instruction 0) for transfer 0"),
            std::string::npos)
      << Err;
}

TEST(PlanFile, RejectsUnreceivedTransfer) {
  ProgramDesc P = pipelinePair();
  P.ranks[1].instrs[0] = {op::Fill, {}, {0}, {}, {0.0}};
  std::string Err = verify(P);
  EXPECT_NE(Err.find("rank 0 sends transfer 0 of micro-batch 0 to rank 1, "
                     "which never receives it"),
            std::string::npos)
      << Err;
}

TEST(PlanFile, RejectsBadPipelineStructure) {
  {
    ProgramDesc P = pipelinePair();
    P.ranks[0].schedule = {{0, 0}, {0, 0}};
    EXPECT_NE(verify(P).find("the schedule runs segment 0 on micro-batch 0 2 "
                             "times (expected once)"),
              std::string::npos);
  }
  {
    // The micro-batch sums start at micro-batch 0.
    ProgramDesc P = pipelinePair();
    P.ranks[0].schedule = {{0, 1}, {0, 0}};
    EXPECT_NE(verify(P).find("runs segment 0 on micro-batch 1 before all "
                             "earlier micro-batches"),
              std::string::npos);
  }
  {
    ProgramDesc P = pipelinePair();
    P.ranks[0].instrs[1].ints = {0, 0};
    EXPECT_NE(verify(P).find("peer rank 0 is not another rank"),
              std::string::npos);
  }
  {
    ProgramDesc P = pipelinePair();
    P.ranks[0].segments[0].end = 1;
    EXPECT_NE(verify(P).find("the segments end at instruction 1, not at "
                             "accumulate_end 2"),
              std::string::npos);
  }
  {
    ProgramDesc P = pipelinePair();
    P.pipelineStages = 0;
    EXPECT_NE(verify(P).find("has pipeline segments but the plan has no "
                             "pipeline"),
              std::string::npos);
    for (RankDesc &R : P.ranks) {
      R.segments.clear();
      R.schedule.clear();
    }
    EXPECT_NE(verify(P).find("point-to-point transfers need a pipeline"),
              std::string::npos);
  }
}

TEST(PlanFile, RejectsBadFusedKernels) {
  // A plan with one kernel, y = x + b over a [2, 3] output and a bias of 3.
  auto Make = [](std::vector<std::pair<OpCode, std::vector<int32_t>>> Steps,
                 std::vector<int64_t> BiasShape) {
    ProgramDesc P;
    P.target = "cuda";
    P.kernels.push_back({"k", Steps, 2});
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 3}, "x");
    uint32_t B = R.addBuffer(dt::F32, BiasShape, "b");
    R.instrs.push_back({op::Fill, {}, {X}, {}, {1.0}});
    R.instrs.push_back({op::Fill, {}, {B}, {}, {2.0}});
    R.emit(op::Fused, {X, B}, {2, 3}, {0});
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Make({{op::Add, {0, 1}}}, {3})), "");
  EXPECT_NE(verify(Make({{op::Add, {0, 1}}}, {2})).find(
                "input 1 [2] is neither the shape of the output [2,3] nor a "
                "row of it"),
            std::string::npos);
  EXPECT_NE(verify(Make({{op::Add, {0, -1}}}, {3})).find(
                "kernel 0 (k), step 0: argument -1 is neither an input nor "
                "an earlier step"),
            std::string::npos);
  EXPECT_NE(verify(Make({{op::Softmax, {0}}}, {3})).find(
                "softmax cannot be a fused step"),
            std::string::npos);
  EXPECT_NE(verify(Make({{op::Gelu, {0, 1}}}, {3})).find(
                "gelu takes 1 arguments"),
            std::string::npos);
}

TEST(PlanFile, RejectsBadEpiloguesAndAccumulation) {
  // linear_bias: x [2,4], w [4,3], bias of the output's width.
  auto Gemm = [](std::vector<int64_t> BiasShape) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t W = R.addBuffer(dt::F32, {4, 3}, "w");
    uint32_t B = R.addBuffer(dt::F32, BiasShape, "b");
    for (uint32_t Id : {X, W, B})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    R.emit(op::LinearBias, {X, W, B}, {2, 3}, {0, 1});
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Gemm({3})), "");
  EXPECT_NE(verify(Gemm({4})).find("and bias [4] do not fit together"),
            std::string::npos);
  // Format 10: a second output (the GeLU's input), only with the GeLU and
  // of the output's shape; round_bf16 over both outputs.
  auto Kept = [](int64_t Gelu, std::vector<int64_t> PreShape, bool Round) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t W = R.addBuffer(dt::F32, {4, 3}, "w");
    uint32_t B = R.addBuffer(dt::F32, {3}, "b");
    for (uint32_t Id : {X, W, B})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    uint32_t Y = R.addBuffer(dt::F32, {2, 3}, "y");
    uint32_t Pre = R.addBuffer(dt::F32, PreShape, "pre");
    R.instrs.push_back({op::LinearBias, {X, W, B}, {Y, Pre}, {0, Gelu}});
    R.instrs.back().roundBf16 = Round;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Kept(1, {2, 3}, true)), "");
  EXPECT_EQ(verify(Kept(1, {2, 3}, false)), "");
  EXPECT_NE(verify(Kept(0, {2, 3}, true))
                .find("has a second output (the GeLU's input) but no GeLU"),
            std::string::npos);
  EXPECT_NE(verify(Kept(1, {2, 4}, false))
                .find("output 1 has shape [2,4], expected [2,3]"),
            std::string::npos);
  // Format 11: a residual (a fourth input) of the output's shape, only
  // without the GeLU.
  auto Residual = [](int64_t Gelu, std::vector<int64_t> ResShape) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t W = R.addBuffer(dt::F32, {4, 3}, "w");
    uint32_t B = R.addBuffer(dt::F32, {3}, "b");
    uint32_t Res = R.addBuffer(dt::F32, ResShape, "r");
    for (uint32_t Id : {X, W, B, Res})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    R.emit(op::LinearBias, {X, W, B, Res}, {2, 3}, {0, Gelu});
    R.instrs.back().roundBf16 = true;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Residual(0, {2, 3})), "");
  EXPECT_NE(
      verify(Residual(1, {2, 3})).find("has a residual (input 3) and a GeLU"),
      std::string::npos);
  EXPECT_NE(verify(Residual(0, {3}))
                .find("input 3 (the residual) has shape [3], expected the "
                      "product's [2,3]"),
            std::string::npos);
  // Format 15: linear's C (a third input) of the product's shape, not
  // its output's buffer.
  auto Into = [](std::vector<int64_t> CShape, bool InPlace) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t W = R.addBuffer(dt::F32, {4, 3}, "w");
    uint32_t C = R.addBuffer(dt::F32, CShape, "c");
    for (uint32_t Id : {X, W, C})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    if (InPlace)
      R.instrs.push_back({op::Linear, {X, W, C}, {C}, {0}});
    else
      R.emit(op::Linear, {X, W, C}, {2, 3}, {0});
    R.instrs.back().roundBf16 = true;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Into({2, 3}, false)), "");
  EXPECT_NE(verify(Into({3}, false))
                .find("input 2 (added to the product) has shape [3], "
                      "expected the product's [2,3]"),
            std::string::npos);
  EXPECT_NE(verify(Into({2, 3}, true)).find("is also an input"),
            std::string::npos);
  // Format 11: layer_norm_grad's residual gradient, of x's shape.
  auto NormGrad = [](std::vector<int64_t> ResShape) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t G = R.addBuffer(dt::F32, {4}, "gamma");
    uint32_t Dy = R.addBuffer(dt::F32, {2, 4}, "dy");
    uint32_t Res = R.addBuffer(dt::F32, ResShape, "r");
    for (uint32_t Id : {X, G, Dy, Res})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    R.emit(op::LayerNormGrad, {X, G, Dy, Res}, {2, 4}, {}, {1e-5});
    R.instrs.back().roundBf16 = true;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(NormGrad({2, 4})), "");
  EXPECT_NE(verify(NormGrad({4}))
                .find("input 3 (the residual gradient) [4] must have x's "
                      "shape [2,4]"),
            std::string::npos);
  // Format 11: layer_norm_gain_grad's second output, the bias gradient,
  // of x's last dimension.
  auto GainBias = [](std::vector<int64_t> BiasShape) {
    ProgramDesc P;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
    uint32_t Dy = R.addBuffer(dt::F32, {2, 4}, "dy");
    for (uint32_t Id : {X, Dy})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    uint32_t G = R.addBuffer(dt::F32, {4}, "dgamma");
    uint32_t B = R.addBuffer(dt::F32, BiasShape, "dbeta");
    R.instrs.push_back({op::LayerNormGainGrad, {X, Dy}, {G, B}, {}, {1e-5}});
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(GainBias({4})), "");
  EXPECT_NE(verify(GainBias({2}))
                .find("output 1 (the bias gradient) has shape [2], expected "
                      "[4]"),
            std::string::npos);
  // Format 13: linear_weight_grad's second output, the bias gradient, of
  // dy's last dimension (the weight used transposed or not); never with
  // the flag that adds into a micro-batch sum.
  auto WeightBias = [](std::vector<int64_t> BiasShape, int64_t Transposed,
                       bool Accumulate) {
    ProgramDesc P;
    P.microBatches = 2;
    P.globalBatch = 2;
    RankDesc R;
    uint32_t X = R.addBuffer(dt::F32, {2, 3, 4}, "x");
    uint32_t Dy = R.addBuffer(dt::F32, {2, 3, 5}, "dy");
    for (uint32_t Id : {X, Dy})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    uint32_t W = R.addBuffer(dt::F32,
                             Transposed ? std::vector<int64_t>{5, 4}
                                        : std::vector<int64_t>{4, 5},
                             "dw");
    uint32_t B = R.addBuffer(dt::F32, BiasShape, "db");
    std::vector<int64_t> Ints = {Transposed};
    if (Accumulate)
      Ints.push_back(1);
    R.instrs.push_back({op::LinearWeightGrad, {X, Dy}, {W, B}, Ints});
    R.accumulateEnd = int32_t(R.instrs.size());
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(WeightBias({5}, 0, false)), "");
  EXPECT_EQ(verify(WeightBias({5}, 1, false)), "");
  EXPECT_NE(verify(WeightBias({4}, 0, false))
                .find("(linear_weight_grad): output 1 (the bias gradient) has "
                      "shape [4], expected [5]"),
            std::string::npos);
  EXPECT_NE(verify(WeightBias({5}, 0, true))
                .find("writes a bias gradient and adds into a micro-batch "
                      "sum"),
            std::string::npos);
  // Format 13: embedding_grad's fourth input, a gradient of the table
  // added as the rows are written, of the table's shape; the output may be
  // that input (in place), and no other input.
  auto Tied = [](std::vector<int64_t> IntoShape, int InPlaceOf) {
    ProgramDesc P = test::programOf(2, 3, 6);
    RankDesc R;
    uint32_t T = R.addBuffer(dt::F32, {6, 4}, "table");
    uint32_t Ids = R.addBuffer(dt::I32, {2, 3}, "ids");
    R.inputs.push_back({"ids", Ids, "tokens"});
    uint32_t Dy = R.addBuffer(dt::F32, {2, 3, 4}, "dy");
    uint32_t Into = R.addBuffer(dt::F32, IntoShape, "into");
    for (uint32_t Id : {T, Dy, Into})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {0.0}});
    const std::vector<uint32_t> In = {T, Ids, Dy, Into};
    const uint32_t Out = InPlaceOf >= 0 ? In[size_t(InPlaceOf)]
                                        : R.addBuffer(dt::F32, {6, 4}, "dt");
    R.instrs.push_back({op::EmbeddingGrad, In, {Out}, {0}});
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Tied({6, 4}, -1)), "");
  EXPECT_EQ(verify(Tied({6, 4}, 3)), "");
  EXPECT_NE(verify(Tied({6, 5}, -1))
                .find("(embedding_grad): input 3 (the gradient added) has "
                      "shape [6,5], expected the table's [6,4]"),
            std::string::npos);
  EXPECT_NE(verify(Tied({6, 4}, 0))
                .find("is also an input (only adam_w, all_reduce on its own "
                      "input and embedding_grad on the gradient it adds to "
                      "update in place)"),
            std::string::npos);
  // Format 11: attention_grad's which = 3 writes dk and dv, two outputs
  // of q's shape; two outputs with another which are refused.
  auto KeyValue = [](int64_t Which, std::vector<std::vector<int64_t>> Outs) {
    ProgramDesc P;
    RankDesc R;
    std::vector<uint32_t> In;
    for (const char *Name : {"q", "k", "v", "dy"}) {
      In.push_back(R.addBuffer(dt::F32, {1, 4, 8}, Name));
      R.instrs.push_back({op::Fill, {}, {In.back()}, {}, {1.0}});
    }
    std::vector<uint32_t> Ys;
    for (const std::vector<int64_t> &S : Outs)
      Ys.push_back(R.addBuffer(dt::F32, S, "d"));
    R.instrs.push_back({op::AttentionGrad, In, Ys, {2, 1, Which}});
    R.instrs.back().roundBf16 = true;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(KeyValue(3, {{1, 4, 8}, {1, 4, 8}})), "");
  EXPECT_NE(
      verify(KeyValue(3, {{1, 4, 8}})).find("expects 4 inputs and 2 outputs"),
      std::string::npos);
  EXPECT_NE(verify(KeyValue(1, {{1, 4, 8}, {1, 4, 8}}))
                .find("expects 4 inputs and 1 outputs"),
            std::string::npos);
  EXPECT_NE(verify(KeyValue(3, {{1, 4, 8}, {1, 4, 4}}))
                .find("output 1 (dv) has shape [1,4,4], expected [1,4,8]"),
            std::string::npos);
  // Format 12: which = 4 writes dq, dk and dv, three outputs of q's
  // shape; which 5 is refused.
  EXPECT_EQ(verify(KeyValue(4, {{1, 4, 8}, {1, 4, 8}, {1, 4, 8}})), "");
  EXPECT_NE(verify(KeyValue(4, {{1, 4, 8}, {1, 4, 8}}))
                .find("expects 4 inputs and 3 outputs"),
            std::string::npos);
  EXPECT_NE(verify(KeyValue(4, {{1, 4, 8}, {1, 4, 8}, {1, 4, 8, 1}}))
                .find("output 2 (dv) has shape [1,4,8,1], expected [1,4,8]"),
            std::string::npos);
  EXPECT_NE(verify(KeyValue(4, {{1, 4, 8}, {1, 2, 8}, {1, 4, 8}}))
                .find("output 1 (dk) has shape [1,2,8], expected [1,4,8]"),
            std::string::npos);
  EXPECT_NE(verify(KeyValue(5, {{1, 4, 8}}))
                .find("which = 5 (expected 0 for q, 1 for k, 2 for v, 3 for k "
                      "and v, 4 for q, k and v)"),
            std::string::npos);
  // linear_gelu_grad (format 10): dy [2,4], w [4,3], the kept GeLU input
  // of the product's shape [2,3].
  auto GeluGrad = [](std::vector<int64_t> KeptShape) {
    ProgramDesc P;
    RankDesc R;
    uint32_t Dy = R.addBuffer(dt::F32, {2, 4}, "dy");
    uint32_t W = R.addBuffer(dt::F32, {4, 3}, "w");
    uint32_t X = R.addBuffer(dt::F32, KeptShape, "x");
    for (uint32_t Id : {Dy, W, X})
      R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
    R.emit(op::LinearGeluGrad, {Dy, W, X}, {2, 3}, {0});
    R.instrs.back().roundBf16 = true;
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(GeluGrad({2, 3})), "");
  EXPECT_NE(verify(GeluGrad({2, 4}))
                .find("input 2 (the GeLU's input) has shape [2,4], expected "
                      "the product's [2,3]"),
            std::string::npos);
  // round_bf16 with two outputs is linear_bias's alone.
  ProgramDesc Two;
  RankDesc T;
  uint32_t A = T.addBuffer(dt::F32, {3}, "a");
  T.instrs.push_back({op::Fill, {}, {A}, {}, {1.0}});
  uint32_t S1 = T.addBuffer(dt::F32, {3}, "s1");
  uint32_t S2 = T.addBuffer(dt::F32, {3}, "s2");
  T.instrs.push_back({op::Linear, {A, A}, {S1, S2}, {0}});
  T.instrs.back().roundBf16 = true;
  Two.ranks.push_back(T);
  EXPECT_NE(verify(Two).find("round_bf16 is only for the f32 outputs of "
                             "linear, linear_bias"),
            std::string::npos);
  // A weight gradient written into a micro-batch sum needs micro-batches.
  ProgramDesc P;
  RankDesc R;
  uint32_t X = R.addBuffer(dt::F32, {2, 4}, "x");
  uint32_t DY = R.addBuffer(dt::F32, {2, 3}, "dy");
  for (uint32_t Id : {X, DY})
    R.instrs.push_back({op::Fill, {}, {Id}, {}, {1.0}});
  R.emit(op::LinearWeightGrad, {X, DY}, {4, 3}, {0, 1});
  P.ranks.push_back(R);
  EXPECT_NE(verify(P).find("accumulates over micro-batches, but the plan has "
                           "no accumulate_end"),
            std::string::npos);
}

TEST(PlanFile, ChecksStackMicroBatches) {
  // Format 16: a per-row output's rows over the step's micro-batches:
  // micro-batch k's [r, ...] into rows [k r, (k + 1) r) of [m r, ...], the
  // dtype kept, in the part run once per micro-batch.
  auto Stack = [](std::vector<int64_t> OutShape, DType OutType, bool Inside,
                  bool IntoParam = false) {
    ProgramDesc P = test::programOf(2, 3, 8);
    P.microBatches = 2;
    P.globalBatch = 4;
    RankDesc R;
    uint32_t X = R.emit(op::Fill, {}, {2, 3}, {}, {1.0});
    if (Inside)
      R.accumulateEnd = 2;
    uint32_t Y =
        R.emit(op::StackMicroBatches, {X}, OutShape, {}, {}, -1, "", OutType);
    if (IntoParam)
      R.params.push_back({"p",
                          Y,
                          OutShape,
                          std::vector<int64_t>(2, 0),
                          ik::Zeros,
                          0.0,
                          "",
                          {}});
    if (!Inside)
      R.accumulateEnd = 1;
    R.outputs.push_back({"rows", Y, ""});
    P.ranks.push_back(R);
    return P;
  };
  EXPECT_EQ(verify(Stack({4, 3}, dt::F32, true)), "");
  EXPECT_NE(verify(Stack({2, 3}, dt::F32, true))
                .find("(stack_micro_batches): output has shape [2,3] but the "
                      "inputs imply [4,3]"),
            std::string::npos)
      << verify(Stack({2, 3}, dt::F32, true));
  EXPECT_NE(verify(Stack({4, 3}, dt::I32, true)).find("changes the dtype"),
            std::string::npos);
  EXPECT_NE(verify(Stack({4, 3}, dt::F32, false))
                .find("stacks micro-batches' rows outside the part run once "
                      "per micro-batch (accumulate_end 1)"),
            std::string::npos)
      << verify(Stack({4, 3}, dt::F32, false));
  // (The check every instruction gets: only adam_w and assign write one.)
  EXPECT_NE(verify(Stack({4, 3}, dt::F32, true, true))
                .find("output 0 (%1) is the parameter p (only adam_w and "
                      "assign write parameters)"),
            std::string::npos)
      << verify(Stack({4, 3}, dt::F32, true, true));
  // A scalar has no rows to stack.
  ProgramDesc Scalar = test::programOf(2, 3, 8);
  Scalar.microBatches = 2;
  Scalar.globalBatch = 4;
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {}, {}, {1.0});
  R.accumulateEnd = 2;
  uint32_t Y = R.emit(op::StackMicroBatches, {X}, {}, {}, {}, -1, "", dt::F32);
  R.outputs.push_back({"rows", Y, ""});
  Scalar.ranks.push_back(R);
  EXPECT_NE(verify(Scalar).find("(stack_micro_batches): input [] has no rows"),
            std::string::npos)
      << verify(Scalar);
}

// Plans a fuzzer made (fields left out, values at their limits), each of
// which crashed the runtime before the verifier caught it.
TEST(PlanFile, RejectsFuzzedPlans) {
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].buffers[3].omitShape = true;
    EXPECT_EQ(verify(P), "rank 0: buffer %3 has no shape (a scalar's is [])");
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].instrs[1].axis = 0;
    EXPECT_EQ(verify(P), "rank 0, instruction 1 (linear): axis 0 is not an "
                         "axis of the grid (which has 0)");
  }
  {
    // Offset + rows would wrap around to fit.
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].params[0].offset = {INT64_MAX - 7, 0};
    EXPECT_NE(verify(P).find("does not fit in its global shape [8,4]"),
              std::string::npos);
  }
  {
    ProgramDesc P = test::tinyProgram();
    P.ranks[0].outputs.push_back({"loss", 2, ""}); // the i32 tokens
    EXPECT_EQ(verify(P), "rank 0: output loss (buffer %2) must be f32, with "
                         "at least one element");
  }
  {
    // A generation-only send without an outputs field.
    ProgramDesc P = pipelinePair();
    P.ranks[0].instrs[1].generationOnly = true;
    P.ranks[0].instrs[1].omitOutputs = true;
    P.ranks[1].instrs[0].generationOnly = true;
    EXPECT_EQ(verify(P), "");
    // Training steps would skip the send only: the receive would wait.
    P.ranks[1].instrs[0].generationOnly = false;
    EXPECT_EQ(verify(P), "rank 1, instruction 0 (recv) receives transfer 0 "
                         "of micro-batch 0 from rank 0, but only rank 0's "
                         "instruction 1 is generation-only (training steps "
                         "skip it; the other end would wait)");
  }
  {
    // A rank outside any segment sends in its once-per-step part, which
    // the runtime tags as micro-batch 0, as the receiver's only
    // micro-batch is.
    ProgramDesc P = pipelinePair();
    P.microBatches = 1;
    P.globalBatch = 1;
    P.ranks[0].segments.clear();
    P.ranks[0].schedule.clear();
    P.ranks[1].schedule = {{0, 0}};
    EXPECT_EQ(verify(P), "");
  }
  {
    ProgramDesc P = pipelinePair();
    P.ranks[1].buffers[0].shape = {3};
    EXPECT_EQ(verify(P), "rank 1, instruction 0 (recv) receives transfer 0 "
                         "of micro-batch 0 from rank 0 as f32 [3], but rank "
                         "0's instruction 1 sends f32 [2]");
  }
  {
    // Two messages of one transfer per micro-batch: MPI matches them in
    // order, so the second receive takes the second send, whose shape
    // differs (the first send's shape is the receive's).
    ProgramDesc P = pipelinePair();
    RankDesc &R0 = P.ranks[0], &R1 = P.ranks[1];
    uint32_t Z = R0.addBuffer(dt::F32, {3}, "z");
    R0.instrs.push_back({op::Fill, {}, {Z}, {}, {2.0}});
    R0.instrs.push_back({op::Send, {Z}, {}, {1, 0}});
    uint32_t W = R1.addBuffer(dt::F32, {2}, "w");
    R1.instrs.push_back({op::Recv, {}, {W}, {0, 0}});
    for (RankDesc *R : {&R0, &R1}) {
      R->accumulateEnd = int32_t(R->instrs.size());
      R->segments[0].end = uint32_t(R->instrs.size());
    }
    EXPECT_EQ(verify(P), "rank 1, instruction 1 (recv) receives transfer 0 "
                         "of micro-batch 0 from rank 0 as f32 [2], but rank "
                         "0's instruction 3 sends f32 [3]");
    R1.buffers[W].shape = {3};
    EXPECT_EQ(verify(P), "");
  }
  {
    ProgramDesc P = pipelinePair();
    P.ranks[0].schedule = {{0, 0}};
    EXPECT_EQ(verify(P), "rank 0: the schedule has 1 entry, but 1 segments "
                         "on 2 micro-batches take 2");
  }
}
