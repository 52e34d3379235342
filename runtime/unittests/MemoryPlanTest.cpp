//===- MemoryPlanTest.cpp - The arena plan and its bf16 copies ------------===//
//
// bf16CopyLifetimes and bf16OnlyBuffers against lifetimes and choices
// worked out by hand on a small step, and planMemory's placement of
// buffers and copies: nothing live at the same time shares bytes.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"
#include "megac_rt/memory_plan.h"
#include "megac_rt/plan_file.h"
#include "plan_builder.h"
#include "plan_enums.h"

#include <gtest/gtest.h>

using namespace megac_rt;
using namespace megac_rt::builder;
using megac_rt::test::programOf;

namespace {

/// A bf16 training step in miniature. Forward (0..3): the weight and the
/// embedding are rounded, a product reads both. Backward (4..): the
/// product's output gradient is rounded, and the weight gradient reads it
/// and the forward's rounded embedding (a saved activation); an unrounded
/// GeLU gradient of two buffers is not bf16 (and its kernel reads fp32).
struct Step {
  ProgramDesc P;
  uint32_t Wr, E, Er, Y, Dy, Dyr, Dw, Gg;
  Step() : P(programOf(2, 3, 8)) {
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
    Gg = R.emit(op::GeluGrad, {Dyr, Dy}, {2, 3, 8});           // 7
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

/// Checks that no two of \p Plan's arena items (fp32 buffers and bf16
/// copies, each over its lifetime) that are live at once share bytes, and
/// that all lie in the arena; returns how many there are.
size_t placedWithoutOverlap(const MemoryPlan &Plan,
                            const megac::plan::RankProgram &R) {
  struct Item {
    int64_t Begin, End, First, Last;
  };
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
    int64_t Elements = 1;
    for (int64_t D : *R.buffers()->Get(B)->shape())
      Elements *= D;
    const int64_t Lo = First[B] < 0 ? 0 : First[B];
    const int64_t Hi = First[B] < 0 ? NI : LastUse[B];
    if (Plan.offset[B] >= 0) // else a parameter, or kept in bf16 alone
      Items.push_back({Plan.offset[B], Plan.offset[B] + 4 * Elements, Lo, Hi});
    if (Plan.copyOffset[B] >= 0)
      Items.push_back({Plan.copyOffset[B], Plan.copyOffset[B] + 2 * Elements,
                       Plan.copyFirst[B], Plan.copyLast[B]});
  }
  for (size_t A = 0; A < Items.size(); ++A)
    for (size_t B = A + 1; B < Items.size(); ++B) {
      const Item &X = Items[A], &Y = Items[B];
      const bool SameTime = X.First <= Y.Last && Y.First <= X.Last;
      const bool SameBytes = X.Begin < Y.End && Y.Begin < X.End;
      EXPECT_FALSE(SameTime && SameBytes) << "items " << A << " and " << B;
    }
  for (const Item &It : Items)
    EXPECT_LE(uint64_t(It.End), Plan.arenaBytes);
  return Items.size();
}

TEST(MemoryPlan, Bf16ValuesAreTheRoundedOnes) {
  Step S;
  Loaded L(S.P);
  const std::vector<bool> Bf16 = bf16Values(*L.L.program, L.rank());
  EXPECT_TRUE(Bf16[S.Wr]);
  EXPECT_TRUE(Bf16[S.Er]);
  EXPECT_TRUE(Bf16[S.Dyr]);
  EXPECT_FALSE(Bf16[S.E]);
  EXPECT_FALSE(Bf16[S.Y]);
  EXPECT_FALSE(Bf16[S.Gg]);
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
  // GeLU gradient (7) reads it as fp32.
  EXPECT_EQ(Last[S.Dyr], 6);
  // Not rounded by their writer: no copy.
  for (uint32_t B : {S.E, S.Y, S.Dy}) {
    EXPECT_EQ(First[B], -1);
    EXPECT_EQ(Last[B], -1);
  }
}

TEST(MemoryPlan, CopiesStayInTheirPipelineSegment) {
  // The step as two pipeline segments (forward 0..3, backward 4..6) and
  // the GeLU gradient (7) after both, in no segment: a reader outside every
  // segment is in a part of its own, not segment 0's.
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

/// A rank with the parameters x [2,3,4] and w [4,8] and the input labels
/// [2,3]: what a model's head needs for [2,3,8] logits and their loss.
struct HeadRank {
  RankDesc R;
  uint32_t X = R.addBuffer(dt::F32, {2, 3, 4}, "x");
  uint32_t W = R.addBuffer(dt::F32, {4, 8}, "w");
  uint32_t Lab = R.addBuffer(dt::I32, {2, 3}, "labels");
  HeadRank() {
    R.params.push_back(
        {"x", X, {2, 3, 4}, {0, 0, 0}, ik::Normal, 0.02, "", {}});
    R.params.push_back({"w", W, {4, 8}, {0, 0}, ik::Normal, 0.02, "", {}});
    R.inputs.push_back({"labels", Lab, "labels"});
  }
};

TEST(MemoryPlan, LogitsCopyLivesFromTheHeadToTheLossGradient) {
  // The head's product rounds the logits (forward, 1); the loss (2) and
  // its gradient over the whole vocabulary (backward, 4) read them in
  // bf16, so their copy spans both parts. A gradient over one vocabulary
  // block (4 inputs, with the blocks' stats) reads fp32 and keeps none.
  ProgramDesc P = programOf(2, 3, 8);
  HeadRank H;
  RankDesc &R = H.R;
  const uint32_t X = H.X, W = H.W, Lab = H.Lab;
  const uint32_t Wr = R.emit(op::RoundBf16, {W}, {4, 8});          // 0
  const uint32_t Lg = R.emit(op::Linear, {X, Wr}, {2, 3, 8}, {0}); // 1
  R.instrs.back().roundBf16 = true;
  R.emit(op::CrossEntropy, {Lg, Lab}, {}, {6}); // 2
  R.forwardEnd = int32_t(R.instrs.size());
  const uint32_t One = R.emit(op::Fill, {}, {}, {}, {1.0});          // 3
  R.emit(op::CrossEntropyGrad, {Lg, Lab, One}, {2, 3, 8}, {6});      // 4
  const uint32_t Stats = R.emit(op::Fill, {}, {2, 3, 3}, {}, {0.0}); // 5
  R.emit(op::CrossEntropyGrad, {Lg, Lab, One, Stats}, {2, 3, 8}, {6, 0});
  P.ranks.push_back(R);
  Loaded L(P);
  const CopyLifetimes Copies = bf16CopyLifetimes(*L.L.program, L.rank());
  EXPECT_EQ(Copies.first[Lg], 1);
  EXPECT_EQ(Copies.last[Lg], 4); // not 6: the block's gradient reads fp32
  // Its block-gradient reader keeps the logits in fp32 as well.
  EXPECT_FALSE(bf16OnlyBuffers(*L.L.program, L.rank())[Lg]);
}

TEST(MemoryPlan, AnOutputIsKeptInBf16AloneForTheWholeStep) {
  // The logits, an output: the head's product of bf16 values rounds them
  // (2), the loss reads them in bf16 (3). No fp32 storage; their bf16 storage
  // lives from their writer to past the last instruction (the host reads them).
  // The labels, an input the host writes, stay fp32.
  ProgramDesc P = programOf(2, 3, 8);
  HeadRank H;
  RankDesc &R = H.R;
  const uint32_t X = H.X, W = H.W, Lab = H.Lab;
  const uint32_t Xr = R.emit(op::RoundBf16, {X}, {2, 3, 4});        // 0
  const uint32_t Wr = R.emit(op::RoundBf16, {W}, {4, 8});           // 1
  const uint32_t Lg = R.emit(op::Linear, {Xr, Wr}, {2, 3, 8}, {0}); // 2
  R.instrs.back().roundBf16 = true;
  const uint32_t Loss = R.emit(op::CrossEntropy, {Lg, Lab}, {}, {6}); // 3
  R.outputs.push_back({"logits", Lg, ""});
  R.outputs.push_back({"loss", Loss, ""});
  P.ranks.push_back(R);
  Loaded L(P);
  const MemoryPlan Plan =
      planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only);
  ASSERT_TRUE(Plan.bf16Only[Lg]);
  EXPECT_EQ(Plan.offset[Lg], -1);
  EXPECT_GE(Plan.copyOffset[Lg], 0);
  EXPECT_EQ(Plan.copyFirst[Lg], 2);
  EXPECT_EQ(Plan.copyLast[Lg], 4);
  // With the roundings of x and w (read by the product alone).
  EXPECT_EQ(Plan.bf16OnlyBytes, (2u * 3u * 8u + 2u * 3u * 4u + 4u * 8u) * 2u);
  for (uint32_t B : {Lab, Loss}) // an input; a loss the product did not round
    EXPECT_FALSE(Plan.bf16Only[B]) << "buffer " << B;
}

TEST(MemoryPlan, CopiesTakeBytesNothingLiveUses) {
  Step S;
  Loaded L(S.P);
  const MemoryPlan Without = planMemory(*L.L.program, L.rank());
  const MemoryPlan With =
      planMemory(*L.L.program, L.rank(), Bf16Storage::Copies);
  for (int64_t Off : Without.copyOffset)
    EXPECT_EQ(Off, -1);
  EXPECT_EQ(Without.copyBytes, 0u);
  // Three copies of 32, 24 and 48 elements, 2 bytes each, each rounded
  // up to the arena's alignment.
  auto Aligned = [](uint64_t B) {
    return (B + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  };
  EXPECT_EQ(With.copyBytes, Aligned(64) + Aligned(48) + Aligned(96));
  EXPECT_EQ(With.offset.size(), Without.offset.size());
  // The plan places each copy over the lifetime bf16CopyLifetimes gives.
  const CopyLifetimes Copies = bf16CopyLifetimes(*L.L.program, L.rank());
  EXPECT_EQ(With.copyFirst, Copies.first);
  EXPECT_EQ(With.copyLast, Copies.last);

  // The 9 buffers that are not parameters, and 3 copies.
  EXPECT_EQ(placedWithoutOverlap(With, L.rank()), size_t(9 + 3));
}

TEST(MemoryPlan, Bf16OnlyBuffersAreThoseEveryReaderReadsAsBf16) {
  Step S;
  Loaded L(S.P);
  const std::vector<bool> Only = bf16OnlyBuffers(*L.L.program, L.rank());
  // The rounded weight (read by the product alone) and the rounded
  // embedding (by the product and the weight gradient): products of bf16
  // values. The rounded output gradient is also read by a GeLU gradient.
  for (uint32_t B = 0; B < Only.size(); ++B)
    EXPECT_EQ(Only[B], B == S.Wr || B == S.Er) << "buffer " << B;

  const MemoryPlan Plan =
      planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only);
  EXPECT_EQ(Plan.bf16Only, Only);
  EXPECT_EQ(Plan.bf16OnlyBytes, 2u * (32 + 24));
  // No fp32 storage; the copy lives as long as the buffer: the saved
  // embedding from its writer (2) to the backward's weight gradient (6).
  EXPECT_EQ(Plan.offset[S.Wr], -1);
  EXPECT_EQ(Plan.offset[S.Er], -1);
  EXPECT_EQ(Plan.copyFirst[S.Wr], 0);
  EXPECT_EQ(Plan.copyLast[S.Wr], 3);
  EXPECT_EQ(Plan.copyFirst[S.Er], 2);
  EXPECT_EQ(Plan.copyLast[S.Er], 6);
  // The output gradient keeps its fp32 buffer and its copy.
  EXPECT_GE(Plan.offset[S.Dyr], 0);
  EXPECT_EQ(Plan.copyFirst[S.Dyr], 5);
  EXPECT_EQ(Plan.copyLast[S.Dyr], 6);
  // The saved embedding is kept for the backward pass in bf16: 48 bytes.
  const MemoryPlan Fp32 = planMemory(*L.L.program, L.rank());
  EXPECT_EQ(Fp32.savedActivationBytes - Plan.savedActivationBytes, 48u);
  // 2 fp32 buffers fewer than with copies alone.
  EXPECT_EQ(placedWithoutOverlap(Plan, L.rank()), size_t(9 - 2 + 3));
}

TEST(MemoryPlan, AParameterRoundingLivesIntoTheNextStep) {
  // The step above with AdamW updating w (8: its rounding's bits for the
  // next step, parameterCopies) after a clipping coefficient (7): the
  // rounded weight, kept in bf16 alone, spans the whole run. The rounded
  // embedding is no parameter's rounding; with a reader of the rounding
  // after the update there is none (its bits must stay the old ones), nor
  // with fp32 storage beside the copies.
  auto Plan = [](bool LateReader) {
    Step S;
    S.P.hasTrain = true;
    RankDesc &R = S.P.ranks[0];
    R.instrs.pop_back(); // (the GeLU gradient: not needed here)
    const uint32_t W = R.params[1].buffer;
    const uint32_t Coef = R.emit(op::Fill, {}, {}, {}, {1.0}); // 7
    const std::vector<double> Hyper = {0.9, 0.95, 1e-8, 0.0};
    R.instrs.push_back({op::AdamW, {W, S.Dw, Coef}, {W}, {}, Hyper}); // 8
    if (LateReader)
      R.emit(op::Linear, {S.Er, S.Wr}, {2, 3, 8}, {0});
    return S;
  };
  {
    Step S = Plan(false);
    Loaded L(S.P);
    const MemoryPlan M =
        planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only);
    for (uint32_t B = 0; B < M.parameterCopyUpdate.size(); ++B)
      EXPECT_EQ(M.parameterCopyUpdate[B], B == S.Wr ? 8 : -1) << "buffer " << B;
    EXPECT_EQ(parameterCopies(L.rank(), M.bf16Only), M.parameterCopyUpdate);
    EXPECT_EQ(M.copyFirst[S.Wr], 0);
    EXPECT_EQ(M.copyLast[S.Wr], 9); // past the last instruction
    // Nothing else takes its bytes, at any point of the run: the 9
    // buffers that are not parameters, 2 of them in bf16 alone, and 3
    // copies.
    EXPECT_EQ(placedWithoutOverlap(M, L.rank()), size_t(9 - 2 + 3));
    const MemoryPlan Copies =
        planMemory(*L.L.program, L.rank(), Bf16Storage::Copies);
    for (int64_t A : Copies.parameterCopyUpdate)
      EXPECT_EQ(A, -1);
  }
  {
    Step S = Plan(true);
    Loaded L(S.P);
    const MemoryPlan M =
        planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only);
    ASSERT_TRUE(M.bf16Only[S.Wr]);
    for (int64_t A : M.parameterCopyUpdate)
      EXPECT_EQ(A, -1);
  }
}

