//===- TestPlans.h - Small plans shared by the runtime unit tests -*- C++ -*-===//
//
// A one-rank "tokens -> embedding -> linear -> logits" program, small enough
// that tests can break one field at a time and check the verifier's message.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_UNITTESTS_TESTPLANS_H
#define MEGAC_RT_UNITTESTS_TESTPLANS_H

#include "plan_builder.h"

namespace megac_rt {
namespace test {

/// A program of \p Batch x \p Seq tokens over \p Vocab, no ranks yet.
inline builder::ProgramDesc programOf(int64_t Batch, int64_t Seq,
                                      int64_t Vocab) {
  builder::ProgramDesc P;
  P.batch = Batch;
  P.seq = Seq;
  P.vocabSize = Vocab;
  return P;
}

/// tokens(2,3) -> embedding(wte 8x4) -> linear(w 4x8) -> logits(2,3,8).
inline builder::ProgramDesc tinyProgram() {
  using namespace builder;
  ProgramDesc P = programOf(2, 3, 8);
  P.modelName = "tiny";
  P.seed = 7;
  RankDesc R;
  uint32_t Wte = R.addBuffer(dt::F32, {8, 4}, "wte");
  uint32_t W = R.addBuffer(dt::F32, {4, 8}, "head");
  uint32_t Tok = R.addBuffer(dt::I32, {2, 3}, "tokens");
  R.params.push_back({"wte", Wte, {8, 4}, {0, 0}, ik::Normal, 0.02,
                      "wte.weight", {0, 0}});
  R.params.push_back({"head", W, {4, 8}, {0, 0}, ik::Normal, 0.02, "",
                      {}});
  R.inputs.push_back({"tokens", Tok, "tokens"});
  uint32_t E = R.emit(op::Embedding, {Wte, Tok}, {2, 3, 4}, {0});
  uint32_t L = R.emit(op::Linear, {E, W}, {2, 3, 8}, {0}, {}, -1,
                      "model.py:12");
  R.outputs.push_back({"logits", L, ""});
  P.ranks.push_back(R);
  return P;
}

} // namespace test
} // namespace megac_rt

#endif // MEGAC_RT_UNITTESTS_TESTPLANS_H
