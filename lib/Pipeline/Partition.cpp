//===- Partition.cpp - Pipeline stage partitioning by cost ----------------===//

#include "megac/Pipeline/Partition.h"
#include "megac/Dialect/Megac/IR/MegacOps.h"
#include "megac/Dialect/Megac/IR/ModelStructure.h"

#include <algorithm>
#include <limits>
#include <numeric>

using namespace mlir;

namespace megac {

namespace {

double elements(Value V) {
  auto T = dyn_cast<RankedTensorType>(V.getType());
  return T && T.hasStaticShape() ? double(T.getNumElements()) : 0.0;
}

} // namespace

double trainingFlops(Operation *Op) {
  if (auto L = dyn_cast<LinearOp>(Op)) {
    auto W = cast<RankedTensorType>(L.getWeight().getType());
    double K = double(W.getDimSize(L.getTransposeWeight() ? 1 : 0));
    return 3.0 * 2.0 * elements(L.getResult()) * K;
  }
  if (auto A = dyn_cast<AttentionOp>(Op)) {
    auto Q = cast<RankedTensorType>(A.getQuery().getType());
    double B = double(Q.getDimSize(0)), S = double(Q.getDimSize(1)),
           H = double(Q.getDimSize(2));
    return 3.0 * 4.0 * B * S * S * H;
  }
  if (Op->getNumResults() == 1)
    return 3.0 * 5.0 * std::max(elements(Op->getResult(0)),
                                Op->getNumOperands()
                                    ? elements(Op->getOperand(0))
                                    : 0.0);
  return 0.0;
}

double StagePartition::maxOverMean() const {
  double Sum = std::accumulate(stageCost.begin(), stageCost.end(), 0.0);
  double Max = *std::max_element(stageCost.begin(), stageCost.end());
  return Sum > 0 ? Max / (Sum / double(stageCost.size())) : 1.0;
}

std::vector<int64_t> segmentOfOps(func::FuncOp Func) {
  std::vector<int64_t> Segment;
  int64_t Current = -1;
  for (Operation &Op : Func.getBody().front().without_terminator()) {
    if (auto LN = dyn_cast<LayerNormOp>(Op); LN && opensTransformerBlock(LN))
      ++Current;
    Segment.push_back(std::max<int64_t>(Current, 0));
  }
  if (Current < 0)
    Segment.clear();
  return Segment;
}

int64_t stageOfSegment(const StagePartition &P, int64_t Segment) {
  int64_t Stage = 0;
  while (Stage + 1 < int64_t(P.firstBlock.size()) &&
         P.firstBlock[size_t(Stage + 1)] <= Segment)
    ++Stage;
  return Stage;
}

FailureOr<StagePartition> partitionStages(func::FuncOp Func, int64_t Ranks,
                                          int64_t ChunksPerRank,
                                          std::string &Error) {
  const int64_t Stages = Ranks * ChunksPerRank;
  StagePartition P;
  std::vector<int64_t> Segment = segmentOfOps(Func);
  const int64_t L = Segment.empty() ? 0 : Segment.back() + 1;
  std::vector<double> Cost(size_t(L), 0.0);
  size_t K = 0;
  for (Operation &Op : Func.getBody().front().without_terminator()) {
    if (L > 0)
      Cost[size_t(Segment[K])] += trainingFlops(&Op);
    ++K;
  }
  if (Stages < 1 || L < Stages) {
    Error = "cannot split " + std::to_string(L) + " transformer blocks into " +
            std::to_string(Stages) + " pipeline stages" +
            (ChunksPerRank > 1
                 ? " (" + std::to_string(Ranks) + " pipeline ranks x " +
                       std::to_string(ChunksPerRank) +
                       " virtual stages, a model chunk each)"
                 : "") +
            ": each stage holds at least one block; use " +
            (ChunksPerRank > 1 ? "fewer virtual stages or " : "") +
            "fewer pipeline ranks";
    return failure();
  }
  P.blockCost = Cost;
  // Best[k][i]: the smallest possible maximum stage cost of blocks [0, i)
  // in k stages; Cut remembers where the last stage starts.
  std::vector<double> Prefix(size_t(L) + 1, 0.0);
  for (int64_t I = 0; I < L; ++I)
    Prefix[size_t(I) + 1] = Prefix[size_t(I)] + Cost[size_t(I)];
  const double Inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> Best(
      size_t(Stages) + 1, std::vector<double>(size_t(L) + 1, Inf));
  std::vector<std::vector<int64_t>> Cut(
      size_t(Stages) + 1, std::vector<int64_t>(size_t(L) + 1, 0));
  Best[0][0] = 0;
  for (int64_t K = 1; K <= Stages; ++K)
    for (int64_t I = K; I <= L; ++I)
      for (int64_t J = K - 1; J < I; ++J) {
        double V = std::max(Best[size_t(K - 1)][size_t(J)],
                            Prefix[size_t(I)] - Prefix[size_t(J)]);
        if (V < Best[size_t(K)][size_t(I)]) {
          Best[size_t(K)][size_t(I)] = V;
          Cut[size_t(K)][size_t(I)] = J;
        }
      }
  P.firstBlock.assign(size_t(Stages), 0);
  int64_t End = L;
  for (int64_t K = Stages; K >= 1; --K) {
    P.firstBlock[size_t(K - 1)] = Cut[size_t(K)][size_t(End)];
    End = P.firstBlock[size_t(K - 1)];
  }
  for (int64_t K = 0; K < Stages; ++K) {
    int64_t From = P.firstBlock[size_t(K)];
    int64_t To = K + 1 < Stages ? P.firstBlock[size_t(K + 1)] : L;
    P.stageCost.push_back(Prefix[size_t(To)] - Prefix[size_t(From)]);
  }
  return P;
}

} // namespace megac
