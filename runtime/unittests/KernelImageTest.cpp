//===- KernelImageTest.cpp - Which of a kernel's binaries a device loads --===//
//
// The expectations follow CUDA's compatibility rules (the CUDA C
// Programming Guide, "Binary Compatibility" and "PTX Compatibility"): a
// cubin for sm_XY runs on sm_XZ for Z >= Y only; PTX for compute_XY
// compiles for any sm from XY on; "a" binaries run on their own sm alone,
// "f" ones within their major version from their minor on.
//
//===----------------------------------------------------------------------===//

#include "megac_rt/kernel_image.h"

#include <gtest/gtest.h>

using namespace megac_rt;

namespace {

// What megac compile --target cuda embeds.
const std::vector<std::string> kPlanArchs = {"sm_80", "sm_90", "compute_90"};

TEST(KernelImage, ParsesArchitectureNames) {
  EXPECT_EQ(parseArch("sm_80").Version, 80);
  EXPECT_FALSE(parseArch("sm_80").Ptx);
  EXPECT_EQ(parseArch("compute_90").Version, 90);
  EXPECT_TRUE(parseArch("compute_90").Ptx);
  EXPECT_EQ(parseArch("sm_100").Version, 100);
  EXPECT_EQ(parseArch("sm_90a").Suffix, 'a');
  EXPECT_EQ(parseArch("compute_100f").Suffix, 'f');
  for (const char *Bad : {"", "sm_", "sm_x0", "gfx90a", "sm_90ab", "compute"})
    EXPECT_EQ(parseArch(Bad).Version, 0) << Bad;
}

TEST(KernelImage, EachDeviceTakesItsOwnCubinOrAnEarlierMinor) {
  EXPECT_EQ(pickKernelImage(kPlanArchs, 8, 0), 0); // A100: sm_80
  EXPECT_EQ(pickKernelImage(kPlanArchs, 8, 6), 0); // A10: sm_80
  EXPECT_EQ(pickKernelImage(kPlanArchs, 8, 9), 0); // L40S: sm_80
  EXPECT_EQ(pickKernelImage(kPlanArchs, 9, 0), 1); // H100: sm_90
}

TEST(KernelImage, LaterMajorVersionsTakeThePtx) {
  EXPECT_EQ(pickKernelImage(kPlanArchs, 10, 0), 2); // B200: compute_90
  EXPECT_EQ(pickKernelImage(kPlanArchs, 12, 0), 2); // RTX 50: compute_90
  // Without PTX nothing runs there.
  EXPECT_EQ(pickKernelImage({"sm_80", "sm_90"}, 10, 0), -1);
}

TEST(KernelImage, NothingRunsBelowEveryBinary) {
  EXPECT_EQ(pickKernelImage(kPlanArchs, 7, 5), -1);
  // compute_90's PTX does not compile for sm_89.
  EXPECT_EQ(pickKernelImage({"sm_90", "compute_90"}, 8, 9), -1);
  EXPECT_EQ(pickKernelImage({}, 9, 0), -1);
}

TEST(KernelImage, PtxPreferredWhereAsked) {
  EXPECT_EQ(pickKernelImage(kPlanArchs, 9, 0, true), 2);
  // No PTX that compiles there: the cubin still.
  EXPECT_EQ(pickKernelImage(kPlanArchs, 8, 0, true), 0);
}

TEST(KernelImage, NewestApplicableWinsWhateverTheOrder) {
  EXPECT_EQ(pickKernelImage({"sm_86", "sm_80"}, 8, 9), 0);
  EXPECT_EQ(pickKernelImage({"compute_80", "compute_90"}, 10, 0), 1);
  // An arch-specific cubin runs on its own sm alone.
  EXPECT_EQ(pickKernelImage({"sm_90a", "compute_80"}, 9, 0), 0);
  EXPECT_EQ(pickKernelImage({"sm_90a", "compute_80"}, 10, 0), 1);
  EXPECT_EQ(pickKernelImage({"sm_80a", "sm_80"}, 8, 6), 1);
}

TEST(KernelImage, SuffixedBinariesStayWhereTheyCompile) {
  // Arch-specific PTX compiles for its own architecture alone.
  EXPECT_EQ(pickKernelImage({"compute_90a"}, 9, 0), 0);
  EXPECT_EQ(pickKernelImage({"compute_90a"}, 10, 0), -1);
  // Family-specific binaries: their major version, from their minor on.
  EXPECT_EQ(pickKernelImage({"sm_100f"}, 10, 3), 0);
  EXPECT_EQ(pickKernelImage({"compute_100f"}, 10, 3), 0);
  EXPECT_EQ(pickKernelImage({"compute_100f"}, 12, 0), -1);
  EXPECT_EQ(pickKernelImage({"sm_103f"}, 10, 0), -1);
}

} // namespace
