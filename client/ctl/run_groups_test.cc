#include "client/ctl/run_groups.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Job RankJob(const std::string& id, uint32_t owner, const std::string& run,
                uint32_t rank, uint32_t world_size) {
  v1::Job job;
  job.set_id(id);
  job.set_owner_uid(owner);
  job.set_owner_name(owner == 1001 ? "alice" : "bob");
  job.mutable_spec()->set_name(absl::StrCat(run, ".rank", rank));
  job.mutable_spec()->mutable_run()->set_name(run);
  job.mutable_spec()->mutable_run()->set_rank(rank);
  job.mutable_spec()->mutable_run()->set_world_size(world_size);
  return job;
}

v1::Job AloneJob(const std::string& id) {
  v1::Job job;
  job.set_id(id);
  job.set_owner_uid(1001);
  job.mutable_spec()->set_name("solo");
  return job;
}

std::vector<std::string> Ids(const JobEntry& entry) {
  std::vector<std::string> ids;
  for (const v1::Job& job : entry.jobs) ids.push_back(job.id());
  return ids;
}

TEST(GroupRunsTest, OneEntryPerOwnerAndRunRanksInOrder) {
  const std::vector<JobEntry> entries = GroupRuns({
      AloneJob("j-1"),
      RankJob("j-2", 1001, "dp", 1, 2),
      RankJob("j-3", 1002, "dp", 0, 2),  // bob's run of that name
      RankJob("j-4", 1001, "dp", 0, 2),
      RankJob("j-5", 1001, "other", 0, 2),
      AloneJob("j-6"),
  });
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_FALSE(entries[0].is_run());
  EXPECT_EQ(Ids(entries[0]), std::vector<std::string>{"j-1"});
  EXPECT_TRUE(entries[1].is_run());
  EXPECT_EQ(Ids(entries[1]), (std::vector<std::string>{"j-4", "j-2"}));
  EXPECT_EQ(Ids(entries[2]), std::vector<std::string>{"j-3"});
  EXPECT_EQ(Ids(entries[3]), std::vector<std::string>{"j-5"});
  EXPECT_EQ(Ids(entries[4]), std::vector<std::string>{"j-6"});
}

TEST(RunTableTest, OneRowPerRunWithTotals) {
  v1::Job rank0 = RankJob("j-000001", 1001, "dp", 0, 4);
  v1::Job rank2 = RankJob("j-000002", 1001, "dp", 2, 4);
  rank0.mutable_spec()->set_host_pool_bytes(3 << 20);
  rank2.mutable_spec()->set_host_pool_bytes(1 << 20);
  rank0.set_ssd_bytes(1 << 20);
  rank2.set_ssd_bytes(1 << 20);
  rank2.set_state(v1::JOB_STATE_ATTACHED);
  rank2.set_last_failure("SSD full");
  const std::vector<JobEntry> runs = GroupRuns({rank2, rank0});
  ASSERT_EQ(runs.size(), 1u);

  const IterationsByJob iterations = {{"j-000001", 7}, {"j-000002", 7}};
  const std::string table = RunTable(runs, &iterations);
  EXPECT_THAT(table, HasSubstr("RUN "));
  EXPECT_THAT(table, HasSubstr("ITERATION"));
  // One row: name, owner, world size, ranks here, state, the one iteration,
  // the totals and the ids in rank order.
  EXPECT_THAT(table, testing::ContainsRegex(
                         "dp +alice +4 +0,2 +1 of 2 attached +7 +4.0 MiB +2.0 "
                         "MiB +j-000001 j-000002\n"));
  EXPECT_THAT(table, HasSubstr("  rank 2 (j-000002) last failure at "));
  EXPECT_THAT(table, HasSubstr(": SSD full\n"));

  const IterationsByJob apart = {{"j-000001", 7}};
  EXPECT_THAT(RunTable(runs, &apart),
              testing::ContainsRegex("1 of 2 attached +7,- +4.0 MiB"));
  const std::string no_iterations = RunTable(runs, nullptr);
  EXPECT_THAT(no_iterations, Not(HasSubstr("ITERATION")));
  EXPECT_THAT(no_iterations,
              testing::ContainsRegex("1 of 2 attached +4.0 MiB +2.0 MiB"));
}

// An ended rank says when lohand deletes it; a pinned one that it will not;
// an attached one nothing.
TEST(RunTableTest, EndedRanksSayWhenLohandDeletesThem) {
  v1::Job ended = RankJob("j-1", 1001, "dp", 0, 3);
  ended.set_state(v1::JOB_STATE_DETACHED);
  ended.set_ended_unix_seconds(1000);
  ended.set_delete_after_unix_seconds(2000);
  v1::Job kept = RankJob("j-2", 1001, "dp", 1, 3);
  kept.set_kept(true);
  v1::Job attached = RankJob("j-3", 1001, "dp", 2, 3);
  attached.set_state(v1::JOB_STATE_ATTACHED);
  const std::string table =
      RunTable(GroupRuns({ended, kept, attached}), nullptr);
  EXPECT_THAT(table, HasSubstr(absl::StrCat("  rank 0 (j-1) ended at ",
                                            LocalTime(1000), ", deleted after ",
                                            LocalTime(2000), "\n")));
  EXPECT_THAT(table, HasSubstr("  rank 1 (j-2) kept: lohand never deletes "
                               "it on its own\n"));
  EXPECT_THAT(table, Not(HasSubstr("rank 2 (j-3)")));
}

TEST(RunTableTest, RanksThatDisagreeOnTheWorldSizeShowEach) {
  const std::vector<JobEntry> runs = GroupRuns(
      {RankJob("j-1", 1001, "dp", 0, 2), RankJob("j-2", 1001, "dp", 1, 3)});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_THAT(RunTable(runs, nullptr),
              testing::ContainsRegex("dp +alice +2,3 +0,1 +detached"));
}

}  // namespace
}  // namespace lohan
