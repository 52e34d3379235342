//===- EnvTest.cpp - Numbers from the launcher's environment --------------===//

#include "env.h"
#include "error.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>

using megac_rt::envWholeNumber;
using megac_rt::RunError;

namespace {

constexpr const char *kVar = "MEGAC_ENV_TEST_NUMBER";

/// The message envWholeNumber throws for \p Value ("" where it throws none).
std::string refusal(const char *Value, long Lo, long Hi,
                    const std::string &What = "") {
  ::setenv(kVar, Value, 1);
  try {
    envWholeNumber(kVar, Lo, Hi, What);
  } catch (const RunError &E) {
    return E.what();
  }
  return "";
}

TEST(EnvTest, UnsetAndEmptyAreNoValue) {
  ::unsetenv(kVar);
  EXPECT_FALSE(envWholeNumber(kVar, 0, 10).has_value());
  ::setenv(kVar, "", 1);
  EXPECT_FALSE(envWholeNumber(kVar, 0, 10).has_value());
}

TEST(EnvTest, TakesWholeNumbersInRange) {
  ::setenv(kVar, "0", 1);
  EXPECT_EQ(envWholeNumber(kVar, 0, 10), 0);
  ::setenv(kVar, "10", 1);
  EXPECT_EQ(envWholeNumber(kVar, 0, 10), 10);
  ::setenv(kVar, "007", 1);
  EXPECT_EQ(envWholeNumber(kVar, 0, 10), 7);
  ::setenv(kVar, "65535", 1);
  EXPECT_EQ(envWholeNumber(kVar, 1, 65535), 65535);
}

TEST(EnvTest, RefusesWhatAtoiWouldTake) {
  const std::string Expected =
      std::string(kVar) + " is '%': expected a whole number from 0 to 10";
  for (const char *Bad : {"abc", "3x", "-1", "+3", " 3", "3 ", "11", "1e3",
                          "99999999999999999999999"}) {
    std::string Want = Expected;
    Want.replace(Want.find('%'), 1, Bad);
    EXPECT_EQ(refusal(Bad, 0, 10), Want) << Bad;
  }
}

TEST(EnvTest, SaysWhatTheNumberIsFor) {
  EXPECT_EQ(refusal("gpu0", 0, INT_MAX, "the launcher's local rank"),
            std::string(kVar) +
                " is 'gpu0': expected the launcher's local rank");
}

} // namespace
