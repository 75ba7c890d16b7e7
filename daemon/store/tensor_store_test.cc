#include "daemon/store/tensor_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/fault_store.h"
#include "daemon/store/io_gate.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using Fault = FaultInjectionDevice::Fault;
using Op = IoRequest::Op;
using testing_util::Pattern;
using testing_util::TempDir;

constexpr uint64_t kStripe = 64 << 10;

class TensorStoreTest : public ::testing::Test {
 protected:
  StoreOptions Options(int devices, uint64_t capacity = 8 << 20) {
    StoreOptions o;
    for (int i = 0; i < devices; ++i) {
      o.ssd_paths.push_back(dir_.Subdir("ssd" + std::to_string(i)));
    }
    o.state_dir = dir_.path() + "/state";
    o.stripe_unit = kStripe;
    o.queue_depth = 8;
    o.device_capacity_bytes = capacity;
    return o;
  }
  std::unique_ptr<TensorStore> OpenOrDie(const StoreOptions& o) {
    auto s = TensorStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  // Opens with every device wrapped in a FaultInjectionDevice; faults_ gets
  // the wrappers.
  std::unique_ptr<TensorStore> OpenWithFaults(const StoreOptions& o) {
    auto s = testing_util::OpenStoreWithFaults(o, &faults_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  static uint64_t Used(const TensorStore& s) {
    uint64_t used = 0;
    for (const auto& d : s.Stats().devices) used += d.used_bytes;
    return used;
  }
  static uint64_t Padded(uint64_t bytes) {
    return (bytes + 4095) / 4096 * 4096;
  }

  TempDir dir_;
  std::vector<FaultInjectionDevice*> faults_;
};

TEST_F(TensorStoreTest, RoundTripsRandomTensorsOfOddSizes) {
  auto store = OpenOrDie(Options(3));
  ASSERT_NE(store, nullptr);
  std::mt19937_64 rng(1);
  const std::vector<uint64_t> sizes = {
      1, 4095, 4097, 100003, 3 * kStripe + 17, (1 << 20) + 7};
  uint64_t padded = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    ASSERT_TRUE(store->Create("job", name, sizes[i]).ok());
    auto data = Pattern(rng(), sizes[i]);
    auto v = store->Write("job", name, data);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, 1u);
    ASSERT_TRUE(store->Commit("job", name).ok());
    std::vector<uint8_t> back(sizes[i]);
    auto r = store->Read("job", name, absl::MakeSpan(back));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, 1u);
    EXPECT_EQ(back, data) << name;
    padded += Padded(sizes[i]);
  }
  EXPECT_EQ(Used(*store), padded);
  EXPECT_EQ(store->List("job").size(), sizes.size());
  EXPECT_EQ(store->Stats().tensors, sizes.size());
}

