// DataPlane's asynchronous requests against a fake daemon in this process
// (fake_daemon_test_util.h): a thread that reads the submission ring and
// answers when, and in whatever order, the test says. (tests/data_plane_test.cc
// drives the real lohand.)
#include "client/data_plane.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/fake_daemon_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/plane_notice.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kLong = absl::Seconds(30);

SubmissionEntry Request(uint64_t id) {
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(RingOp::kActFree);
  entry.activation_id = id;
  return entry;
}

TEST(DataPlaneAsync, CompletionsInAnyOrderReachTheirTickets) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  std::vector<DataPlane::Ticket> tickets;
  for (uint64_t i = 0; i < 16; ++i) {
    auto ticket = plane->Submit(Request(100 + i), kLong);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  EXPECT_EQ(plane->in_flight(), 16u);
  std::vector<SubmissionEntry> taken = daemon.Take(16);
  ASSERT_EQ(taken.size(), 16u);
  // Answered in a shuffled order; waited for in submission order.
  std::shuffle(taken.begin(), taken.end(), std::mt19937(7));
  for (const SubmissionEntry& entry : taken) {
    daemon.Answer(entry, entry.activation_id * 10);
  }
  for (uint64_t i = 0; i < 16; ++i) {
    auto done = plane->Wait(tickets[i], kLong);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->request_id, tickets[i]);
    EXPECT_EQ(done->detail, (100 + i) * 10);
  }
  EXPECT_EQ(plane->in_flight(), 0u);
  EXPECT_EQ(plane->outstanding(), 0u);
}

TEST(DataPlaneAsync, TicketsAreConsumedOnceAndCheckedByNumber) {
  FakeDaemon daemon(64, /*echo=*/true);
  auto plane = daemon.Plane();
  auto ticket = plane->Submit(Request(5), kLong);
  ASSERT_TRUE(ticket.ok());
  // Done but not waited for: kept, and Poll does not consume it.
  bool done = false;
  for (int i = 0; i < 1000 && !done; ++i) {
    auto polled = plane->Poll(*ticket);
    ASSERT_TRUE(polled.ok()) << polled.status();
    done = *polled;
    if (!done) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(*plane->Poll(*ticket));
  EXPECT_EQ(plane->outstanding(), 1u);
  ASSERT_TRUE(plane->Wait(*ticket, kLong).ok());

  auto again = plane->Wait(*ticket, kLong);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      again.status().message(),
      HasSubstr(absl::StrCat("ticket ", *ticket, " was already waited for")));
  EXPECT_EQ(plane->Poll(*ticket).status().code(), absl::StatusCode::kNotFound);
  for (DataPlane::Ticket never : {DataPlane::Ticket{0}, *ticket + 1000}) {
    auto unknown = plane->Wait(never, kLong);
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(unknown.status().message(),
                HasSubstr("was never issued by this data plane"));
  }
}

TEST(DataPlaneAsync, EachFailureInFlightKeepsItsOwnText) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  std::vector<DataPlane::Ticket> tickets;
  for (uint64_t i = 0; i < 12; ++i) {
    tickets.push_back(*plane->Submit(Request(i), kLong));
  }
  // All answered (even ones fail, each with its own text) before the client
  // reads any of them.
  for (const SubmissionEntry& entry : daemon.Take(12)) {
    if (entry.activation_id % 2 == 0) {
      daemon.Fail(
          entry, absl::StatusCode::kNotFound,
          absl::StrCat("activation ", entry.activation_id, " is not held"));
    } else {
      daemon.Answer(entry, 1);
    }
  }
  for (uint64_t i = 12; i-- > 0;) {  // reverse order
    auto done = plane->Wait(tickets[i], kLong);
    if (i % 2 == 0) {
      EXPECT_EQ(done.status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(done.status().message(),
                absl::StrCat("activation ", i, " is not held"));
    } else {
      EXPECT_TRUE(done.ok()) << done.status();
    }
  }
}

TEST(DataPlaneAsync, MoreFailuresThanRecordsLoseOnlyTheOldestTexts) {
  FakeDaemon daemon(128);
  auto plane = daemon.Plane();
  const uint64_t failures = kErrorTextRecords + 6;
  std::vector<DataPlane::Ticket> tickets;
  for (uint64_t i = 0; i < failures; ++i) {
    tickets.push_back(*plane->Submit(Request(i), kLong));
  }
  for (const SubmissionEntry& entry : daemon.Take(failures)) {
    daemon.Fail(entry, absl::StatusCode::kFailedPrecondition,
                absl::StrCat("failure ", entry.activation_id));
  }
  for (uint64_t i = 0; i < failures; ++i) {
    auto done = plane->Wait(tickets[i], kLong);
    EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition);
    if (i < failures - kErrorTextRecords) {
      EXPECT_THAT(done.status().message(), HasSubstr("was overwritten"));
    } else {
      EXPECT_EQ(done.status().message(), absl::StrCat("failure ", i));
    }
  }
}

