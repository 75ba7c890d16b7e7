// The pieces wired together the way lohand and liblohan_client will be: a
// worked example for the lead as much as a test.
//
// daemon: HostPool arena -> SlotAllocator -> two kControl slots formatted as
//         rings -> SendWithFds(arena fd, EncodeArenaGrant(...)) -> drains the
//         submission ring through EntryValidator (given the job's layout,
//         as the job session gives it the registered model's), answers on
//         the completion ring.
// client: ReceiveWithFds -> DecodeArenaGrant -> mmap -> RingProducer on the
//         submission ring, RingConsumer on the completion ring.

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "daemon/ipc/entry_validator.h"
#include "daemon/pool/host_pool.h"
#include "daemon/pool/slot_allocator.h"
#include "gtest/gtest.h"
#include "wire/arena_grant.h"
#include "wire/fd_passing.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr absl::Duration kFailsafe = absl::Seconds(60);
constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kArenaBytes = 1 << 20;

// Slot offsets the client learns out of band (in lohan, from gRPC replies).
struct ClientPlan {
  uint64_t table_offset;  // a control slot
  uint64_t grad_offset;
};

int Client(int socket_fd, ClientPlan plan) {
  auto message = ReceiveWithFds(socket_fd, kArenaGrantBytes, 1);
  if (!message.ok()) return 10;
  auto grant = DecodeArenaGrant(message->payload);
  if (!grant.ok()) return 11;
  void* mapped = mmap(nullptr, grant->arena_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, message->fds[0].get(), 0);
  if (mapped == MAP_FAILED) return 12;
  uint8_t* base = static_cast<uint8_t*>(mapped);
  auto submissions =
      RingProducer::Attach(base + grant->submission_offset,
                           grant->submission_bytes, kRingEntryBytes);
  auto completions =
      RingConsumer::Attach(base + grant->completion_offset,
                           grant->completion_bytes, kRingEntryBytes);
  if (!submissions.ok() || !completions.ok()) return 13;

  const uint64_t table[2] = {4096, 8192};
  std::memcpy(base + plan.table_offset, table, sizeof(table));
  std::memset(base + plan.grad_offset, 0x3c, 8192);

  // A layout table on the ring is refused: the daemon has the layout.
  SubmissionEntry entries[5] = {};
  entries[0].op = uint16_t(RingOp::kReservedRegisterLayout);
  entries[0].dtype = uint16_t(RingDtype::kBf16);
  entries[0].layer = 2;
  entries[0].slot_offset = plan.table_offset;
  entries[0].length = sizeof(table);
  entries[1].op = uint16_t(RingOp::kIterBegin);
  entries[2].op = uint16_t(RingOp::kGradReady);
  entries[2].dtype = uint16_t(RingDtype::kBf16);
  entries[2].layer = 1;
  entries[2].slot_offset = plan.grad_offset;
  entries[2].length = 8192;
  entries[3] = entries[2];  // the same gradient twice: refused
  entries[4].op = uint16_t(RingOp::kIterEnd);
  for (int i = 0; i < 5; ++i) {
    entries[i].request_id = 100 + i;
    auto pushed = submissions->TryPush(&entries[i]);
    if (!pushed.ok() || !*pushed) return 14;
  }
  const uint32_t want[5] = {uint32_t(absl::StatusCode::kInvalidArgument), 0, 0,
                            uint32_t(absl::StatusCode::kFailedPrecondition), 0};
  for (int i = 0; i < 5; ++i) {
    CompletionEntry done{};
    while (true) {
      auto popped = completions->TryPop(&done);
      if (!popped.ok()) return 15;
      if (*popped) break;
      if (!completions->WaitForEntries(kFailsafe).ok()) return 16;
    }
    if (done.request_id != uint64_t(100 + i)) return 17;
    if (done.status_code != want[i]) return 18;
  }
  munmap(mapped, grant->arena_bytes);
  return 0;
}

TEST(DataPlaneTest, ArenaAndRingsHandedToAClientProcess) {
  // Daemon side: arena, slots, rings.
  HostPool pool(HostPool::Options{.capacity_bytes = 4 * kArenaBytes});
  auto arena = pool.CreateArena("job-1", kArenaBytes);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const SharedArena& memory = (*arena)->arena();
  SlotAllocator slots(memory.size());
  const size_t ring_bytes = RingBytes(kRingCapacity, kRingEntryBytes);
  auto submission_slot = slots.Allocate(ring_bytes, SlotKind::kControl);
  auto completion_slot = slots.Allocate(ring_bytes, SlotKind::kControl);
  auto table_slot = slots.Allocate(4096, SlotKind::kControl);
  auto grad_slot = slots.Allocate(8192, SlotKind::kGradient);
  ASSERT_TRUE(submission_slot.ok() && completion_slot.ok() && table_slot.ok() &&
              grad_slot.ok());
  ASSERT_TRUE(FormatRing(memory.base() + submission_slot->offset,
                         submission_slot->length, kRingCapacity,
                         kRingEntryBytes)
                  .ok());
  ASSERT_TRUE(FormatRing(memory.base() + completion_slot->offset,
                         completion_slot->length, kRingCapacity,
                         kRingEntryBytes)
                  .ok());
  auto submissions =
      RingConsumer::Attach(memory.base() + submission_slot->offset,
                           submission_slot->length, kRingEntryBytes);
  auto completions =
      RingProducer::Attach(memory.base() + completion_slot->offset,
                           completion_slot->length, kRingEntryBytes);
  ASSERT_TRUE(submissions.ok() && completions.ok());

  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UniqueFd daemon_end(fds[0]), client_end(fds[1]);
  const ClientPlan plan{table_slot->offset, grad_slot->offset};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    daemon_end.reset();
    _exit(Client(client_end.get(), plan));
  }
  client_end.reset();

  ArenaGrant grant;
  grant.arena_bytes = memory.size();
  grant.submission_offset = submission_slot->offset;
  grant.submission_bytes = submission_slot->length;
  grant.completion_offset = completion_slot->offset;
  grant.completion_bytes = completion_slot->length;
  const std::vector<uint8_t> payload = EncodeArenaGrant(grant);
  const int arena_fd[] = {memory.fd()};
  ASSERT_TRUE(SendWithFds(daemon_end.get(), payload, arena_fd).ok());

  // Drain five submissions, validating each, answering each.
  EntryValidator validator(&slots, JobLayout{.dtype = RingDtype::kBf16,
                                             .layer_bytes = {4096, 8192}});
  for (int handled = 0; handled < 5;) {
    SubmissionEntry entry;
    auto popped = submissions->TryPop(&entry);
    ASSERT_TRUE(popped.ok()) << popped.status();
    if (!*popped) {
      ASSERT_TRUE(submissions->WaitForEntries(kFailsafe).ok());
      continue;
    }
    const absl::Status verdict = validator.Accept(entry);
    CompletionEntry done{};
    done.request_id = entry.request_id;
    done.status_code = static_cast<uint32_t>(verdict.code());
    if (verdict.ok() && entry.op == uint16_t(RingOp::kGradReady)) {
      // The gradient is readable in the daemon's mapping.
      done.detail = memory.base()[entry.slot_offset + entry.length - 1];
    }
    auto pushed = completions->TryPush(&done);
    ASSERT_TRUE(pushed.ok() && *pushed);
    ++handled;
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(validator.iteration(), 1u);
}

}  // namespace
}  // namespace lohan
