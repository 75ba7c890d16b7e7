#include "daemon/store/aio_device.h"

#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::FillPattern;
using testing_util::TempDir;

constexpr uint32_t kBlock = 4096;

std::unique_ptr<AioBlockDevice> OpenOrDie(const std::string& path,
                                          uint64_t capacity,
                                          uint32_t queue_depth = 8) {
  AioDeviceOptions options;
  options.path = path;
  options.capacity_bytes = capacity;
  options.queue_depth = queue_depth;
  auto device = AioBlockDevice::Open(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

TEST(AioBlockDeviceTest, CreatesPreallocatedFileAndRoundTrips) {
  TempDir dir;
  auto device = OpenOrDie(dir.path(), 8 << 20);
  ASSERT_NE(device, nullptr);
  EXPECT_TRUE(device->direct_io());
  EXPECT_EQ(device->capacity(), 8u << 20);
  EXPECT_EQ(device->file_path(), dir.path() + "/lohan.data");
  EXPECT_EQ(::access(device->file_path().c_str(), F_OK), 0);

  AlignedBuffer out(1 << 20, kBlock), in(1 << 20, kBlock);
  FillPattern(7, out.data(), out.size());
  IoResult w = SubmitAndWait(*device, IoRequest::Op::kWrite, out.data(),
                             out.size(), 3 * kBlock);
  ASSERT_TRUE(w.status.ok()) << w.status;
  EXPECT_EQ(w.transferred, out.size());
  IoResult r = SubmitAndWait(*device, IoRequest::Op::kRead, in.data(),
                             in.size(), 3 * kBlock);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
  EXPECT_TRUE(device->Flush().ok());
}

TEST(AioBlockDeviceTest, ReopenUsesExistingSize) {
  TempDir dir;
  { ASSERT_NE(OpenOrDie(dir.path(), 4 << 20), nullptr); }
  auto device = OpenOrDie(dir.path(), 0);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->capacity(), 4u << 20);
}

TEST(AioBlockDeviceTest, AnSsdPathServesOneStoreAtATime) {
  // Two daemons on one SSD file would overwrite each other's tensors.
  TempDir dir;
  AioDeviceOptions o;
  o.path = dir.path();
  o.capacity_bytes = 1 << 20;
  auto first = AioBlockDevice::Open(o);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = AioBlockDevice::Open(o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another lohand"),
            std::string::npos)
      << second.status();
  first->reset();  // closing it lets the next one in
  EXPECT_TRUE(AioBlockDevice::Open(o).ok());
}

TEST(AioBlockDeviceTest, EmptyDirectoryWithoutCapacityIsAnError) {
  TempDir dir;
  AioDeviceOptions options;
  options.path = dir.path();
  EXPECT_EQ(AioBlockDevice::Open(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.path = dir.path() + "/missing";
  EXPECT_EQ(AioBlockDevice::Open(options).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AioBlockDeviceTest, RejectsMisalignedAndOutOfRange) {
  TempDir dir;
  auto device = OpenOrDie(dir.path(), 1 << 20);
  ASSERT_NE(device, nullptr);
  AlignedBuffer buf(2 * kBlock, kBlock);
  IoResult r =
      SubmitAndWait(*device, IoRequest::Op::kRead, buf.data() + 512, kBlock, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  r = SubmitAndWait(*device, IoRequest::Op::kRead, buf.data(), 100, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  r = SubmitAndWait(*device, IoRequest::Op::kRead, buf.data(), 2 * kBlock,
                    (1 << 20) - kBlock);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kOutOfRange);
}

TEST(AioBlockDeviceTest, ShortReadReportsResidual) {
  TempDir dir;
  auto device = OpenOrDie(dir.path(), 1 << 20);
  ASSERT_NE(device, nullptr);
  // Shrink the file behind the device's back: reads past the new end are
  // short transfers.
  ASSERT_EQ(::truncate(device->file_path().c_str(), 512 << 10), 0);
  AlignedBuffer buf(1 << 20, kBlock);
  IoResult r =
      SubmitAndWait(*device, IoRequest::Op::kRead, buf.data(), 1 << 20, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.transferred, 512u << 10);
  EXPECT_EQ(r.residual(), 512u << 10);
  EXPECT_NE(r.status.message().find("residual 524288"), std::string::npos)
      << r.status;
  EXPECT_NE(r.status.message().find(dir.path()), std::string::npos);
}

TEST(AioBlockDeviceTest, ManyThreadsKeepTheQueueFullAndEveryCallbackRuns) {
  TempDir dir;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 64;
  constexpr uint64_t kLen = 16 << 10;
  auto device = OpenOrDie(dir.path(), kThreads * kPerThread * kLen,
                          /*queue_depth=*/4);
  ASSERT_NE(device, nullptr);
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    bufs.emplace_back(kLen, kBlock);
    FillPattern(i, bufs.back().data(), kLen);
  }
  std::atomic<int> ok{0};
  std::atomic<int> done{0};
  auto run = [&](IoRequest::Op op) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const int i = t * kPerThread + k;
          IoRequest rq;
          rq.op = op;
          rq.buffer = bufs[i].data();
          rq.length = kLen;
          rq.offset = i * kLen;
          rq.done = [&](const IoResult& r) {
            if (r.status.ok()) ok.fetch_add(1);
            done.fetch_add(1);
          };
          device->Submit(std::move(rq));
        }
      });
    }
    for (auto& th : threads) th.join();
    while (done.load() < kThreads * kPerThread) std::this_thread::yield();
  };
  run(IoRequest::Op::kWrite);
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  for (auto& b : bufs) std::memset(b.data(), 0, kLen);
  ok = 0;
  done = 0;
  run(IoRequest::Op::kRead);
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    auto expected = testing_util::Pattern(i, kLen);
    ASSERT_EQ(std::memcmp(bufs[i].data(), expected.data(), kLen), 0) << i;
  }
}