TEST(DataPlaneAsync, ManyThreadsSubmitPollAndWait) {
  FakeDaemon daemon(64, /*echo=*/true);
  auto plane = daemon.Plane();
  constexpr int kThreads = 6;
  constexpr int kRequests = 400;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::deque<std::pair<DataPlane::Ticket, uint64_t>> window;
      auto finish_one = [&] {
        auto [ticket, id] = window.front();
        window.pop_front();
        if (t % 2 == 1) {  // half the threads poll before they wait
          while (true) {
            auto polled = plane->Poll(ticket);
            if (!polled.ok()) {
              ++failures;
              return;
            }
            if (*polled) break;
            std::this_thread::yield();
          }
        }
        auto done = plane->Wait(ticket, kLong);
        if (!done.ok() || done->detail != id) ++failures;
      };
      for (int i = 0; i < kRequests; ++i) {
        const uint64_t id = uint64_t(t) << 32 | i;
        auto ticket = plane->Submit(Request(id), kLong);
        if (!ticket.ok()) {
          ++failures;
          return;
        }
        window.emplace_back(*ticket, id);
        if (window.size() > size_t(1 + t * 5)) finish_one();
      }
      while (!window.empty()) finish_one();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(daemon.served(), uint64_t{kThreads} * kRequests);
  EXPECT_EQ(plane->outstanding(), 0u);
}

TEST(DataPlaneAsync, SubmittingMoreThanTheRingsHoldDrainsInsteadOfDeadlock) {
  // Rings of 4: without the bound, 100 submissions with nobody waiting
  // would fill both rings and hang client and daemon against each other.
  FakeDaemon daemon(4, /*echo=*/true);
  auto plane = daemon.Plane();
  EXPECT_EQ(plane->max_in_flight(), 4u);
  std::vector<DataPlane::Ticket> tickets;
  for (uint64_t i = 0; i < 100; ++i) {
    auto ticket = plane->Submit(Request(i), kLong);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    EXPECT_LE(plane->in_flight(), 4u);
    tickets.push_back(*ticket);
  }
  for (uint64_t i = 100; i-- > 0;) {
    auto done = plane->Wait(tickets[i], kLong);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->detail, i);
  }
}

TEST(DataPlaneAsync, AWaitThatTimesOutLeavesTheTicketValid) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  auto ticket = plane->Submit(Request(3), kLong);
  ASSERT_TRUE(ticket.ok());
  auto early = plane->Wait(*ticket, absl::Milliseconds(30));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr("wait again"));
  EXPECT_FALSE(*plane->Poll(*ticket));
  daemon.Answer(daemon.Take(1)[0], 33);
  auto done = plane->Wait(*ticket, kLong);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->detail, 33u);
}

TEST(DataPlaneAsync, CallThatTimesOutLeavesNothingBehind) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  auto call = plane->Call(Request(1), absl::Milliseconds(20));
  EXPECT_EQ(call.status().code(), absl::StatusCode::kDeadlineExceeded);
  daemon.Answer(daemon.Take(1)[0], 1);
  // The late answer is read (and dropped) by the next drain.
  auto next = plane->Submit(Request(2), kLong);
  daemon.Answer(daemon.Take(1)[0], 2);
  ASSERT_TRUE(plane->Wait(*next, kLong).ok());
  EXPECT_EQ(plane->outstanding(), 0u);
  EXPECT_EQ(plane->in_flight(), 0u);
}

TEST(DataPlaneAsync, DaemonHangingUpWakesEveryWaiter) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  auto first = plane->Submit(Request(1), kLong);
  auto second = plane->Submit(Request(2), kLong);
  auto reserved = plane->Reserve();
  ASSERT_TRUE(first.ok() && second.ok() && reserved.ok());
  daemon.Take(2);  // read, never answered
  std::vector<absl::Status> results(2);
  std::thread a([&] {
    results[0] = plane->Wait(*first, absl::InfiniteDuration()).status();
  });
  std::thread b([&] {
    results[1] = plane->Wait(*second, absl::InfiniteDuration()).status();
  });
  absl::SleepFor(absl::Milliseconds(50));
  const auto hung_up = std::chrono::steady_clock::now();
  daemon.HangUp();
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - hung_up,
            std::chrono::seconds(5));
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("lohand closed"));
  }
  // Everything after fails the same way, the reserved ticket included.
  EXPECT_EQ(plane->Submit(Request(3), kLong).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(plane->SubmitReserved(*reserved, Request(4), kLong).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(plane->Wait(*reserved, kLong).status().code(),
            absl::StatusCode::kUnavailable);
}

// lohand closing the plane from its side says why before it hangs up:
// what it answered first stays answered, the rest fail with its reason.
TEST(DataPlaneAsync, AClosingNoticeIsTheReasonEveryRequestLeftFailsWith) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  auto answered = plane->Submit(Request(1), kLong);
  auto pending = plane->Submit(Request(2), kLong);
  ASSERT_TRUE(answered.ok() && pending.ok());
  std::vector<SubmissionEntry> taken = daemon.Take(2);
  absl::Status waited;
  std::thread waiter([&] { waited = plane->Wait(*pending, kLong).status(); });
  daemon.Answer(taken[0], 11);
  daemon.Say(EncodeClosingNotice(ClosingReason::kGaveWay,
                                 "lohand closed this job's data plane to "
                                 "give uid 1001's job j-9 its share"));
  daemon.HangUp();
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("uid 1001's job j-9"));
  absl::StatusOr<CompletionEntry> first = plane->Wait(*answered, kLong);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->detail, 11u);
  EXPECT_EQ(plane->Submit(Request(3), kLong).status(), waited);
}

