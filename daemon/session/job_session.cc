#include "daemon/session/job_session.h"

#include "absl/strings/str_cat.h"
#include "daemon/ipc/ring.h"
#include "daemon/ipc/ring_entry.h"

namespace lohan {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t bytes, uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

JobSession::JobSession(std::unique_ptr<PooledArena> arena,
                       std::unique_ptr<SlotAllocator> slots, ArenaGrant grant)
    : arena_(std::move(arena)), slots_(std::move(slots)), grant_(grant) {}

absl::StatusOr<std::unique_ptr<JobSession>> JobSession::Create(
    HostPool* pool, const std::string& job_id, uint64_t arena_bytes) {
  const uint64_t ring_bytes = RingBytes(kRingCapacity, kRingEntryBytes);
  const uint64_t rings_bytes = 2 * RoundUp(ring_bytes, kPage);
  if (arena_bytes < rings_bytes + kPage) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id, " asked for a host pool of ", arena_bytes,
        " bytes; its data plane needs at least ", rings_bytes + kPage,
        " (create the job with a larger host_pool_bytes)"));
  }
  absl::StatusOr<std::unique_ptr<PooledArena>> arena =
      pool->CreateArena(job_id, RoundUp(arena_bytes, kPage));
  if (!arena.ok()) return arena.status();
  const SharedArena& memory = (*arena)->arena();
  auto slots = std::make_unique<SlotAllocator>(memory.size());

  ArenaGrant grant{.arena_bytes = memory.size()};
  for (int ring = 0; ring < 2; ++ring) {
    absl::StatusOr<Slot> slot = slots->Allocate(ring_bytes, SlotKind::kControl);
    if (!slot.ok()) return slot.status();
    if (absl::Status status =
            FormatRing(memory.base() + slot->offset, slot->length,
                       kRingCapacity, kRingEntryBytes);
        !status.ok()) {
      return status;
    }
    (ring == 0 ? grant.submission_offset : grant.completion_offset) =
        slot->offset;
    (ring == 0 ? grant.submission_bytes : grant.completion_bytes) =
        slot->length;
  }
  return std::unique_ptr<JobSession>(
      new JobSession(*std::move(arena), std::move(slots), grant));
}

}  // namespace lohan
