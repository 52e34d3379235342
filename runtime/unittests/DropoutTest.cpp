//===- DropoutTest.cpp - Counter-based dropout (format version 4) ---------===//
//
// The mask of an element depends only on (seed, stream, step, its index in
// the whole tensor): these tests check the statistics, that any blocking of
// a tensor gives the unblocked mask bit for bit, that the gradient (the
// same dropout of dy) uses the forward mask, and the executor's and the
// verifier's handling of the opcode.
//
//===----------------------------------------------------------------------===//

#include "executor.h"
#include "kernels.h"
#include "plan_builder.h"
#include "rng.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

using namespace megac_rt;
using namespace megac_rt::builder;

namespace {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape &S) {
  int64_t N = 1;
  for (int64_t D : S)
    N *= D;
  return N;
}

std::vector<float> values(size_t N, float Shift = 0.3f) {
  std::vector<float> V(N);
  for (size_t I = 0; I < N; ++I)
    V[I] = 1.0f + 0.5f * std::sin(float(I) * 0.7f + Shift);
  return V;
}

std::vector<float> dropWhole(const std::vector<float> &X, const Shape &S,
                             double Rate, uint64_t Seed, uint64_t Stream,
                             uint64_t Step) {
  std::vector<float> Y(X.size());
  kernels::dropout(X.data(), S, S, Shape(S.size(), 0), Rate, Seed, Stream,
                   Step, Y.data());
  return Y;
}

bool sameBits(const std::vector<float> &A, const std::vector<float> &B) {
  return A.size() == B.size() &&
         std::memcmp(A.data(), B.data(), A.size() * sizeof(float)) == 0;
}

TEST(Dropout, FormulaKnownValues) {
  // Computed independently (Python, test/runtime/Inputs/check_dropout.py's
  // formula): K = splitmix64(splitmix64(splitmix64(1234 ^ tag) + 7) + 1).
  const uint64_t K = dropoutKey(1234, 7, 1);
  EXPECT_EQ(K, 0x4dc469dbd7430bacull);
  EXPECT_EQ(splitmix64(K + 0), 0x3d745638b4900671ull);
  EXPECT_EQ(dropoutUniform(K, 0), 0.24005640873343737);
  EXPECT_EQ(dropoutUniform(K, 1), 0.4259284991954273);
  EXPECT_EQ(dropoutUniform(K, 1000), 0.11180501520805752);
  // So at rate 0.25, element 0 is dropped and element 1 kept.
  std::vector<float> X = {2.0f, 3.0f}, Y(2);
  kernels::dropout(X.data(), {2}, {2}, {0}, 0.25, 1234, 7, 1, Y.data());
  EXPECT_EQ(Y[0], 0.0f);
  EXPECT_EQ(Y[1], float(3.0 * (1.0 / 0.75)));
}

TEST(Dropout, KeepFractionAndMean) {
  const int64_t N = 100000;
  const std::vector<float> X = values(size_t(N));
  double MeanX = 0;
  for (float V : X)
    MeanX += V;
  MeanX /= double(N);
  for (double Rate : {0.1, 0.5, 0.9}) {
    std::vector<float> Y = dropWhole(X, {N}, Rate, 42, 3, 1);
    const double Scale = 1.0 / (1.0 - Rate);
    int64_t Kept = 0;
    double MeanY = 0;
    for (int64_t I = 0; I < N; ++I) {
      MeanY += Y[size_t(I)];
      if (Y[size_t(I)] != 0.0f) {
        ++Kept;
        ASSERT_EQ(Y[size_t(I)], float(double(X[size_t(I)]) * Scale));
      }
    }
    MeanY /= double(N);
    // Binomial std of the fraction is at most 0.0016 here: ~6 sigma.
    EXPECT_NEAR(double(Kept) / double(N), 1.0 - Rate, 0.01) << Rate;
    // mean(y) has std sqrt(E[x^2] rate / (1 - rate) / N) <= 0.01 at 0.9.
    EXPECT_NEAR(MeanY, MeanX, Rate < 0.8 ? 0.02 : 0.06) << Rate;
  }
}

