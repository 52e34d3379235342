//===- EpilogueEmuTest.cpp - The products' epilogue kernels, emulated -----===//
//
// Where a product runs without cuBLASLt's epilogue, megac's kernels add
// the bias (and residual) and apply the GeLU, or the GeLU's gradient,
// four elements a thread where the rows and pointers allow and one at a
// time elsewhere. Each element must come out as the formula gives it
// here, element by element, the same from either path: rows whose width
// is a multiple of 4 and not, storage offset by one element (unaligned),
// biases and residuals in fp32 and as bf16 bits, with and without GeLU and
// rounding, and enough rows for several blocks.
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

float valueAt(int64_t I, int Seed) {
  return float(std::sin(0.37 * double(I) + Seed)) * 2.3f;
}

/// Rows x Cols elements, stored from element Offset of their vectors.
struct Shape {
  int64_t Rows, Cols, Offset;
};
const Shape kShapes[] = {
    {3, 8, 0}, {5, 6, 0}, {4, 8, 1}, {1000, 12, 0}, {7, 4, 2}};

/// linearEpilogueKernel against the formula, for one shape, the residual
/// of type ResT (or none), the bias of type BiasT (fp32, or bf16 bits: a
/// bias kept in bf16 alone), GeLU and rounding on or off.
template <class ResT, class BiasT = float>
void checkLinearEpilogue(const Shape &Sh, bool WithRes, int Gelu, int Round) {
  const int64_t N = Sh.Rows * Sh.Cols, O = Sh.Offset;
  const size_t Room = size_t(N + O + 4);
  std::vector<float> T(Room), Y(Room, -7.0f), Pre(Room, -7.0f);
  std::vector<BiasT> Bias(size_t(Sh.Cols + O + 4));
  std::vector<uint16_t> Y16(Room), Pre16(Room);
  std::vector<ResT> Res(Room);
  for (int64_t I = 0; I < N; ++I) {
    T[size_t(O + I)] = valueAt(I, 1);
    const float R = roundedHere(valueAt(I, 2));
    if constexpr (sizeof(ResT) == 2)
      Res[size_t(O + I)] = bitsHere(R);
    else
      Res[size_t(O + I)] = R;
  }
  for (int64_t C = 0; C < Sh.Cols; ++C) {
    const float B = roundedHere(valueAt(C, 3));
    if constexpr (sizeof(BiasT) == 2)
      Bias[size_t(O + C)] = bitsHere(B);
    else
      Bias[size_t(O + C)] = B;
  }
  const float *Tp = T.data() + O;
  const BiasT *Bp = Bias.data() + O;
  const ResT *Rp = WithRes ? Res.data() + O : nullptr;
  float *Yp = Y.data() + O, *Pp = Pre.data() + O;
  uint16_t *Y16p = Y16.data() + O, *P16p = Pre16.data() + O;
  const int64_t Cols = Sh.Cols;
  launchBlocks(wideBlocks(N), [=] {
    linearEpilogueKernel<ResT, BiasT>(Tp, N, Bp, Cols, Gelu, Round, Yp, Y16p,
                                      Pp, P16p, Rp);
  });
  for (int64_t I = 0; I < N; ++I) {
    float S = valueAt(I, 1) + roundedHere(valueAt(I % Sh.Cols, 3));
    if (WithRes)
      S += roundedHere(valueAt(I, 2));
    const float P = Round ? roundedHere(S) : S;
    const float V = Gelu ? megac_gelu(S) : S;
    const float R = Round ? roundedHere(V) : V;
    SCOPED_TRACE("element " + std::to_string(I) + " of " +
                 std::to_string(Sh.Rows) + "x" + std::to_string(Sh.Cols) +
                 " offset " + std::to_string(O));
    ASSERT_EQ(Pre[size_t(O + I)], P);
    ASSERT_EQ(Y[size_t(O + I)], R);
    ASSERT_EQ(Pre16[size_t(O + I)], bitsHere(P));
    ASSERT_EQ(Y16[size_t(O + I)], bitsHere(R));
  }
  // Nothing written past the end.
  EXPECT_EQ(Y[size_t(O + N)], -7.0f);
  EXPECT_EQ(Pre[size_t(O + N)], -7.0f);
}