TEST_F(TensorStoreTest, PendingVersionIsInvisibleUntilCommitAndRollsBack) {
  auto store = OpenOrDie(Options(2));
  ASSERT_NE(store, nullptr);
  const uint64_t n = 200000;
  ASSERT_TRUE(store->Create("j", "w", n).ok());
  std::vector<uint8_t> back(n);
  EXPECT_EQ(store->Read("j", "w", absl::MakeSpan(back)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Commit("j", "w").code(),
            absl::StatusCode::kFailedPrecondition);
  auto v1 = Pattern(1, n), v2 = Pattern(2, n), v3 = Pattern(3, n);
  ASSERT_TRUE(store->Write("j", "w", v1).ok());
  ASSERT_TRUE(store->Commit("j", "w").ok());
  auto w2 = store->Write("j", "w", v2);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(*w2, 2u);
  EXPECT_EQ(Used(*store), 2 * Padded(n));
  ASSERT_EQ(*store->Read("j", "w", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, v1);
  auto info = store->Stat("j", "w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->committed_version, 1u);
  EXPECT_EQ(info->pending_version, 2u);

  ASSERT_TRUE(store->Rollback("j", "w").ok());
  EXPECT_EQ(Used(*store), Padded(n));
  EXPECT_EQ(store->Rollback("j", "w").code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(*store->Read("j", "w", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, v1);

  auto w3 = store->Write("j", "w", v3);
  ASSERT_TRUE(w3.ok());
  EXPECT_EQ(*w3, 3u);
  ASSERT_TRUE(store->Commit("j", "w").ok());
  EXPECT_EQ(Used(*store), Padded(n));  // v1's space came back.
  ASSERT_EQ(*store->Read("j", "w", absl::MakeSpan(back)), 3u);
  EXPECT_EQ(back, v3);
}

TEST_F(TensorStoreTest, ReadPendingReadsScratchThatIsNeverCommitted) {
  const StoreOptions o = Options(2);
  const uint64_t n = 3 * kStripe + 11;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Create("j", "w", n).ok());
    std::vector<uint8_t> back(n);
    EXPECT_EQ(
        store->ReadPending("j", "w", absl::MakeSpan(back)).status().code(),
        absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store->Write("j", "w", Pattern(1, n)).ok());
    ASSERT_TRUE(store->Commit("j", "w").ok());
    ASSERT_TRUE(store->Write("j", "w", Pattern(2, n)).ok());
    ASSERT_EQ(*store->ReadPending("j", "w", absl::MakeSpan(back)), 2u);
    EXPECT_EQ(back, Pattern(2, n));
    ASSERT_EQ(*store->Read("j", "w", absl::MakeSpan(back)), 1u);
    EXPECT_EQ(back, Pattern(1, n));
    EXPECT_EQ(
        store->ReadPending("j", "nope", absl::MakeSpan(back)).status().code(),
        absl::StatusCode::kNotFound);
    std::vector<uint8_t> small(10);
    EXPECT_EQ(
        store->ReadPending("j", "w", absl::MakeSpan(small)).status().code(),
        absl::StatusCode::kInvalidArgument);

    // Scratch: created, written, read back, deleted, never committed.
    ASSERT_TRUE(store->Create("j", "scratch", n).ok());
    ASSERT_TRUE(store->Write("j", "scratch", Pattern(3, n)).ok());
    ASSERT_EQ(*store->ReadPending("j", "scratch", absl::MakeSpan(back)), 1u);
    EXPECT_EQ(back, Pattern(3, n));
    EXPECT_EQ(Used(*store), 3 * Padded(n));
    ASSERT_TRUE(store->Delete("j", "scratch").ok());
    EXPECT_EQ(Used(*store), 2 * Padded(n));
    // An uncommitted tensor left behind (as by a crash).
    ASSERT_TRUE(store->Create("j", "left", n).ok());
    ASSERT_TRUE(store->Write("j", "left", Pattern(4, n)).ok());
  }
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stat("j", "scratch").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stat("j", "left")->pending_version, 0u);
  EXPECT_EQ(Used(*store), Padded(n));
  std::vector<uint8_t> back(n);
  ASSERT_EQ(*store->Read("j", "w", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, Pattern(1, n));
}

TEST_F(TensorStoreTest, DeletedJobsGiveTheirSpaceBackAlsoAfterARestart) {
  auto store = OpenOrDie(Options(2));
  ASSERT_NE(store, nullptr);
  const uint64_t n = 100000;
  for (const char* job : {"j-1", "j-2", "j-3"}) {
    for (const char* name : {"a", "b"}) {
      ASSERT_TRUE(store->Create(job, name, n).ok());
      ASSERT_TRUE(store->Write(job, name, Pattern(1, n)).ok());
      ASSERT_TRUE(store->Commit(job, name).ok());
    }
  }
  ASSERT_TRUE(store->Write("j-2", "a", Pattern(2, n)).ok());  // pending too
  EXPECT_EQ(store->Jobs(), (std::vector<std::string>{"j-1", "j-2", "j-3"}));
  // j-2's "a" holds a committed and a pending version.
  EXPECT_EQ(store->BytesByJob(),
            (std::map<std::string, uint64_t>{
                {"j-1", 2 * n}, {"j-2", 3 * n}, {"j-3", 2 * n}}));
  const uint64_t before = Used(*store);
  ASSERT_TRUE(store->DeleteJob("j-2").ok());
  EXPECT_TRUE(store->List("j-2").empty());
  EXPECT_EQ(Used(*store), before - 3 * Padded(n));
  EXPECT_TRUE(store->DeleteJob("j-2").ok());  // nothing left: fine

  // A job the registry no longer knows (its delete was cut short) is freed
  // at the next start; the others keep everything.
  store.reset();
  store = OpenOrDie(Options(2));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->DeleteJobsExcept({"j-1"}),
            (std::vector<std::string>{"j-3"}));
  EXPECT_EQ(store->Jobs(), (std::vector<std::string>{"j-1"}));
  EXPECT_EQ(store->BytesByJob(),
            (std::map<std::string, uint64_t>{{"j-1", 2 * n}}));
  EXPECT_EQ(Used(*store), 2 * Padded(n));
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(store->Read("j-1", "b", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(1, n));
}

TEST_F(TensorStoreTest, ReopenKeepsCommittedDropsPendingAndCompacts) {
  const StoreOptions o = Options(3);
  const uint64_t n = 5 * kStripe + 3;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Create("j", "a", n).ok());
    ASSERT_TRUE(store->Create("j", "gone", 10).ok());
    ASSERT_TRUE(store->Create("j", "never", 10).ok());
    for (uint64_t v = 1; v <= 20; ++v) {
      ASSERT_TRUE(store->Write("j", "a", Pattern(v, n)).ok());
      ASSERT_TRUE(store->Commit("j", "a").ok());
    }
    ASSERT_TRUE(store->Write("j", "gone", Pattern(0, 10)).ok());
    ASSERT_TRUE(store->Commit("j", "gone").ok());
    ASSERT_TRUE(store->Delete("j", "gone").ok());
    EXPECT_EQ(store->Delete("j", "gone").code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE(store->Write("j", "a", Pattern(99, n)).ok());  // Pending.
    EXPECT_EQ(Used(*store), 2 * Padded(n));
  }
  const uint64_t log_before =
      testing_util::ReadWholeFile(o.state_dir + "/catalog.log").size();
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const uint64_t log_after =
      testing_util::ReadWholeFile(o.state_dir + "/catalog.log").size();
  EXPECT_LT(log_after, log_before / 3);
  EXPECT_EQ(Used(*store), Padded(n));
  std::vector<uint8_t> back(n);
  ASSERT_EQ(*store->Read("j", "a", absl::MakeSpan(back)), 20u);
  EXPECT_EQ(back, Pattern(20, n));
  EXPECT_EQ(store->Stat("j", "a")->pending_version, 0u);
  EXPECT_EQ(store->Stat("j", "gone").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stat("j", "never")->committed_version, 0u);
  auto w = store->Write("j", "a", Pattern(21, n));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 21u);
}

TEST_F(TensorStoreTest, CatalogStaysBoundedOverALongRunWhileMutationsRace) {
  // A training run commits every tensor once per iteration; the catalog
  // must not grow with the number of iterations.
  StoreOptions o = Options(2);
  o.catalog_compact_bytes = 8 << 10;
  constexpr int kThreads = 4;
  constexpr uint64_t kCommits = 150;
  const uint64_t n = 3 * kStripe + 17;
  std::vector<uint64_t> last_committed(kThreads);
  uint64_t max_catalog = 0;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(store->Create("j", "t" + std::to_string(t), n).ok());
      // Scratch: created and deleted unsynced, as a streamed gradient is.
    }
    std::atomic<bool> failed{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string name = "t" + std::to_string(t);
        const std::string scratch = "scratch" + std::to_string(t);
        for (uint64_t i = 1; i <= kCommits && !failed; ++i) {
          auto v = store->Write("j", name, Pattern(t * 1000 + i, n));
          absl::Status s = v.ok() ? store->Commit("j", name) : v.status();
          if (s.ok()) s = store->Create("j", scratch, 100);
          if (s.ok()) s = store->Delete("j", scratch);
          if (!s.ok()) {
            ADD_FAILURE() << s;
            failed = true;
            return;
          }
          last_committed[t] = *v;
        }
      });
    }
    // Watches the catalog while the writers run.
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done) {
        max_catalog = std::max(max_catalog, store->Stats().catalog_bytes);
        std::this_thread::yield();
      }
    });
    for (auto& th : threads) th.join();
    done = true;
    watcher.join();
    ASSERT_FALSE(failed);
    const StoreStats stats = store->Stats();
    EXPECT_GT(stats.catalog_compactions, 3u);
    // Without compaction: kThreads * kCommits commit records of ~100 bytes.
    EXPECT_LE(max_catalog, 2 * o.catalog_compact_bytes + 4096);
    EXPECT_EQ(Used(*store), kThreads * Padded(n));
  }
  // What the compacted catalog says is what was committed last.
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Used(*store), kThreads * Padded(n));
  EXPECT_EQ(store->List("j").size(), static_cast<size_t>(kThreads));
  for (int t = 0; t < kThreads; ++t) {
    std::vector<uint8_t> back(n);
    auto v = store->Read("j", "t" + std::to_string(t), absl::MakeSpan(back));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, last_committed[t]);
    EXPECT_EQ(back, Pattern(t * 1000 + kCommits, n));
  }
}

