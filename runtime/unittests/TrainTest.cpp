//===- TrainTest.cpp - Optimizer, schedule, data and checkpoints ----------===//
//
// AdamW and the learning-rate schedule against hand computations, the data
// cursor, the verifier's in-place rule, the hand-built training plan's
// gradients against finite differences of its loss, and a checkpoint
// save/load round trip in one process (world size 1), including detection
// of a flipped byte.
//
//===----------------------------------------------------------------------===//

#include "checkpoint.h"
#include "error.h"
#include "executor.h"
#include "init.h"
#include "kernels.h"
#include "plan_builder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace megac_rt;
using namespace megac_rt::builder;

namespace {

TEST(AdamW, MatchesHandComputationForTwoSteps) {
  const double B1 = 0.9, B2 = 0.95, Eps = 1e-8, Wd = 0.1, Lr1 = 0.01,
               Lr2 = 0.02, Coef = 0.5;
  std::vector<float> P = {1.0f, -2.0f}, G1 = {0.4f, 0.2f}, G2 = {-0.6f, 1.0f},
                     M(2, 0.0f), V(2, 0.0f);
  kernels::adamw(P.data(), G1.data(), 2, Coef, M.data(), V.data(), 1, Lr1, B1,
                 B2, Eps, Wd);
  // t = 1: m = (1-b1) g, v = (1-b2) g^2, so mhat = g and vhat = g^2.
  // Element 0: g = 0.2, p = 1 - 0.01 * (0.2 / (0.2 + 1e-8) + 0.1 * 1).
  double P0 = 1.0 - 0.01 * (0.2 / (0.2 + 1e-8) + 0.1);
  EXPECT_NEAR(P[0], P0, 1e-7);
  EXPECT_NEAR(M[0], 0.1 * 0.2, 1e-9);
  EXPECT_NEAR(V[0], 0.05 * 0.04, 1e-10);
  double P1 = -2.0 - 0.01 * (1.0 + 0.1 * -2.0);
  EXPECT_NEAR(P[1], P1, 1e-6);
  // t = 2, element 0: g = -0.3.
  kernels::adamw(P.data(), G2.data(), 2, Coef, M.data(), V.data(), 2, Lr2, B1,
                 B2, Eps, Wd);
  double m = 0.9 * 0.02 + 0.1 * -0.3, v = 0.95 * 0.002 + 0.05 * 0.09;
  double Mhat = m / (1 - 0.81), Vhat = v / (1 - 0.9025);
  double P0b = P0 - 0.02 * (Mhat / (std::sqrt(Vhat) + 1e-8) + 0.1 * P0);
  EXPECT_NEAR(M[0], m, 1e-8);
  EXPECT_NEAR(V[0], v, 1e-9);
  EXPECT_NEAR(P[0], P0b, 1e-6);
}

TEST(LearningRate, WarmupPeakCosineEnd) {
  const double Max = 6e-4, Min = 6e-5;
  auto Lr = [&](int64_t T) {
    return kernels::learningRate(Max, Min, 10, 110, T);
  };
  EXPECT_DOUBLE_EQ(Lr(1), Max * 0.1);
  EXPECT_DOUBLE_EQ(Lr(5), Max * 0.5);
  EXPECT_DOUBLE_EQ(Lr(10), Max);                     // peak
  EXPECT_NEAR(Lr(60), (Max + Min) / 2, 1e-15);       // half-way down
  EXPECT_NEAR(Lr(35), Min + (Max - Min) * (1 + std::cos(M_PI / 4)) / 2,
              1e-15);
  EXPECT_DOUBLE_EQ(Lr(110), Min);                    // end
  EXPECT_DOUBLE_EQ(Lr(500), Min);                    // after
  EXPECT_DOUBLE_EQ(kernels::learningRate(Max, Min, 0, 100, 0), Max);
  // No warm-up: the cosine starts at max_lr at step 0.
  EXPECT_NEAR(kernels::learningRate(Max, Min, 0, 100, 1),
              Min + (Max - Min) * (1 + std::cos(M_PI / 100)) / 2, 1e-15);
}

TEST(Data, PositionsWrapAndRowsFollowBatchOffset) {
  // Stride 8 in a stream of 30: period 30 - 8 - 1 = 21.
  uint64_t P = 0;
  std::vector<uint64_t> Seen;
  for (int K = 0; K < 5; ++K) {
    Seen.push_back(P);
    P = nextDataPosition(P, 8, 30);
  }
  EXPECT_EQ(Seen, (std::vector<uint64_t>{0, 8, 16, 3, 11}));
  for (uint64_t X : Seen)
    EXPECT_LE(X + 8 + 1, 30u);
  EXPECT_EQ(nextDataPosition(0, 8, 9), 0u); // exactly one batch + 1

  // Data-parallel rank 1 of 2 (global batch 4, local 2, seq 3).
  TrainDemoOptions O;
  O.dp = 2;
  O.batch = 4;
  O.seq = 3;
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O)), L), "");
  Executor E(*L.program, 1);
  E.allocate();
  EXPECT_EQ(E.tokensPerStep(), 12u);
  std::vector<int32_t> T(40);
  for (int I = 0; I < 40; ++I)
    T[size_t(I)] = I % O.vocab;
  E.setInputs(TokenSource::fromTokens(T), 5);
  const auto *Ins = E.rankProgram().inputs();
  const Tensor &Tok = E.buffer(Ins->Get(0)->buffer());
  const Tensor &Lab = E.buffer(Ins->Get(1)->buffer());
  // Rows 2 and 3 of the global batch at position 5: t[5 + 2*3 + s].
  EXPECT_EQ(Tok.i, (std::vector<int32_t>{11, 12, 13, 14, 15, 0}));
  EXPECT_EQ(Lab.i, (std::vector<int32_t>{12, 13, 14, 15, 0, 1}));
}

