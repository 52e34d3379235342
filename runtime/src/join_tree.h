//===- join_tree.h - The order in which separate ranks join ---*- C++ -*-===//
//
// The ranks of a torchrun-style launch start as separate MPI jobs and join
// one world (torchrun_world.cpp) as a binary tree: in round k the blocks
// of 2^k consecutive ranks pair up, and each even block accepts the odd
// block after it, so N ranks form one world in ceil(log2 N) rounds, in
// RANK order. Each rank computes its own part from its rank alone.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_JOIN_TREE_H
#define MEGAC_RT_JOIN_TREE_H

#include <algorithm>
#include <string>

namespace megac_rt {

/// One rank's part in one round of the tree of joins.
struct JoinRound {
  int First = 0, Last = 0;           ///< this rank's block
  int OtherFirst = 0, OtherLast = 0; ///< the block it would merge with
  /// Whether the other block exists (a last block without a partner sits
  /// the round out).
  bool Merges = false;
  /// This block comes first: it accepts, and its first rank opens the port
  /// whose name the other block's first rank receives.
  bool Accepts = false;
};

/// Rank \p Rank's part in round \p Round among \p Size ranks.
inline JoinRound joinRound(int Rank, int Size, int Round) {
  const int Span = 1 << Round;
  JoinRound J;
  J.First = Rank & ~(Span - 1);
  J.Accepts = (J.First & Span) == 0;
  J.OtherFirst = J.Accepts ? J.First + Span : J.First - Span;
  J.Merges = J.OtherFirst < Size;
  J.Last = std::min(J.First + Span, Size) - 1;
  J.OtherLast = std::min(J.OtherFirst + Span, Size) - 1;
  return J;
}

/// How many rounds \p Size ranks take to form one world.
inline int joinRounds(int Size) {
  int Rounds = 0;
  while ((1 << Rounds) < Size)
    ++Rounds;
  return Rounds;
}

/// "rank 3" or "ranks 4-7".
inline std::string rankSpan(int First, int Last) {
  return First == Last
             ? "rank " + std::to_string(First)
             : "ranks " + std::to_string(First) + "-" + std::to_string(Last);
}

} // namespace megac_rt

#endif // MEGAC_RT_JOIN_TREE_H
