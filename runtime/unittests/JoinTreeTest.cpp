//===- JoinTreeTest.cpp - The order in which separate ranks join ----------===//

#include "join_tree.h"

#include <gtest/gtest.h>

#include <vector>

using megac_rt::joinRound;
using megac_rt::JoinRound;
using megac_rt::joinRounds;
using megac_rt::rankSpan;

namespace {

TEST(JoinTree, RoundsAreCeilLog2) {
  EXPECT_EQ(joinRounds(1), 0);
  EXPECT_EQ(joinRounds(2), 1);
  EXPECT_EQ(joinRounds(3), 2);
  EXPECT_EQ(joinRounds(4), 2);
  EXPECT_EQ(joinRounds(5), 3);
  EXPECT_EQ(joinRounds(1024), 10);
  EXPECT_EQ(joinRounds(1025), 11);
}

/// Plays the rounds for every world size up to 300, keeping each rank's
/// block as ranges, and checks what torchrun_world.cpp relies on: both
/// sides of a merge agree on it, the accepting block is the lower one and
/// adjoins the other (so the merged world stays in RANK order), every
/// rank but 0 receives exactly one port name, from a lower rank (rank 0's
/// relay refuses any other), and the last round leaves one block of all
/// ranks.
TEST(JoinTree, EverySizeFormsOneOrderedWorld) {
  for (int Size = 1; Size <= 300; ++Size) {
    SCOPED_TRACE("world of " + std::to_string(Size));
    std::vector<int> First(size_t(Size), 0), Last(size_t(Size), 0),
        PortsReceived(size_t(Size), 0);
    for (int R = 0; R < Size; ++R)
      First[size_t(R)] = Last[size_t(R)] = R;
    for (int Round = 0; Round < joinRounds(Size); ++Round) {
      std::vector<int> NextFirst = First, NextLast = Last;
      for (int R = 0; R < Size; ++R) {
        const JoinRound J = joinRound(R, Size, Round);
        // The block the rounds so far formed.
        ASSERT_EQ(J.First, First[size_t(R)]) << "rank " << R;
        ASSERT_EQ(J.Last, Last[size_t(R)]) << "rank " << R;
        if (!J.Merges)
          continue;
        const JoinRound O = joinRound(J.OtherFirst, Size, Round);
        ASSERT_TRUE(O.Merges);
        ASSERT_EQ(O.OtherFirst, J.First);
        ASSERT_EQ(O.Last, J.OtherLast);
        ASSERT_NE(O.Accepts, J.Accepts);
        if (J.Accepts)
          ASSERT_EQ(J.Last + 1, J.OtherFirst);
        else
          ASSERT_EQ(J.OtherLast + 1, J.First);
        if (R == J.First && !J.Accepts) {
          ++PortsReceived[size_t(R)];
          ASSERT_LT(J.OtherFirst, R);
        }
        NextFirst[size_t(R)] = std::min(J.First, J.OtherFirst);
        NextLast[size_t(R)] = std::max(J.Last, J.OtherLast);
      }
      First = NextFirst;
      Last = NextLast;
    }
    for (int R = 0; R < Size; ++R) {
      EXPECT_EQ(First[size_t(R)], 0);
      EXPECT_EQ(Last[size_t(R)], Size - 1);
      EXPECT_EQ(PortsReceived[size_t(R)], R == 0 ? 0 : 1) << "rank " << R;
    }
  }
}

TEST(JoinTree, SixRanks) {
  // Round 0: {0,1} {2,3} {4,5}; round 1: {0..3} forms and {4,5} sits out
  // (there are no ranks 6-7); round 2: {0..3} accepts {4,5}.
  JoinRound J = joinRound(5, 6, 0);
  EXPECT_FALSE(J.Accepts);
  EXPECT_EQ(J.OtherFirst, 4);
  J = joinRound(4, 6, 1);
  EXPECT_FALSE(J.Merges);
  J = joinRound(5, 6, 2);
  EXPECT_EQ(J.First, 4);
  EXPECT_EQ(J.Last, 5);
  EXPECT_EQ(J.OtherFirst, 0);
  EXPECT_EQ(J.OtherLast, 3);
  EXPECT_FALSE(J.Accepts);
  EXPECT_EQ(rankSpan(J.OtherFirst, J.OtherLast), "ranks 0-3");
  EXPECT_EQ(rankSpan(3, 3), "rank 3");
}

} // namespace
