// Volatile commits (TensorStore::CommitBatchVolatile): what Read sees, the
// space they hold, what a restart brings back (the durable versions, all of
// a batch alike), and how a durable commit ends them.

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

class VolatileCommitTest : public testing_util::CommitTest {
 protected:
  // Step 1 committed durably (tag 1), step 2 volatile (tag 2).
  void DurableThenVolatile(TensorStore& store) {
    Create(store);
    WriteStep(store, 1);
    ASSERT_TRUE(store.CommitBatch("j", kNames, 1).ok());
    WriteStep(store, 2);
    ASSERT_TRUE(store.CommitBatchVolatile("j", kNames, 2).ok());
  }
};

TEST_F(VolatileCommitTest, ReadsSeeThemARestartFindsTheDurableVersions) {
  {
    auto store = Open();
    Create(*store);
    WriteStep(*store, 1);
    ASSERT_TRUE(store->CommitBatch("j", kNames, /*tag=*/1).ok());
    for (uint64_t step = 2; step <= 4; ++step) {
      WriteStep(*store, step);
      ASSERT_TRUE(store->CommitBatchVolatile("j", kNames, step).ok());
      ExpectStep(*store, step);
      // The durable version, and the last volatile one: never more.
      EXPECT_EQ(Used(*store), Versions(2));
    }
    auto info = store->Stat("j", "chunk0");
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->volatile_commit);
    EXPECT_EQ(info->committed_tag, 4u);
    EXPECT_EQ(info->durable_tag, 1u);
    EXPECT_NE(info->durable_version, info->committed_version);
    // A pending version beside them: three versions at most.
    WriteStep(*store, 5);
    EXPECT_EQ(Used(*store), Versions(3));
  }  // a restart (the catalog never heard of steps 2 to 5)
  auto store = Open();
  ExpectStep(*store, 1);
  auto info = store->Stat("j", "meta");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->volatile_commit);
  EXPECT_EQ(info->committed_tag, 1u);
  EXPECT_EQ(Used(*store), Versions(1));
}

TEST_F(VolatileCommitTest, ADurableCommitEndsThemAndFreesTheOldDurable) {
  {
    auto store = Open();
    DurableThenVolatile(*store);
    WriteStep(*store, 3);
    ASSERT_TRUE(store->CommitBatch("j", kNames, 3).ok());
    ExpectStep(*store, 3);
    EXPECT_EQ(Used(*store), Versions(1));
    EXPECT_FALSE(store->Stat("j", "chunk1")->volatile_commit);
  }
  auto store = Open();
  ExpectStep(*store, 3);
}

TEST_F(VolatileCommitTest,
       ABatchWithoutPendingVersionsMakesTheVolatileDurable) {
  {
    auto store = Open();
    DurableThenVolatile(*store);
    // Only the meta has a new version: the chunks' volatile ones (step 2)
    // are made durable as they are, in the same record.
    ASSERT_TRUE(store->Write("j", "meta", Pattern(302, SizeOf(2))).ok());
    ASSERT_TRUE(store->CommitBatch("j", kNames, 3).ok());
    EXPECT_EQ(Used(*store), Versions(1));
    EXPECT_EQ(store->Stat("j", "chunk0")->committed_tag, 3u);
  }
  auto store = Open();
  for (size_t i = 0; i < 2; ++i) {
    std::vector<uint8_t> back(SizeOf(i));
    ASSERT_TRUE(store->Read("j", kNames[i], absl::MakeSpan(back)).ok());
    EXPECT_EQ(back, Pattern(200 + i, SizeOf(i))) << kNames[i];
  }
  std::vector<uint8_t> meta(SizeOf(2));
  ASSERT_TRUE(store->Read("j", "meta", absl::MakeSpan(meta)).ok());
  EXPECT_EQ(meta, Pattern(302, SizeOf(2)));
  EXPECT_EQ(store->Stat("j", "chunk1")->committed_tag, 3u);
}

TEST_F(VolatileCommitTest, ATensorFirstCommittedVolatileComesBackEmpty) {
  {
    auto store = Open();
    Create(*store);
    WriteStep(*store, 1);
    ASSERT_TRUE(store->CommitBatchVolatile("j", kNames, 1).ok());
    ExpectStep(*store, 1);
    EXPECT_EQ(store->Stat("j", "chunk0")->durable_version, 0u);
    // Nothing durable was named: a commit batch of it makes it durable.
    ASSERT_TRUE(store->CommitBatch("j", {"chunk0"}, 1).ok());
  }
  auto store = Open();
  std::vector<uint8_t> back(SizeOf(0));
  ASSERT_TRUE(store->Read("j", "chunk0", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(100, SizeOf(0)));
  for (const char* name : {"chunk1", "meta"}) {
    auto info = store->Stat("j", name);
    ASSERT_TRUE(info.ok()) << name;
    EXPECT_EQ(info->committed_version, 0u) << name;
  }
}

TEST_F(VolatileCommitTest, KeptAndVolatileCommitsDoNotMix) {
  auto store = Open();
  DurableThenVolatile(*store);
  WriteStep(*store, 3);
  absl::Status kept = store->CommitBatchKeepingPrevious("j", kNames, 3);
  EXPECT_EQ(kept.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(kept.message().find("has a volatile commit"), std::string::npos)
      << kept;
  ExpectStep(*store, 2);  // nothing committed
  ASSERT_TRUE(store->CommitBatch("j", kNames, 3).ok());
  WriteStep(*store, 4);
  ASSERT_TRUE(store->CommitBatchKeepingPrevious("j", kNames, 4).ok());
  WriteStep(*store, 5);
  absl::Status volatile_commit = store->CommitBatchVolatile("j", kNames, 5);
  EXPECT_EQ(volatile_commit.code(), absl::StatusCode::kFailedPrecondition);
  // A volatile commit needs a pending version of every tensor.
  ASSERT_TRUE(store->ReleasePrevious("j").ok());
  ASSERT_TRUE(store->CommitBatchVolatile("j", {"chunk0"}, 5).ok());
  absl::Status empty = store->CommitBatchVolatile("j", {"chunk0"}, 6);
  EXPECT_EQ(empty.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(VolatileCommitTest, DeletingATensorFreesEveryVersion) {
  auto store = Open();
  DurableThenVolatile(*store);
  WriteStep(*store, 3);
  EXPECT_EQ(Used(*store), Versions(3));
  EXPECT_EQ(store->BytesByJob()["j"], 3 * (SizeOf(0) + SizeOf(1) + SizeOf(2)));
  ASSERT_TRUE(store->DeleteJob("j").ok());
  EXPECT_EQ(Used(*store), 0u);
}

}  // namespace
}  // namespace lohan
