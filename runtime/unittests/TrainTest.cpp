//===- TrainTest.cpp - Optimizer, schedule, data and checkpoints ----------===//
//
// AdamW and the learning-rate schedule against hand computations, the data
// cursor, the verifier's in-place rule, the hand-built training plan's
// gradients against finite differences of its loss, and a checkpoint
// save/load round trip in one process (world size 1), including detection
// of a flipped byte.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"
#include "checkpoint.h"
#include "error.h"
#include "executor.h"
#include "init.h"
#include "kernels.h"
#include "plan_builder.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// The update's ratio m^ / (sqrt(v^) + eps) is computed in float (the
// rest in double): against the same update all in double, the moments are
// the same bits and each parameter is within its own float rounding (one
// spacing of floats at its value) plus the ratio's float rounding scaled
// by the learning rate, over gradients from 1e-12 (below eps) to 10 and
// parameters from 1e-3 to 10, for five steps.
TEST(AdamW, RatioInFloatStaysWithinTheParametersRounding) {
  const double B1 = 0.9, B2 = 0.95, Eps = 1e-8, Wd = 0.1, Lr = 3e-4, Coef = 0.7;
  const int64_t N = 4096;
  std::vector<float> P(N), M(N, 0.0f), V(N, 0.0f), G(N);
  std::vector<double> Pd(N);
  uint64_t State = 12345;
  auto Uniform = [&State] { // in [0, 1)
    State = State * 6364136223846793005ULL + 1442695040888963407ULL;
    return double(State >> 11) / double(1ULL << 53);
  };
  for (int64_t I = 0; I < N; ++I)
    P[size_t(I)] = float((Uniform() < 0.5 ? -1 : 1) *
                         std::pow(10.0, -3.0 + 4.0 * Uniform()));
  std::vector<float> Mr = M, Vr = V, Pr = P;
  for (int64_t T = 1; T <= 5; ++T) {
    for (int64_t I = 0; I < N; ++I)
      G[size_t(I)] = float((Uniform() < 0.5 ? -1 : 1) *
                           std::pow(10.0, -12.0 + 13.0 * Uniform()));
    kernels::adamw(P.data(), G.data(), N, Coef, M.data(), V.data(), T, Lr, B1,
                   B2, Eps, Wd);
    const double Bc1 = 1.0 - std::pow(B1, double(T)),
                 Bc2 = 1.0 - std::pow(B2, double(T));
    for (size_t I = 0; I < size_t(N); ++I) {
      const double Gd = double(G[I]) * Coef;
      Mr[I] = float(B1 * Mr[I] + (1.0 - B1) * Gd);
      Vr[I] = float(B2 * Vr[I] + (1.0 - B2) * Gd * Gd);
      const double Ratio = (Mr[I] / Bc1) / (std::sqrt(Vr[I] / Bc2) + Eps);
      const double Before = Pr[I];
      Pr[I] = float(Before - Lr * (Ratio + Wd * Before));
      ASSERT_EQ(M[I], Mr[I]) << "step " << T << " element " << I;
      ASSERT_EQ(V[I], Vr[I]) << "step " << T << " element " << I;
      const double Spacing =
          std::nextafter(std::fabs(Pr[I]), INFINITY) - std::fabs(Pr[I]);
      ASSERT_LE(std::fabs(double(P[I]) - Pr[I]),
                Spacing + Lr * std::fabs(Ratio) * 1e-6)
          << "step " << T << " element " << I;
      // (Each step from the reference's parameter: the two runs' own
      // roundings do not add up.)
      P[I] = Pr[I];
    }
  }
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
  EXPECT_NE(verify(Q).find("is also an input (only adam_w, all_reduce on "
                           "its own input and embedding_grad on the gradient "
                           "it adds to update in place)"),
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
  // Internal buffers share the memory-planned arena: take every gradient
  // before the forward runs below reuse their bytes.
  std::map<std::string, std::vector<float>> Grads;
  for (const auto *Pa : *E.rankProgram().params())
    Grads[Pa->name()->str()] =
        E.buffer(bufferNamed(E, "grad/" + Pa->name()->str())).f;
  for (const auto *Pa : *E.rankProgram().params()) {
    const std::string Name = Pa->name()->str();
    const std::vector<float> &G = Grads[Name];
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
  M.grid = gridString(P);
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

/// Verifies the one-rank plan \p P into \p L and runs it once on the CPU,
/// its parameters drawn from P.seed (null, and a test failure, where it
/// does not verify).
std::unique_ptr<Executor> runOnce(const ProgramDesc &P, LoadedPlan &L) {
  const std::string Error = verifyPlanBytes(buildPlanBytes(P), L);
  EXPECT_EQ(Error, "");
  if (!Error.empty())
    return nullptr;
  auto E = std::make_unique<Executor>(*L.program, 0);
  E->allocate();
  E->initParams(P.seed);
  LocalCollectives C;
  E->run(C);
  return E;
}

/// runOnce of a plan of the one rank \p R and no training config, its
/// parameters drawn from \p Seed.
std::unique_ptr<Executor> runRank(const RankDesc &R, LoadedPlan &L,
                                  uint64_t Seed = 0) {
  ProgramDesc P;
  P.seed = Seed;
  P.ranks.push_back(R);
  return runOnce(P, L);
}

/// A parameter \p Name of \p Shape that runOnce draws from N(0, 1).
uint32_t randomParam(RankDesc &R, const std::string &Name,
                     const std::vector<int64_t> &Shape) {
  uint32_t B = R.addBuffer(dt::F32, Shape, Name);
  R.params.push_back({Name,
                      B,
                      Shape,
                      std::vector<int64_t>(Shape.size(), 0),
                      ik::Normal,
                      1.0,
                      "",
                      {}});
  return B;
}

TEST(Executor, ClipCoefficientAndFill) {
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {3}, {}, {2.0});
  uint32_t S = R.emit(op::SumSquares, {X}, {});
  uint32_t C1 = R.emit(op::ClipCoefficient, {S}, {}, {}, {1.0});
  uint32_t C2 = R.emit(op::ClipCoefficient, {S}, {}, {}, {100.0});
  R.outputs = {{"c1", C1, ""}, {"c2", C2, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(X).f, (std::vector<float>{2, 2, 2}));
  EXPECT_FLOAT_EQ(E->buffer(S).f[0], 12.0f);
  EXPECT_FLOAT_EQ(E->buffer(C1).f[0], float(1.0 / (std::sqrt(12.0) + 1e-6)));
  EXPECT_FLOAT_EQ(E->buffer(C2).f[0], 1.0f);
}

TEST(Executor, LinearBiasRoundsOnceFromTheFp32Sum) {
  // t = 1 x (1 + 3/1024) + 1/256 = 1.0068359375. Rounded once (format 10's
  // linear_bias with round_bf16): 1.0078125, the nearer bf16 value.
  // Rounding the product first (1.0) and then the sum (1.00390625, a tie,
  // to even) would give 1.0. The GeLU reads the fp32 t: bf16 of
  // GeLU(1.0068359375) = 0.848601 is 0.84765625 (GeLU of 1.0 would give
  // 0.83984375); the second output keeps the rounded t.
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {1, 1}, {}, {1.0});
  uint32_t W = R.emit(op::Fill, {}, {1, 1}, {}, {1.0029296875});
  uint32_t B = R.emit(op::Fill, {}, {1}, {}, {0.00390625});
  uint32_t Plain = R.emit(op::LinearBias, {X, W, B}, {1, 1}, {0, 0});
  R.instrs.back().roundBf16 = true;
  uint32_t Y = R.addBuffer(dt::F32, {1, 1}, "y");
  uint32_t Pre = R.addBuffer(dt::F32, {1, 1}, "pre");
  R.instrs.push_back({op::LinearBias, {X, W, B}, {Y, Pre}, {0, 1}});
  R.instrs.back().roundBf16 = true;
  uint32_t Fp32 = R.addBuffer(dt::F32, {1, 1}, "y32");
  uint32_t Pre32 = R.addBuffer(dt::F32, {1, 1}, "pre32");
  R.instrs.push_back({op::LinearBias, {X, W, B}, {Fp32, Pre32}, {0, 1}});
  R.outputs = {{"plain", Plain, ""},
               {"y", Y, ""},
               {"pre", Pre, ""},
               {"y32", Fp32, ""},
               {"pre32", Pre32, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Plain).f[0], 1.0078125f);
  EXPECT_EQ(E->buffer(Y).f[0], 0.84765625f);
  EXPECT_EQ(E->buffer(Pre).f[0], 1.0078125f);
  // Not rounded (an fp32 plan): t itself, and its GeLU.
  EXPECT_EQ(E->buffer(Pre32).f[0], 1.0068359375f);
  EXPECT_NEAR(E->buffer(Fp32).f[0], 0.8486006848, 1e-6);
}

TEST(Executor, LinearBiasAddsItsResidualBeforeTheOneRounding) {
  // t = 1 x (1 + 3/1024) + 1/256 = 1.0068359375 as above; the residual
  // r = -3/1024 makes the sum 1.00390625, half way between the bf16
  // values 1.0 and 1.0078125: rounded once (format 11's linear_bias with
  // a residual and round_bf16), to even, 1.0. Rounding t first (to
  // 1.0078125) and then the residual sum (1.0048828125) would give
  // 1.0078125.
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {1, 1}, {}, {1.0});
  uint32_t W = R.emit(op::Fill, {}, {1, 1}, {}, {1.0029296875});
  uint32_t B = R.emit(op::Fill, {}, {1}, {}, {0.00390625});
  uint32_t Res = R.emit(op::Fill, {}, {1, 1}, {}, {-0.0029296875});
  uint32_t Rounded = R.emit(op::LinearBias, {X, W, B, Res}, {1, 1}, {0, 0});
  R.instrs.back().roundBf16 = true;
  uint32_t Fp32 = R.emit(op::LinearBias, {X, W, B, Res}, {1, 1}, {0, 0});
  R.outputs = {{"rounded", Rounded, ""}, {"fp32", Fp32, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Rounded).f[0], 1.0f);
  EXPECT_EQ(E->buffer(Fp32).f[0], 1.00390625f);
}

TEST(Executor, LinearAddsItsCBeforeTheOneRounding) {
  // Format 15's linear with a third input c: y = x w + c. The product
  // 1 x (1 + 3/1024) = 1.0029296875 plus c = 1/512 is 1.0048828125, past
  // the midpoint (1.00390625) of the bf16 values 1.0 and 1.0078125:
  // rounded once (with round_bf16), 1.0078125. Rounding the product first
  // (to 1.0) and then the sum (1.001953125) would give 1.0.
  RankDesc R;
  uint32_t X = R.emit(op::Fill, {}, {1, 1}, {}, {1.0});
  uint32_t W = R.emit(op::Fill, {}, {1, 1}, {}, {1.0029296875});
  uint32_t C = R.emit(op::Fill, {}, {1, 1}, {}, {0.001953125});
  uint32_t Rounded = R.emit(op::Linear, {X, W, C}, {1, 1}, {0});
  R.instrs.back().roundBf16 = true;
  uint32_t Fp32 = R.emit(op::Linear, {X, W, C}, {1, 1}, {0});
  // Rows of 2 with w read transposed (ints[0] = 1).
  uint32_t X2 = R.emit(op::Fill, {}, {1, 2}, {}, {1.0});
  uint32_t W2 = R.emit(op::Fill, {}, {2, 2}, {}, {1.0});
  uint32_t C2 = R.emit(op::Fill, {}, {1, 2}, {}, {10.0});
  uint32_t T2 = R.emit(op::Linear, {X2, W2, C2}, {1, 2}, {1});
  R.outputs = {{"rounded", Rounded, ""}, {"fp32", Fp32, ""}, {"t", T2, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Rounded).f[0], 1.0078125f);
  EXPECT_EQ(E->buffer(Fp32).f[0], 1.0048828125f);
  // x = [1, 1], w = ones [2, 2] read transposed: each output 2, plus 10.
  EXPECT_EQ(E->buffer(T2).f[0], 12.0f);
  EXPECT_EQ(E->buffer(T2).f[1], 12.0f);
}

TEST(Executor, LayerNormGradAddsTheResidualBeforeTheOneRounding) {
  // Format 11's layer_norm_grad with a residual gradient r and round_bf16
  // against the unfused ops it stands for (megac-round-after-epilogue's
  // output): layer_norm_grad in fp32, + r, round_bf16. Random rows (x, dy,
  // r, the gain), 8 of 32.
  RankDesc R;
  const std::vector<int64_t> Shape = {8, 32};
  const uint32_t X = randomParam(R, "x", Shape),
                 G = randomParam(R, "gamma", {32}),
                 Dy = randomParam(R, "dy", Shape),
                 Res = randomParam(R, "r", Shape);
  auto normGrad = [&](std::vector<uint32_t> Inputs, bool Round) {
    uint32_t Y = R.emit(op::LayerNormGrad, Inputs, Shape, {}, {1e-5});
    R.instrs.back().roundBf16 = Round;
    return Y;
  };
  uint32_t Fused = normGrad({X, G, Dy, Res}, true);
  uint32_t Plain = normGrad({X, G, Dy}, false);
  uint32_t Sum = R.emit(op::Add, {Res, Plain}, Shape);
  uint32_t Unfused = R.emit(op::RoundBf16, {Sum}, Shape);
  // Rounded before the residual is added: what the fusion spares.
  uint32_t Early = normGrad({X, G, Dy}, true);
  uint32_t EarlySum = R.emit(op::Add, {Res, Early}, Shape);
  uint32_t Twice = R.emit(op::RoundBf16, {EarlySum}, Shape);
  uint32_t Fp32 = normGrad({X, G, Dy, Res}, false);
  R.outputs = {{"fused", Fused, ""},
               {"unfused", Unfused, ""},
               {"twice", Twice, ""},
               {"fp32", Fp32, ""},
               {"sum", Sum, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L, 11);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Fused).f, E->buffer(Unfused).f);
  EXPECT_EQ(E->buffer(Fp32).f, E->buffer(Sum).f);
  EXPECT_NE(E->buffer(Fused).f, E->buffer(Twice).f);
}