TEST_F(TensorStoreTest, AVersionSplitOverAFragmentedSsdSurvivesAReopen) {
  // One SSD of 16 stripes, filled with one-stripe tensors, every other one
  // deleted: 8 stripes free, no two together.
  const StoreOptions o = Options(1, 16 * kStripe);
  const uint64_t n = 5 * kStripe + 123;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 16; ++i) {
      const std::string name = "small" + std::to_string(i);
      ASSERT_TRUE(store->Create("j", name, kStripe).ok());
      ASSERT_TRUE(store->Write("j", name, Pattern(i, kStripe)).ok());
      ASSERT_TRUE(store->Commit("j", name).ok());
    }
    for (int i = 0; i < 16; i += 2) {
      ASSERT_TRUE(store->Delete("j", "small" + std::to_string(i)).ok());
    }
    ASSERT_TRUE(store->Create("j", "big", n).ok());
    auto written = store->Write("j", "big", Pattern(77, n));
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_TRUE(store->Commit("j", "big").ok());
  }
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(store->Read("j", "big", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(77, n));
  for (int i = 1; i < 16; i += 2) {
    std::vector<uint8_t> small(kStripe);
    ASSERT_TRUE(
        store->Read("j", "small" + std::to_string(i), absl::MakeSpan(small))
            .ok());
    EXPECT_EQ(small, Pattern(i, kStripe)) << i;
  }
  EXPECT_EQ(Used(*store), 8 * kStripe + Padded(n));
}

