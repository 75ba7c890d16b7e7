#include "wire/ring.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

// A failsafe only (a hung peer must not hang the test), never a measurement.
constexpr absl::Duration kFailsafe = absl::Seconds(60);

// MAP_SHARED anonymous memory: shared with forked children. RAII.
class SharedRegion {
 public:
  explicit SharedRegion(size_t bytes) : bytes_(bytes) {
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    base_ = base == MAP_FAILED ? nullptr : base;
  }
  ~SharedRegion() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  RingHeader* header() const { return static_cast<RingHeader*>(base_); }

 private:
  void* base_;
  size_t bytes_;
};

SubmissionEntry Numbered(uint64_t n) {
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(RingOp::kGradReady);
  entry.request_id = n;
  entry.slot_offset = n * 7919;
  entry.iteration = ~n;
  return entry;
}

bool IsNumbered(const SubmissionEntry& entry, uint64_t n) {
  return entry.request_id == n && entry.slot_offset == n * 7919 &&
         entry.iteration == ~n;
}

int ExitCode(pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RingTest, GeometryAndAttachValidation) {
  EXPECT_EQ(RingBytes(8, 64), kRingHeaderBytes + 8 * 64);
  EXPECT_EQ(RingBytes(6, 64), 0u);  // not a power of two
  EXPECT_EQ(RingBytes(1, 64), 0u);  // too small
  EXPECT_EQ(RingBytes(8, 12), 0u);  // not a multiple of 8
  EXPECT_EQ(RingBytes(8, 0), 0u);
  EXPECT_EQ(RingBytes(kRingMaxCapacity * 2, 64), 0u);

  SharedRegion region(RingBytes(8, 64));
  EXPECT_EQ(FormatRing(region.base(), region.bytes() - 1, 8, 64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormatRing(static_cast<uint8_t*>(region.base()) + 8, region.bytes(),
                       2, 64)
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 8, 64).ok());
  EXPECT_TRUE(RingConsumer::Attach(region.base(), region.bytes(), 64).ok());
  EXPECT_EQ(
      RingConsumer::Attach(region.base(), region.bytes(), 32).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingProducer::Attach(region.base(), region.bytes() - 64, 64)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);

  region.header()->magic = 0x12345678;
  EXPECT_EQ(
      RingProducer::Attach(region.base(), region.bytes(), 64).status().code(),
      absl::StatusCode::kDataLoss);
  region.header()->magic = kRingMagic;
  region.header()->version = 99;
  EXPECT_EQ(
      RingProducer::Attach(region.base(), region.bytes(), 64).status().code(),
      absl::StatusCode::kDataLoss);
  region.header()->version = kRingVersion;
  region.header()->capacity = 7;
  EXPECT_EQ(
      RingProducer::Attach(region.base(), region.bytes(), 64).status().code(),
      absl::StatusCode::kDataLoss);
  region.header()->capacity = 8;
  region.header()->head.store(20);  // tail 0: more than capacity ahead
  EXPECT_EQ(
      RingConsumer::Attach(region.base(), region.bytes(), 64).status().code(),
      absl::StatusCode::kDataLoss);
}

