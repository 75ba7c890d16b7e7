#include "daemon/sched/state_tier.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kChunk = 64 << 10;

std::vector<uint8_t> Filled(uint64_t bytes, uint8_t value) {
  return std::vector<uint8_t>(bytes, value);
}

// Whether `tier` gives chunk `flat`'s committed copy, equal to `value`s.
bool Holds(StateTier& tier, size_t flat, uint8_t value) {
  std::vector<uint8_t> out(kChunk, 0);
  if (!tier.ReadCommitted(flat, absl::MakeSpan(out))) return false;
  EXPECT_EQ(out, Filled(kChunk, value)) << "chunk " << flat;
  return true;
}

TEST(StateTierTest, WithoutMemoryNothingIsKept) {
  StateTier tier("job", {kChunk, kChunk}, StateTierMemory{}, "", 1.0);
  EXPECT_FALSE(tier.enabled());
  tier.Place();
  tier.KeepPending(0, Filled(kChunk, 1));
  tier.CommitPending();
  EXPECT_FALSE(Holds(tier, 0, 1));
  EXPECT_EQ(tier.stats().bytes_held, 0u);
}

TEST(StateTierTest, APendingCopyStandsInOnlyOnceCommitted) {
  MemoryShares shares(3 * kChunk);
  StateTier tier("job", {kChunk, kChunk}, StateTierMemory{&shares}, "", 1.0);
  tier.Place();
  tier.KeepPending(0, Filled(kChunk, 7));
  EXPECT_FALSE(Holds(tier, 0, 7));  // the store still has the old one
  tier.CommitPending();
  EXPECT_TRUE(Holds(tier, 0, 7));
  EXPECT_FALSE(Holds(tier, 1, 0));  // never written
  // A new pending version voids the committed copy until it commits.
  tier.KeepPending(0, Filled(kChunk, 8));
  EXPECT_FALSE(tier.HoldsCommitted(0));
  tier.DropPending();  // rolled back: the store's committed one is older
  EXPECT_FALSE(tier.HoldsCommitted(0));
  tier.KeepPending(0, Filled(kChunk, 9));
  tier.KeepPending(1, Filled(kChunk, 10));
  tier.CommitPending();
  EXPECT_TRUE(Holds(tier, 0, 9));
  EXPECT_TRUE(Holds(tier, 1, 10));
  tier.Invalidate(1, 1);
  EXPECT_TRUE(Holds(tier, 0, 9));
  EXPECT_FALSE(tier.HoldsCommitted(1));
  EXPECT_EQ(tier.stats().bytes_held, 2 * kChunk);
  EXPECT_EQ(tier.stats().committed_bytes, kChunk);
}

TEST(StateTierTest, ALentCopyIsUpdatedWhereItLivesAndReadByNoOneElse) {
  MemoryShares shares(2 * kChunk);
  StateTier tier("job", {kChunk, kChunk}, StateTierMemory{&shares}, "", 1.0);
  tier.Place();
  EXPECT_EQ(tier.Lend(0), nullptr);  // no committed copy yet
  tier.KeepPending(0, Filled(kChunk, 3));
  tier.CommitPending();
  uint8_t* state = tier.Lend(0);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state[0], 3);
  EXPECT_EQ(tier.Lend(0), nullptr);  // lent once
  // While lent, nobody reads it: the committed version is the store's now.
  EXPECT_FALSE(tier.HoldsCommitted(0));
  std::vector<uint8_t> out(kChunk);
  EXPECT_FALSE(tier.ReadCommitted(0, absl::MakeSpan(out), true));
  std::fill(state, state + kChunk, 4);  // the update, in place
  tier.GiveBack(0, /*stored=*/true);
  EXPECT_FALSE(tier.PendingOnly(0));
  EXPECT_TRUE(tier.ReadCommitted(0, absl::MakeSpan(out), true));  // pending
  tier.CommitPending();
  EXPECT_TRUE(Holds(tier, 0, 4));
  // Between durable commits: given back unstored, the tier alone has it.
  ASSERT_NE(tier.Lend(0), nullptr);
  tier.GiveBack(0, /*stored=*/false);
  EXPECT_TRUE(tier.PendingOnly(0));
  tier.CommitPending();
  EXPECT_TRUE(tier.HoldsCommittedOnly(0));
  // Lent again and rolled back: the only copy of the committed version was
  // the one updated, so the job cannot go back to it.
  ASSERT_NE(tier.Lend(0), nullptr);
  tier.GiveBack(0, /*stored=*/false);
  EXPECT_FALSE(tier.DropPending());
  EXPECT_FALSE(tier.HoldsCommitted(0));
  // A stored committed copy lent and rolled back loses nothing: the store
  // has the committed version.
  tier.KeepPending(1, Filled(kChunk, 5));
  tier.CommitPending();
  ASSERT_NE(tier.Lend(1), nullptr);
  tier.GiveBack(1, /*stored=*/true);
  EXPECT_TRUE(tier.DropPending());
  EXPECT_FALSE(tier.HoldsCommitted(1));
}