TEST_F(TensorStoreTest, CheckFindsWhatOpenWouldRefuseWithoutOpening) {
  StoreOptions o = Options(1, 1 << 20);
  EXPECT_TRUE(TensorStore::Check(o).ok());  // nothing there yet
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    absl::Status busy = TensorStore::Check(o);
    EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition) << busy;
    EXPECT_NE(busy.message().find("in use by a running lohand"),
              std::string::npos)
        << busy;
    for (int i = 0; i < 4; ++i) {
      const std::string name = "t" + std::to_string(i);
      ASSERT_TRUE(store->Create("j", name, 4 * kStripe).ok());
      ASSERT_TRUE(store->Write("j", name, Pattern(i, 4 * kStripe)).ok());
      ASSERT_TRUE(store->Commit("j", name).ok());
    }
  }
  EXPECT_TRUE(TensorStore::Check(o).ok());
  StoreOptions smaller = o;
  smaller.device_capacity_bytes = 512 << 10;
  absl::Status past = TensorStore::Check(smaller);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << past;
  EXPECT_NE(past.message().find("past the 524288 bytes"), std::string::npos)
      << past;
  StoreOptions other_stripe = o;
  other_stripe.stripe_unit = 2 * kStripe;
  EXPECT_EQ(TensorStore::Check(other_stripe).code(),
            absl::StatusCode::kFailedPrecondition);
  // Check wrote nothing: the store opens as before.
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->List("j").size(), 4u);
}

TEST_F(TensorStoreTest, TornCatalogTailIsIgnored) {
  const StoreOptions o = Options(1);
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Create("j", "a", 5000).ok());
    ASSERT_TRUE(store->Write("j", "a", Pattern(1, 5000)).ok());
    ASSERT_TRUE(store->Commit("j", "a").ok());
  }
  int fd = ::open((o.state_dir + "/catalog.log").c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  const char junk[] = "\x40\x00\x00\x00garbage";
  ASSERT_GT(::write(fd, junk, sizeof(junk)), 0);
  ::close(fd);
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> back(5000);
  ASSERT_TRUE(store->Read("j", "a", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(1, 5000));
}

TEST_F(TensorStoreTest, CommitBatchCommitsAllOrNothing) {
  const StoreOptions o = Options(2);
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> names = {"c", "a", "b"};
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(store->Create("j", names[i], 5000 + i).ok());
    ASSERT_TRUE(store->Write("j", names[i], Pattern(i, 5000 + i)).ok());
  }
  EXPECT_EQ(store->CommitBatch("j", {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CommitBatch("j", {"a", "a"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CommitBatch("j", {"a", "zz"}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->CommitBatch("j", names).ok());
  for (const std::string& n : names) {
    auto info = store->Stat("j", n);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->committed_version, 1u);
    EXPECT_EQ(info->pending_version, 0u);
  }
  // One of the batch lacks a pending version: nothing commits.
  ASSERT_TRUE(store->Write("j", "a", Pattern(10, 5001)).ok());
  ASSERT_TRUE(store->Write("j", "c", Pattern(12, 5000)).ok());
  EXPECT_EQ(store->CommitBatch("j", names).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Stat("j", "a")->committed_version, 1u);
  EXPECT_EQ(store->Stat("j", "a")->pending_version, 2u);
  // The single-tensor Commit still works next to batches.
  ASSERT_TRUE(store->Commit("j", "a").ok());
  EXPECT_EQ(store->Stat("j", "a")->committed_version, 2u);
}

TEST_F(TensorStoreTest, CommitBatchIsReplayedWholeAndATornBatchIsDroppedWhole) {
  const StoreOptions o = Options(2);
  const std::vector<std::string> names = {"w0", "w1", "w2", "meta"};
  auto size = [](size_t i) { return uint64_t{70000} + 1000 * i; };
  uint64_t before_batch = 0;
  uint64_t after_batch = 0;
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_TRUE(store->Create("j", names[i], size(i)).ok());
      ASSERT_TRUE(store->Write("j", names[i], Pattern(i, size(i))).ok());
    }
    ASSERT_TRUE(store->CommitBatch("j", names).ok());
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_TRUE(store->Write("j", names[i], Pattern(100 + i, size(i))).ok());
    }
    before_batch =
        testing_util::ReadWholeFile(o.state_dir + "/catalog.log").size();
    ASSERT_TRUE(store->CommitBatch("j", names).ok());
    after_batch =
        testing_util::ReadWholeFile(o.state_dir + "/catalog.log").size();
  }
  ASSERT_GT(after_batch, before_batch);
  const std::string catalog = o.state_dir + "/catalog.log";
  const std::string full = testing_util::ReadWholeFile(catalog);
  // Replay of the intact record: every tensor at version 2.
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<uint8_t> back(size(i));
      auto v = store->Read("j", names[i], absl::MakeSpan(back));
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, 2u);
      EXPECT_EQ(back, Pattern(100 + i, size(i)));
    }
  }
  // The same catalog with the batch record torn at several points (a crash
  // mid-append): every tensor back at version 1, none at 2.
  // The log ends [batch record][sync mark (9 bytes)].
  const uint64_t batch_end = after_batch - 9;
  for (uint64_t cut : {before_batch + 1, before_batch + 9,
                       (before_batch + batch_end) / 2, batch_end - 1}) {
    std::string torn = full.substr(0, cut);
    int fd = ::open(catalog.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, torn.data(), torn.size()),
              static_cast<ssize_t>(torn.size()));
    ::close(fd);
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<uint8_t> back(size(i));
      auto v = store->Read("j", names[i], absl::MakeSpan(back));
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, 1u) << "cut " << cut << " tensor " << names[i];
      EXPECT_EQ(back, Pattern(i, size(i)));
    }
  }
}