/// Runs \p R (seeded \p Seed) and expects each pair of its buffers
/// (an instruction's output, the same from the op alone) to hold the same
/// bits, and the buffer \p Bias to hold column \p Col's sum of the \p
/// Rows x \p Cols buffer \p Dy (a bias gradient, summed independently).
void expectLikeApart(RankDesc &R, uint64_t Seed,
                     const std::vector<std::pair<uint32_t, uint32_t>> &Same,
                     uint32_t Bias, uint32_t Dy, int64_t Rows, int64_t Cols,
                     int64_t Col) {
  for (auto [Fused, Alone] : Same)
    for (uint32_t B : {Fused, Alone})
      R.outputs.push_back({"b" + std::to_string(B), B, ""});
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L, Seed);
  ASSERT_TRUE(E);
  for (auto [Fused, Alone] : Same)
    EXPECT_EQ(E->buffer(Fused).f, E->buffer(Alone).f) << "buffer " << Fused;
  double Sum = 0;
  for (int64_t I = 0; I < Rows; ++I)
    Sum += E->buffer(Dy).f[size_t(I * Cols + Col)];
  EXPECT_NEAR(E->buffer(Bias).f[size_t(Col)], Sum, 1e-5);
}

TEST(Executor, LayerNormGainGradWritesTheBiasGradientToo) {
  // Format 11's layer_norm_gain_grad with a second output against the two
  // ops it stands for: layer_norm_gain_grad(x, dy) and sum_leading(dy),
  // bit for bit. Random x and dy, 6 rows of 16.
  RankDesc R;
  const std::vector<int64_t> Shape = {6, 16};
  const uint32_t X = randomParam(R, "x", Shape),
                 Dy = randomParam(R, "dy", Shape);
  uint32_t Gain = R.addBuffer(dt::F32, {16}, "dgamma");
  uint32_t Bias = R.addBuffer(dt::F32, {16}, "dbeta");
  R.instrs.push_back(
      {op::LayerNormGainGrad, {X, Dy}, {Gain, Bias}, {}, {1e-5}});
  uint32_t GainAlone = R.emit(op::LayerNormGainGrad, {X, Dy}, {16}, {}, {1e-5});
  uint32_t BiasAlone = R.emit(op::SumLeading, {Dy}, {16});
  expectLikeApart(R, 5, {{Gain, GainAlone}, {Bias, BiasAlone}}, Bias, Dy, 6, 16,
                  0);
}