TEST(StateTierTest, CopyingUpdatesLendNothing) {
  MemoryShares shares(kChunk);
  StateTier tier("job", {kChunk},
                 StateTierMemory{.shares = &shares, .update_in_place = false},
                 "", 1.0);
  tier.Place();
  tier.KeepPending(0, Filled(kChunk, 1));
  tier.CommitPending();
  EXPECT_EQ(tier.Lend(0), nullptr);
  EXPECT_TRUE(Holds(tier, 0, 1));
}

TEST(StateTierTest, APrefixInForwardOrderFitsTheShare) {
  MemoryShares shares(2 * kChunk + kChunk / 2);
  StateTier tier("job", {kChunk, kChunk, kChunk}, StateTierMemory{&shares}, "",
                 1.0);
  tier.Place();
  EXPECT_EQ(tier.stats().placed_chunks, 2u);
  for (size_t flat = 0; flat < 3; ++flat) {
    tier.KeepPending(flat, Filled(kChunk, static_cast<uint8_t>(flat + 1)));
  }
  tier.CommitPending();
  EXPECT_TRUE(Holds(tier, 0, 1));
  EXPECT_TRUE(Holds(tier, 1, 2));
  EXPECT_FALSE(Holds(tier, 2, 3));
  EXPECT_EQ(shares.Held("job"), 2 * kChunk);
}

TEST(StateTierTest, AJobThatJoinsGetsItsShareAtTheOthersNextPlace) {
  MemoryShares shares(4 * kChunk);
  StateTier first("first", std::vector<uint64_t>(4, kChunk),
                  StateTierMemory{&shares}, "alice", 2.0);
  first.Place();
  for (size_t flat = 0; flat < 4; ++flat) {
    first.KeepPending(flat, Filled(kChunk, 1));
  }
  first.CommitPending();
  EXPECT_EQ(shares.Held("first"), 4 * kChunk);
  {
    // Weights 2:2 (the groups' own): half each once the first places again.
    StateTier second("second", std::vector<uint64_t>(4, kChunk),
                     StateTierMemory{&shares}, "bob", 2.0);
    second.Place();
    second.KeepPending(0, Filled(kChunk, 2));  // no room yet
    second.CommitPending();
    EXPECT_FALSE(Holds(second, 0, 2));
    first.Place();
    EXPECT_EQ(shares.Held("first"), 2 * kChunk);
    EXPECT_TRUE(Holds(first, 1, 1));
    EXPECT_FALSE(first.HoldsCommitted(2));
    second.KeepPending(0, Filled(kChunk, 2));
    second.KeepPending(1, Filled(kChunk, 2));
    second.CommitPending();
    EXPECT_TRUE(Holds(second, 1, 2));
    EXPECT_EQ(shares.Held("second"), 2 * kChunk);
  }
  // The second left: its memory is free for the first again.
  EXPECT_EQ(shares.Held("second"), 0u);
  first.Place();
  EXPECT_EQ(first.stats().placed_chunks, 4u);
}

TEST(StateTierTest, UnderMemoryPressureStatesStayOnTheSsds) {
  MemoryShares shares(4 * kChunk);
  StateTierMemory memory{&shares};
  // A floor no machine has free: every copy is refused, nothing is held.
  memory.keep_available_bytes = std::numeric_limits<uint64_t>::max() / 2;
  StateTier tier("job", {kChunk}, memory, "", 1.0);
  tier.Place();
  tier.KeepPending(0, Filled(kChunk, 1));
  tier.CommitPending();
  EXPECT_FALSE(Holds(tier, 0, 1));
  EXPECT_EQ(shares.Held("job"), 0u);
}

