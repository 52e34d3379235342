//===- CudnnAttentionTest.cpp - cuDNN's attention graphs, without a GPU ---===//
//
// The graphs MEGAC_CUDA_ATTENTION=cudnn builds for GPT shapes pass the
// frontend's validation for sm_80 and sm_90 (the tensors' dims, strides
// and types against megac's [B, S, NH * D] layout, the causal mask and
// scale, the backward's inputs), and a shape cuDNN cannot take is refused
// with a reason rather than run. Without a GPU nothing executes; the GPU
// test (test/runtime/cuda-cudnn.test) checks the results.
//
//===----------------------------------------------------------------------===//

#include "cudnn_attention.h"

#include <gtest/gtest.h>

#include <cmath>

using megac_rt::cuda::SdpaShape;
using megac_rt::cuda::validateSdpaGraphs;

namespace {

SdpaShape shape(int64_t B, int64_t S, int64_t NH, int64_t D, bool Causal) {
  SdpaShape Sh;
  Sh.B = B;
  Sh.S = S;
  Sh.NH = NH;
  Sh.D = D;
  Sh.Causal = Causal;
  Sh.Scale = float(1.0 / std::sqrt(double(D)));
  return Sh;
}

/// "" where cuDNN loads here; else the reason, to skip on.
std::string cudnnMissing() {
  const std::string Why = validateSdpaGraphs(shape(1, 64, 1, 64, true), 90);
  return Why.rfind("cannot load", 0) == 0 ? Why : std::string();
}

TEST(CudnnAttention, GptShapesValidateForAmpereAndHopper) {
  if (std::string Why = cudnnMissing(); !Why.empty())
    GTEST_SKIP() << Why;
  // GPT-2 124M and 350M (head 64), the 1.3B shape (head 128), a tiny
  // test model's odd sequence length, with and without the causal mask.
  const SdpaShape Shapes[] = {
      shape(8, 1024, 12, 64, true), shape(8, 1024, 16, 128, true),
      shape(2, 80, 2, 64, true), shape(2, 80, 1, 128, false)};
  for (int Sm : {80, 90})
    for (const SdpaShape &Sh : Shapes)
      EXPECT_EQ(validateSdpaGraphs(Sh, Sm), "")
          << "sm_" << Sm << ", B " << Sh.B << " S " << Sh.S << " NH " << Sh.NH
          << " D " << Sh.D;
}

TEST(CudnnAttention, UnsupportedHeadSizeIsRefusedWithAReason) {
  if (std::string Why = cudnnMissing(); !Why.empty())
    GTEST_SKIP() << Why;
  // cuDNN's attention needs the head size a multiple of 8, and at most
  // 128 before Hopper.
  const std::string Why = validateSdpaGraphs(shape(2, 64, 2, 36, true), 90);
  EXPECT_NE(Why.find("multiple of 8"), std::string::npos) << Why;
  EXPECT_EQ(validateSdpaGraphs(shape(2, 64, 1, 256, true), 90), "");
  const std::string Ampere = validateSdpaGraphs(shape(2, 64, 1, 256, true), 80);
  EXPECT_NE(Ampere.find("less than or equal to 128"), std::string::npos)
      << Ampere;
}

} // namespace
