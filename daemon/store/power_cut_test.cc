// A power cut at every step of an iteration's commit, LevelDB-style: every
// SSD write not yet flushed is lost (overwritten with garbage:
// FaultInjectionDevice::PowerCut), and the catalog keeps only what was
// synced plus any part of what was appended after. The reopened store must
// hold exactly the last acknowledged iteration, every tensor reading back
// its bytes (checksums would catch a committed version hit by a lost
// write); never the iteration in flight, never a mix.

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/store/fault_injection_device.h"
#include "daemon/store/fault_store.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::Pattern;
using testing_util::TempDir;

const std::vector<std::string> kNames = {"w0", "w1", "w2", "meta"};
constexpr uint64_t kBytes = 150000;  // Three stripe units and a bit.

std::vector<uint8_t> DataOf(int iteration, size_t tensor) {
  return Pattern(iteration * 100 + tensor, kBytes);
}

class PowerCutTest : public ::testing::Test {
 protected:
  StoreOptions Options(const std::string& name) {
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir(name + "-ssd0"), dir_.Subdir(name + "-ssd1")};
    o.state_dir = dir_.path() + "/" + name + "-state";
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 8 << 20;
    return o;
  }

  std::unique_ptr<TensorStore> OpenWithFaults(const StoreOptions& o) {
    auto s = testing_util::OpenStoreWithFaults(o, &faults_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  static uint64_t FileSize(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    return static_cast<uint64_t>(in.tellg());
  }

  // The power goes: every SSD write not flushed is lost. Returns how many.
  int PowerCut() {
    int lost = 0;
    for (FaultInjectionDevice* f : faults_) {
      absl::StatusOr<size_t> undone = f->PowerCut();
      EXPECT_TRUE(undone.ok()) << undone.status();
      if (undone.ok()) lost += static_cast<int>(*undone);
    }
    return lost;
  }

  // And the catalog keeps its first `kept` bytes at most: what was synced,
  // and maybe some of the rest.
  static void CutCatalog(const std::string& catalog, uint64_t kept) {
    const uint64_t size = FileSize(catalog);
    ASSERT_EQ(
        ::truncate(catalog.c_str(), static_cast<off_t>(std::min(size, kept))),
        0);
  }

  // Every tensor at `iteration`'s version with its bytes.
  static void ExpectIteration(TensorStore& s, int iteration,
                              const std::string& label) {
    for (size_t i = 0; i < kNames.size(); ++i) {
      std::vector<uint8_t> back(kBytes);
      absl::StatusOr<uint64_t> v =
          s.Read("job", kNames[i], absl::MakeSpan(back));
      ASSERT_TRUE(v.ok()) << label << ": " << v.status();
      EXPECT_EQ(*v, static_cast<uint64_t>(iteration))
          << label << " " << kNames[i];
      EXPECT_EQ(back, DataOf(iteration, i)) << label << " " << kNames[i];
    }
  }

  TempDir dir_;
  std::vector<FaultInjectionDevice*> faults_;
};

TEST_F(PowerCutTest, EveryStepOfACommitLeavesTheLastAcknowledgedIteration) {
  int cases = 0, lost_writes = 0;
  // Steps of iteration 3: k tensors written (0..4), then the commit done
  // (5); the catalog cut after its synced part by `tail` bytes of what
  // followed (0: none; 1000: all of it).
  for (int step = 0; step <= 5; ++step) {
    for (uint64_t tail : {uint64_t{0}, uint64_t{5}, uint64_t{1000}}) {
      const std::string name =
          "s" + std::to_string(step) + "t" + std::to_string(tail);
      const StoreOptions o = Options(name);
      const std::string catalog = o.state_dir + "/catalog.log";
      uint64_t synced = 0;  // Catalog bytes known durable.
      int acknowledged = 0;
      {
        std::unique_ptr<TensorStore> s = OpenWithFaults(o);
        ASSERT_NE(s, nullptr);
        for (const std::string& n : kNames) {
          ASSERT_TRUE(s->Create("job", n, kBytes).ok());
        }
        for (int iteration = 1; iteration <= 3; ++iteration) {
          const int written = iteration < 3 ? 4 : std::min(step, 4);
          for (int i = 0; i < written; ++i) {
            ASSERT_TRUE(s->Write("job", kNames[i], DataOf(iteration, i)).ok());
          }
          if (iteration < 3 || step == 5) {
            ASSERT_TRUE(s->CommitBatch("job", kNames).ok());
            acknowledged = iteration;
            // Durable up to the commit record: the sync mark after it is
            // appended once the sync returned (not yet synced itself).
            synced = FileSize(catalog) - 9;
          }
        }
        lost_writes += PowerCut();
      }
      CutCatalog(catalog, synced + tail);
      auto reopened = TensorStore::Open(o);
      ASSERT_TRUE(reopened.ok()) << name << ": " << reopened.status();
      ExpectIteration(**reopened, acknowledged, name);
      ++cases;
    }
  }
  std::printf(
      "power cut at each step of a commit (%d cases: 0 to 4 of 4 tensors "
      "written, or committed; the catalog's unsynced tail lost, cut or "
      "kept): %d unflushed SSD writes lost; every reopened store at the last "
      "acknowledged iteration\n",
      cases, lost_writes);
  EXPECT_GT(lost_writes, 0);
}

// The state tier's commit interval at the store: a tensor the tier holds
// is written only at durable commits, the others every iteration, and the
// iterations between durable commits are volatile (CommitBatchVolatile).
// A power cut at every step of the durable commit that ends such a run
// brings every tensor back at one iteration, the last durable one: never
// a volatile iteration, never the one in flight, never a mix of them.
TEST_F(PowerCutTest, ACutDuringADurableCommitAfterVolatileOnesLeavesNoMix) {
  // kNames[0] is in the tier; the rest are written every iteration.
  const std::vector<std::string> every(kNames.begin() + 1, kNames.end());
  int cases = 0, lost_writes = 0;
  for (int step = 0; step <= 5; ++step) {
    for (uint64_t tail : {uint64_t{0}, uint64_t{5}, uint64_t{1000}}) {
      const std::string name =
          "v" + std::to_string(step) + "t" + std::to_string(tail);
      const StoreOptions o = Options(name);
      const std::string catalog = o.state_dir + "/catalog.log";
      uint64_t synced = 0;
      int durable = 0;
      {
        std::unique_ptr<TensorStore> s = OpenWithFaults(o);
        ASSERT_NE(s, nullptr);
        for (const std::string& n : kNames) {
          ASSERT_TRUE(s->Create("job", n, kBytes).ok());
        }
        auto commit = [&](int iteration) {
          ASSERT_TRUE(s->CommitBatch("job", kNames, iteration).ok());
          durable = iteration;
          synced = FileSize(catalog) - 9;
        };
        for (size_t i = 0; i < kNames.size(); ++i) {
          ASSERT_TRUE(s->Write("job", kNames[i], DataOf(1, i)).ok());
        }
        commit(1);
        for (int iteration = 2; iteration <= 3; ++iteration) {
          for (size_t i = 1; i < kNames.size(); ++i) {
            ASSERT_TRUE(s->Write("job", kNames[i], DataOf(iteration, i)).ok());
          }
          ASSERT_TRUE(s->CommitBatchVolatile("job", every, iteration).ok());
        }
        // Iteration 4 is durable: the tier's tensor is written too, then
        // all are committed; the power goes after `step` of its steps.
        for (size_t i = 0; i < std::min<size_t>(step, kNames.size()); ++i) {
          ASSERT_TRUE(s->Write("job", kNames[i], DataOf(4, i)).ok());
        }
        if (step == 5) commit(4);
        lost_writes += PowerCut();
      }
      CutCatalog(catalog, synced + tail);
      auto reopened = TensorStore::Open(o);
      ASSERT_TRUE(reopened.ok()) << name << ": " << reopened.status();
      for (size_t i = 0; i < kNames.size(); ++i) {
        std::vector<uint8_t> back(kBytes);
        ASSERT_TRUE(
            (*reopened)->Read("job", kNames[i], absl::MakeSpan(back)).ok())
            << name << " " << kNames[i];
        EXPECT_EQ(back, DataOf(durable, i)) << name << " " << kNames[i];
        absl::StatusOr<TensorInfo> info = (*reopened)->Stat("job", kNames[i]);
        ASSERT_TRUE(info.ok()) << info.status();
        EXPECT_EQ(info->committed_tag, static_cast<uint64_t>(durable))
            << name << " " << kNames[i];
        EXPECT_FALSE(info->volatile_commit);
      }
      ++cases;
    }
  }
  std::printf(
      "power cut during a durable commit after volatile ones (%d cases): "
      "%d unflushed SSD writes lost; every reopened store at the last "
      "durable iteration, no tensor at a volatile one\n",
      cases, lost_writes);
  EXPECT_GT(lost_writes, 0);
}

}  // namespace
}  // namespace lohan