TEST(StateTierTest, CopiesGoBackFromTheEndWhenMemoryRunsShort) {
  MemoryShares shares(4 * kChunk);
  // A machine of 20 chunks' memory, of which others use `others` and the
  // tier what it holds; the tier keeps 10 chunks' free.
  uint64_t others = 0;
  StateTierMemory memory{.shares = &shares,
                         .keep_available_bytes = 10 * kChunk,
                         .available_bytes = [&] {
                           return 20 * kChunk - others - shares.Held("job");
                         }};
  StateTier tier("job", {kChunk, kChunk, kChunk}, memory, "", 1.0);
  tier.Place();
  for (size_t flat = 0; flat < 3; ++flat) {
    tier.KeepPending(flat, Filled(kChunk, static_cast<uint8_t>(flat + 1)));
  }
  tier.CommitPending();
  EXPECT_EQ(shares.Held("job"), 3 * kChunk);
  // Others take 8.5 chunks: 1.5 below the floor. The next Place gives
  // copies back, the last first, until the floor holds again.
  others = 8 * kChunk + kChunk / 2;
  tier.Place();
  EXPECT_EQ(shares.Held("job"), kChunk);
  EXPECT_TRUE(Holds(tier, 0, 1));
  EXPECT_FALSE(tier.HoldsCommitted(1));
  EXPECT_FALSE(tier.HoldsCommitted(2));
  // Nothing new is taken while it would go below the floor.
  tier.KeepPending(1, Filled(kChunk, 9));
  tier.CommitPending();
  EXPECT_FALSE(tier.HoldsCommitted(1));
  // The others gave their memory back: the tier grows again.
  others = 0;
  tier.KeepPending(1, Filled(kChunk, 9));
  tier.CommitPending();
  EXPECT_TRUE(Holds(tier, 1, 9));
}

TEST(StateTierTest, AVersionOnlyTheTierHoldsIsNeverDroppedUnstored) {
  MemoryShares shares(2 * kChunk);
  StateTier tier("job", {kChunk, kChunk}, StateTierMemory{&shares}, "", 1.0);
  tier.Place();
  // Between durable commits: the store does not get these versions.
  EXPECT_TRUE(tier.KeepPending(0, Filled(kChunk, 1), /*stored=*/false));
  EXPECT_TRUE(tier.PendingOnly(0));
  tier.CommitPending();
  EXPECT_TRUE(tier.HoldsCommittedOnly(0));
  EXPECT_EQ(tier.CommittedOnly(), std::vector<size_t>{0});
  // Its next version replaces it; rolled back, the version is lost.
  EXPECT_TRUE(tier.KeepPending(0, Filled(kChunk, 2), /*stored=*/false));
  EXPECT_FALSE(tier.DropPending());
  EXPECT_FALSE(tier.HoldsCommitted(0));
  // A version the store has too is never lost by a rollback.
  EXPECT_TRUE(tier.KeepPending(1, Filled(kChunk, 3), /*stored=*/false));
  tier.CommitPending();
  tier.MarkStored(1);
  EXPECT_FALSE(tier.HoldsCommittedOnly(1));
  EXPECT_TRUE(tier.KeepPending(1, Filled(kChunk, 4), /*stored=*/false));
  EXPECT_TRUE(tier.DropPending());
  // A job that joins shrinks the share: a copy the store lacks is handed
  // back to be stored, not freed.
  EXPECT_TRUE(tier.KeepPending(1, Filled(kChunk, 5), /*stored=*/false));
  tier.CommitPending();
  shares.Join("other", "", 1.0);
  const std::vector<size_t> to_store = tier.Place();
  EXPECT_EQ(to_store, std::vector<size_t>{1});
  EXPECT_TRUE(Holds(tier, 1, 5));
  tier.MarkStored(1);
  tier.Release(1);
  EXPECT_FALSE(tier.HoldsCommitted(1));
  EXPECT_EQ(shares.Held("job"), kChunk);  // chunk 0's memory, kept
}

}  // namespace
}  // namespace lohan
