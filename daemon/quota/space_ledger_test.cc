#include "daemon/quota/space_ledger.h"

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
  EXPECT_TRUE(ledger_.Reserve("alice-greedy", SpaceLedger::kStates, 400).ok());
  absl::Status full = ledger_.Reserve("alice-greedy", SpaceLedger::kStates, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(
      full.message(),
      HasSubstr("SSD array is full: jobs hold 1000 (1000 B) of its 1000 "));
  // ...while the running job writes into its own set-aside.
  EXPECT_TRUE(ledger_.Reserve("alice-train", SpaceLedger::kStates, 600).ok());
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);
  ledger_.Release("alice-train", SpaceLedger::kStates, 600);
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);    // still set aside
  ledger_.ClearSetAside("alice-train", 2);  // not the holder
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);
  ledger_.ClearSetAside("alice-train", 1);
  EXPECT_EQ(ledger_.HeldByAll(), 400u);
  EXPECT_TRUE(ledger_.Reserve("alice-greedy", SpaceLedger::kStates, 600).ok());
}

TEST_F(SpaceLedgerTest, ASetAsideThatDoesNotFitIsRefusedAndChangesNothing) {
  ledger_.Track("a", kAlice, 0);
  ledger_.Track("b", kAlice, 0);
  ASSERT_TRUE(ledger_.Reserve("b", SpaceLedger::kStates, 700).ok());
  absl::Status refused = ledger_.SetAside("a", 400, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("the updates of its model needs 400 "));
  EXPECT_EQ(ledger_.UsageOf("a").set_aside, 0u);
  EXPECT_EQ(ledger_.HeldByAll(), 700u);
}

TEST_F(SpaceLedgerTest, JobLimitAndUserQuotaBoundEveryWrite) {
  ledger_.Track("capped", kAlice, 100);
  EXPECT_TRUE(ledger_.Reserve("capped", SpaceLedger::kStates, 100).ok());
  absl::Status over_job = ledger_.Reserve("capped", SpaceLedger::kStates, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over_job));
  EXPECT_THAT(over_job.message(),
              HasSubstr("the job holds 100 (100 B) and its limit is 100"));

  // Bob's quota (300) is over all of his jobs, set-asides included.
  ledger_.Track("bob-1", kBob, 0);
  ledger_.Track("bob-2", kBob, 0);
  ASSERT_TRUE(ledger_.SetAside("bob-1", 200, 1).ok());
  EXPECT_TRUE(ledger_.Reserve("bob-2", SpaceLedger::kStates, 100).ok());
  absl::Status over_user = ledger_.Reserve("bob-2", SpaceLedger::kStates, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over_user));
  EXPECT_THAT(over_user.message(),
              HasSubstr("its owner (uid 1002) holds 300 (300 B) over all "
                        "their jobs and the quota is 300"));
  EXPECT_EQ(ledger_.HeldBy(kBob), 300u);
  // Within its set-aside bob-1 still writes.
  EXPECT_TRUE(ledger_.Reserve("bob-1", SpaceLedger::kStates, 200).ok());
  EXPECT_FALSE(ledger_.Reserve("bob-1", SpaceLedger::kStates, 1).ok());
}