TEST(Executor, LinearWeightGradWritesTheBiasGradientToo) {
  // Format 13's linear_weight_grad with a second output against the two
  // ops it stands for: linear_weight_grad(x, dy) and sum_leading(dy), bit
  // for bit, the weight used as stored and transposed. Random x [2,3,4]
  // and dy [2,3,5].
  for (int64_t Transposed : {0, 1}) {
    RankDesc R;
    const uint32_t X = randomParam(R, "x", {2, 3, 4}),
                   Dy = randomParam(R, "dy", {2, 3, 5});
    const std::vector<int64_t> WShape =
        Transposed ? std::vector<int64_t>{5, 4} : std::vector<int64_t>{4, 5};
    uint32_t W = R.addBuffer(dt::F32, WShape, "dw");
    uint32_t Bias = R.addBuffer(dt::F32, {5}, "db");
    R.instrs.push_back(
        {op::LinearWeightGrad, {X, Dy}, {W, Bias}, {Transposed}});
    uint32_t WAlone =
        R.emit(op::LinearWeightGrad, {X, Dy}, WShape, {Transposed});
    uint32_t BiasAlone = R.emit(op::SumLeading, {Dy}, {5});
    expectLikeApart(R, 7, {{W, WAlone}, {Bias, BiasAlone}}, Bias, Dy, 6, 5, 4);
  }
}

