#include "daemon/quota/space_ledger.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kAlice = 1001;
constexpr uid_t kBob = 1002;

class SpaceLedgerTest : public ::testing::Test {
 protected:
  QuotaTable quotas_{UserLimits{}, {{kBob, UserLimits{.ssd_bytes = 300}}}};
  SpaceLedger ledger_{1000, &quotas_};
};

TEST_F(SpaceLedgerTest, AJobsSetAsideIsItsWhateverOthersWrite) {
  ledger_.Track("alice-train", kAlice, 0);
  ledger_.Track("alice-greedy", kAlice, 0);
  ASSERT_TRUE(ledger_.SetAside("alice-train", 600, 1).ok());
  // The greedy job can take only what is not set aside...
  EXPECT_TRUE(ledger_.Reserve("alice-greedy", 400).ok());
  absl::Status full = ledger_.Reserve("alice-greedy", 1);
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(
      full.message(),
      HasSubstr("SSD array is full: jobs hold 1000 (1000 B) of its 1000 "));
  // ...while the running job writes into its own set-aside.
  EXPECT_TRUE(ledger_.Reserve("alice-train", 600).ok());
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);
  ledger_.Release("alice-train", 600);
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);    // still set aside
  ledger_.ClearSetAside("alice-train", 2);  // not the holder
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);
  ledger_.ClearSetAside("alice-train", 1);
  EXPECT_EQ(ledger_.HeldByAll(), 400u);
  EXPECT_TRUE(ledger_.Reserve("alice-greedy", 600).ok());
}

TEST_F(SpaceLedgerTest, ASetAsideThatDoesNotFitIsRefusedAndChangesNothing) {
  ledger_.Track("a", kAlice, 0);
  ledger_.Track("b", kAlice, 0);
  ASSERT_TRUE(ledger_.Reserve("b", 700).ok());
  absl::Status refused = ledger_.SetAside("a", 400, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("the updates of its model needs 400 "));
  EXPECT_EQ(ledger_.UsageOf("a").set_aside, 0u);
  EXPECT_EQ(ledger_.HeldByAll(), 700u);
}

TEST_F(SpaceLedgerTest, JobLimitAndUserQuotaBoundEveryWrite) {
  ledger_.Track("capped", kAlice, 100);
  EXPECT_TRUE(ledger_.Reserve("capped", 100).ok());
  absl::Status over_job = ledger_.Reserve("capped", 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over_job));
  EXPECT_THAT(over_job.message(),
              HasSubstr("the job holds 100 (100 B) and its limit is 100"));

  // Bob's quota (300) is over all of his jobs, set-asides included.
  ledger_.Track("bob-1", kBob, 0);
  ledger_.Track("bob-2", kBob, 0);
  ASSERT_TRUE(ledger_.SetAside("bob-1", 200, 1).ok());
  EXPECT_TRUE(ledger_.Reserve("bob-2", 100).ok());
  absl::Status over_user = ledger_.Reserve("bob-2", 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over_user));
  EXPECT_THAT(over_user.message(),
              HasSubstr("its owner (uid 1002) holds 300 (300 B) over all "
                        "their jobs and the quota is 300"));
  EXPECT_EQ(ledger_.HeldBy(kBob), 300u);
  // Within its set-aside bob-1 still writes.
  EXPECT_TRUE(ledger_.Reserve("bob-1", 200).ok());
  EXPECT_FALSE(ledger_.Reserve("bob-1", 1).ok());
}

TEST_F(SpaceLedgerTest, RoomIsTheLeastOfTheJobsUsersAndArraysLeft) {
  EXPECT_EQ(ledger_.RoomFor("untracked"), 1000u);
  ledger_.Track("capped", kAlice, 100);
  ASSERT_TRUE(ledger_.Reserve("capped", 30).ok());
  EXPECT_EQ(ledger_.RoomFor("capped"), 70u);  // its own limit
  ledger_.Track("bobs", kBob, 0);
  ledger_.Track("bobs-other", kBob, 0);
  ASSERT_TRUE(ledger_.SetAside("bobs-other", 200, 1).ok());
  EXPECT_EQ(ledger_.RoomFor("bobs"), 100u);  // Bob's quota of 300
  ledger_.Track("alice-big", kAlice, 0);
  ASSERT_TRUE(ledger_.Reserve("alice-big", 700).ok());
  EXPECT_EQ(ledger_.RoomFor("alice-big"), 70u);  // the array's 1000
  EXPECT_EQ(ledger_.RoomFor("bobs"), 70u);
  // What a room says may be written fits; one byte more does not.
  EXPECT_TRUE(ledger_.Reserve("bobs", 70).ok());
  EXPECT_EQ(ledger_.RoomFor("bobs"), 0u);
  EXPECT_FALSE(ledger_.Reserve("bobs", 1).ok());
}

TEST_F(SpaceLedgerTest, ChargedSpaceCountsAndForgottenJobsDrainToNothing) {
  ledger_.Charge("old", 900);  // found at start, before anyone asked
  EXPECT_FALSE(ledger_.Reserve("new", 101).ok());
  ledger_.Track("old", kAlice, 0);
  ledger_.Forget("old");  // deleted while a reader holds a version
  EXPECT_EQ(ledger_.HeldByAll(), 900u);
  ledger_.Release("old", 900);
  EXPECT_EQ(ledger_.HeldByAll(), 0u);
  EXPECT_EQ(ledger_.UsageOf("old").used, 0u);
  EXPECT_TRUE(ledger_.Reserve("new", 1000).ok());
}

}  // namespace
}  // namespace lohan
