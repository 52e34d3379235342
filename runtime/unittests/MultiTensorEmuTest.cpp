//===- MultiTensorEmuTest.cpp - Many tensors a launch, on the emulation ---===//
//
// The CUDA backend runs a run of round_bf16, AdamW or sum_squares
// instructions as one launch over a table of tensors. Each tensor must
// come out as a launch of its own would leave it: every element of the
// roundings (against round-to-nearest-even worked out here from the bits),
// and every sum of squares bit for bit the same in a run as alone (and
// within double rounding of a sum taken here), across tensors of no
// elements, fewer than four, unaligned ones and ones of many blocks. And
// the loss's reductions: its sum of the rows' losses (one block, in row
// order, the bits of a sum taken here one row after another), and each
// row's softmax statistics and loss over rows a vocabulary wide.
//
//===----------------------------------------------------------------------===//

#include "EmuLaunch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace megac_rt;
using namespace megac_rt::cuda;

namespace {

/// Element counts, and the offset (in floats) of each tensor's start in
/// its 16-byte aligned storage: 1 makes it unaligned.
struct Case {
  int64_t N, Offset;
};
// (The last: more than four times a launch's 1024 blocks of 256 threads
// of groups of four, so that the sums' threads load four groups at once.)
const Case kCases[] = {{0, 0},    {3, 0},     {4, 0}, {1029, 0},
                       {1030, 1}, {70001, 0}, {5, 2}, {4200003, 0}};

std::vector<float> values(int64_t N, int Seed) {
  std::vector<float> V(static_cast<size_t>(N));
  for (int64_t I = 0; I < N; ++I)
    V[size_t(I)] = float(std::sin(0.37 * double(I) + Seed)) * 3.1f;
  return V;
}

TEST(MultiTensor, RoundingsComeOutAsAlone) {
  std::vector<std::vector<float>> In, Out;
  std::vector<std::vector<uint16_t>> Bits;
  std::vector<RoundSpan> Table;
  for (const Case &C : kCases) {
    In.push_back(std::vector<float>(size_t(C.N + 8)));
    Out.push_back(std::vector<float>(size_t(C.N + 8), -1.0f));
    Bits.push_back(std::vector<uint16_t>(size_t(C.N + 8)));
  }
  for (size_t T = 0; T < In.size(); ++T) {
    const Case &C = kCases[T];
    const std::vector<float> V = values(C.N, int(T));
    std::copy(V.begin(), V.end(), In[T].begin() + C.Offset);
    RoundSpan E;
    E.X = In[T].data() + C.Offset;
    E.Y = Out[T].data() + C.Offset;
    E.Bits = Bits[T].data() + C.Offset;
    E.Span.N = C.N;
    E.Span.Groups =
        aligned16(E.X) && aligned16(E.Y) && aligned16(E.Bits) ? C.N / 4 : 0;
    Table.push_back(E);
  }
  const int64_t Blocks = layOutSpans(Table);
  const RoundSpan *Tp = Table.data();
  const int Count = int(Table.size());
  launchBlocks(Blocks, [=] { roundBf16ManyKernel(Tp, Count); });
  for (size_t T = 0; T < In.size(); ++T) {
    const Case &C = kCases[T];
    for (int64_t I = 0; I < C.N; ++I) {
      const float X = In[T][size_t(C.Offset + I)];
      const float Y = Out[T][size_t(C.Offset + I)];
      ASSERT_EQ(Y, roundedHere(X)) << "tensor " << T << " element " << I;
      uint32_t U;
      std::memcpy(&U, &Y, 4);
      ASSERT_EQ(Bits[T][size_t(C.Offset + I)], uint16_t(U >> 16));
    }
    // Nothing outside the tensor is written.
    EXPECT_EQ(Out[T][size_t(C.Offset + C.N)], -1.0f) << "tensor " << T;
  }
}

/// Each tensor's sum of squares from a launch over \p Which of kCases.
std::vector<float> sumsOf(const std::vector<size_t> &Which,
                          std::vector<std::vector<float>> &Data) {
  std::vector<SumSquaresSpan> Table;
  std::vector<float> Sums(Which.size(), -1.0f);
  int64_t Parts = 0;
  for (size_t K = 0; K < Which.size(); ++K) {
    const Case &C = kCases[Which[K]];
    SumSquaresSpan E;
    E.X = Data[Which[K]].data() + C.Offset;
    E.Y = &Sums[K];
    E.Span.N = C.N;
    E.Span.Groups = aligned16(E.X) ? C.N / 4 : 0;
    E.Blocks = reductionBlocks(C.N);
    E.Span.FirstBlock = Parts;
    Parts += E.Blocks;
    Table.push_back(E);
  }
  std::vector<double> PartSums(static_cast<size_t>(Parts));
  const SumSquaresSpan *Tp = Table.data();
  const int Count = int(Table.size());
  double *Pp = PartSums.data();
  launchBlocks(Parts, [=] { sumSquaresPartsManyKernel(Tp, Count, Pp); });
  launchBlocks(Count, [=] { sumSquaresTotalsKernel(Tp, Pp); });
  return Sums;
}

TEST(MultiTensor, SumsOfSquaresAreTheSameInARunAsAlone) {
  std::vector<std::vector<float>> Data;
  std::vector<size_t> All;
  for (size_t T = 0; T < std::size(kCases); ++T) {
    const Case &C = kCases[T];
    Data.push_back(std::vector<float>(size_t(C.N + 8)));
    const std::vector<float> V = values(C.N, int(T) + 10);
    std::copy(V.begin(), V.end(), Data.back().begin() + C.Offset);
    All.push_back(T);
  }
  const std::vector<float> InARun = sumsOf(All, Data);
  for (size_t T = 0; T < All.size(); ++T) {
    const float Alone = sumsOf({T}, Data)[0];
    EXPECT_EQ(InARun[T], Alone) << "tensor " << T;
    double Here = 0;
    for (int64_t I = 0; I < kCases[T].N; ++I) {
      const double V = Data[T][size_t(kCases[T].Offset + I)];
      Here += V * V;
    }
    EXPECT_EQ(InARun[T], float(Here)) << "tensor " << T;
  }
  EXPECT_EQ(InARun[0], 0.0f); // no elements
}

// Row losses whose sum depends on the order of the adds, even rounded to
// float: ones, with 1e17 at a third of the rows and -1e17 at two thirds
// (in row order the ones between the two vanish into 1e17; in another
// order some would count); counts around the kernel's tile of 2048 rows
// (staged in shared memory, then added by one thread) and a step's 8192
// tokens.
TEST(RowSum, LossesAddInRowOrderAcrossTiles) {
  for (const int64_t N : {0, 1, 2047, 2048, 2049, 5000, 8192}) {
    std::vector<double> Rows(static_cast<size_t>(N), 1.0);
    if (N > 2) {
      Rows[size_t(N / 3)] = 1e17;
      Rows[size_t(2 * N / 3)] = -1e17;
    }
    double Here = 0;
    for (const double R : Rows)
      Here += R;
    const double Norm = 3.0;
    float Y = -1.0f;
    const double *Rp = Rows.data();
    float *Yp = &Y;
    launchBlocks(1, [=] { sumRowsKernel(Rp, N, Norm, Yp); });
    EXPECT_EQ(Y, float(Here / Norm)) << N << " rows";
  }
}

// Rows as wide as GPT-2's vocabularies (50304, and 50257: rows starting
// off a group of four), wider than a block's threads take in one batch
// of four-wide loads each (4 x 4 x 256 logits): the loss logsumexp -
// logit[label] and the statistics [max, sum of exp(logit - max)] against
// a computation here in double (the kernel's terms are fp32 exps).
TEST(Loss, WideRowsGiveTheirLogSumExp) {
  for (const int64_t V : {50304, 50257}) {
    const int64_t Rows = 3;
    std::vector<float> L(static_cast<size_t>(Rows * V));
    for (size_t I = 0; I < L.size(); ++I)
      L[I] = float(std::sin(0.0137 * double(I)) * 6.0 +
                   std::cos(0.71 * double(I)) * 2.0);
    const std::vector<int32_t> Labels = {0, int32_t(V / 2), int32_t(V - 1)};
    std::vector<double> Out(static_cast<size_t>(Rows)),
        Stats(static_cast<size_t>(2 * Rows));
    int Bad = 0;
    const float *Lp = L.data();
    const int32_t *Lab = Labels.data();
    double *Op = Out.data(), *Sp = Stats.data();
    int *Bp = &Bad;
    launchBlocks(Rows, [=] {
      crossEntropyRowsKernel<float>(Lp, Rows, V, V, Lab, Op, Sp, Bp);
    });
    EXPECT_EQ(Bad, 0);
    for (int64_t R = 0; R < Rows; ++R) {
      const float *Row = L.data() + R * V;
      double Max = -INFINITY, Sum = 0;
      for (int64_t J = 0; J < V; ++J)
        Max = std::max(Max, double(Row[J]));
      for (int64_t J = 0; J < V; ++J)
        Sum += std::exp(double(Row[J]) - Max);
      const double Loss = Max + std::log(Sum) - double(Row[Labels[size_t(R)]]);
      SCOPED_TRACE("row " + std::to_string(R) + " of " + std::to_string(V));
      EXPECT_EQ(Stats[size_t(2 * R)], Max);
      EXPECT_NEAR(Stats[size_t(2 * R + 1)], Sum, Sum * 1e-6);
      EXPECT_NEAR(Out[size_t(R)], Loss, 1e-5);
    }
  }
}

} // namespace
