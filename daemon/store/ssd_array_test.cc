#include "daemon/store/ssd_array.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/common/test_point.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::Pattern;
using testing_util::TempDir;

constexpr uint64_t kStripe = 64 << 10;

class SsdArrayTest : public ::testing::Test {
 protected:
  void Open(int n, uint64_t capacity) {
    std::vector<std::unique_ptr<BlockDevice>> devices;
    for (int i = 0; i < n; ++i) {
      AioDeviceOptions options;
      options.path = dir_.Subdir("ssd" + std::to_string(i));
      options.capacity_bytes = capacity;
      auto d = AioBlockDevice::Open(options);
      ASSERT_TRUE(d.ok()) << d.status();
      files_.push_back((*d)->file_path());
      devices.push_back(*std::move(d));
    }
    auto array = SsdArray::Create(std::move(devices), kStripe);
    ASSERT_TRUE(array.ok()) << array.status();
    array_ = *std::move(array);
  }
  TempDir dir_;
  std::vector<std::string> files_;
  std::unique_ptr<SsdArray> array_;
};

TEST_F(SsdArrayTest, StripesOverThreeFilesAndReadsBack) {
  Open(3, 4 << 20);
  const uint64_t bytes = 10 * kStripe + 12345;  // 11 chunks, odd tail.
  std::vector<uint8_t> data = Pattern(5, bytes);
  auto p = array_->Allocate(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(array_->Write(data.data(), *p, "t").ok());
  ASSERT_EQ(p->chunk_crc.size(), 11u);
  for (int d = 0; d < 3; ++d) EXPECT_GT(p->region_length[d], 0u) << d;
  std::vector<uint8_t> back(bytes);
  ASSERT_TRUE(array_->Read(*p, back.data(), "t").ok());
  EXPECT_EQ(back, data);

  // The bytes really are on all three files, chunk by chunk, round-robin.
  std::vector<std::string> raw;
  for (const auto& f : files_) raw.push_back(testing_util::ReadWholeFile(f));
  for (size_t i = 0; i < 11; ++i) {
    const size_t d = (p->first_device + i) % 3;
    const uint64_t off = p->region_offset[d] + (i / 3) * kStripe;
    const uint64_t len = std::min<uint64_t>(kStripe, bytes - i * kStripe);
    ASSERT_GE(raw[d].size(), off + len);
    EXPECT_EQ(std::memcmp(raw[d].data() + off, data.data() + i * kStripe, len),
              0)
        << "chunk " << i << " on device " << d;
  }
  auto stats = array_->Stats();
  uint64_t used = 0;
  for (const auto& s : stats) used += s.used_bytes;
  EXPECT_EQ(used, (bytes + 4095) / 4096 * 4096);
  array_->Free(*p);
  for (const auto& s : array_->Stats()) EXPECT_EQ(s.used_bytes, 0u);
}

TEST_F(SsdArrayTest, SmallTensorsRotateOverDevices) {
  Open(3, 1 << 20);
  std::vector<Placement> ps;
  for (int i = 0; i < 3; ++i) {
    auto p = array_->Allocate(100);
    ASSERT_TRUE(p.ok());
    ps.push_back(*p);
  }
  for (const auto& s : array_->Stats()) EXPECT_EQ(s.used_bytes, 4096u);
}

TEST_F(SsdArrayTest, UnalignedCallerBuffersWork) {
  Open(2, 1 << 20);
  const uint64_t bytes = 3 * kStripe + 1;
  std::vector<uint8_t> src(bytes + 1), dst(bytes + 1);
  std::vector<uint8_t> data = Pattern(9, bytes);
  std::memcpy(src.data() + 1, data.data(), bytes);
  auto p = array_->Allocate(bytes);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(array_->Write(src.data() + 1, *p, "t").ok());
  ASSERT_TRUE(array_->Read(*p, dst.data() + 1, "t").ok());
  EXPECT_EQ(std::memcmp(dst.data() + 1, data.data(), bytes), 0);
}

// A read extent's CRC32C is checked on the device's checker thread: while a
// check is held, the device still completes transfers (this read's and a
// later one's), each part's `done` runs when its transfers are done, and
// Wait returns only once every check has (the bounce copy into an
// unaligned buffer is part of the check).
TEST_F(SsdArrayTest, ChecksRunOffTheCompletionThread) {
  Open(1, 4 << 20);
  const uint64_t bytes_a = 3 * kStripe, bytes_b = 2 * kStripe;
  const std::vector<uint8_t> data_a = Pattern(3, bytes_a);
  const std::vector<uint8_t> data_b = Pattern(4, bytes_b);
  auto a = array_->Allocate(bytes_a);
  auto b = array_->Allocate(bytes_b);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(array_->Write(data_a.data(), *a, "a").ok());
  ASSERT_TRUE(array_->Write(data_b.data(), *b, "b").ok());

  absl::Notification held, release;
  std::atomic<int> checks{0};
  ScopedTestPointHook hook("ssd_array.check", [&] {
    if (checks.fetch_add(1) == 0) {
      held.Notify();
      release.WaitForNotification();
    }
  });
  // A failed expectation must not leave the checker held: the reads' waits
  // (their destructors) and the array's destructor would never return.
  std::unique_ptr<SsdArray::InFlight> in_flight_a, in_flight_b;
  auto release_at_exit = absl::MakeCleanup([&] {
    if (!release.HasBeenNotified()) release.Notify();
  });
  std::vector<uint8_t> dest_a(bytes_a + 1, 0), dest_b(bytes_b + 1, 0);
  absl::Notification a_transferred, b_transferred;
  in_flight_a = array_->SubmitRead(*a, dest_a.data() + 1, "a", UINT64_MAX, 0, 3,
                                   [&] { a_transferred.Notify(); });
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(a_transferred.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "the part's transfers waited for its checks";
  // Not one extent is checked (and so copied out of its bounce buffer).
  EXPECT_TRUE(std::all_of(dest_a.begin(), dest_a.end(),
                          [](uint8_t v) { return v == 0; }));
  in_flight_b = array_->SubmitRead(*b, dest_b.data() + 1, "b", UINT64_MAX, 0, 2,
                                   [&] { b_transferred.Notify(); });
  EXPECT_TRUE(b_transferred.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "a held check held the device's completions";
  EXPECT_EQ(checks.load(), 1);
  release.Notify();
  ASSERT_TRUE(in_flight_a->Wait().ok());
  ASSERT_TRUE(in_flight_b->Wait().ok());
  EXPECT_EQ(checks.load(), 5);
  EXPECT_EQ(std::memcmp(dest_a.data() + 1, data_a.data(), bytes_a), 0);
  EXPECT_EQ(std::memcmp(dest_b.data() + 1, data_b.data(), bytes_b), 0);
}

TEST_F(SsdArrayTest, FullDeviceIsResourceExhaustedAndLeaksNothing) {
  Open(2, 256 << 10);
  auto big = array_->Allocate(400 << 10);  // 200 KiB per device.
  ASSERT_TRUE(big.ok());
  auto too_big = array_->Allocate(200 << 10);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("ssd"), std::string::npos)
      << too_big.status();
  uint64_t used = 0;
  for (const auto& s : array_->Stats()) used += s.used_bytes;
  EXPECT_EQ(used, 400u << 10);
}

TEST_F(SsdArrayTest, ReserveRejectsOverlapsAndBadShapes) {
  Open(2, 1 << 20);
  auto p = array_->Allocate(3 * kStripe);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(array_->Reserve(*p).code(), absl::StatusCode::kDataLoss);
  Placement bad = *p;
  bad.region_length[0] += 4096;
  EXPECT_EQ(array_->Reserve(bad).code(), absl::StatusCode::kDataLoss);
  array_->Free(*p);
  EXPECT_TRUE(array_->Reserve(*p).ok());
}

TEST_F(SsdArrayTest, AFragmentedDeviceHoldsAVersionInSeveralRuns) {
  // 16 stripes per device, every other one taken: 8 stripes free, no two
  // together.
  Open(2, 16 * kStripe);
  std::vector<Placement> taken;
  for (int i = 0; i < 32; ++i) {
    auto p = array_->Allocate(kStripe);  // one stripe, devices alternate
    ASSERT_TRUE(p.ok()) << p.status();
    taken.push_back(*p);
  }
  for (size_t i = 0; i < taken.size(); i += 4) {
    array_->Free(taken[i]);      // device A
    array_->Free(taken[i + 1]);  // device B
  }
  // 5 stripes and a short tail over two devices: 3 runs on one, 3 on the
  // other, where before it was RESOURCE_EXHAUSTED with 16 stripes free.
  const uint64_t bytes = 5 * kStripe + 5000;
  auto p = array_->Allocate(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->more_runs.size(), 4u);
  std::vector<uint8_t> data = Pattern(11, bytes);
  ASSERT_TRUE(array_->Write(data.data(), *p, "split").ok());
  std::vector<uint8_t> back(bytes);
  ASSERT_TRUE(array_->Read(*p, back.data(), "split").ok());
  EXPECT_EQ(back, data);
  // The chunks are where the runs say: each run's bytes on its file.
  std::vector<std::string> raw;
  for (const auto& f : files_) raw.push_back(testing_util::ReadWholeFile(f));
  for (const Placement::Run& run : p->more_runs) {
    ASSERT_GE(raw[run.device].size(), run.offset + run.length);
    EXPECT_EQ(run.length % 4096, 0u);
  }
  // What the catalog replays: the same runs, refused while in use.
  EXPECT_EQ(array_->Reserve(*p).code(), absl::StatusCode::kDataLoss);
  array_->Free(*p);
  ASSERT_TRUE(array_->Reserve(*p).ok());
  ASSERT_TRUE(array_->Read(*p, back.data(), "split").ok());
  EXPECT_EQ(back, data);
  // A run that does not end on a stripe (but a device's last) is refused.
  array_->Free(*p);
  Placement bad = *p;
  bad.region_length[bad.more_runs[0].device] -= 4096;
  bad.more_runs[0].length += 4096;
  EXPECT_EQ(array_->Reserve(bad).code(), absl::StatusCode::kDataLoss);
  // More than the free space, however split: refused, nothing leaked.
  uint64_t used = 0;
  for (const auto& s : array_->Stats()) used += s.used_bytes;
  auto too_big = array_->Allocate(17 * kStripe);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted)
      << too_big.status();
  uint64_t after = 0;
  for (const auto& s : array_->Stats()) after += s.used_bytes;
  EXPECT_EQ(after, used);
}

}  // namespace
}  // namespace lohan