TEST(DataPlaneAsync, ReservedTicketsCanBeWaitedForBeforeTheyAreSubmitted) {
  FakeDaemon daemon(64, /*echo=*/true);
  auto plane = daemon.Plane();
  auto reserved = plane->Reserve();
  ASSERT_TRUE(reserved.ok());
  EXPECT_FALSE(*plane->Poll(*reserved));
  EXPECT_EQ(plane->WaitForReserved(absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<CompletionEntry> result;
  std::thread waiter([&] { result = plane->Wait(*reserved, kLong); });
  // As a CUDA host function would, from another thread, a little later.
  std::thread callback([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(plane->SubmitReserved(*reserved, Request(77), kLong).ok());
  });
  EXPECT_TRUE(plane->WaitForReserved(kLong).ok());
  callback.join();
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->detail, 77u);
  EXPECT_EQ(result->request_id, *reserved);

  auto cancelled = plane->Reserve();
  plane->Cancel(*cancelled);
  EXPECT_EQ(plane->Wait(*cancelled, kLong).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(plane->WaitForReserved(absl::ZeroDuration()).ok());
  EXPECT_EQ(plane->SubmitReserved(12345, Request(1), kLong).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataPlaneAsync, ABufferInUseIsHeldUntilItsRequestCompletes) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  SubmissionEntry reads = Request(1);
  reads.slot_offset = 4096;
  reads.length = 1024;
  auto first = plane->Submit(reads, kLong);
  ASSERT_TRUE(first.ok());
  // Overlapping bytes are busy until the daemon answers; others are not.
  auto busy = plane->Reserve(4096 + 1000, 100, absl::Milliseconds(20));
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(busy.status().message(),
              HasSubstr(absl::StrCat("request ", *first, " still uses")));
  EXPECT_TRUE(plane->WaitForRange(0, 4096, absl::ZeroDuration()).ok());
  EXPECT_TRUE(plane->WaitForRange(5120, 64, absl::ZeroDuration()).ok());
  absl::StatusOr<DataPlane::Ticket> next;
  std::thread writer([&] { next = plane->Reserve(4096, 1024, kLong); });
  absl::SleepFor(absl::Milliseconds(30));
  daemon.Answer(daemon.Take(1)[0], 1);
  writer.join();
  ASSERT_TRUE(next.ok()) << next.status();
  // Now the reservation holds the bytes, until its request completes.
  EXPECT_EQ(plane->WaitForRange(4500, 1, absl::Milliseconds(10)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(plane->SubmitReserved(*next, reads, kLong).ok());
  daemon.Answer(daemon.Take(1)[0], 2);
  EXPECT_TRUE(plane->WaitForRange(4096, 1024, kLong).ok());
  EXPECT_TRUE(plane->Wait(*first, kLong).ok());
  EXPECT_TRUE(plane->Wait(*next, kLong).ok());
}

TEST(DataPlaneAsync, AFailedReservationEndsItsTicketWithTheErrorAndFreesIt) {
  FakeDaemon daemon;
  auto plane = daemon.Plane();
  auto reserved = plane->Reserve(8192, 512, kLong);
  ASSERT_TRUE(reserved.ok());
  absl::StatusOr<CompletionEntry> result;
  std::thread waiter([&] { result = plane->Wait(*reserved, kLong); });
  std::thread refill([&] {
    // As a FETCH_PARAMS that would refill the buffer waits.
    EXPECT_TRUE(plane->WaitForRange(8192, 512, kLong).ok());
  });
  // As a CUDA stream callback does when the copy hit a device error.
  absl::SleepFor(absl::Milliseconds(20));
  plane->FailReserved(*reserved, absl::InternalError("CUDA error 700"));
  waiter.join();
  refill.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(), HasSubstr("CUDA error 700"));
  EXPECT_TRUE(plane->WaitForReserved(absl::ZeroDuration()).ok());
  // Only a reserved ticket can be failed; nothing reached the daemon.
  plane->FailReserved(*reserved, absl::InternalError("again"));
  EXPECT_EQ(plane->Wait(*reserved, kLong).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing of it reached the daemon: the next submission is the first.
  auto next = plane->Submit(Request(5), kLong);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(daemon.Take(1)[0].request_id, *next);
}

}  // namespace
}  // namespace lohan