// A refusal the owner's holdings stand behind names the owner's ended jobs
// that hold space, largest first (a few, then how many more), never
// another user's (whatever the lister answers) nor one with a set-aside.
TEST_F(SpaceLedgerTest, ARefusalNamesTheOwnersEndedJobsThatHoldSpace) {
  std::vector<uid_t> asked;
  ledger_.SetEndedJobs([&asked](uid_t owner) {
    asked.push_back(owner);
    // A lister that gets it wrong: the ledger names Bob's jobs to Bob only.
    return std::vector<SpaceLedger::EndedJob>{
        {"a-small", "bench"}, {"a-big", "bench-old"}, {"a-mid", "sweep"},
        {"a-tiny", "probe"},  {"a-empty", "never"},   {"a-open", "running"},
        {"b-old", "secret"},  {"a-ask", "asking"}};
  });
  for (const char* job :
       {"a-small", "a-big", "a-mid", "a-tiny", "a-empty", "a-open", "a-ask"}) {
    ledger_.Track(job, kAlice, 0);
  }
  ledger_.Track("b-old", kBob, 0);
  ASSERT_TRUE(ledger_.Reserve("a-small", SpaceLedger::kStates, 100).ok());
  ASSERT_TRUE(ledger_.Reserve("a-big", SpaceLedger::kStates, 300).ok());
  ASSERT_TRUE(ledger_.Reserve("a-mid", SpaceLedger::kActivations, 200).ok());
  ASSERT_TRUE(ledger_.Reserve("a-tiny", SpaceLedger::kStates, 10).ok());
  ASSERT_TRUE(ledger_.SetAside("a-open", 50, 7).ok());
  ASSERT_TRUE(ledger_.Reserve("b-old", SpaceLedger::kStates, 250).ok());
  // 910 held of 1000.
  absl::Status full = ledger_.SetAside("a-ask", 200, 8);
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_EQ(asked, std::vector<uid_t>{kAlice});
  EXPECT_THAT(full.message(), HasSubstr("SSD array is full"));
  EXPECT_THAT(full.message(),
              HasSubstr("; uid 1001's jobs that no process is attached to "
                        "hold 610 B: a-big 'bench-old' 300 B, a-mid 'sweep' "
                        "200 B, a-small 'bench' 100 B and 1 more (10 B); "
                        "delete those no longer needed ('lohanctl jobs "
                        "delete ID'; 'lohanctl jobs' shows when lohand "
                        "deletes each on its own)"));
  for (const char* never :
       {"b-old", "secret", "a-open", "a-empty", "never", "'asking'"}) {
    EXPECT_THAT(full.message(), Not(HasSubstr(never)));
  }
  // The same for a write (a swapped activation) that does not fit.
  absl::Status swap = ledger_.Reserve("a-ask", SpaceLedger::kActivations, 100);
  ASSERT_TRUE(absl::IsResourceExhausted(swap)) << swap;
  EXPECT_THAT(swap.message(), HasSubstr("a-big 'bench-old' 300 B"));
  // And the store's own refusal.
  EXPECT_THAT(
      ledger_.NoRoom("a-ask", absl::ResourceExhaustedError("full")).message(),
      HasSubstr("full; uid 1001's jobs that no process is attached to"));

  // Bob's refusal (his quota) names his own ended job, never Alice's.
  ledger_.Track("b-new", kBob, 0);
  asked.clear();
  absl::Status bobs = ledger_.Reserve("b-new", SpaceLedger::kStates, 100);
  ASSERT_TRUE(absl::IsResourceExhausted(bobs)) << bobs;
  EXPECT_EQ(asked, std::vector<uid_t>{kBob});
  EXPECT_THAT(bobs.message(), HasSubstr("the quota is 300"));
  EXPECT_THAT(bobs.message(), HasSubstr("b-old 'secret' 250 B"));
  for (const char* never : {"a-big", "a-mid", "a-small", "bench"}) {
    EXPECT_THAT(bobs.message(), Not(HasSubstr(never)));
  }

  // A job past its own limit: the other jobs do not stand behind that.
  ledger_.Track("a-capped", kAlice, 5);
  asked.clear();
  absl::Status capped = ledger_.Reserve("a-capped", SpaceLedger::kStates, 6);
  ASSERT_TRUE(absl::IsResourceExhausted(capped)) << capped;
  EXPECT_TRUE(asked.empty());
  EXPECT_THAT(capped.message(), Not(HasSubstr("no process is attached")));

  // Without a lister, the refusal alone.
  ledger_.SetEndedJobs(nullptr);
  EXPECT_THAT(ledger_.SetAside("a-ask", 200, 8).message(),
              Not(HasSubstr("no process is attached")));
}

TEST_F(SpaceLedgerTest, RoomIsTheLeastOfTheJobsUsersAndArraysLeft) {
  EXPECT_EQ(ledger_.RoomFor("untracked"), 1000u);
  ledger_.Track("capped", kAlice, 100);
  ASSERT_TRUE(ledger_.Reserve("capped", SpaceLedger::kStates, 30).ok());
  EXPECT_EQ(ledger_.RoomFor("capped"), 70u);  // its own limit
  ledger_.Track("bobs", kBob, 0);
  ledger_.Track("bobs-other", kBob, 0);
  ASSERT_TRUE(ledger_.SetAside("bobs-other", 200, 1).ok());
  EXPECT_EQ(ledger_.RoomFor("bobs"), 100u);  // Bob's quota of 300
  ledger_.Track("alice-big", kAlice, 0);
  ASSERT_TRUE(ledger_.Reserve("alice-big", SpaceLedger::kStates, 700).ok());
  EXPECT_EQ(ledger_.RoomFor("alice-big"), 70u);  // the array's 1000
  EXPECT_EQ(ledger_.RoomFor("bobs"), 70u);
  // What a room says may be written fits; one byte more does not.
  EXPECT_TRUE(ledger_.Reserve("bobs", SpaceLedger::kStates, 70).ok());
  EXPECT_EQ(ledger_.RoomFor("bobs"), 0u);
  EXPECT_FALSE(ledger_.Reserve("bobs", SpaceLedger::kStates, 1).ok());
}