TEST(Executor, EmbeddingGradAddsTheOtherGradientAsTheAddDid) {
  // Format 13's embedding_grad with a fourth input (a tied embedding's
  // output-layer gradient), into a buffer of its own and in place, against
  // embedding_grad and add apart: the same bits. Ids with repeats.
  for (bool InPlace : {false, true}) {
    RankDesc R;
    uint32_t Table = randomParam(R, "table", {6, 4});
    uint32_t Dy = randomParam(R, "dy", {2, 3, 4});
    uint32_t Head = randomParam(R, "head", {6, 4});
    uint32_t Ids = R.addBuffer(dt::I32, {2, 3}, "ids");
    R.inputs.push_back({"ids", Ids, "tokens"});
    uint32_t Apart = R.emit(op::EmbeddingGrad, {Table, Ids, Dy}, {6, 4}, {0});
    uint32_t Want = R.emit(op::Add, {Head, Apart}, {6, 4});
    // In place: into a copy of the head's gradient (parameters change only
    // through adam_w).
    uint32_t Into = R.emit(op::Add, {Head, Head}, {6, 4});
    uint32_t Twice = R.emit(op::Add, {Into, Apart}, {6, 4});
    uint32_t Got = InPlace ? Into : R.addBuffer(dt::F32, {6, 4}, "got");
    R.instrs.push_back({op::EmbeddingGrad,
                        {Table, Ids, Dy, InPlace ? Into : Head},
                        {Got},
                        {0}});
    for (uint32_t B : {Want, Twice, Got})
      R.outputs.push_back({"b" + std::to_string(B), B, ""});
    ProgramDesc P = test::programOf(2, 3, 6);
    P.ranks.push_back(R);
    LoadedPlan L;
    std::unique_ptr<Executor> E = runOnce(P, L);
    ASSERT_TRUE(E);
    // (The tokens input is all zeros: every token is id 0, repeated.)
    EXPECT_EQ(E->buffer(Got).f, E->buffer(InPlace ? Twice : Want).f)
        << (InPlace ? "in place" : "apart");
  }
}

/// An attention gradient's inputs for the tests below: random q, k, v and
/// dy of \p Shape, parameters of \p R.
std::vector<uint32_t> attentionGradInputs(RankDesc &R,
                                          const std::vector<int64_t> &Shape) {
  std::vector<uint32_t> In;
  for (const char *Name : {"q", "k", "v", "dy"})
    In.push_back(randomParam(R, Name, Shape));
  return In;
}

TEST(Executor, AttentionGradGivesKeyAndValueTogether) {
  // Format 11's attention_grad with which = 3 against the key's and the
  // value's steps (which = 1, 2) it stands for, bit for bit, rounded and
  // not. Random q, k, v, dy of [2, 8, 16], 2 heads, causal.
  RankDesc R;
  const std::vector<int64_t> Shape = {2, 8, 16};
  const std::vector<uint32_t> In = attentionGradInputs(R, Shape);
  auto both = [&](bool Round) {
    uint32_t Dk = R.addBuffer(dt::F32, Shape, "dk");
    uint32_t Dv = R.addBuffer(dt::F32, Shape, "dv");
    R.instrs.push_back({op::AttentionGrad, In, {Dk, Dv}, {2, 1, 3}});
    R.instrs.back().roundBf16 = Round;
    return std::pair{Dk, Dv};
  };
  auto one = [&](int64_t Which, bool Round) {
    uint32_t Y = R.emit(op::AttentionGrad, In, Shape, {2, 1, Which});
    R.instrs.back().roundBf16 = Round;
    return Y;
  };
  const auto [Dk, Dv] = both(false);
  const uint32_t K1 = one(1, false), V1 = one(2, false);
  const auto [Dk16, Dv16] = both(true);
  const uint32_t K16 = one(1, true), V16 = one(2, true);
  R.outputs = {{"dk", Dk, ""},   {"dv", Dv, ""},     {"k1", K1, ""},
               {"v1", V1, ""},   {"dk16", Dk16, ""}, {"dv16", Dv16, ""},
               {"k16", K16, ""}, {"v16", V16, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L, 9);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Dk).f, E->buffer(K1).f);
  EXPECT_EQ(E->buffer(Dv).f, E->buffer(V1).f);
  EXPECT_EQ(E->buffer(Dk16).f, E->buffer(K16).f);
  EXPECT_EQ(E->buffer(Dv16).f, E->buffer(V16).f);
  EXPECT_NE(E->buffer(Dk).f, E->buffer(Dv).f);
  EXPECT_NE(E->buffer(Dk).f, E->buffer(Dk16).f);
}