std::string verify(const ProgramDesc &P) {
  LoadedPlan L;
  return verifyPlanBytes(buildPlanBytes(P), L);
}

TEST(Verifier, OnlyAdamWUpdatesInPlace) {
  ProgramDesc P = buildTrainDemo(TrainDemoOptions());
  ASSERT_EQ(verify(P), "");
  // An add writing its own input.
  ProgramDesc Q = P;
  InstrDesc &Add = Q.ranks[0].instrs[2];
  ASSERT_EQ(Add.op, op::Add);
  Add.outputs = {Add.inputs[0]};
  EXPECT_NE(verify(Q).find("is also an input (only adam_w updates in place)"),
            std::string::npos)
      << verify(Q);
  // An adam_w writing somewhere else.
  Q = P;
  InstrDesc &Adam = Q.ranks[0].instrs.back();
  ASSERT_EQ(Adam.op, op::AdamW);
  Adam.outputs = {Adam.inputs[1]};
  EXPECT_NE(verify(Q).find("must be the parameter buffer"), std::string::npos)
      << verify(Q);
  // adam_w without a training config.
  Q = P;
  Q.hasTrain = false;
  EXPECT_NE(verify(Q).find("no training config"), std::string::npos);
  // forward_end must cover the outputs.
  Q = P;
  Q.ranks[0].forwardEnd = 3;
  EXPECT_NE(verify(Q).find("is not computed before forward_end 3"),
            std::string::npos)
      << verify(Q);
  // Rows outside the global batch.
  Q = P;
  Q.ranks[0].inputs[0].batchOffset = 1;
  EXPECT_NE(verify(Q).find("do not fit in the global batch"),
            std::string::npos)
      << verify(Q);
}

uint32_t bufferNamed(const Executor &E, const std::string &Name) {
  const auto *Bufs = E.rankProgram().buffers();
  for (uint32_t B = 0; B < Bufs->size(); ++B)
    if (Bufs->Get(B)->name() && Bufs->Get(B)->name()->str() == Name)
      return B;
  ADD_FAILURE() << "no buffer " << Name;
  return 0;
}