TEST(RingTest, FullEmptyAndWraparound) {
  SharedRegion region(RingBytes(4, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 4, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok() && consumer.ok());

  SubmissionEntry out{};
  EXPECT_EQ(*consumer->TryPop(&out), false);  // empty
  uint64_t pushed = 0, popped = 0;
  for (int round = 0; round < 100; ++round) {
    // Fill to the brim, then pop a varying number: indices wrap many times.
    while (true) {
      SubmissionEntry in = Numbered(pushed);
      absl::StatusOr<bool> ok = producer->TryPush(&in);
      ASSERT_TRUE(ok.ok()) << ok.status();
      if (!*ok) break;
      ++pushed;
    }
    EXPECT_EQ(pushed - popped, 4u);  // full at exactly capacity
    for (int i = 0; i <= round % 4; ++i) {
      absl::StatusOr<bool> ok = consumer->TryPop(&out);
      ASSERT_TRUE(ok.ok() && *ok);
      ASSERT_TRUE(IsNumbered(out, popped)) << popped;
      ++popped;
    }
  }
  while (*consumer->TryPop(&out)) {
    ASSERT_TRUE(IsNumbered(out, popped));
    ++popped;
  }
  EXPECT_EQ(popped, pushed);
  EXPECT_GT(region.header()->head.load(), 4u * 50);
}

TEST(RingTest, MillionEntriesAcrossProcesses) {
  constexpr uint64_t kCount = 1000000;
  SharedRegion region(RingBytes(256, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 256, 64).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // producer
    auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
    if (!producer.ok()) _exit(10);
    for (uint64_t n = 0; n < kCount;) {
      SubmissionEntry in = Numbered(n);
      absl::StatusOr<bool> ok = producer->TryPush(&in);
      if (!ok.ok()) _exit(11);
      if (*ok) {
        ++n;
      } else if (!producer->WaitForSpace(kFailsafe).ok()) {
        _exit(12);
      }
    }
    _exit(0);
  }
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(consumer.ok());
  uint64_t expected = 0;
  uint64_t mismatches = 0;
  SubmissionEntry out{};
  while (expected < kCount) {
    absl::StatusOr<bool> ok = consumer->TryPop(&out);
    ASSERT_TRUE(ok.ok()) << ok.status();
    if (!*ok) {
      absl::Status waited = consumer->WaitForEntries(kFailsafe);
      ASSERT_TRUE(waited.ok()) << waited;
      continue;
    }
    mismatches += !IsNumbered(out, expected);
    ++expected;
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(ExitCode(child), 0);
  EXPECT_EQ(*consumer->TryPop(&out), false);
}

TEST(RingTest, DoorbellWakesSleepingConsumerInAnotherProcess) {
  SharedRegion region(RingBytes(8, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 8, 64).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // consumer: blocks until the entry arrives
    auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
    if (!consumer.ok()) _exit(10);
    for (uint64_t n = 0; n < 3; ++n) {
      if (!consumer->WaitForEntries(kFailsafe).ok()) _exit(11);
      SubmissionEntry out{};
      absl::StatusOr<bool> ok = consumer->TryPop(&out);
      if (!ok.ok() || !*ok || !IsNumbered(out, n)) _exit(12);
    }
    _exit(0);
  }
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok());
  for (uint64_t n = 0; n < 3; ++n) {
    // Push only once the consumer has said it is going to sleep, so each
    // entry has to be delivered by a doorbell wake-up.
    while (region.header()->consumer_waiting.load() == 0) sched_yield();
    SubmissionEntry in = Numbered(n);
    ASSERT_TRUE(*producer->TryPush(&in));
    // Wait for the consumer to take it before the next round.
    while (region.header()->tail.load() <= n) sched_yield();
  }
  EXPECT_EQ(ExitCode(child), 0);
  // The producer rang (bumped the futex word) for the sleeping consumer.
  EXPECT_GE(region.header()->not_empty_seq.load(), 1u);
}

TEST(RingTest, NoDoorbellSyscallWhileConsumerIsAwake) {
  SharedRegion region(RingBytes(8, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 8, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok());
  SubmissionEntry in = Numbered(0);
  ASSERT_TRUE(*producer->TryPush(&in));
  EXPECT_EQ(region.header()->not_empty_seq.load(), 0u);  // nobody rang
}

TEST(RingTest, ProducerSleepsWhenFullAndIsWokenByPop) {
  SharedRegion region(RingBytes(2, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 2, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok() && consumer.ok());
  SubmissionEntry in = Numbered(0);
  ASSERT_TRUE(*producer->TryPush(&in));
  ASSERT_TRUE(*producer->TryPush(&in));
  ASSERT_FALSE(*producer->TryPush(&in));  // full

  absl::Status waited;
  std::thread waiter(
      [&producer, &waited] { waited = producer->WaitForSpace(kFailsafe); });
  while (region.header()->producer_waiting.load() == 0) sched_yield();
  SubmissionEntry out{};
  ASSERT_TRUE(*consumer->TryPop(&out));
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(*producer->TryPush(&in));
}

TEST(RingTest, InfiniteWaitIsWokenByAPushFromAnotherThread) {
  SharedRegion region(RingBytes(2, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 2, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok() && consumer.ok());
  absl::Status waited;
  std::thread waiter([&consumer, &waited] {
    waited = consumer->WaitForEntries(absl::InfiniteDuration());
  });
  while (region.header()->consumer_waiting.load() == 0) sched_yield();
  SubmissionEntry in = Numbered(1);
  ASSERT_TRUE(*producer->TryPush(&in));
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(RingTest, WaitTimesOut) {
  SharedRegion region(RingBytes(2, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 2, 64).ok());
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(consumer.ok());
  EXPECT_EQ(consumer->WaitForEntries(absl::Milliseconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(region.header()->consumer_waiting.load(), 0u);
}

TEST(RingTest, CorruptHeadIsDetectedAndSticky) {
  SharedRegion region(RingBytes(8, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 8, 64).ok());
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(consumer.ok());
  SubmissionEntry out{};
  region.header()->head.store(9);  // claims 9 entries in an 8-entry ring
  absl::StatusOr<bool> popped = consumer->TryPop(&out);
  EXPECT_EQ(popped.status().code(), absl::StatusCode::kDataLoss);
  region.header()->head.store(0);  // "fixing" it does not un-break us
  EXPECT_EQ(consumer->TryPop(&out).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(consumer->WaitForEntries(absl::Seconds(1)).code(),
            absl::StatusCode::kDataLoss);
  region.header()->head.store(UINT64_MAX);
  auto fresh = RingConsumer::Attach(region.base(), region.bytes(), 64);
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kDataLoss);
}

TEST(RingTest, HeadGoingBackwardsIsDetected) {
  SharedRegion region(RingBytes(8, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 8, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  SubmissionEntry in = Numbered(0), out{};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(*producer->TryPush(&in));
  ASSERT_TRUE(*consumer->TryPop(&out));
  region.header()->head.store(1);  // behind what we already saw
  // Two entries are still cached as available; the corruption shows once the
  // consumer looks at head again.
  EXPECT_TRUE(*consumer->TryPop(&out));
  EXPECT_TRUE(*consumer->TryPop(&out));
  EXPECT_EQ(consumer->TryPop(&out).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(RingTest, CorruptTailIsDetectedByProducer) {
  SharedRegion region(RingBytes(2, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 2, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok());
  SubmissionEntry in = Numbered(0);
  ASSERT_TRUE(*producer->TryPush(&in));
  ASSERT_TRUE(*producer->TryPush(&in));
  region.header()->tail.store(1000);  // consumer "read" entries never written
  EXPECT_EQ(producer->TryPush(&in).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(producer->WaitForSpace(absl::Seconds(1)).code(),
            absl::StatusCode::kDataLoss);
}

TEST(RingTest, GeometryChangedAfterAttachIsIgnored) {
  SharedRegion region(RingBytes(4, 64));
  ASSERT_TRUE(FormatRing(region.base(), region.bytes(), 4, 64).ok());
  auto producer = RingProducer::Attach(region.base(), region.bytes(), 64);
  auto consumer = RingConsumer::Attach(region.base(), region.bytes(), 64);
  ASSERT_TRUE(producer.ok() && consumer.ok());
  region.header()->capacity = 1u << 30;  // hostile peer
  region.header()->entry_size = 4096;
  SubmissionEntry in = Numbered(5), out{};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(*producer->TryPush(&in));
  EXPECT_FALSE(*producer->TryPush(&in));  // still 4
  ASSERT_TRUE(*consumer->TryPop(&out));
  EXPECT_TRUE(IsNumbered(out, 5));
}

}  // namespace
}  // namespace lohan