/// Drops out \p S as Parts blocks along \p Dim (each at its offset) and
/// writes the blocks back into a whole tensor.
std::vector<float> dropInBlocks(const std::vector<float> &X, const Shape &S,
                                size_t Dim, int64_t Parts, double Rate,
                                uint64_t Seed, uint64_t Stream,
                                uint64_t Step) {
  int64_t Outer = 1, Inner = 1;
  for (size_t D = 0; D < Dim; ++D)
    Outer *= S[D];
  for (size_t D = Dim + 1; D < S.size(); ++D)
    Inner *= S[D];
  const int64_t Len = S[Dim] / Parts;
  std::vector<float> Whole(X.size(), -1.0f);
  for (int64_t P = 0; P < Parts; ++P) {
    Shape Local = S, Off(S.size(), 0);
    Local[Dim] = Len;
    Off[Dim] = P * Len;
    std::vector<float> Block(size_t(numel(Local))), Out(Block.size());
    kernels::sliceChunk(reinterpret_cast<const uint8_t *>(X.data()), Outer,
                        Len, Inner, Parts, P, 4,
                        reinterpret_cast<uint8_t *>(Block.data()));
    kernels::dropout(Block.data(), Local, S, Off, Rate, Seed, Stream, Step,
                     Out.data());
    // Put the block back where it came from.
    for (int64_t O = 0; O < Outer; ++O)
      std::memcpy(Whole.data() + (O * S[Dim] + P * Len) * Inner,
                  Out.data() + O * Len * Inner,
                  size_t(Len * Inner) * sizeof(float));
  }
  return Whole;
}

TEST(Dropout, BlocksMatchWhole) {
  for (const Shape &S : {Shape{16, 24}, Shape{8, 12, 10}}) {
    const std::vector<float> X = values(size_t(numel(S)));
    const std::vector<float> Y = dropWhole(X, S, 0.3, 5, 11, 4);
    for (size_t Dim : {size_t(0), size_t(1)})
      for (int64_t Parts : {2, 4}) {
        std::vector<float> B = dropInBlocks(X, S, Dim, Parts, 0.3, 5, 11, 4);
        EXPECT_TRUE(sameBits(B, Y))
            << "shape " << shapeString(S) << ", " << Parts
            << " blocks along dim " << Dim;
      }
  }
}

TEST(Dropout, BlockInTheMiddle) {
  // A 2-D block not at the origin: rows 2..4, columns 3..8 of [6x10].
  const Shape S = {6, 10};
  const std::vector<float> X = values(60);
  const std::vector<float> Y = dropWhole(X, S, 0.5, 9, 1, 1);
  std::vector<float> Block, Out(15);
  for (int64_t R = 2; R < 5; ++R)
    for (int64_t C = 3; C < 8; ++C)
      Block.push_back(X[size_t(R * 10 + C)]);
  kernels::dropout(Block.data(), {3, 5}, S, {2, 3}, 0.5, 9, 1, 1, Out.data());
  for (int64_t R = 0; R < 3; ++R)
    for (int64_t C = 0; C < 5; ++C)
      ASSERT_EQ(Out[size_t(R * 5 + C)], Y[size_t((R + 2) * 10 + C + 3)]);
}

std::vector<bool> maskOf(const std::vector<float> &Y) {
  std::vector<bool> M;
  for (float V : Y)
    M.push_back(V != 0.0f);
  return M;
}

TEST(Dropout, StreamsStepsAndSeedsGiveDifferentMasks) {
  const std::vector<float> X = values(4096);
  const Shape S = {64, 64};
  const auto Base = maskOf(dropWhole(X, S, 0.5, 1, 3, 1));
  EXPECT_EQ(maskOf(dropWhole(X, S, 0.5, 1, 3, 1)), Base); // deterministic
  const std::vector<std::vector<bool>> Others = {
      maskOf(dropWhole(X, S, 0.5, 1, 4, 1)),  // stream
      maskOf(dropWhole(X, S, 0.5, 1, 3, 2)),  // step
      maskOf(dropWhole(X, S, 0.5, 2, 3, 1))}; // seed
  for (const auto &M : Others) {
    // Independent masks at rate 0.5 agree on about half the elements.
    int64_t Same = 0;
    for (size_t I = 0; I < M.size(); ++I)
      Same += M[I] == Base[I];
    EXPECT_NEAR(double(Same) / double(M.size()), 0.5, 0.05);
  }
}

TEST(Dropout, RateZeroIsIdentity) {
  std::vector<float> X = values(1000);
  X[3] = -0.0f;
  X[4] = 1e-40f; // denormal
  for (int Step : {1, 7}) {
    std::vector<float> Y = dropWhole(X, {10, 100}, 0.0, 3, 2, uint64_t(Step));
    EXPECT_TRUE(sameBits(X, Y));
    // The same through a block at an offset.
    std::vector<float> Z(500);
    kernels::dropout(X.data() + 500, {5, 100}, {10, 100}, {5, 0}, 0.0, 3, 2,
                     uint64_t(Step), Z.data());
    EXPECT_TRUE(sameBits(std::vector<float>(X.begin() + 500, X.end()), Z));
  }
}

