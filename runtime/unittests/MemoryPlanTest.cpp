//===- MemoryPlanTest.cpp - The arena plan and its bf16 copies ------------===//
//
// bf16CopyLifetimes against lifetimes worked out by hand on a small step,
// and planMemory's placement of buffers and copies: nothing live at the
// same time shares bytes.
//
//===----------------------------------------------------------------------===//

#include "megac_rt/memory_plan.h"
#include "megac_rt/plan_file.h"
#include "plan_builder.h"
#include "plan_enums.h"

#include <gtest/gtest.h>

using namespace megac_rt;
using namespace megac_rt::builder;

namespace {

/// A bf16 training step in miniature. Forward (0..3): the weight and the
/// embedding are rounded, a product reads both. Backward (4..): the
/// product's output gradient is rounded, and the weight gradient reads it
/// and the forward's rounded embedding (a saved activation); an unrounded
/// sum of two buffers is not bf16.
struct Step {
  ProgramDesc P;
  uint32_t Wr, E, Er, Y, Dy, Dyr, Dw, Sum;
  Step() {
    P.batch = 2;
    P.seq = 3;
    P.vocabSize = 8;
    RankDesc R;
    const uint32_t Wte = R.addBuffer(dt::F32, {8, 4}, "wte");
    const uint32_t W = R.addBuffer(dt::F32, {4, 8}, "w");
    const uint32_t Tok = R.addBuffer(dt::I32, {2, 3}, "tokens");
    R.params.push_back({"wte", Wte, {8, 4}, {0, 0}, ik::Normal, 0.02, "", {}});
    R.params.push_back({"w", W, {4, 8}, {0, 0}, ik::Normal, 0.02, "", {}});
    R.inputs.push_back({"tokens", Tok, "tokens"});
    Wr = R.emit(op::RoundBf16, {W}, {4, 8});               // 0
    E = R.emit(op::Embedding, {Wte, Tok}, {2, 3, 4}, {0}); // 1
    Er = R.emit(op::RoundBf16, {E}, {2, 3, 4});            // 2
    Y = R.emit(op::Linear, {Er, Wr}, {2, 3, 8}, {0});      // 3
    R.forwardEnd = 4;
    Dy = R.emit(op::Add, {Y, Y}, {2, 3, 8});                   // 4
    Dyr = R.emit(op::RoundBf16, {Dy}, {2, 3, 8});              // 5
    Dw = R.emit(op::LinearWeightGrad, {Er, Dyr}, {4, 8}, {0}); // 6
    Sum = R.emit(op::Add, {Dyr, Dy}, {2, 3, 8});               // 7
    P.ranks.push_back(R);
  }
};

struct Loaded {
  LoadedPlan L;
  explicit Loaded(const ProgramDesc &P) {
    EXPECT_EQ(verifyPlanBytes(buildPlanBytes(P), L), "");
  }
  const megac::plan::RankProgram &rank() const {
    return *L.program->ranks()->Get(0);
  }
};

TEST(MemoryPlan, Bf16ValuesAreTheRoundedOnes) {
  Step S;
  Loaded L(S.P);
  const std::vector<bool> Bf16 = bf16Values(*L.L.program, L.rank());
  EXPECT_TRUE(Bf16[S.Wr]);
  EXPECT_TRUE(Bf16[S.Er]);
  EXPECT_TRUE(Bf16[S.Dyr]);
  EXPECT_FALSE(Bf16[S.E]);
  EXPECT_FALSE(Bf16[S.Y]);
  EXPECT_FALSE(Bf16[S.Sum]);
}

TEST(MemoryPlan, CopiesLiveToTheLastReaderInTheirPart) {
  Step S;
  Loaded L(S.P);
  const CopyLifetimes Copies = bf16CopyLifetimes(*L.L.program, L.rank());
  const std::vector<int64_t> &First = Copies.first, &Last = Copies.last;
  // Each copy starts at its writer.
  EXPECT_EQ(First[S.Wr], 0);
  EXPECT_EQ(First[S.Er], 2);
  EXPECT_EQ(First[S.Dyr], 5);
  // The weight and the embedding: read by the forward product (3); the
  // embedding's backward reader (6) packs it instead.
  EXPECT_EQ(Last[S.Wr], 3);
  EXPECT_EQ(Last[S.Er], 3);
  // The output gradient: written and read (6) in the backward part; the
  // sum (7) reads it as fp32.
  EXPECT_EQ(Last[S.Dyr], 6);
  // Not rounded by their writer: no copy.
  for (uint32_t B : {S.E, S.Y, S.Dy}) {
    EXPECT_EQ(First[B], -1);
    EXPECT_EQ(Last[B], -1);
  }
}

TEST(MemoryPlan, CopiesStayInTheirPipelineSegment) {
  // The step as two pipeline segments (forward 0..3, backward 4..6) and
  // the sum (7) after both, in no segment: a reader outside every segment
  // is in a part of its own, not segment 0's.
  Step S;
  RankDesc &R = S.P.ranks[0];
  R.segments = {{0, 4, 0, false}, {4, 7, 0, true}};
  R.schedule = {{0, 0}, {1, 0}};
  R.accumulateEnd = 7;
  // After the segments, a product reading the forward's rounded weight.
  R.emit(op::Linear, {S.Er, S.Wr}, {2, 3, 8}, {0}); // 8
  const std::vector<uint8_t> Bytes = serializeProgram(S.P);
  const auto *P = flatbuffers::GetRoot<megac::plan::Program>(Bytes.data());
  const CopyLifetimes Copies = bf16CopyLifetimes(*P, *P->ranks()->Get(0));
  EXPECT_EQ(Copies.last[S.Wr], 3); // not 8: that reader packs
  EXPECT_EQ(Copies.last[S.Er], 3);
  EXPECT_EQ(Copies.first[S.Dyr], 5);
  EXPECT_EQ(Copies.last[S.Dyr], 6);
}

TEST(MemoryPlan, CopiesTakeBytesNothingLiveUses) {
  Step S;
  Loaded L(S.P);
  const MemoryPlan Without = planMemory(*L.L.program, L.rank());
  const MemoryPlan With =
      planMemory(*L.L.program, L.rank(), /*Bf16Copies=*/true);
  for (int64_t Off : Without.copyOffset)
    EXPECT_EQ(Off, -1);
  EXPECT_EQ(Without.copyBytes, 0u);
  // Three copies of 32, 24 and 48 elements, 2 bytes each, aligned to 64.
  EXPECT_EQ(With.copyBytes, 64u + 64u + 128u);
  EXPECT_EQ(With.offset.size(), Without.offset.size());
  // The plan places each copy over the lifetime bf16CopyLifetimes gives.
  const CopyLifetimes Copies = bf16CopyLifetimes(*L.L.program, L.rank());
  EXPECT_EQ(With.copyFirst, Copies.first);
  EXPECT_EQ(With.copyLast, Copies.last);

  // Every arena buffer and copy as (bytes, lifetime); no two that are
  // live at once may overlap in the arena.
  struct Item {
    int64_t Begin, End, First, Last;
  };
  const auto &R = L.rank();
  std::vector<Item> Items;
  const uint32_t NB = R.buffers()->size(), NI = R.instrs()->size();
  std::vector<int64_t> First(NB, -1), LastUse(NB, -1);
  for (uint32_t I = 0; I < NI; ++I) {
    const auto *In = R.instrs()->Get(I);
    for (uint32_t X : *In->inputs())
      LastUse[X] = I;
    for (uint32_t Y : *In->outputs()) {
      if (First[Y] < 0)
        First[Y] = I;
      LastUse[Y] = std::max<int64_t>(LastUse[Y], I);
    }
  }
  for (const auto *O : *R.outputs())
    LastUse[O->buffer()] = NI;
  for (uint32_t B = 0; B < NB; ++B) {
    if (With.offset[B] < 0)
      continue; // a parameter
    int64_t Elements = 1;
    for (int64_t D : *R.buffers()->Get(B)->shape())
      Elements *= D;
    const int64_t Lo = First[B] < 0 ? 0 : First[B];
    const int64_t Hi = First[B] < 0 ? NI : LastUse[B];
    Items.push_back({With.offset[B], With.offset[B] + 4 * Elements, Lo, Hi});
    if (With.copyOffset[B] >= 0)
      Items.push_back({With.copyOffset[B], With.copyOffset[B] + 2 * Elements,
                       With.copyFirst[B], With.copyLast[B]});
  }
  EXPECT_EQ(Items.size(), size_t(NB - 2 + 3)); // all but the parameters
  for (size_t A = 0; A < Items.size(); ++A)
    for (size_t B = A + 1; B < Items.size(); ++B) {
      const Item &X = Items[A], &Y = Items[B];
      const bool SameTime = X.First <= Y.Last && Y.First <= X.Last;
      const bool SameBytes = X.Begin < Y.End && Y.Begin < X.End;
      EXPECT_FALSE(SameTime && SameBytes) << "items " << A << " and " << B;
    }
  for (const Item &It : Items)
    EXPECT_LE(uint64_t(It.End), With.arenaBytes);
}

} // namespace
