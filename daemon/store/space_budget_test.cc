// The store asks its SpaceBudget before every version it places and gives
// every version's bytes back once the space is free, on every path: commit,
// rollback, replace, delete, a refused or failed write, and a reopen.
#include "daemon/store/space_budget.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::Pattern;
using testing_util::TempDir;

// What one version of a tensor of up to 4 KiB takes (the default block).
constexpr uint64_t kBlock = 4096;

// A budget with one limit per job, counting what the store tells it; the
// versions of tensors named "act.*" in an account of their own (as the
// daemon's ledger counts swapped activations), which must come back with
// the bytes.
class CountingBudget : public SpaceBudget {
 public:
  explicit CountingBudget(uint64_t limit) : limit_(limit) {}
  uint8_t AccountOf(absl::string_view name) const override {
    return name.rfind("act.", 0) == 0 ? 1 : 0;
  }
  absl::Status Reserve(absl::string_view job, uint8_t account,
                       uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    uint64_t& held = held_[std::string(job)];
    if (held + bytes > limit_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("needed ", bytes, ", held ", held, ", limit ", limit_));
    }
    held += bytes;
    by_account_[account] += bytes;
    return absl::OkStatus();
  }
  void Charge(absl::string_view job, uint8_t account, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    held_[std::string(job)] += bytes;
    by_account_[account] += bytes;
  }
  void Release(absl::string_view job, uint8_t account,
               uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    uint64_t& held = held_[std::string(job)];
    EXPECT_GE(held, bytes) << "released more than was counted";
    EXPECT_GE(by_account_[account], bytes) << "released in another account";
    held -= bytes;
    by_account_[account] -= bytes;
  }
  uint64_t InAccount(uint8_t account) {
    absl::MutexLock lock(&mu_);
    return by_account_[account];
  }
  uint64_t Held(const std::string& job) {
    absl::MutexLock lock(&mu_);
    return held_[job];
  }

 private:
  const uint64_t limit_;
  absl::Mutex mu_;
  std::map<uint8_t, uint64_t> by_account_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> held_ ABSL_GUARDED_BY(mu_);
};

class SpaceBudgetTest : public ::testing::Test {
 protected:
  StoreOptions Options() {
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    o.state_dir = dir_.path() + "/state";
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 8 << 20;
    return o;
  }
  TempDir dir_;
};

TEST_F(SpaceBudgetTest, EveryVersionIsCountedWhileItHoldsSpace) {
  auto store = TensorStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  CountingBudget budget(3 * kBlock);
  (*store)->SetSpaceBudget(&budget);
  ASSERT_TRUE((*store)->Create("j", "t", 3000).ok());
  EXPECT_EQ(budget.Held("j"), 0u);  // a declared tensor holds no space
  EXPECT_EQ((*store)->FootprintBytes(3000), kBlock);
  const std::vector<uint8_t> data = Pattern(1, 3000);
  ASSERT_TRUE((*store)->Write("j", "t", data).ok());
  EXPECT_EQ(budget.Held("j"), kBlock);
  ASSERT_TRUE((*store)->Commit("j", "t").ok());
  EXPECT_EQ(budget.Held("j"), kBlock);
  ASSERT_TRUE((*store)->Write("j", "t", data).ok());  // committed + pending
  EXPECT_EQ(budget.Held("j"), 2 * kBlock);
  ASSERT_TRUE((*store)->Write("j", "t", data).ok());  // replaces the pending
  EXPECT_EQ(budget.Held("j"), 2 * kBlock);
  ASSERT_TRUE((*store)->Commit("j", "t").ok());  // the old one is freed
  EXPECT_EQ(budget.Held("j"), kBlock);
  ASSERT_TRUE((*store)->Write("j", "t", data).ok());
  ASSERT_TRUE((*store)->Rollback("j", "t").ok());
  EXPECT_EQ(budget.Held("j"), kBlock);
  ASSERT_TRUE((*store)->Delete("j", "t").ok());
  EXPECT_EQ(budget.Held("j"), 0u);
}

// Each version comes back to the account its tensor's name gave it.
TEST_F(SpaceBudgetTest, VersionsAreCountedInTheirTensorsAccount) {
  auto store = TensorStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  CountingBudget budget(uint64_t{1} << 30);
  (*store)->SetSpaceBudget(&budget);
  for (const char* name : {"layer.0", "act.7"}) {
    ASSERT_TRUE((*store)->Create("j", name, 5000).ok());
    ASSERT_TRUE((*store)->Write("j", name, Pattern(1, 5000)).ok());
  }
  EXPECT_EQ(budget.InAccount(0), 2 * kBlock);
  EXPECT_EQ(budget.InAccount(1), 2 * kBlock);
  ASSERT_TRUE((*store)->Delete("j", "act.7").ok());
  EXPECT_EQ(budget.InAccount(1), 0u);
  EXPECT_EQ(budget.InAccount(0), 2 * kBlock);
}

TEST_F(SpaceBudgetTest, ARefusedWriteFailsWithTheBudgetsNumbersAndKeepsData) {
  auto store = TensorStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  CountingBudget budget(6000);
  (*store)->SetSpaceBudget(&budget);
  ASSERT_TRUE((*store)->Create("j", "t", 3000).ok());
  const std::vector<uint8_t> first = Pattern(1, 3000);
  ASSERT_TRUE((*store)->Write("j", "t", first).ok());
  ASSERT_TRUE((*store)->Commit("j", "t").ok());
  absl::StatusOr<uint64_t> refused =
      (*store)->Write("j", "t", Pattern(2, 3000));
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "write of tensor 'j/t': needed 4096, held 4096, limit 6000");
  EXPECT_EQ(budget.Held("j"), kBlock);
  std::vector<uint8_t> back(3000);
  ASSERT_TRUE((*store)->Read("j", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, first);
  // Another job has a budget of its own.
  ASSERT_TRUE((*store)->Create("k", "t", 4000).ok());
  EXPECT_TRUE((*store)->Write("k", "t", Pattern(3, 4000)).ok());
}

TEST_F(SpaceBudgetTest, AWriteTheSsdsCannotHoldGivesItsBytesBack) {
  auto store = TensorStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  CountingBudget budget(uint64_t{1} << 40);
  (*store)->SetSpaceBudget(&budget);
  const uint64_t too_big = uint64_t{17} << 20;  // two 8 MiB SSDs
  ASSERT_TRUE((*store)->Create("j", "huge", too_big).ok());
  std::vector<uint8_t> data(too_big);
  EXPECT_TRUE(
      absl::IsResourceExhausted((*store)->Write("j", "huge", data).status()));
  EXPECT_EQ(budget.Held("j"), 0u);
}

TEST_F(SpaceBudgetTest, VersionsFoundAtOpenAreChargedAndReleased) {
  {
    auto store = TensorStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Create("j", "t", 1000).ok());
    ASSERT_TRUE((*store)->Write("j", "t", Pattern(1, 1000)).ok());
    ASSERT_TRUE((*store)->Commit("j", "t").ok());
  }
  auto store = TensorStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  CountingBudget budget(6000);
  (*store)->SetSpaceBudget(&budget);
  EXPECT_EQ(budget.Held("j"), kBlock);
  EXPECT_EQ(budget.InAccount(0), kBlock);
  EXPECT_TRUE(absl::IsResourceExhausted(
      (*store)->Write("j", "t", Pattern(2, 1000)).status()));
  ASSERT_TRUE((*store)->DeleteJob("j").ok());
  EXPECT_EQ(budget.Held("j"), 0u);
}

}  // namespace
}  // namespace lohan