TEST(TrainPlan, GradientsMatchFiniteDifferencesOfTheLoss) {
  TrainDemoOptions O;
  O.vocab = 12;
  O.nEmbd = 8;
  O.nFf = 16;
  O.batch = 2;
  O.seq = 5;
  O.maxLr = O.minLr = 0; // adam_w leaves the parameters as they are
  O.clip = 0;
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O)), L), "");
  Executor E(*L.program, 0);
  E.allocate();
  E.initParams(3);
  E.setInputs(defaultTokenStream(9, E.tokensNeeded(), O.vocab));
  LocalCollectives C;
  E.setStep(1, 0.0);
  E.run(C);
  const uint32_t LossBuf = E.rankProgram().outputs()->Get(1)->buffer();
  for (const auto *Pa : *E.rankProgram().params()) {
    const std::string Name = Pa->name()->str();
    const std::vector<float> G =
        E.buffer(bufferNamed(E, "grad/" + Name)).f; // copy
    Tensor &W = E.mutableBuffer(Pa->buffer());
    double MaxAbs = 0;
    for (float X : G)
      MaxAbs = std::max(MaxAbs, double(std::fabs(X)));
    // A few entries of each parameter, the loss in float: h = 1e-2.
    for (size_t I = 0; I < W.f.size(); I += 1 + W.f.size() / 7) {
      const float Orig = W.f[I];
      W.f[I] = Orig + 0.01f;
      E.run(C, E.forwardEnd());
      double Lp = E.buffer(LossBuf).f[0];
      W.f[I] = Orig - 0.01f;
      E.run(C, E.forwardEnd());
      double Lm = E.buffer(LossBuf).f[0];
      W.f[I] = Orig;
      double FD = (Lp - Lm) / (double(Orig + 0.01f) - double(Orig - 0.01f));
      EXPECT_NEAR(G[I], FD, 1e-2 * std::max(std::fabs(FD), 0.1 * MaxAbs) + 2e-5)
          << Name << "[" << I << "]";
    }
  }
}