/// A rank with an attention of head size 64 on x rounded to bf16 (q = k
/// = v; instructions 0 and 1 round x and w), its rounded output y (2) read
/// by a product (3), the end of the forward part, and a rounded output
/// gradient (4) for the gradient steps the tests add.
struct AttentionRank {
  RankDesc R;
  uint32_t X = R.addBuffer(dt::F32, {1, 4, 64}, "x");
  uint32_t G = R.addBuffer(dt::F32, {1, 4, 64}, "g");
  uint32_t W = R.addBuffer(dt::F32, {64, 8}, "w");
  uint32_t Xr = 0, Wr = 0, Y = 0, Gr = 0;
  AttentionRank() {
    R.params.push_back(
        {"x", X, {1, 4, 64}, {0, 0, 0}, ik::Normal, 0.02, "", {}});
    R.params.push_back(
        {"g", G, {1, 4, 64}, {0, 0, 0}, ik::Normal, 0.02, "", {}});
    R.params.push_back({"w", W, {64, 8}, {0, 0}, ik::Normal, 0.02, "", {}});
    Xr = R.emit(op::RoundBf16, {X}, {1, 4, 64});
    Wr = R.emit(op::RoundBf16, {W}, {64, 8});
    Y = R.emit(op::Attention, {Xr, Xr, Xr}, {1, 4, 64}, {1, 1});
    R.instrs.back().roundBf16 = true;
    R.emit(op::Linear, {Y, Wr}, {1, 4, 8}, {0});
    R.forwardEnd = int32_t(R.instrs.size());
    Gr = R.emit(op::RoundBf16, {G}, {1, 4, 64});
  }
};