TEST(Executor, AttentionGradGivesAllThreeTogether) {
  // Format 12's attention_grad with which = 4 against the query's, the
  // key's and the value's steps (which = 0, 1, 2), bit for bit, rounded
  // and not. Random q, k, v, dy of [2, 8, 16], 2 heads, causal.
  RankDesc R;
  const std::vector<int64_t> Shape = {2, 8, 16};
  const std::vector<uint32_t> In = attentionGradInputs(R, Shape);
  std::vector<std::pair<uint32_t, uint32_t>> Pairs; // (together, apart)
  for (bool Round : {false, true}) {
    std::vector<uint32_t> All;
    for (const char *Name : {"dq", "dk", "dv"})
      All.push_back(R.addBuffer(dt::F32, Shape, Name));
    R.instrs.push_back({op::AttentionGrad, In, All, {2, 1, 4}});
    R.instrs.back().roundBf16 = Round;
    for (int64_t Which = 0; Which < 3; ++Which) {
      Pairs.push_back(
          {All[Which], R.emit(op::AttentionGrad, In, Shape, {2, 1, Which})});
      R.instrs.back().roundBf16 = Round;
    }
  }
  for (auto [Together, Apart] : Pairs) {
    R.outputs.push_back({"t" + std::to_string(Together), Together, ""});
    R.outputs.push_back({"a" + std::to_string(Apart), Apart, ""});
  }
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L, 11);
  ASSERT_TRUE(E);
  for (auto [Together, Apart] : Pairs)
    EXPECT_EQ(E->buffer(Together).f, E->buffer(Apart).f)
        << "buffer " << Together;
  // Three different gradients, and the rounding shows.
  EXPECT_NE(E->buffer(Pairs[0].first).f, E->buffer(Pairs[1].first).f);
  EXPECT_NE(E->buffer(Pairs[1].first).f, E->buffer(Pairs[2].first).f);
  EXPECT_NE(E->buffer(Pairs[0].first).f, E->buffer(Pairs[3].first).f);
}

TEST(Executor, LinearGeluGradReadsTheFp32Product) {
  // dy w = 1 x (1 + 3/1024) = 1.0029296875, GeLU's gradient at x = 0.5 is
  // 0.8673699 (tanh form), their product 0.8699110: rounded once (format
  // 10's linear_gelu_grad with round_bf16) 0.87109375. Rounding the
  // product first (to 1.0) would give 0.8671875.
  RankDesc R;
  uint32_t Dy = R.emit(op::Fill, {}, {1, 1}, {}, {1.0});
  uint32_t W = R.emit(op::Fill, {}, {1, 1}, {}, {1.0029296875});
  uint32_t X = R.emit(op::Fill, {}, {1, 1}, {}, {0.5});
  uint32_t Rounded = R.emit(op::LinearGeluGrad, {Dy, W, X}, {1, 1}, {0});
  R.instrs.back().roundBf16 = true;
  uint32_t Fp32 = R.emit(op::LinearGeluGrad, {Dy, W, X}, {1, 1}, {1});
  R.outputs = {{"rounded", Rounded, ""}, {"fp32", Fp32, ""}};
  LoadedPlan L;
  std::unique_ptr<Executor> E = runRank(R, L);
  ASSERT_TRUE(E);
  EXPECT_EQ(E->buffer(Rounded).f[0], 0.87109375f);
  EXPECT_NEAR(E->buffer(Fp32).f[0], 0.8699110263, 1e-6);
}

//===----------------------------------------------------------------------===//
// ZeRO stage 1 (format 3): reduce_scatter, assign, adam_w on a slice
//===----------------------------------------------------------------------===//

/// Index of the instruction whose loc is \p Loc on rank \p R.
size_t instrAt(const ProgramDesc &P, uint32_t R, const std::string &Loc) {
  const auto &Is = P.ranks[R].instrs;
  for (size_t I = 0; I < Is.size(); ++I)
    if (Is[I].loc == Loc)
      return I;
  ADD_FAILURE() << "no instruction " << Loc;
  return 0;
}

TrainDemoOptions zeroOptions(uint32_t Dp) {
  TrainDemoOptions O;
  O.dp = Dp;
  O.zero = true;
  return O;
}

/// Format 5 rules: what training skips (generation-only instructions) may
/// not feed what it runs; micro-batches need an accumulation region in
/// range; an all-reduce may sum only its own input in place.
TEST(Verifier, GenerationOnlyMicroBatchesAndInPlaceSums) {
  ProgramDesc P = buildTrainDemo(TrainDemoOptions());
  ASSERT_EQ(verify(P), "");
  ProgramDesc Q = P;
  Q.ranks[0].instrs[2].generationOnly = true; // read by the rest of the step
  EXPECT_NE(verify(Q).find("which only a generation-only instruction writes "
                           "(training steps skip those)"),
            std::string::npos)
      << verify(Q);
  Q = P;
  Q.microBatches = 2;
  Q.globalBatch = 2 * Q.batch;
  EXPECT_NE(verify(Q).find("the plan has 2 micro-batches but no "
                           "accumulate_end"),
            std::string::npos)
      << verify(Q);
  Q.ranks[0].accumulateEnd = int32_t(Q.ranks[0].instrs.size()) + 1;
  EXPECT_NE(verify(Q).find("accumulate_end " +
                           std::to_string(Q.ranks[0].accumulateEnd) +
                           " is outside [-1, "),
            std::string::npos)
      << verify(Q);
  Q = P;
  Q.microBatches = 3;
  Q.globalBatch = 2 * Q.batch;
  EXPECT_NE(verify(Q).find("micro_batches 3 must be 0, 1 or divide the "
                           "global batch"),
            std::string::npos)
      << verify(Q);
  // An all-reduce summing into its own input is fine; into another's not.
  Q = P;
  RankDesc &R = Q.ranks[0];
  uint32_t X = R.instrs[0].outputs[0];
  uint32_t Y = R.emit(op::Add, {X, X}, R.buffers[X].shape);
  R.instrs.push_back(InstrDesc(op::AllReduce, {X, Y}, {X, Y}, {}, {}, 0));
  Q.axes = {{"tp", 1, {{0}}}};
  R.coords = {0};
  EXPECT_EQ(verify(Q), "");
  R.instrs.back().outputs = {Y, X};
  EXPECT_NE(verify(Q).find("is also an input (only adam_w, all_reduce on "
                           "its own input and embedding_grad on the gradient "
                           "it adds to update in place)"),
            std::string::npos)
      << verify(Q);
}