// A completion-driven chain: each callback submits the next request of its
// lane. Submitting from the completion thread must never block, even with
// a queue far smaller than the number of lanes.
TEST(AioBlockDeviceTest, CallbacksCanSubmitTheNextRequest) {
  TempDir dir;
  AioDeviceOptions options;
  options.path = dir.path();
  options.capacity_bytes = 1 << 20;
  options.queue_depth = 2;
  options.submit_queue_capacity = 1;
  auto device = AioBlockDevice::Open(options);
  ASSERT_TRUE(device.ok()) << device.status();
  constexpr int kLanes = 8;
  constexpr int kPerLane = 50;
  AlignedBuffer buf(kLanes * kBlock, kBlock);
  absl::Mutex mu;
  int done = 0;
  int failed = 0;
  std::function<void(int, int)> issue = [&](int lane, int k) {
    IoRequest rq;
    rq.op = IoRequest::Op::kRead;
    rq.buffer = buf.data() + lane * kBlock;
    rq.length = kBlock;
    rq.offset = ((lane * kPerLane + k) % 256) * kBlock;
    rq.done = [&, lane, k](const IoResult& r) {
      {
        absl::MutexLock lock(&mu);
        ++done;
        if (!r.status.ok()) ++failed;
      }
      if (k + 1 < kPerLane) issue(lane, k + 1);
    };
    (*device)->Submit(std::move(rq));
  };
  for (int lane = 0; lane < kLanes; ++lane) issue(lane, 0);
  mu.LockWhen(absl::Condition(
      +[](int* d) { return *d == kLanes * kPerLane; }, &done));
  mu.Unlock();
  EXPECT_EQ(failed, 0);
}

TEST(AioBlockDeviceTest, DestructorCompletesQueuedRequests) {
  TempDir dir;
  constexpr int kRequests = 100;
  AlignedBuffer buf(kBlock, kBlock);
  std::atomic<int> done{0};
  {
    auto device = OpenOrDie(dir.path(), 1 << 20, /*queue_depth=*/2);
    ASSERT_NE(device, nullptr);
    for (int i = 0; i < kRequests; ++i) {
      IoRequest rq;
      rq.op = IoRequest::Op::kRead;
      rq.buffer = buf.data();
      rq.length = kBlock;
      rq.offset = (i % 16) * kBlock;
      rq.done = [&](const IoResult&) { done.fetch_add(1); };
      device->Submit(std::move(rq));
    }
  }
  EXPECT_EQ(done.load(), kRequests);
}

// ramfs refuses O_DIRECT (tmpfs accepts it on recent kernels). Mounting needs
// root; elsewhere the test is skipped.
TEST(AioBlockDeviceTest, FilesystemWithoutODirectIsFailedPrecondition) {
  TempDir dir;
  const std::string mnt = dir.Subdir("ramfs");
  if (::geteuid() != 0 || ::mount("none", mnt.c_str(), "ramfs", 0, "") != 0) {
    GTEST_SKIP() << "cannot mount a ramfs here";
  }
  AioDeviceOptions options;
  options.path = mnt;
  options.capacity_bytes = 1 << 20;
  auto refused = AioBlockDevice::Open(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(mnt), std::string::npos)
      << refused.status();
  options.allow_buffered_io = true;
  {
    auto buffered = AioBlockDevice::Open(options);
    ASSERT_TRUE(buffered.ok()) << buffered.status();
    EXPECT_FALSE((*buffered)->direct_io());
    AlignedBuffer out(kBlock, kBlock), in(kBlock, kBlock);
    FillPattern(3, out.data(), kBlock);
    EXPECT_TRUE(SubmitAndWait(**buffered, IoRequest::Op::kWrite, out.data(),
                              kBlock, kBlock)
                    .status.ok());
    EXPECT_TRUE(SubmitAndWait(**buffered, IoRequest::Op::kRead, in.data(),
                              kBlock, kBlock)
                    .status.ok());
    EXPECT_EQ(std::memcmp(out.data(), in.data(), kBlock), 0);
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
}

}  // namespace
}  // namespace lohan