TEST_F(TensorStoreTest, OneProcessPerStateDirAndOptionsMustMatch) {
  StoreOptions o = Options(2);
  {
    auto store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(TensorStore::Open(o).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  o.stripe_unit = 2 * kStripe;
  auto changed = TensorStore::Open(o);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  o.stripe_unit = kStripe;
  std::swap(o.ssd_paths[0], o.ssd_paths[1]);
  EXPECT_EQ(TensorStore::Open(o).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TensorStoreTest, FullDeviceIsResourceExhaustedAndHarmsNoCommittedData) {
  const StoreOptions o = Options(1, 256 << 10);
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  const uint64_t n = 150 << 10;
  ASSERT_TRUE(store->Create("j", "a", n).ok());
  ASSERT_TRUE(store->Write("j", "a", Pattern(1, n)).ok());
  ASSERT_TRUE(store->Commit("j", "a").ok());
  // A second version of `a` does not fit next to the first.
  auto w = store->Write("j", "a", Pattern(2, n));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted)
      << w.status();
  ASSERT_TRUE(store->Create("j", "b", 200 << 10).ok());
  EXPECT_EQ(store->Write("j", "b", Pattern(3, 200 << 10)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Used(*store), Padded(n));
  std::vector<uint8_t> back(n);
  ASSERT_EQ(*store->Read("j", "a", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, Pattern(1, n));
  store.reset();
  store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(*store->Read("j", "a", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, Pattern(1, n));
}

TEST_F(TensorStoreTest, ChecksumMismatchIsDataLossNamingTensorAndExtent) {
  auto store = OpenWithFaults(Options(3));
  ASSERT_NE(store, nullptr);
  const uint64_t n = 6 * kStripe;
  ASSERT_TRUE(store->Create("job", "weights", n).ok());
  ASSERT_TRUE(store->Write("job", "weights", Pattern(1, n)).ok());
  ASSERT_TRUE(store->Commit("job", "weights").ok());
  std::vector<uint8_t> back(n);

  // Corrupted on the way back.
  faults_[1]->Inject({Fault::kBitFlip, Op::kRead, 1, 0, UINT64_MAX});
  auto r = store->Read("job", "weights", absl::MakeSpan(back));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("job/weights"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("extent"), std::string::npos);
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos);
  // Transient: the next read is fine.
  ASSERT_TRUE(store->Read("job", "weights", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(1, n));

  // Corrupted at rest: every read fails, never silently.
  faults_[2]->Inject({Fault::kBitFlip, Op::kWrite, 1, 0, UINT64_MAX});
  ASSERT_TRUE(store->Write("job", "weights", Pattern(2, n)).ok());
  ASSERT_TRUE(store->Commit("job", "weights").ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(
        store->Read("job", "weights", absl::MakeSpan(back)).status().code(),
        absl::StatusCode::kDataLoss);
  }
}

TEST_F(TensorStoreTest, ReadPrefixReadsOnlyTheChunksThatHoldIt) {
  auto store = OpenWithFaults(Options(3));
  ASSERT_NE(store, nullptr);
  const uint64_t n = 6 * kStripe + 1000;  // 7 stripe chunks over 3 devices
  ASSERT_TRUE(store->Create("job", "states", n).ok());
  ASSERT_TRUE(store->Write("job", "states", Pattern(3, n)).ok());
  ASSERT_TRUE(store->Commit("job", "states").ok());
  ASSERT_TRUE(store->Write("job", "states", Pattern(4, n)).ok());  // pending
  // A zero-delay rule on every device counts its reads.
  auto reads = [&] {
    uint64_t total = 0;
    for (FaultInjectionDevice* f : faults_) total += f->faults_fired();
    return total;
  };
  for (FaultInjectionDevice* f : faults_) {
    f->Inject({Fault::kDelay, Op::kRead, UINT64_MAX, 0, UINT64_MAX, 0});
  }
  for (uint64_t prefix :
       {uint64_t{1}, uint64_t{4096}, kStripe, kStripe + 17, 3 * kStripe, n}) {
    std::vector<uint8_t> back(prefix);
    const uint64_t before = reads();
    ASSERT_TRUE(store->ReadPrefix("job", "states", absl::MakeSpan(back)).ok())
        << prefix;
    const std::vector<uint8_t> want = Pattern(3, n);
    EXPECT_TRUE(std::equal(back.begin(), back.end(), want.begin())) << prefix;
    EXPECT_EQ(reads() - before, (prefix + kStripe - 1) / kStripe) << prefix;
    ASSERT_TRUE(store
                    ->ReadPrefix("job", "states", absl::MakeSpan(back),
                                 /*pending=*/true)
                    .ok());
    const std::vector<uint8_t> pending = Pattern(4, n);
    EXPECT_TRUE(std::equal(back.begin(), back.end(), pending.begin()));
  }
  std::vector<uint8_t> too_long(n + 1);
  EXPECT_EQ(store->ReadPrefix("job", "states", absl::MakeSpan(too_long))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorStoreTest, InjectedIoErrorsNameTheDeviceAndKeepCommittedData) {
  const StoreOptions o = Options(2);
  auto store = OpenWithFaults(o);
  ASSERT_NE(store, nullptr);
  const uint64_t n = 4 * kStripe + 1;
  ASSERT_TRUE(store->Create("j", "t", n).ok());
  ASSERT_TRUE(store->Write("j", "t", Pattern(1, n)).ok());
  ASSERT_TRUE(store->Commit("j", "t").ok());
  const uint64_t used = Used(*store);
  std::vector<uint8_t> back(n);

  faults_[0]->Inject({Fault::kEio, Op::kRead, 1, 0, UINT64_MAX});
  auto r = store->Read("j", "t", absl::MakeSpan(back));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(o.ssd_paths[0]), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("offset"), std::string::npos);

  faults_[1]->Inject({Fault::kEio, Op::kWrite, 1, 0, UINT64_MAX});
  auto w = store->Write("j", "t", Pattern(2, n));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find(o.ssd_paths[1]), std::string::npos);
  EXPECT_EQ(Used(*store), used);  // The failed version's space is back.

  faults_[0]->Inject({Fault::kEnospc, Op::kWrite, 1, 0, UINT64_MAX});
  EXPECT_EQ(store->Write("j", "t", Pattern(3, n)).status().code(),
            absl::StatusCode::kResourceExhausted);

  faults_[1]->Inject({Fault::kShortTransfer, Op::kRead, 1, 0, UINT64_MAX});
  r = store->Read("j", "t", absl::MakeSpan(back));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("residual"), std::string::npos);

  EXPECT_EQ(store->Stat("j", "t")->pending_version, 0u);
  ASSERT_EQ(*store->Read("j", "t", absl::MakeSpan(back)), 1u);
  EXPECT_EQ(back, Pattern(1, n));
}

TEST_F(TensorStoreTest, ConcurrentReadersAndWriters) {
  auto store = OpenOrDie(Options(3));
  ASSERT_NE(store, nullptr);
  constexpr int kWriters = 3;
  constexpr int kTensors = 2 * kWriters;  // Writer w owns w and w + kWriters.
  constexpr uint64_t kVersions = 10;
  const uint64_t n = 3 * kStripe + 777;
  auto seed = [](int t, uint64_t v) { return t * 1000 + v; };
  for (int t = 0; t < kTensors; ++t) {
    const std::string name = "t" + std::to_string(t);
    ASSERT_TRUE(store->Create("j", name, n).ok());
    ASSERT_TRUE(store->Write("j", name, Pattern(seed(t, 1), n)).ok());
    ASSERT_TRUE(store->Commit("j", name).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<int> reads{0};
  std::vector<std::thread> writers, readers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t v = 2; v <= kVersions; ++v) {
        for (int t : {w, w + kWriters}) {
          const std::string name = "t" + std::to_string(t);
          auto got = store->Write("j", name, Pattern(seed(t, v), n));
          if (!got.ok() || *got != v || !store->Commit("j", name).ok()) {
            failures++;
          }
        }
      }
    });
  }
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::vector<uint8_t> back(n);
      int t = r;
      while (!stop.load()) {
        t = (t + 1) % kTensors;
        auto v =
            store->Read("j", "t" + std::to_string(t), absl::MakeSpan(back));
        if (!v.ok() || back != Pattern(seed(t, *v), n)) failures++;
        reads++;
      }
    });
  }
  for (auto& th : writers) th.join();
  stop = true;
  for (auto& th : readers) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(Used(*store), kTensors * Padded(n));
  std::vector<uint8_t> back(n);
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_EQ(*store->Read("j", "t" + std::to_string(t), absl::MakeSpan(back)),
              kVersions);
    EXPECT_EQ(back, Pattern(seed(t, kVersions), n));
  }
}