TEST(MemoryPlan, AttentionBuffersInBf16WhereItsKernelsReadBf16) {
  // q = k = v (rounded), the attention's rounded output read by a product,
  // a rounded dy, and two rounded gradient steps: dq read by a GeLU
  // gradient (in fp32), dk by a product. Head size 64.
  ProgramDesc P = programOf(1, 4, 8);
  AttentionRank A;
  RankDesc &R = A.R;
  const uint32_t Xr = A.Xr, Wr = A.Wr, Y = A.Y, Gr = A.Gr;
  const uint32_t Dq =
      R.emit(op::AttentionGrad, {Xr, Xr, Xr, Gr}, {1, 4, 64}, {1, 1, 0});
  R.instrs.back().roundBf16 = true;
  const uint32_t Dk =
      R.emit(op::AttentionGrad, {Xr, Xr, Xr, Gr}, {1, 4, 64}, {1, 1, 1});
  R.instrs.back().roundBf16 = true;
  R.emit(op::GeluGrad, {Dq, Dq}, {1, 4, 64});
  R.emit(op::LinearWeightGrad, {Y, Dk}, {64, 64}, {0});
  P.ranks.push_back(R);
  Loaded L(P);
  // On the register-resident kernels (the default at head size 64): q, k,
  // v, the output, dy and dk; not dq, which the GeLU gradient reads.
  const std::vector<bool> Only = bf16OnlyBuffers(*L.L.program, L.rank());
  for (uint32_t B : {Xr, Wr, Y, Gr, Dk})
    EXPECT_TRUE(Only[B]) << "buffer " << B;
  EXPECT_FALSE(Only[Dq]);
  // Where the backend runs them in fp32 (the wmma kernels, or a device
  // without the shared memory): the attentions' buffers stay fp32.
  const std::vector<bool> Fp32Attention = bf16OnlyBuffers(
      *L.L.program, L.rank(), [](const megac::plan::Instr &) { return false; });
  for (uint32_t B : {Xr, Y, Gr, Dq, Dk})
    EXPECT_FALSE(Fp32Attention[B]) << "buffer " << B;
  EXPECT_TRUE(Fp32Attention[Wr]);
}