TEST_F(SpaceLedgerTest, ChargedSpaceCountsAndForgottenJobsDrainToNothing) {
  ledger_.Charge("old", SpaceLedger::kStates,
                 900);  // found at start, before anyone asked
  EXPECT_FALSE(ledger_.Reserve("new", SpaceLedger::kStates, 101).ok());
  ledger_.Track("old", kAlice, 0);
  ledger_.Forget("old");  // deleted while a reader holds a version
  EXPECT_EQ(ledger_.HeldByAll(), 900u);
  ledger_.Release("old", SpaceLedger::kStates, 900);
  EXPECT_EQ(ledger_.HeldByAll(), 0u);
  EXPECT_EQ(ledger_.UsageOf("old").used, 0u);
  EXPECT_TRUE(ledger_.Reserve("new", SpaceLedger::kStates, 1000).ok());
}

// A job's swapped activations never eat the set-aside of its updates: its
// states may fill it whatever its activations hold.
TEST_F(SpaceLedgerTest, ActivationsNeverTakeTheirOwnJobsSetAside) {
  ledger_.Track("train", kAlice, 0);
  ASSERT_TRUE(ledger_.SetAside("train", 600, 1).ok());
  EXPECT_EQ(ledger_.AccountOf("act.12"), SpaceLedger::kActivations);
  EXPECT_EQ(ledger_.AccountOf("layer.000001.chunk.000000"),
            SpaceLedger::kStates);
  EXPECT_TRUE(ledger_.Reserve("train", SpaceLedger::kActivations, 400).ok());
  absl::Status full = ledger_.Reserve("train", SpaceLedger::kActivations, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("a swapped activation needs 1 (1 B)"));
  // The updates still have all 600.
  EXPECT_TRUE(ledger_.Reserve("train", SpaceLedger::kStates, 600).ok());
  EXPECT_EQ(ledger_.UsageOf("train").activations, 400u);
  EXPECT_EQ(ledger_.HeldByAll(), 1000u);
  ledger_.Release("train", SpaceLedger::kActivations, 400);
  EXPECT_EQ(ledger_.HeldByAll(), 600u);
}

// Two users training: each one's share of the array stays free for it.
TEST_F(SpaceLedgerTest, ATrainingUsersShareStaysFreeForItsNextJob) {
  ledger_.Track("alice", kAlice, 0);
  ledger_.Track("bob", kBob, 0);
  ledger_.SetPresent(kAlice, true);
  // Alone, Alice's activations may take the whole array.
  EXPECT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 900).ok());
  ledger_.Release("alice", SpaceLedger::kActivations, 900);
  ledger_.SetPresent(kBob, true);
  EXPECT_EQ(ledger_.RoomFor("alice"), 500u);
  EXPECT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 500).ok());
  absl::Status over = ledger_.Reserve("alice", SpaceLedger::kActivations, 1);
  ASSERT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("beyond uid 1001's share"));
  // Bob's (quota 300) new job sets aside what it needs of his share.
  EXPECT_TRUE(ledger_.SetAside("bob", 300, 7).ok());
  ledger_.SetPresent(kBob, false);  // Bob stops: his unused share is free
  ledger_.ClearSetAside("bob", 7);
  EXPECT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 500).ok());
}

// A set-aside that only space held beyond another user's share stands in
// the way of waits for it (that user's activations come back as its
// iterations end); one that waiting cannot help is refused at once.
TEST_F(SpaceLedgerTest, ASetAsideWaitsForSpaceHeldBeyondAnotherShare) {
  ledger_.Track("alice", kAlice, 0);
  ledger_.Track("bob", kBob, 0);
  ledger_.SetPresent(kAlice, true);
  ASSERT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 900).ok());
  ledger_.SetPresent(kBob, true);
  absl::Status set_aside;
  std::thread bob([&] {
    set_aside = ledger_.SetAside("bob", 300, 7, absl::InfiniteDuration());
  });
  while (ledger_.waiting() == 0) absl::SleepFor(absl::Milliseconds(1));
  // Alice, over her share, may take nothing more meanwhile.
  EXPECT_FALSE(ledger_.Reserve("alice", SpaceLedger::kActivations, 1).ok());
  ledger_.Release("alice", SpaceLedger::kActivations, 900);  // her iteration
  bob.join();
  EXPECT_TRUE(set_aside.ok()) << set_aside;
  EXPECT_EQ(ledger_.UsageOf("bob").set_aside, 300u);
  // Nothing over anyone's share (Bob's quota is what stands in the way):
  // refused at once, however long it might wait.
  ledger_.Track("bob-2", kBob, 0);
  EXPECT_FALSE(ledger_.SetAside("bob-2", 1, 8, absl::InfiniteDuration()).ok());
}

