//===- RngTest.cpp - Counter-based init and token streams -----------------===//
//
// The property that matters is that a sharded parameter is bit-identical to
// the same elements of the unsharded one, whatever the slice.
//
//===----------------------------------------------------------------------===//

#include "init.h"
#include "rng.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace megac_rt;

namespace {

TEST(Rng, SplitMixAndFnvKnownValues) {
  // Reference values of SplitMix64 seeded with 0 (first output) and of
  // FNV-1a 64 on the empty string and "a".
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}

TEST(Rng, NormalMoments) {
  const uint64_t Key = paramKey("h.0.mlp.c_fc.weight", 1234);
  const int N = 100000;
  double Sum = 0, Sq = 0;
  for (int I = 0; I < N; ++I) {
    double Z = normalAt(Key, uint64_t(I));
    ASSERT_TRUE(std::isfinite(Z));
    Sum += Z;
    Sq += Z * Z;
  }
  double Mean = Sum / N, Std = std::sqrt(Sq / N - Mean * Mean);
  EXPECT_NEAR(Mean, 0.0, 0.02);
  EXPECT_NEAR(Std, 1.0, 0.02);
}

TEST(Rng, SliceMatchesWhole) {
  const ShapeVec Global = {6, 10};
  std::vector<float> Whole(60);
  initParamSlice("w", InitMode::Normal, 0.02, Global, {0, 0}, Global, 99,
                 Whole.data());
  // A column slice (like tp-sharded c_fc) and a row slice (like c_proj).
  struct Case {
    ShapeVec Off, Local;
  } Cases[] = {{{0, 5}, {6, 5}}, {{2, 0}, {3, 10}}, {{1, 3}, {4, 4}}};
  for (const Case &C : Cases) {
    std::vector<float> Part(size_t(C.Local[0] * C.Local[1]));
    initParamSlice("w", InitMode::Normal, 0.02, Global, C.Off, C.Local, 99,
                   Part.data());
    for (int64_t R = 0; R < C.Local[0]; ++R)
      for (int64_t K = 0; K < C.Local[1]; ++K)
        ASSERT_EQ(Part[size_t(R * C.Local[1] + K)],
                  Whole[size_t((C.Off[0] + R) * 10 + C.Off[1] + K)]);
  }
}

TEST(Rng, DependsOnNameAndSeed) {
  std::vector<float> A(8), B(8), C(8);
  initParamSlice("a", InitMode::Normal, 1.0, {8}, {0}, {8}, 1, A.data());
  initParamSlice("b", InitMode::Normal, 1.0, {8}, {0}, {8}, 1, B.data());
  initParamSlice("a", InitMode::Normal, 1.0, {8}, {0}, {8}, 2, C.data());
  EXPECT_NE(A, B);
  EXPECT_NE(A, C);
  std::vector<float> O(3);
  initParamSlice("o", InitMode::Ones, 0, {3}, {0}, {3}, 1, O.data());
  EXPECT_EQ(O, std::vector<float>(3, 1.0f));
}

TEST(Rng, DefaultTokenStream) {
  auto T = defaultTokenStream(1234, 1000, 50);
  auto U = defaultTokenStream(1234, 10, 50);
  ASSERT_EQ(T.size(), 1000u);
  for (size_t I = 0; I < 10; ++I)
    EXPECT_EQ(T[I], U[I]); // a prefix does not depend on the length
  for (int32_t X : T)
    ASSERT_TRUE(X >= 0 && X < 50);
  EXPECT_EQ(T[0], int32_t(splitmix64(splitmix64(1234)) % 50));
}

TEST(Rng, ForEachRunScalar) {
  int Calls = 0;
  forEachRun({}, {}, {}, [&](int64_t L, int64_t B, int64_t Len) {
    EXPECT_EQ(L, 0);
    EXPECT_EQ(B, 0);
    EXPECT_EQ(Len, 1);
    ++Calls;
  });
  EXPECT_EQ(Calls, 1);
}

} // namespace