TEST(Dropout, GradientUsesTheSameMask) {
  // d dropout(x) / dx = the same dropout applied to dy.
  const Shape S = {32, 50};
  const std::vector<float> X = values(1600, 0.3f), DY = values(1600, 2.1f);
  const double Rate = 0.2;
  const std::vector<float> Y = dropWhole(X, S, Rate, 77, 5, 3);
  const std::vector<float> DX = dropWhole(DY, S, Rate, 77, 5, 3);
  int64_t Kept = 0;
  for (size_t I = 0; I < X.size(); ++I) {
    ASSERT_NE(X[I], 0.0f);
    ASSERT_NE(DY[I], 0.0f);
    ASSERT_EQ(Y[I] == 0.0f, DX[I] == 0.0f) << I;
    if (Y[I] != 0.0f) {
      ++Kept;
      EXPECT_NEAR(double(Y[I]) / X[I], double(DX[I]) / DY[I], 1e-6);
      EXPECT_NEAR(double(Y[I]) / X[I], 1.0 / (1.0 - Rate), 1e-6);
    }
  }
  EXPECT_GT(Kept, 0);
  EXPECT_LT(Kept, int64_t(X.size()));
  // In place (y = x) gives the same result.
  std::vector<float> InPlace = X;
  kernels::dropout(InPlace.data(), S, S, {0, 0}, Rate, 77, 5, 3,
                   InPlace.data());
  EXPECT_TRUE(sameBits(InPlace, Y));
}

//===-- Plans ---------------------------------------------------------------===//

/// One rank: parameter x [4,6] (normal), y = dropout(x) as the block at
/// [4, 0] of a [8,6] tensor, output y.
ProgramDesc dropoutProgram(double Rate = 0.5, int64_t Stream = 3) {
  ProgramDesc P;
  P.modelName = "dropout";
  P.seed = 11;
  RankDesc R;
  uint32_t X = R.addBuffer(dt::F32, {4, 6}, "x");
  R.params.push_back({"x", X, {4, 6}, {0, 0}, ik::Normal, 1.0, "", {}});
  uint32_t Y = R.emit(op::Dropout, {X}, {4, 6},
                      dropoutInts(Stream, {8, 6}, {4, 0}), {Rate}, -1,
                      "model.py:3");
  R.outputs.push_back({"y", Y, ""});
  P.ranks.push_back(R);
  return P;
}

std::string verify(const ProgramDesc &P) {
  LoadedPlan L;
  return verifyPlanBytes(buildPlanBytes(P), L);
}

TEST(Dropout, ExecutorSeedStepAndInference) {
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(dropoutProgram()), L), "");
  Executor E(*L.program, 0);
  E.allocate();
  E.initParams(11);
  LocalCollectives C;
  const std::vector<float> X = E.buffer(0).f;
  auto Run = [&]() {
    E.run(C);
    return E.buffer(1).f;
  };
  auto Kernel = [&](uint64_t Seed, uint64_t Step) {
    std::vector<float> Y(X.size());
    kernels::dropout(X.data(), {4, 6}, {8, 6}, {4, 0}, 0.5, Seed, 3, Step,
                     Y.data());
    return Y;
  };
  // Defaults: the plan's seed and step 1.
  EXPECT_EQ(E.seed(), 11u);
  EXPECT_EQ(E.step(), 1);
  const std::vector<float> Y1 = Run();
  EXPECT_TRUE(sameBits(Y1, Kernel(11, 1)));
  EXPECT_FALSE(sameBits(Y1, X));
  E.setStep(2, 0.0);
  const std::vector<float> Y2 = Run();
  EXPECT_TRUE(sameBits(Y2, Kernel(11, 2)));
  EXPECT_FALSE(sameBits(Y1, Y2));
  E.setSeed(12);
  EXPECT_TRUE(sameBits(Run(), Kernel(12, 2)));
  E.setInference(true);
  EXPECT_TRUE(sameBits(Run(), X));
  E.setInference(false);
  EXPECT_TRUE(sameBits(Run(), Kernel(12, 2)));
}

TEST(Dropout, VerifierAcceptsValidPlans) {
  EXPECT_EQ(verify(dropoutProgram()), "");
  EXPECT_EQ(verify(dropoutProgram(0.0)), "");
  EXPECT_EQ(verify(dropoutProgram(0.5, -1)), ""); // any int64 stream
  for (uint32_t W : {1u, 2u, 4u})
    EXPECT_EQ(verify(buildDropoutTest(W)), "") << W;
  // A scalar: r = 0, no shape or offset.
  ProgramDesc P = dropoutProgram();
  RankDesc &R = P.ranks[0];
  uint32_t S = R.emit(op::SumSquares, {0}, {});
  R.emit(op::Dropout, {S}, {}, {5, 0}, {0.1});
  EXPECT_EQ(verify(P), "");
}