// A set-aside that waits first tells the reclaimer what others hold beyond
// their shares (close them at the end of their iterations); with no room
// after half its patience, tells it again to close them at once.
TEST_F(SpaceLedgerTest, AWaitingSetAsideAsksTheReclaimerTwice) {
  ledger_.Track("alice", kAlice, 0);
  ledger_.Track("bob", kBob, 0);
  ledger_.SetPresent(kAlice, true);
  ASSERT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 900).ok());
  ledger_.SetPresent(kBob, true);
  std::vector<bool> asked;  // at_once, per call
  ledger_.SetReclaimer([&](uid_t for_uid, const std::string& job,
                           const std::map<uid_t, uint64_t>& beyond,
                           bool at_once) {
    EXPECT_EQ(for_uid, kBob);
    EXPECT_EQ(job, "bob");
    // Alice's share is 500 of the 1000 with Bob training.
    EXPECT_EQ(beyond, (std::map<uid_t, uint64_t>{{kAlice, 400}}));
    asked.push_back(at_once);
    // Her plane ignores the drain; closed at once, its activations go.
    if (at_once) ledger_.Release("alice", SpaceLedger::kActivations, 900);
    return absl::OkStatus();
  });
  const absl::Status set_aside =
      ledger_.SetAside("bob", 300, 7, absl::Milliseconds(400));
  EXPECT_TRUE(set_aside.ok()) << set_aside;
  EXPECT_EQ(asked, (std::vector<bool>{false, true}));
  // Without room even then: refused once the patience is out, having asked
  // twice.
  asked.clear();
  ledger_.SetReclaimer([&](uid_t, const std::string&,
                           const std::map<uid_t, uint64_t>&, bool at_once) {
    asked.push_back(at_once);
    return absl::OkStatus();
  });
  ledger_.ClearSetAside("bob", 7);
  ledger_.SetPresent(kBob, false);  // Alice alone again takes 900
  ASSERT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 900).ok());
  ledger_.SetPresent(kBob, true);
  ledger_.Track("bob-2", kBob, 0);
  const absl::Status refused =
      ledger_.SetAside("bob-2", 200, 8, absl::Milliseconds(200));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("waited"));
  EXPECT_EQ(asked, (std::vector<bool>{false, true}));
  // What Bob's own quota (300) stands in the way of is refused at once,
  // nobody asked to give anything back.
  asked.clear();
  const absl::Status over_quota =
      ledger_.SetAside("bob-2", 301, 8, absl::InfiniteDuration());
  EXPECT_THAT(over_quota.message(), HasSubstr("the quota is 300"));
  EXPECT_TRUE(asked.empty());
  ledger_.SetReclaimer(nullptr);
}

// A reclaimer that may take nothing back now (lohand's reclaim_interval)
// ends the wait: the set-aside is refused at once, saying why, asked once.
TEST_F(SpaceLedgerTest, AReclaimerThatMayNotTakeBackEndsTheWaitAtOnce) {
  ledger_.Track("alice", kAlice, 0);
  ledger_.Track("bob", kBob, 0);
  ledger_.SetPresent(kAlice, true);
  ASSERT_TRUE(ledger_.Reserve("alice", SpaceLedger::kActivations, 900).ok());
  ledger_.SetPresent(kBob, true);
  int asked = 0;
  ledger_.SetReclaimer([&](uid_t, const std::string&,
                           const std::map<uid_t, uint64_t>&, bool) {
    ++asked;
    return absl::ResourceExhaustedError("not again before 10:00 (the rule)");
  });
  // An infinite patience: had it waited, it would never return.
  const absl::Status refused =
      ledger_.SetAside("bob", 300, 7, absl::InfiniteDuration());
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("not again before 10:00"));
  EXPECT_THAT(refused.message(), Not(HasSubstr("waited")));
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(ledger_.UsageOf("bob").set_aside, 0u);
  ledger_.SetReclaimer(nullptr);
}

}  // namespace
}  // namespace lohan