TEST(Verifier, ZeroAdamWOnAParameterSlice) {
  ProgramDesc P = buildTrainDemo(zeroOptions(2));
  ASSERT_EQ(verify(P), "");
  const size_t Wte = instrAt(P, 1, "wte.weight.adamw");
  EXPECT_EQ(P.ranks[1].instrs[Wte].paramName, "wte.weight");
  EXPECT_EQ(P.ranks[1].instrs[Wte].paramOffset,
            (std::vector<int64_t>{8, 0}));

  // A slice without param_name is not a parameter.
  ProgramDesc Q = P;
  Q.ranks[1].instrs[Wte].paramName.clear();
  Q.ranks[1].instrs[Wte].paramOffset.clear();
  EXPECT_NE(verify(Q).find("is not a parameter (an update of a slice of one "
                           "needs param_name)"),
            std::string::npos)
      << verify(Q);
  // param_offset without param_name.
  Q = P;
  Q.ranks[1].instrs[Wte].paramName.clear();
  EXPECT_NE(verify(Q).find("has param_offset [8,0] but no param_name"),
            std::string::npos)
      << verify(Q);
  // An unknown parameter.
  Q = P;
  Q.ranks[1].instrs[Wte].paramName = "nope.weight";
  EXPECT_NE(verify(Q).find("param_name nope.weight is not a parameter of "
                           "this rank"),
            std::string::npos)
      << verify(Q);
  // The slice must lie inside the parameter, with its rank.
  Q = P;
  Q.ranks[1].instrs[Wte].paramOffset = {9, 0};
  EXPECT_NE(verify(Q).find("rank 1, instruction " + std::to_string(Wte) +
                           " (adam_w): slice [8,32] at param_offset [9,0] "
                           "does not fit in wte.weight's global shape "
                           "[16,32]"),
            std::string::npos)
      << verify(Q);
  Q = P;
  Q.ranks[1].instrs[Wte].paramOffset = {8};
  EXPECT_NE(verify(Q).find("must have the rank of wte.weight's global shape"),
            std::string::npos)
      << verify(Q);
  // Each parameter is updated by one adam_w: ln.bias's slice has the shape
  // of ln.weight's, so naming ln.weight there is only caught as a duplicate.
  Q = P;
  Q.ranks[0].instrs[instrAt(Q, 0, "ln.bias.adamw")].paramName = "ln.weight";
  EXPECT_NE(verify(Q).find("parameter ln.weight is already updated by "
                           "another adam_w"),
            std::string::npos)
      << verify(Q);
  // Moments are shaped like the slice: the gradient must match it.
  Q = P;
  Q.ranks[1].instrs[Wte].inputs[1] =
      Q.ranks[1].instrs[instrAt(Q, 1, "wte.weight.grad_scatter")].inputs[0];
  EXPECT_NE(verify(Q).find("gradient [16,32] does not match the parameter "
                           "[8,32]"),
            std::string::npos)
      << verify(Q);
}

TEST(Verifier, AdamWOnAWholeParameterMayNameIt) {
  ProgramDesc P = buildTrainDemo(TrainDemoOptions());
  InstrDesc &Adam = P.ranks[0].instrs.back();
  ASSERT_EQ(Adam.loc, "proj.weight.adamw");
  Adam.paramName = "proj.weight";
  Adam.paramOffset = {0, 0};
  EXPECT_EQ(verify(P), "");
  ProgramDesc Q = P;
  Q.ranks[0].instrs.back().paramName = "fc.weight";
  EXPECT_NE(verify(Q).find("is the parameter proj.weight but param_name says "
                           "fc.weight"),
            std::string::npos)
      << verify(Q);
  // A parameter that is a slice [0, 64) of a [128, 32] whole: the offset
  // must be its own.
  Q = P;
  Q.ranks[0].params.back().globalShape = {128, 32};
  EXPECT_EQ(verify(Q), "");
  Q.ranks[0].instrs.back().paramOffset = {64, 0};
  EXPECT_NE(verify(Q).find("param_offset [64,0] differs from the offset "
                           "[0,0] of the parameter proj.weight"),
            std::string::npos)
      << verify(Q);
  // Without param_name the name is input 0's: a second adam_w of the same
  // parameter is a duplicate.
  Q = P;
  InstrDesc Twice = Q.ranks[0].instrs[Q.ranks[0].instrs.size() - 2];
  ASSERT_EQ(Twice.loc, "fc.bias.adamw");
  Q.ranks[0].instrs.push_back(Twice);
  EXPECT_NE(verify(Q).find("parameter fc.bias is already updated by another "
                           "adam_w"),
            std::string::npos)
      << verify(Q);
}

TEST(Verifier, AssignWritesOnlyParameters) {
  ProgramDesc P = buildTrainDemo(zeroOptions(2));
  ASSERT_EQ(verify(P), "");
  const size_t A = instrAt(P, 0, "fc.weight.assign");
  // Into a buffer that is not a parameter.
  ProgramDesc Q = P;
  RankDesc &R = Q.ranks[0];
  uint32_t Fresh = R.addBuffer(dt::F32, {32, 64}, "not_a_param");
  R.instrs[A].outputs = {Fresh};
  EXPECT_NE(verify(Q).find("rank 0, instruction " + std::to_string(A) +
                           " (assign): output %" + std::to_string(Fresh) +
                           " is not a parameter (assign writes a "
                           "parameter's buffer)"),
            std::string::npos)
      << verify(Q);
  // A source of another shape (the slice instead of the gathered whole).
  Q = P;
  const size_t S = instrAt(Q, 0, "fc.weight.shard");
  Q.ranks[0].instrs[A].inputs = Q.ranks[0].instrs[S].outputs;
  EXPECT_NE(verify(Q).find("source [16,64] does not match the parameter "
                           "fc.weight [32,64]"),
            std::string::npos)
      << verify(Q);
  // Its own source.
  Q = P;
  Q.ranks[0].instrs[A].inputs = Q.ranks[0].instrs[A].outputs;
  EXPECT_NE(verify(Q).find("is also an input"), std::string::npos)
      << verify(Q);
  // Other opcodes may not write parameters.
  Q = P;
  const size_t G = instrAt(Q, 0, "fc.weight.gather");
  Q.ranks[0].instrs[G].outputs = Q.ranks[0].instrs[A].outputs;
  EXPECT_NE(verify(Q).find("(all_gather): output 0 (%4) is the parameter "
                           "fc.weight (only adam_w and assign write "
                           "parameters)"),
            std::string::npos)
      << verify(Q);
}

