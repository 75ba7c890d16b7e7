#include "daemon/quota/fair_share.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing::HasSubstr;

constexpr uid_t kAlice = 1001;
constexpr uid_t kBob = 1002;
constexpr uid_t kCarol = 1003;

TEST(FairShareTest, ALoneUserTakesEverythingFree) {
  std::map<uid_t, ShareHolder> holders = {{kAlice, {1, 900, true}}};
  EXPECT_TRUE(FitsFairShare(1000, 900, kAlice, 100, holders, "x", "r").ok());
  absl::Status full = FitsFairShare(1000, 900, kAlice, 101, holders, "x", "r");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("the r is full"));
  // A user who is not training reserves nothing.
  holders[kBob] = {1, 0, false};
  EXPECT_TRUE(FitsFairShare(1000, 900, kAlice, 100, holders, "x", "r").ok());
}

TEST(FairShareTest, ATrainingUsersUnusedShareStaysFreeForIt) {
  std::map<uid_t, ShareHolder> holders = {{kAlice, {1, 400, true}},
                                          {kBob, {1, 100, true}}};
  // Bob's share is 500, 400 of it free: Alice may take 100 more, not 101.
  EXPECT_TRUE(FitsFairShare(1000, 500, kAlice, 100, holders, "x", "r").ok());
  absl::Status over = FitsFairShare(1000, 500, kAlice, 101, holders,
                                    "a swapped activation", "SSD array");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.message()),
              HasSubstr("a swapped activation needs 101 B beyond uid 1001's "
                        "share of the SSD array: it holds 400 B and its "
                        "share is 500 B while 1 other user is training"));
  EXPECT_THAT(std::string(over.message()),
              HasSubstr("of the 500 B free, the rest of their shares keeps "
                        "400 B for them and 100 B is free for uid 1001"));
  // Bob may take the rest of his share; Alice's unused 100 stays hers.
  EXPECT_TRUE(FitsFairShare(1000, 500, kBob, 400, holders, "x", "r").ok());
  EXPECT_FALSE(FitsFairShare(1000, 500, kBob, 401, holders, "x", "r").ok());
}

// A user who is not training yet (its data plane closed for another's
// share) asks again: the others' shares count it, so what they keep is
// their part of the pool, not everything free.
TEST(FairShareTest, ARefusalCountsTheAskersShareApartFromTheOthers) {
  // Bob trains with 10 of 64; Alice holds nothing and is not present.
  std::map<uid_t, ShareHolder> holders = {{kAlice, {1, 0, false}},
                                          {kBob, {1, 10, true}}};
  const absl::Status over =
      FitsFairShare(64, 10, kAlice, 40, holders, "job j-1's arena", "pool");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.message()),
              HasSubstr("job j-1's arena needs 40 B beyond uid 1001's share "
                        "of the pool: it holds 0 B and its share is 32 B "
                        "while 1 other user is training (by [quotas] "
                        "weight); of the 54 B free, the rest of their shares "
                        "keeps 22 B for them and 32 B is free for uid 1001"));
  EXPECT_TRUE(FitsFairShare(64, 10, kAlice, 32, holders, "x", "r").ok());
  // Absent from `holders` altogether: the same.
  holders.erase(kAlice);
  EXPECT_TRUE(FitsFairShare(64, 10, kAlice, 32, holders, "x", "r").ok());
  EXPECT_FALSE(FitsFairShare(64, 10, kAlice, 33, holders, "x", "r").ok());
  // Bob over his share keeps nothing free for himself: all that is free is
  // Alice's to ask for, within her share.
  holders = {{kBob, {1, 43, true}}};
  const absl::Status full =
      FitsFairShare(64, 43, kAlice, 40, holders, "x", "pool");
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("of the 21 B free, the rest of their shares keeps "
                        "0 B for them and 21 B is free for uid 1001"));
}

TEST(FairShareTest, WeightsDivideTheShares) {
  std::map<uid_t, ShareHolder> holders = {{kAlice, {2, 0, true}},
                                          {kBob, {1, 0, true}}};
  EXPECT_EQ(ShareOf(900, kAlice, holders), 600u);
  EXPECT_EQ(ShareOf(900, kBob, holders), 300u);
  // A newcomer's share counts it too.
  EXPECT_EQ(ShareOf(900, kCarol, holders), 225u);
  EXPECT_TRUE(FitsFairShare(900, 0, kAlice, 600, holders, "x", "r").ok());
  EXPECT_FALSE(FitsFairShare(900, 0, kAlice, 601, holders, "x", "r").ok());
}

// A user over its share (it took it while alone) keeps what it holds, but
// a user within its share still gets what is free.
TEST(FairShareTest, AUserWithinItsShareTakesWhatIsFreeBesideAnOverShareOne) {
  std::map<uid_t, ShareHolder> holders = {{kAlice, {1, 900, true}},
                                          {kBob, {1, 0, true}}};
  EXPECT_TRUE(FitsFairShare(1000, 900, kBob, 100, holders, "x", "r").ok());
  // Bob's 101 are within his share: the refusal says the resource is full
  // because of what others hold beyond theirs, not that he asks too much.
  const absl::Status full =
      FitsFairShare(1000, 900, kBob, 101, holders, "x", "r");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("the r is full (900 B of 1000 B held, 0 B of it by "
                        "uid 1002, whose share is 500 B); it is within that "
                        "share: other users hold beyond theirs"));
  EXPECT_FALSE(FitsFairShare(1000, 900, kAlice, 1, holders, "x", "r").ok());
}

// FairShareRoom is the most FitsFairShare admits, byte for byte: alone,
// beyond the others' shares, and within its own share while others hold
// beyond theirs (the issue #47 pool: 32, one user holding 23 alone).
TEST(FairShareTest, TheRoomIsTheMostThatFits) {
  struct Case {
    uint64_t capacity, held_by_all;
    uid_t uid;
    std::map<uid_t, ShareHolder> holders;
    uint64_t room;
  };
  const std::map<uid_t, ShareHolder> both = {{kAlice, {1, 400, true}},
                                             {kBob, {1, 100, true}}};
  const Case cases[] = {
      {1000, 900, kAlice, {{kAlice, {1, 900, true}}}, 100},
      {1000, 500, kAlice, both, 100},
      {1000, 500, kBob, both, 400},
      {32, 23, kBob, {{kAlice, {1, 23, true}}}, 9},
      {32, 30, kBob, {{kAlice, {1, 23, true}}, {kBob, {1, 7, true}}}, 2},
      {30, 29, kCarol, {{kAlice, {1, 20, true}}, {kBob, {1, 9, true}}}, 1},
  };
  for (const Case& c : cases) {
    const uint64_t room =
        FairShareRoom(c.capacity, c.held_by_all, c.uid, c.holders);
    EXPECT_EQ(room, c.room) << c.uid << " of " << c.capacity;
    EXPECT_TRUE(FitsFairShare(c.capacity, c.held_by_all, c.uid, room, c.holders,
                              "x", "r")
                    .ok());
    EXPECT_FALSE(FitsFairShare(c.capacity, c.held_by_all, c.uid, room + 1,
                               c.holders, "x", "r")
                     .ok());
  }
}

}  // namespace
}  // namespace lohan
