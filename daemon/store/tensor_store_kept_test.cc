// Kept commits (TensorStore::CommitBatchKeepingPrevious, ReleasePrevious,
// RevertToPrevious): the space they hold, and what a restart brings back.

#include <string>
#include <vector>

#include "daemon/store/commit_test_fixture.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::Pattern;

const std::vector<std::string>& kNames = testing_util::CommitTest::Names();

class KeptCommitTest : public testing_util::CommitTest {
 protected:
  // Steps 1 (a plain commit) and 2 (kept): the previous version is step 1.
  void CommitTwoSteps(TensorStore& store) {
    for (size_t i = 0; i < kNames.size(); ++i) {
      ASSERT_TRUE(store.Create("j", kNames[i], SizeOf(i)).ok());
    }
    WriteStep(store, 1);
    ASSERT_TRUE(store.CommitBatch("j", kNames).ok());
    WriteStep(store, 2);
    ASSERT_TRUE(store.CommitBatchKeepingPrevious("j", kNames).ok());
  }
};

TEST_F(KeptCommitTest, KeepsThePreviousVersionUntilReleased) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  CommitTwoSteps(*store);
  ExpectStep(*store, 2);
  EXPECT_EQ(store->Stat("j", "meta")->previous_version, 1u);
  EXPECT_EQ(Used(*store), Versions(2));
  EXPECT_EQ(store->BytesByJob()["j"], 2 * (SizeOf(0) + SizeOf(1) + SizeOf(2)));

  auto released = store->ReleasePrevious("j");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, kNames.size());
  EXPECT_EQ(Used(*store), Versions(1));
  EXPECT_EQ(store->Stat("j", "meta")->previous_version, 0u);
  ExpectStep(*store, 2);
  EXPECT_EQ(*store->ReleasePrevious("j"), 0u) << "nothing left to release";
  EXPECT_EQ(store->RevertToPrevious("j").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectStep(*store, 2);

  // A kept commit while one is kept frees the older one: at most committed,
  // previous and pending at any time.
  WriteStep(*store, 3);
  EXPECT_EQ(Used(*store), Versions(2));
  ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames).ok());
  WriteStep(*store, 4);
  EXPECT_EQ(Used(*store), Versions(3));
  ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames).ok());
  EXPECT_EQ(Used(*store), Versions(2));
  EXPECT_EQ(store->Stat("j", "chunk0")->previous_version, 3u);
  // A plain commit frees it.
  WriteStep(*store, 5);
  ASSERT_TRUE(store->CommitBatch("j", kNames).ok());
  EXPECT_EQ(Used(*store), Versions(1));
  EXPECT_EQ(store->Stat("j", "chunk0")->previous_version, 0u);
}

TEST_F(KeptCommitTest, RevertGoesBackToThePreviousVersionAcrossRestarts) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    CommitTwoSteps(*store);
  }
  // Twice: the first open replays the kept batch's record, the second the
  // snapshot the first wrote.
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ExpectStep(*store, 2);
    EXPECT_EQ(store->Stat("j", "chunk1")->previous_version, 1u) << reopen;
    EXPECT_EQ(Used(*store), Versions(2)) << reopen;
  }
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    WriteStep(*store, 3);  // a step in progress: dropped by the revert
    EXPECT_EQ(Used(*store), Versions(3));
    auto reverted = store->RevertToPrevious("j");
    ASSERT_TRUE(reverted.ok()) << reverted.status();
    EXPECT_EQ(*reverted, kNames.size());
    ExpectStep(*store, 1);
    EXPECT_EQ(Used(*store), Versions(1));
    EXPECT_EQ(store->Stat("j", "meta")->pending_version, 0u);
    EXPECT_EQ(store->Stat("j", "meta")->previous_version, 0u);
    EXPECT_EQ(store->RevertToPrevious("j").status().code(),
              absl::StatusCode::kFailedPrecondition)
        << "only one step back";
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ExpectStep(*store, 1);
  EXPECT_EQ(Used(*store), Versions(1));
  // The job goes on from there.
  WriteStep(*store, 6);
  ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames).ok());
  ExpectStep(*store, 6);
}