TEST(MemoryPlan, AttentionOutputLivesUntilItsGradients) {
  // y = attention(q, q, q) (2), read by a product (3) and nothing else;
  // its three gradient steps (5-7) on the same q, and one on other inputs
  // (8). The CUDA backend takes each row's delta from y in the gradient
  // steps, so y lives until the last of them (7), not the product (3).
  ProgramDesc P = programOf(1, 4, 8);
  AttentionRank A;
  RankDesc &R = A.R;
  const uint32_t Xr = A.Xr, Y = A.Y, Gr = A.Gr;
  std::vector<uint32_t> Grads;
  for (int64_t Which = 0; Which < 3; ++Which) { // 5, 6, 7
    Grads.push_back(
        R.emit(op::AttentionGrad, {Xr, Xr, Xr, Gr}, {1, 4, 64}, {1, 1, Which}));
    R.instrs.back().roundBf16 = true;
  }
  R.emit(op::AttentionGrad, {Gr, Gr, Gr, Xr}, {1, 4, 64}, {1, 1, 0}); // 8
  R.emit(op::LinearWeightGrad, {Grads[0], Grads[1]}, {64, 64}, {0});
  R.emit(op::LinearWeightGrad, {Grads[2], Grads[2]}, {64, 64}, {0});
  P.ranks.push_back(R);
  Loaded L(P);
  const std::vector<int64_t> Outputs =
      attentionOutputsOfGradients(*L.L.program, L.rank());
  ASSERT_EQ(Outputs.size(), L.rank().instrs()->size());
  for (size_t I = 0; I < Outputs.size(); ++I)
    EXPECT_EQ(Outputs[I], I >= 5 && I <= 7 ? int64_t(Y) : -1)
        << "instruction " << I;
  // Kept in bf16 alone, y's storage is its copy: [2, 7].
  const MemoryPlan Plan =
      planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only);
  ASSERT_TRUE(Plan.bf16Only[Y]);
  EXPECT_EQ(Plan.copyFirst[Y], 2);
  EXPECT_EQ(Plan.copyLast[Y], 7);
  EXPECT_EQ(Plan.attentionOutputOf, Outputs); // the pairing the backend takes
  // The CPU's plan (fp32 storage) pairs nothing: its y dies at the product.
  for (int64_t O : planMemory(*L.L.program, L.rank()).attentionOutputOf)
    EXPECT_EQ(O, -1);
  // Attentions the backend runs on other kernels read no y.
  for (int64_t O : attentionOutputsOfGradients(
           *L.L.program, L.rank(),
           [](const megac::plan::Instr &) { return false; }))
    EXPECT_EQ(O, -1);
  const MemoryPlan Other =
      planMemory(*L.L.program, L.rank(), Bf16Storage::Bf16Only,
                 [](const megac::plan::Instr &) { return false; });
  EXPECT_FALSE(Other.bf16Only[Y]); // (fp32 attention: y has fp32 storage)
}

TEST(MemoryPlan, PipelineRanksKeepFp32Buffers) {
  Step S;
  RankDesc &R = S.P.ranks[0];
  R.segments = {{0, 4, 0, false}, {4, 8, 0, true}};
  R.schedule = {{0, 0}, {1, 0}};
  R.accumulateEnd = 8;
  const std::vector<uint8_t> Bytes = serializeProgram(S.P);
  const auto *P = flatbuffers::GetRoot<megac::plan::Program>(Bytes.data());
  const std::vector<bool> Only = bf16OnlyBuffers(*P, *P->ranks()->Get(0));
  EXPECT_EQ(Only.size(), P->ranks()->Get(0)->buffers()->size());
  for (bool O : Only)
    EXPECT_FALSE(O);
}

} // namespace
