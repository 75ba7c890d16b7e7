// Activation swaps scheduled like every other SSD transfer: through a real
// store whose IoGate is the daemon's FairSsdGate (one slot each way), with
// the order in which transfers are let through recorded. The test holds
// the slot, queues transfers one by one (each seen waiting in the queue
// before the next is asked for), then lets them go.

#include "daemon/sched/activation_swap.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/sched/fair_gates.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::Pattern;

// The FairSsdGate, noting each transfer ("job:bytes") as it is let
// through.
class RecordingGate : public IoGate {
 public:
  RecordingGate(FairQueue* reads, FairQueue* writes)
      : inner_(reads, writes,
               [](absl::string_view) { return FairSsdGate::Share{}; }) {}

  std::unique_ptr<Pass> Enter(absl::string_view job, uint64_t bytes,
                              Direction direction) override {
    std::unique_ptr<Pass> pass = inner_.Enter(job, bytes, direction);
    absl::MutexLock lock(&mu_);
    order_.push_back(absl::StrCat(job, ":", bytes));
    return pass;
  }
  std::vector<std::string> order() const {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    order_.clear();
  }

 private:
  FairSsdGate inner_;
  mutable absl::Mutex mu_;
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
};

class ActivationSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0")};
    o.state_dir = dir_.path() + "/state";
    o.queue_depth = 8;
    o.device_capacity_bytes = 16 << 20;
    auto store = TensorStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    store_->SetIoGate(&gate_);
  }

  // Blocks until `flow` has `waiting` requests waiting in `queue`.
  static void AwaitWaiting(const FairQueue& queue, const std::string& flow,
                           size_t waiting) {
    for (;;) {
      const auto stats = queue.Stats();
      auto at = stats.find(flow);
      if (at != stats.end() && at->second.waiting == waiting) return;
      absl::SleepFor(absl::Microseconds(200));
    }
  }

  testing_util::TempDir dir_;
  FairQueue reads_{1};
  FairQueue writes_{1};
  RecordingGate gate_{&reads_, &writes_};
  std::unique_ptr<TensorStore> store_;
};

TEST_F(ActivationSwapTest, PutGetFreeRoundTrip) {
  ActivationSwap swap(store_.get(), "a");
  const std::vector<uint8_t> data = Pattern(7, 12345);
  ASSERT_TRUE(swap.Put(1, data).ok());
  EXPECT_EQ(swap.Put(1, data).code(), absl::StatusCode::kAlreadyExists);
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(swap.Get(1, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, data);
  absl::StatusOr<uint64_t> freed = swap.Free(1);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, data.size());
  EXPECT_FALSE(swap.Get(1, absl::MakeSpan(back)).ok());
  // Whatever a session left is gone with FreeAll; the job's other tensors
  // stay.
  ASSERT_TRUE(store_->Create("a", "state", 4096).ok());
  ASSERT_TRUE(swap.Put(2, data).ok());
  ASSERT_TRUE(swap.Put(3, data).ok());
  swap.FreeAll();
  EXPECT_EQ(store_->List("a"), std::vector<std::string>{"state"});
}

// The device waits for a get: it goes ahead of its own job's state read
// that was waiting first.
TEST_F(ActivationSwapTest, AGetGoesAheadOfItsJobsWaitingStateRead) {
  ActivationSwap swap(store_.get(), "a");
  ASSERT_TRUE(store_->Create("a", "state", 16384).ok());
  ASSERT_TRUE(store_->Write("a", "state", Pattern(1, 16384)).ok());
  ASSERT_TRUE(store_->Commit("a", "state").ok());
  ASSERT_TRUE(swap.Put(1, Pattern(2, 8192)).ok());
  gate_.Clear();
  FairQueue::Grant held = reads_.Acquire("a", 1, 1);
  std::thread state([&] {
    std::vector<uint8_t> buffer(16384);
    EXPECT_TRUE(store_->Read("a", "state", absl::MakeSpan(buffer)).ok());
  });
  AwaitWaiting(reads_, "a", 1);
  std::thread activation([&] {
    std::vector<uint8_t> buffer(8192);
    EXPECT_TRUE(swap.Get(1, absl::MakeSpan(buffer)).ok());
    EXPECT_EQ(buffer, Pattern(2, 8192));
  });
  AwaitWaiting(reads_, "a", 2);
  held = FairQueue::Grant();
  state.join();
  activation.join();
  EXPECT_EQ(gate_.order(), (std::vector<std::string>{"a:8192", "a:16384"}));
}

// A put takes its job's fair turn: a job that starts swapping while
// another has a backlog of puts waits behind one of them, not all.
TEST_F(ActivationSwapTest, APutTakesItsJobsFairTurnAcrossJobs) {
  ActivationSwap a(store_.get(), "a");
  ActivationSwap b(store_.get(), "b");
  FairQueue::Grant held = writes_.Acquire("other", 1, 1);
  std::vector<std::thread> puts;
  for (uint64_t id = 1; id <= 3; ++id) {
    puts.emplace_back(
        [&, id] { EXPECT_TRUE(a.Put(id, Pattern(id, 4096 * id)).ok()); });
    AwaitWaiting(writes_, "a", id);
  }
  puts.emplace_back([&] { EXPECT_TRUE(b.Put(1, Pattern(9, 1000)).ok()); });
  AwaitWaiting(writes_, "b", 1);
  held = FairQueue::Grant();
  for (std::thread& put : puts) put.join();
  EXPECT_EQ(gate_.order(), (std::vector<std::string>{"a:4096", "b:1000",
                                                     "a:8192", "a:12288"}));
}

}  // namespace
}  // namespace lohan
