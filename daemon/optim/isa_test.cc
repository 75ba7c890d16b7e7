#include "daemon/optim/isa.h"

#include <cstdlib>

#include "daemon/optim/adam.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

class IsaEnvTest : public testing::Test {
 protected:
  void SetUp() override { unsetenv(kIsaEnvVar); }
  void TearDown() override { unsetenv(kIsaEnvVar); }
};

TEST_F(IsaEnvTest, ParsesNames) {
  EXPECT_EQ(*ParseIsa("avx512"), Isa::kAvx512);
  EXPECT_EQ(*ParseIsa("avx2"), Isa::kAvx2);
  EXPECT_EQ(*ParseIsa("scalar"), Isa::kScalar);
  EXPECT_EQ(ParseIsa("sse9").status().code(),
            absl::StatusCode::kInvalidArgument);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(*ParseIsa(IsaName(isa)), isa);
  }
}

TEST_F(IsaEnvTest, DefaultIsBestAndScalarAlwaysWorks) {
  EXPECT_TRUE(CpuSupportsIsa(Isa::kScalar));
  EXPECT_TRUE(CpuSupportsIsa(BestIsa()));
  EXPECT_EQ(*ResolveIsa(std::nullopt), BestIsa());
  setenv(kIsaEnvVar, "auto", 1);
  EXPECT_EQ(*ResolveIsa(std::nullopt), BestIsa());
  EXPECT_EQ(*ResolveIsa(Isa::kScalar), Isa::kScalar);
}

TEST_F(IsaEnvTest, EnvironmentVariableForcesAPath) {
  setenv(kIsaEnvVar, "scalar", 1);
  EXPECT_EQ(*ResolveIsa(std::nullopt), Isa::kScalar);
  auto updater = AdamUpdater::Create(nullptr, std::nullopt);
  ASSERT_TRUE(updater.ok());
  EXPECT_EQ(updater->isa(), Isa::kScalar);
  // The API parameter wins over the variable.
  EXPECT_EQ(*ResolveIsa(BestIsa()), BestIsa());
  setenv(kIsaEnvVar, "bogus", 1);
  EXPECT_EQ(ResolveIsa(std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(AdamUpdater::Create(nullptr, std::nullopt).ok());
}

TEST_F(IsaEnvTest, AskingForAMissingPathIsAnError) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (CpuSupportsIsa(isa)) {
      EXPECT_EQ(*ResolveIsa(isa), isa);
      continue;
    }
    EXPECT_EQ(ResolveIsa(isa).status().code(),
              absl::StatusCode::kFailedPrecondition);
    setenv(kIsaEnvVar, std::string(IsaName(isa)).c_str(), 1);
    EXPECT_EQ(ResolveIsa(std::nullopt).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  if (CpuSupportsIsa(Isa::kAvx512)) {
    GTEST_SKIP() << "this CPU has every path; the error case is not "
                    "reachable here";
  }
}

}  // namespace
}  // namespace lohan