TEST(Dropout, VerifierRejects) {
  const std::string Pfx = "rank 0, instruction 0 (dropout): ";
  auto WithInts = [](std::vector<int64_t> I) {
    ProgramDesc P = dropoutProgram();
    P.ranks[0].instrs[0].ints = std::move(I);
    return verify(P);
  };
  EXPECT_EQ(WithInts({3, 2, 8, 6, 4}),
            Pfx + "expects 6 integer attributes (stream, r = 2 = the rank of "
                  "input 0 [4,6], global_shape, offset), got [3,2,8,6,4]");
  EXPECT_EQ(WithInts({3, 3, 8, 6, 4, 0}),
            Pfx + "expects 6 integer attributes (stream, r = 2 = the rank of "
                  "input 0 [4,6], global_shape, offset), got [3,3,8,6,4,0]");
  EXPECT_EQ(WithInts({}), Pfx + "expects 6 integer attributes (stream, r = 2 "
                                "= the rank of input 0 [4,6], global_shape, "
                                "offset), got []");
  EXPECT_EQ(WithInts({3, 2, 8, 6, 5, 0}),
            Pfx + "block [4,6] at offset [5,0] does not fit in the global "
                  "shape [8,6]");
  EXPECT_EQ(WithInts({3, 2, 8, 6, -1, 0}),
            Pfx + "block [4,6] at offset [-1,0] does not fit in the global "
                  "shape [8,6]");
  EXPECT_EQ(WithInts({3, 2, 8, 5, 0, 0}),
            Pfx + "block [4,6] at offset [0,0] does not fit in the global "
                  "shape [8,5]");
  EXPECT_EQ(WithInts({3, 2, -8, 6, 0, 0}),
            Pfx + "invalid global shape [-8,6]");
  EXPECT_EQ(WithInts({3, 2, int64_t(1) << 40, 1 << 20, 0, 0}),
            Pfx + "invalid global shape [1099511627776,1048576]");
  for (double Rate : {1.0, -0.1, 2.0, std::nan("")})
    EXPECT_EQ(verify(dropoutProgram(Rate)).rfind(
                  Pfx + "expects one float attribute (rate) in [0, 1), got ",
                  0),
              0u)
        << Rate;
  {
    ProgramDesc P = dropoutProgram();
    P.ranks[0].instrs[0].floats = {};
    EXPECT_EQ(verify(P), Pfx + "expects one float attribute (rate) in [0, 1)");
  }
  {
    ProgramDesc P = dropoutProgram();
    P.ranks[0].buffers[1].shape = {4, 5};
    EXPECT_EQ(verify(P), Pfx + "output has shape [4,5] but the inputs imply "
                               "[4,6]");
  }
  {
    ProgramDesc P = dropoutProgram();
    P.ranks[0].buffers[1].dtype = dt::I32;
    EXPECT_EQ(verify(P), Pfx + "output 0 is i32, expected f32");
  }
  {
    ProgramDesc P = dropoutProgram();
    P.ranks[0].instrs[0].inputs = {0, 0};
    EXPECT_EQ(verify(P), Pfx + "expects 1 inputs and 1 outputs, got 2 and 1");
  }
}

TEST(Dropout, Dumps) {
  EXPECT_STREQ(opcodeName(op::Dropout), "dropout");
  LoadedPlan L;
  ASSERT_EQ(verifyPlanBytes(buildPlanBytes(dropoutProgram(0.1, 3)), L), "");
  std::string T = dumpPlanText(L);
  EXPECT_NE(T.find("0: %1 = dropout %0 {rate = 0.1, stream = 3} : [4x6] f32"
                   "   model.py:3"),
            std::string::npos)
      << T;
  nlohmann::json J = nlohmann::json::parse(dumpPlanJson(L));
  const nlohmann::json &I = J["ranks"][0]["instructions"][0];
  EXPECT_EQ(I["op"], "dropout");
  EXPECT_EQ(I["rate"], 0.1);
  EXPECT_EQ(I["stream"], 3);
  EXPECT_EQ(I["global_shape"], nlohmann::json::parse("[8,6]"));
  EXPECT_EQ(I["offset"], nlohmann::json::parse("[4,0]"));
  EXPECT_EQ(I["ints"], nlohmann::json::parse("[3,2,8,6,4,0]"));
}

} // namespace