TEST(EpilogueEmu, LinearBiasElementsAsTheFormula) {
  for (const Shape &Sh : kShapes)
    for (int Gelu = 0; Gelu < 2; ++Gelu)
      for (int Round = 0; Round < 2; ++Round) {
        checkLinearEpilogue<float>(Sh, false, Gelu, Round);
        checkLinearEpilogue<float>(Sh, true, Gelu, Round);
        checkLinearEpilogue<uint16_t>(Sh, true, Gelu, Round);
        checkLinearEpilogue<uint16_t, uint16_t>(Sh, true, Gelu, Round);
        checkLinearEpilogue<float, uint16_t>(Sh, false, Gelu, Round);
      }
}

/// geluGradEpilogueKernel against the formula, the kept input of type XT.
template <class XT> void checkGeluGradEpilogue(const Shape &Sh, int Round) {
  const int64_t N = Sh.Rows * Sh.Cols, O = Sh.Offset;
  const size_t Room = size_t(N + O + 4);
  std::vector<XT> X(Room);
  std::vector<float> DY(Room), Y(Room, -7.0f);
  std::vector<uint16_t> Y16(Room);
  for (int64_t I = 0; I < N; ++I) {
    const float Xv = roundedHere(valueAt(I, 4));
    if constexpr (sizeof(XT) == 2)
      X[size_t(O + I)] = bitsHere(Xv);
    else
      X[size_t(O + I)] = Xv;
    DY[size_t(O + I)] = valueAt(I, 5);
  }
  const XT *Xp = X.data() + O;
  const float *Dp = DY.data() + O;
  float *Yp = Y.data() + O;
  uint16_t *Y16p = Y16.data() + O;
  launchBlocks(wideBlocks(N),
               [=] { geluGradEpilogueKernel<XT>(Xp, Dp, N, Round, Yp, Y16p); });
  for (int64_t I = 0; I < N; ++I) {
    const float V = megac_gelu_grad(roundedHere(valueAt(I, 4)), valueAt(I, 5));
    const float R = Round ? roundedHere(V) : V;
    SCOPED_TRACE("element " + std::to_string(I) + " offset " +
                 std::to_string(O));
    ASSERT_EQ(Y[size_t(O + I)], R);
    ASSERT_EQ(Y16[size_t(O + I)], bitsHere(R));
  }
  EXPECT_EQ(Y[size_t(O + N)], -7.0f);
}

TEST(EpilogueEmu, GeluGradElementsAsTheFormula) {
  for (const Shape &Sh : kShapes)
    for (int Round = 0; Round < 2; ++Round) {
      checkGeluGradEpilogue<float>(Sh, Round);
      checkGeluGradEpilogue<uint16_t>(Sh, Round);
    }
}

} // namespace

/// broadcastRowKernel: every row of the result the row's bits (the bias
/// a product then adds as its C), four at a time and one at a time.
TEST(EpilogueEmu, BroadcastRowFillsEveryRow) {
  for (const Shape &Sh : kShapes) {
    const int64_t N = Sh.Rows * Sh.Cols, O = Sh.Offset;
    std::vector<uint16_t> Row(size_t(Sh.Cols + O)), Y(size_t(N + O + 4), 7);
    for (int64_t C = 0; C < Sh.Cols; ++C)
      Row[size_t(O + C)] = bitsHere(roundedHere(valueAt(C, 6)));
    const uint16_t *Rp = Row.data() + O;
    uint16_t *Yp = Y.data() + O;
    const int64_t Cols = Sh.Cols;
    launchBlocks(wideBlocks(N), [=] { broadcastRowKernel(Rp, Cols, N, Yp); });
    for (int64_t I = 0; I < N; ++I) {
      SCOPED_TRACE("element " + std::to_string(I) + " of " +
                   std::to_string(Sh.Rows) + "x" + std::to_string(Sh.Cols) +
                   " offset " + std::to_string(O));
      ASSERT_EQ(Y[size_t(O + I)], Row[size_t(O + I % Sh.Cols)]);
    }
    EXPECT_EQ(Y[size_t(O + N)], 7); // nothing written past the end
  }
}