TEST_F(TensorStoreTest, MutationsOfOneTensorSerialize) {
  auto store = OpenOrDie(Options(2));
  ASSERT_NE(store, nullptr);
  const uint64_t n = 2 * kStripe + 5;
  ASSERT_TRUE(store->Create("j", "t", n).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 10; ++k) {
        if (!store->Write("j", "t", Pattern(i, n)).ok()) failures++;
        absl::Status c = store->Commit("j", "t");
        // The other thread may have committed our version already.
        if (!c.ok() && c.code() != absl::StatusCode::kFailedPrecondition) {
          failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(store->Read("j", "t", absl::MakeSpan(back)).ok());
  EXPECT_TRUE(back == Pattern(0, n) || back == Pattern(1, n));
  const uint64_t pending = store->Stat("j", "t")->pending_version ? 1 : 0;
  EXPECT_EQ(Used(*store), (1 + pending) * Padded(n));
}

// A gate of one slot that records each pass: its job, bytes and
// direction. Enter waits until no pass is held.
class RecordingGate : public IoGate {
 public:
  struct Passed {
    std::string job;
    uint64_t bytes;
    Direction direction;
    bool operator==(const Passed&) const = default;
  };
  std::unique_ptr<Pass> Enter(absl::string_view job, uint64_t bytes,
                              Direction direction) override {
    mu_.LockWhen(absl::Condition(
        +[](int* open) { return *open == 0; }, &open_));
    passes_.push_back({std::string(job), bytes, direction});
    ++open_;
    mu_.Unlock();
    return std::make_unique<Held>(this);
  }
  std::vector<Passed> TakePasses() {
    absl::MutexLock lock(&mu_);
    return std::exchange(passes_, {});
  }
  int open() {
    absl::MutexLock lock(&mu_);
    return open_;
  }
  size_t passed() {
    absl::MutexLock lock(&mu_);
    return passes_.size();
  }

 private:
  class Held : public Pass {
   public:
    explicit Held(RecordingGate* gate) : gate_(gate) {}
    ~Held() override {
      absl::MutexLock lock(&gate_->mu_);
      --gate_->open_;
    }

   private:
    RecordingGate* const gate_;
  };
  absl::Mutex mu_;
  std::vector<Passed> passes_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
};

// With gate_unit_bytes, a version's transfer passes the gate in parts of
// whole stripes summing to the version, each part's pass given back once
// its I/O is done (a gate of one slot lets the next part in then): another
// job waits for a part, not for a whole version; the data is as ungated.
TEST_F(TensorStoreTest, AGatedTransferPassesInPartsOfTheGateUnit) {
  StoreOptions o = Options(2);
  o.gate_unit_bytes = 3 * kStripe;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  RecordingGate gate;
  store->SetIoGate(&gate);
  const uint64_t n = 7 * kStripe + 1000;  // 8 stripes
  ASSERT_TRUE(store->Create("j", "t", n).ok());
  ASSERT_TRUE(store->Write("j", "t", Pattern(3, n)).ok());
  using Passed = RecordingGate::Passed;
  const auto kWrite = IoGate::Direction::kWrite;
  const auto kRead = IoGate::Direction::kRead;
  EXPECT_EQ(gate.TakePasses(),
            (std::vector<Passed>{{"j", 3 * kStripe, kWrite},
                                 {"j", 3 * kStripe, kWrite},
                                 {"j", kStripe + 1000, kWrite}}));
  ASSERT_TRUE(store->Commit("j", "t").ok());
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(store->Read("j", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(3, n));
  EXPECT_EQ(gate.TakePasses(),
            (std::vector<Passed>{{"j", 3 * kStripe, kRead},
                                 {"j", 3 * kStripe, kRead},
                                 {"j", kStripe + 1000, kRead}}));
  // A prefix read passes only for the stripes that hold it.
  std::vector<uint8_t> head(kStripe + 10);
  ASSERT_TRUE(store->ReadPrefix("j", "t", absl::MakeSpan(head)).ok());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), back.begin()));
  EXPECT_EQ(gate.TakePasses(),
            (std::vector<Passed>{{"j", kStripe + 10, kRead}}));
  EXPECT_EQ(gate.open(), 0);
  // Without a unit: one pass a version.
  store.reset();
  o.gate_unit_bytes = 0;
  store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  store->SetIoGate(&gate);
  ASSERT_TRUE(store->Read("j", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(gate.TakePasses(), (std::vector<Passed>{{"j", n, kRead}}));
}

// ReadYielding calls its hook before each part enters the gate, the first
// included, and reads what Read reads. Without a gate it still stops at
// each part; without a unit the read is one part.
TEST_F(TensorStoreTest, AYieldingReadStopsBeforeEachPart) {
  StoreOptions o = Options(2);
  o.gate_unit_bytes = 3 * kStripe;
  auto store = OpenOrDie(o);
  ASSERT_NE(store, nullptr);
  RecordingGate gate;
  store->SetIoGate(&gate);
  const uint64_t n = 7 * kStripe + 1000;  // 8 stripes: parts of 3, 3, 2
  ASSERT_TRUE(store->Create("j", "t", n).ok());
  ASSERT_TRUE(store->Write("j", "t", Pattern(4, n)).ok());
  ASSERT_TRUE(store->Commit("j", "t").ok());
  gate.TakePasses();
  // Each call sees the passes of the parts before it only.
  std::vector<size_t> passes_seen;
  std::vector<uint8_t> back(n);
  absl::StatusOr<uint64_t> r =
      store->ReadYielding("j", "t", absl::MakeSpan(back),
                          [&] { passes_seen.push_back(gate.passed()); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(back, Pattern(4, n));
  EXPECT_EQ(passes_seen, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(gate.TakePasses().size(), 3u);
  EXPECT_EQ(gate.open(), 0);
  // Ungated, with and without a unit.
  for (const uint64_t unit : {uint64_t{3} * kStripe, uint64_t{0}}) {
    store.reset();
    o.gate_unit_bytes = unit;
    store = OpenOrDie(o);
    ASSERT_NE(store, nullptr);
    int calls = 0;
    std::fill(back.begin(), back.end(), 0);
    r = store->ReadYielding("j", "t", absl::MakeSpan(back), [&] { ++calls; });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(back, Pattern(4, n));
    EXPECT_EQ(calls, unit == 0 ? 1 : 3) << unit;
  }
}

// A part that fails fails the transfer naming the tensor, leaves no pass
// held, and the parts after it are not started: the version is not
// committed, the last one still reads back.
TEST_F(TensorStoreTest, AFailedPartFailsTheGatedTransfer) {
  StoreOptions o = Options(1);
  o.gate_unit_bytes = 2 * kStripe;
  auto store = OpenWithFaults(o);
  ASSERT_NE(store, nullptr);
  RecordingGate gate;
  store->SetIoGate(&gate);
  const uint64_t n = 6 * kStripe;  // three parts
  ASSERT_TRUE(store->Create("j", "t", n).ok());
  ASSERT_TRUE(store->Write("j", "t", Pattern(1, n)).ok());
  ASSERT_TRUE(store->Commit("j", "t").ok());
  gate.TakePasses();
  faults_[0]->Inject({Fault::kEio, Op::kWrite, 1, 0, UINT64_MAX, 0});
  const absl::Status failed = store->Write("j", "t", Pattern(2, n)).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_TRUE(absl::StrContains(failed.message(), "j/t")) << failed;
  EXPECT_EQ(gate.open(), 0);
  // The first part's EIO completes inside Submit: the second never starts.
  EXPECT_EQ(gate.TakePasses().size(), 1u);
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(store->Read("j", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(1, n));
}

TEST_F(TensorStoreTest, RejectsBadArguments) {
  auto store = OpenOrDie(Options(1));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Create("", "x", 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Create("j", "x", 0).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Create("j", "x", 10).ok());
  EXPECT_EQ(store->Create("j", "x", 10).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Write("j", "x", Pattern(1, 11)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Write("j", "y", Pattern(1, 10)).status().code(),
            absl::StatusCode::kNotFound);
  StoreOptions bad = Options(1);
  bad.ssd_paths.push_back(bad.ssd_paths[0]);
  EXPECT_EQ(TensorStore::Open(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