TEST(Verifier, ReduceScatterShapesTypesAndAgreement) {
  ProgramDesc P = buildCollectiveTest(2);
  ASSERT_EQ(verify(P), "");
  auto &Rs1 = P.ranks[0].instrs[4]; // reduce_scatter along dim 1
  ASSERT_EQ(Rs1.op, op::ReduceScatter);
  ASSERT_EQ(Rs1.ints, (std::vector<int64_t>{1}));
  // Output shape: dim 1 divided by the group size, the others kept.
  ProgramDesc Q = P;
  Q.ranks[0].buffers[Q.ranks[0].instrs[4].outputs[0]].shape = {2, 8, 12};
  EXPECT_EQ(verify(Q), "rank 0, instruction 4 (reduce_scatter): output has "
                       "shape [2,8,12] but the inputs imply [4,4,12]");
  // The dimension must exist and divide by the group size.
  Q = P;
  Q.ranks[0].instrs[4].ints = {3};
  EXPECT_EQ(verify(Q), "rank 0, instruction 4 (reduce_scatter): dim 3 is out "
                       "of range for shape [4,8,12]");
  Q = P;
  for (auto &R : Q.ranks) {
    for (uint32_t B : {R.instrs[0].outputs[0], R.instrs[1].outputs[0], 0u, 1u})
      R.buffers[B].shape = {5, 8, 12};
    for (auto &Pa : R.params)
      Pa.globalShape = {5, 8, 12};
  }
  EXPECT_EQ(verify(Q), "rank 0, instruction 2 (reduce_scatter): dimension 0 "
                       "of [5,8,12] is not divisible by the group size 2");
  // f32 only.
  Q = P;
  uint32_t Ids = Q.ranks[0].addBuffer(dt::I32, {4, 8}, "ids");
  Q.ranks[0].inputs.push_back({"ids", Ids, "tokens"});
  Q.batch = 4;
  Q.seq = 8;
  Q.ranks[0].instrs[4].inputs = {Ids};
  EXPECT_EQ(verify(Q), "rank 0, instruction 4 (reduce_scatter): input 0 is "
                       "i32, expected f32");
  // Members of a group must scatter the same sizes along the same dims.
  Q = P;
  Q.ranks[1].instrs[4].ints = {2};
  Q.ranks[1].buffers[Q.ranks[1].instrs[4].outputs[0]].shape = {4, 8, 6};
  Q.ranks[1].instrs[5].ints = {2};
  EXPECT_EQ(verify(Q), "ranks 0 and 1 disagree on their x collectives: "
                       "collective 2 is reduce_scatter of 384 elements along "
                       "dim 1 (instruction 4) on rank 0 but reduce_scatter "
                       "of 384 elements along dim 2 (instruction 4) on rank "
                       "1");
  Q = P;
  Q.ranks[1].instrs[2].op = op::AllReduce;
  Q.ranks[1].instrs[2].ints = {};
  Q.ranks[1].buffers[Q.ranks[1].instrs[2].outputs[0]].shape = {4, 8, 12};
  Q.ranks[1].instrs[3].ints = {1};
  Q.ranks[1].buffers[Q.ranks[1].instrs[3].outputs[0]].shape = {4, 16, 12};
  Q.ranks[1].outputs.erase(Q.ranks[1].outputs.begin() + 1,
                           Q.ranks[1].outputs.begin() + 3);
  EXPECT_NE(verify(Q).find("collective 0 is reduce_scatter of 384 elements "
                           "along dim 0 (instruction 2) on rank 0 but "
                           "all_reduce of 384 elements (instruction 2)"),
            std::string::npos)
      << verify(Q);
}

/// Collectives of member \p Coord of a two-member group whose other member
/// contributes the same values: the sum is twice this member's data.
class TwinCollectives : public Collectives {
public:
  explicit TwinCollectives(int Coord) : Coord(Coord) {}
  void allReduceSum(int, float *Data, size_t N) override {
    for (size_t I = 0; I < N; ++I)
      Data[I] *= 2;
  }
  void allGather(int, const void *Send, size_t Bytes, void *Recv) override {
    std::memcpy(static_cast<char *>(Recv), Send, Bytes);
    std::memcpy(static_cast<char *>(Recv) + Bytes, Send, Bytes);
  }
  void reduceScatterSum(int, const float *Send, float *Recv,
                        size_t N) override {
    for (size_t I = 0; I < N; ++I)
      Recv[I] = 2 * Send[size_t(Coord) * N + I];
  }

private:
  int Coord;
};