/// A temporary directory removed at the end of the test.
struct TempDir {
  std::string Path;
  TempDir() {
    char Tmpl[] = "/tmp/megac-ckpt-test-XXXXXX";
    Path = ::mkdtemp(Tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(Path); }
};

void trainSteps(Executor &E, const TokenSource &S, uint64_t &Pos, int64_t From,
                int64_t To, std::vector<float> &Losses) {
  const Program &P = E.program();
  LocalCollectives C;
  for (int64_t T = From; T <= To; ++T) {
    E.setInputs(S, Pos);
    E.setStep(T, kernels::learningRate(P.train()->max_lr(), P.train()->min_lr(),
                                       P.train()->warmup_steps(),
                                       P.train()->total_steps(), T));
    E.run(C);
    Losses.push_back(E.buffer(E.rankProgram().outputs()->Get(1)->buffer()).f[0]);
    Pos = nextDataPosition(Pos, E.tokensPerStep(), S.length());
  }
}

TEST(Checkpoint, RoundTripIsBitExactAndDetectsCorruption) {
  TrainDemoOptions O;
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O)), L), "");
  const Program &P = *L.program;
  std::vector<int32_t> Data(500);
  for (size_t I = 0; I < Data.size(); ++I)
    Data[I] = int32_t((I * 7 + I / 11) % size_t(O.vocab));
  TokenSource S = TokenSource::fromTokens(Data);

  // Straight: 6 steps.
  Executor A(P, 0);
  A.allocate();
  A.initParams(5);
  uint64_t PosA = 0;
  std::vector<float> LossA;
  trainSteps(A, S, PosA, 1, 6, LossA);

  // 4 steps, save, load into a fresh executor, 2 more.
  TempDir Dir;
  Executor B(P, 0);
  B.allocate();
  B.initParams(5);
  uint64_t PosB = 0;
  std::vector<float> LossB;
  trainSteps(B, S, PosB, 1, 4, LossB);
  ShardInfo Shard = writeCheckpointShard(Dir.Path, 4, B);
  CheckpointMeta M;
  M.step = 4;
  M.dataPosition = PosB;
  M.seed = 5;
  M.worldSize = 1;
  M.grid = planGridString(P);
  M.modelHash = P.model_hash();
  M.shards = {Shard};
  writeCheckpointMeta(Dir.Path, M);

  Executor Rb(P, 0);
  Rb.allocate();
  std::string StepDir;
  CheckpointMeta Got = readCheckpointMeta(Dir.Path, P, StepDir);
  EXPECT_EQ(StepDir, Dir.Path + "/step-00000004");
  EXPECT_EQ(Got.step, 4);
  EXPECT_EQ(Got.dataPosition, PosB);
  loadCheckpointShard(StepDir, Got, Rb, true);
  uint64_t PosR = Got.dataPosition;
  trainSteps(Rb, S, PosR, 5, 6, LossB);

  ASSERT_EQ(LossA.size(), LossB.size());
  for (size_t I = 0; I < LossA.size(); ++I)
    EXPECT_EQ(LossA[I], LossB[I]) << "step " << I + 1;
  for (const auto *Pa : *P.ranks()->Get(0)->params())
    EXPECT_EQ(A.buffer(Pa->buffer()).f, Rb.buffer(Pa->buffer()).f)
        << Pa->name()->str();
  ASSERT_EQ(A.adamStates().size(), 7u);
  for (size_t I = 0; I < A.adamStates().size(); ++I) {
    EXPECT_EQ(A.adamStates()[I].m, Rb.adamStates()[I].m);
    EXPECT_EQ(A.adamStates()[I].v, Rb.adamStates()[I].v);
  }

  // A flipped byte in the shard is caught by its CRC and named.
  const std::string ShardPath = StepDir + "/rank-00000.safetensors";
  {
    std::fstream F(ShardPath, std::ios::in | std::ios::out | std::ios::binary);
    F.seekg(-3, std::ios::end);
    char Byte;
    F.get(Byte);
    F.seekp(-3, std::ios::end);
    F.put(char(Byte ^ 0x10));
  }
  Executor Bad(P, 0);
  Bad.allocate();
  try {
    loadCheckpointShard(StepDir, Got, Bad, true);
    FAIL() << "corruption not detected";
  } catch (const RunError &E) {
    EXPECT_EQ(std::string(E.what()),
              "checkpoint shard " + ShardPath +
                  " is corrupted (crc32 mismatch)");
  }

  // A plan of another model is refused by its hash.
  TrainDemoOptions O2 = O;
  O2.nFf = 48;
  LoadedPlan L2;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O2)), L2), "");
  try {
    readCheckpointMeta(Dir.Path, *L2.program, StepDir);
    FAIL() << "model hash mismatch not detected";
  } catch (const RunError &E) {
    EXPECT_NE(std::string(E.what()).find("model hash"), std::string::npos)
        << E.what();
  }
}

TEST(Executor, ClipCoefficientAndFill) {
  ProgramDesc P;
  P.hasTrain = false;
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {3}, {}, {2.0});
  uint32_t S = R.emit(op::SumSquares, {X}, {});
  uint32_t C1 = R.emit(op::ClipCoefficient, {S}, {}, {}, {1.0});
  uint32_t C2 = R.emit(op::ClipCoefficient, {S}, {}, {}, {100.0});
  R.outputs = {{"c1", C1, ""}, {"c2", C2, ""}};
  P.ranks.push_back(R);
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(P), L), "");
  Executor E(*L.program, 0);
  E.allocate();
  LocalCollectives C;
  E.run(C);
  EXPECT_EQ(E.buffer(X).f, (std::vector<float>{2, 2, 2}));
  EXPECT_FLOAT_EQ(E.buffer(S).f[0], 12.0f);
  EXPECT_FLOAT_EQ(E.buffer(C1).f[0], float(1.0 / (std::sqrt(12.0) + 1e-6)));
  EXPECT_FLOAT_EQ(E.buffer(C2).f[0], 1.0f);
}

} // namespace