TEST_F(KeptCommitTest, AReleaseSurvivesARestartAndOtherJobsAreUntouched) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    CommitTwoSteps(*store);
    ASSERT_TRUE(store->Create("other", "t", 5000).ok());
    ASSERT_TRUE(store->Write("other", "t", Pattern(7, 5000)).ok());
    ASSERT_TRUE(store->CommitBatch("other", {"t"}).ok());
    ASSERT_TRUE(store->Write("other", "t", Pattern(8, 5000)).ok());
    ASSERT_TRUE(store->CommitBatchKeepingPrevious("other", {"t"}).ok());
    ASSERT_TRUE(store->ReleasePrevious("j").ok());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ExpectStep(*store, 2);
  EXPECT_EQ(store->Stat("j", "chunk0")->previous_version, 0u);
  EXPECT_EQ(Used(*store), Versions(1) + 2 * Padded(5000));
  ASSERT_TRUE(store->RevertToPrevious("other").ok());
  std::vector<uint8_t> back(5000);
  ASSERT_TRUE(store->Read("other", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(7, 5000));
  ExpectStep(*store, 2);
  // Deleting a job frees its previous versions too.
  ASSERT_TRUE(store->Create("gone", "t", 5000).ok());
  ASSERT_TRUE(store->Write("gone", "t", Pattern(1, 5000)).ok());
  ASSERT_TRUE(store->CommitBatch("gone", {"t"}).ok());
  ASSERT_TRUE(store->Write("gone", "t", Pattern(2, 5000)).ok());
  ASSERT_TRUE(store->CommitBatchKeepingPrevious("gone", {"t"}).ok());
  ASSERT_TRUE(store->DeleteJob("gone").ok());
  EXPECT_EQ(Used(*store), Versions(1) + Padded(5000));
}

// Tags (a committer's label of each version, e.g. the iteration) follow
// their versions: through a kept commit, a revert, a release, a reopen
// (replayed from the log, then from the snapshot it compacts into).
TEST_F(KeptCommitTest, TagsFollowTheirVersionsThroughRevertAndReopen) {
  auto tags = [](TensorStore& store) {
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (const std::string& name : kNames) {
      auto info = store.Stat("j", name);
      EXPECT_TRUE(info.ok()) << info.status();
      out.emplace_back(info->committed_tag, info->previous_tag);
    }
    return out;
  };
  using Tags = std::vector<std::pair<uint64_t, uint64_t>>;
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < kNames.size(); ++i) {
      ASSERT_TRUE(store->Create("j", kNames[i], SizeOf(i)).ok());
    }
    WriteStep(*store, 1);
    ASSERT_TRUE(store->CommitBatch("j", kNames, /*tag=*/11).ok());
    EXPECT_EQ(tags(*store), Tags(3, {11, 0}));
    WriteStep(*store, 2);
    ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames, 12).ok());
    EXPECT_EQ(tags(*store), Tags(3, {12, 11}));
  }
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(tags(*store), Tags(3, {12, 11})) << "reopen " << reopen;
  }
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->RevertToPrevious("j").ok());
    EXPECT_EQ(tags(*store), Tags(3, {11, 0}));
    ExpectStep(*store, 1);
    WriteStep(*store, 3);
    ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames, 13).ok());
    ASSERT_TRUE(store->ReleasePrevious("j").ok());
    EXPECT_EQ(tags(*store), Tags(3, {13, 0}));
    ASSERT_TRUE(store->Write("j", "meta", Pattern(5, SizeOf(2))).ok());
    ASSERT_TRUE(store->Commit("j", "meta").ok());  // untagged
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(tags(*store), (Tags{{13, 0}, {13, 0}, {0, 0}}));
}

}  // namespace
}  // namespace lohan