TEST(Executor, ReduceScatterTakesThisMembersChunkAlongEachDim) {
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildCollectiveTest(2)), L), "");
  for (uint32_t Rank : {0u, 1u}) {
    Executor E(*L.program, Rank);
    E.allocate();
    E.initParams(3);
    TwinCollectives C{int(Rank)};
    E.run(C);
    const Tensor &X = E.buffer(0);
    const float F = float(Rank + 1) * 2; // this rank's y, twice
    for (int D = 0; D < 3; ++D) {
      const Tensor &Rs = E.buffer(E.rankProgram().instrs()->Get(2 + 2 * D)
                                      ->outputs()->Get(0));
      ASSERT_EQ(Rs.shape[size_t(D)] * 2, X.shape[size_t(D)]);
      for (int64_t I = 0; I < Rs.shape[0]; ++I)
        for (int64_t J = 0; J < Rs.shape[1]; ++J)
          for (int64_t K = 0; K < Rs.shape[2]; ++K) {
            int64_t Idx[3] = {I, J, K};
            Idx[D] += Rank * Rs.shape[size_t(D)];
            float Want =
                X.f[size_t((Idx[0] * X.shape[1] + Idx[1]) * X.shape[2] +
                           Idx[2])] *
                F;
            ASSERT_EQ(Rs.f[size_t((I * Rs.shape[1] + J) * Rs.shape[2] + K)],
                      Want)
                << "rank " << Rank << " dim " << D << " at " << I << "," << J
                << "," << K;
          }
    }
  }
}

TEST(Zero, SingleRankZeroPlanTrainsLikeThePlainOne) {
  // With a group of one, slice/scatter/gather are identities: the ZeRO
  // pattern must then give the plain plan's parameters and moments exactly.
  TrainDemoOptions O;
  LoadedPlan Plain, Zero;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O)), Plain), "");
  O.zero = true;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(O)), Zero), "");
  std::vector<int32_t> Data(400);
  for (size_t I = 0; I < Data.size(); ++I)
    Data[I] = int32_t((I * 5 + I / 7) % size_t(O.vocab));
  TokenSource S = TokenSource::fromTokens(Data);
  Executor A(*Plain.program, 0), B(*Zero.program, 0);
  A.allocate();
  B.allocate();
  A.initParams(9);
  B.initParams(9);
  uint64_t PosA = 0, PosB = 0;
  std::vector<float> LA, LB;
  trainSteps(A, S, PosA, 1, 5, LA);
  trainSteps(B, S, PosB, 1, 5, LB);
  EXPECT_EQ(LA, LB);
  for (const auto *Pa : *Plain.program->ranks()->Get(0)->params())
    EXPECT_EQ(A.buffer(Pa->buffer()).f, B.buffer(Pa->buffer()).f)
        << Pa->name()->str();
  ASSERT_EQ(A.adamStates().size(), B.adamStates().size());
  for (size_t I = 0; I < A.adamStates().size(); ++I) {
    EXPECT_EQ(A.adamStates()[I].param, B.adamStates()[I].param);
    EXPECT_EQ(A.adamStates()[I].m, B.adamStates()[I].m);
    EXPECT_EQ(A.adamStates()[I].v, B.adamStates()[I].v);
  }
}

TEST(Zero, MomentsCoverTheRanksSliceAndRoundTrip) {
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(buildTrainDemo(zeroOptions(2))), L),
            "");
  Executor E(*L.program, 1);
  E.allocate();
  E.initParams(4);
  ASSERT_EQ(E.adamStates().size(), 7u);
  const AdamState &Wte = E.adamStates()[0];
  EXPECT_EQ(Wte.param, "wte.weight");
  EXPECT_EQ(Wte.globalShape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(Wte.offset, (std::vector<int64_t>{8, 0}));
  EXPECT_EQ(Wte.m.size(), 8u * 32u);
  for (AdamState &St : E.adamStates())
    for (size_t I = 0; I < St.m.size(); ++I) {
      St.m[I] = float(I) * 0.5f;
      St.v[I] = float(I) * 0.25f;
    }

  TempDir Dir;
  ShardInfo Shard = writeCheckpointShard(Dir.Path, 3, E);
  // (Before rank 0's meta.json moves it into place, the shard is in the
  // step's staging directory.)
  const std::string Staged = Dir.Path + "/" + stagingDirName(3) + "/";
  SafetensorsFile F(Staged + Shard.file);
  const TensorInfo *M = F.header().find("adam_m/wte.weight");
  ASSERT_NE(M, nullptr);
  EXPECT_EQ(M->shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(F.header().find("param/wte.weight")->shape,
            (std::vector<int64_t>{16, 32}));
  {
    std::ifstream In(Staged + Shard.file, std::ios::binary);
    uint64_t N = 0;
    In.read(reinterpret_cast<char *>(&N), 8);
    std::string Hdr(N, ' ');
    In.read(&Hdr[0], std::streamsize(N));
    nlohmann::json Meta = nlohmann::json::parse(Hdr)["__metadata__"];
    EXPECT_EQ(nlohmann::json::parse(Meta["adam_v/wte.weight"].get<std::string>()),
              nlohmann::json::parse(
                  R"({"global_shape":[16,32],"offset":[8,0]})"));
  }

  // Loading matches the moments back by name and slice.
  CheckpointMeta Meta;
  Meta.step = 3;
  Meta.worldSize = 2;
  Meta.grid = gridString(*L.program);
  Meta.modelHash = L.program->model_hash();
  Meta.shards = {Shard, Shard};
  Meta.shards[0].rank = 0;
  Meta.shards[0].file = shardFileName(0);
  Executor R(*L.program, 1);
  R.allocate();
  loadCheckpointShard(Staged, Meta, R, true);
  for (size_t I = 0; I < R.adamStates().size(); ++I) {
    EXPECT_EQ(R.adamStates()[I].m, E.adamStates()[I].m);
    EXPECT_EQ(R.adamStates()[I].v, E.adamStates()[I].v);
  }
  // Rank 0's plan wants the slice at [0,0]: this shard does not fit it.
  Executor R0(*L.program, 0);
  R0.allocate();
  Meta.shards[0] = Shard;
  try {
    loadCheckpointShard(Staged, Meta, R0, true);
    FAIL() << "a moment of another slice was accepted";
  } catch (const RunError &Ex) {
    EXPECT_NE(std::string(Ex.what()).find(
                  "tensor adam_m/wte.weight is the slice "),
              std::string::npos)
        << Ex.what();
  }
}

} // namespace

