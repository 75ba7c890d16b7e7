#ifndef LOHAN_WIRE_RING_H_
#define LOHAN_WIRE_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lohan {

// A single-producer / single-consumer ring of fixed-size entries in memory
// shared by two processes (e.g. a region of a job's arena), with doorbells so
// neither side spins while idle.
//
// Layout (all integers native little-endian; see RingHeader): one 256-byte
// header, then `capacity` entries of `entry_size` bytes. head (next index the
// producer writes) and tail (next index the consumer reads) are free-running
// 64-bit counters on their own cache lines; an index maps to slot
// `index & (capacity - 1)`. The producer publishes with a release store of
// head, the consumer with a release store of tail; each reads the other's
// with acquire.
//
// Doorbells: a futex word (a sequence number) plus a "waiter present" flag per
// direction. A side about to sleep sets the flag, re-checks the ring, then
// FUTEX_WAITs on the word (not FUTEX_PRIVATE: the word is in MAP_SHARED
// memory and works across processes). The other side, after publishing,
// rings (bumps the word and FUTEX_WAKEs) only when the flag is set, so the
// hot path is syscall-free while the peer is busy.
//
// Trust: the peer may be buggy or hostile. Each side copies the geometry once
// at attach time and never re-reads it; entries are addressed with the local
// mask, so nothing the peer writes can move our reads or writes outside the
// ring. The peer's counter is checked on every read (monotonic, never more
// than `capacity` ahead/behind ours); a violation is DATA_LOSS and the ring
// object stays broken (every later call returns the same error). A peer can
// still ring spuriously or never publish: Wait* always returns by its
// timeout. Entry contents are copied out before the caller sees them, so a
// peer rewriting a slot cannot change an entry after it was validated.

inline constexpr uint32_t kRingMagic = 0x474e5252;  // "RRNG"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr size_t kRingHeaderBytes = 256;
inline constexpr uint32_t kRingMaxCapacity = 1u << 20;
inline constexpr uint32_t kRingMaxEntryBytes = 4096;

// The shared header. Public so tests (and tools) can inspect or corrupt it.
struct alignas(64) RingHeader {
  // Written once by FormatRing, before the ring is shared.
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;    // power of two
  uint32_t entry_size;  // multiple of 8
  uint8_t pad0[48];
  alignas(64) std::atomic<uint64_t> head;  // written by the producer only
  alignas(64) std::atomic<uint64_t> tail;  // written by the consumer only
  // Consumer sleeps on `not_empty_seq`, producer on `not_full_seq`.
  alignas(64) std::atomic<uint32_t> not_empty_seq;
  std::atomic<uint32_t> consumer_waiting;
  std::atomic<uint32_t> not_full_seq;
  std::atomic<uint32_t> producer_waiting;
};
static_assert(sizeof(RingHeader) == kRingHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word");

// Bytes a ring of this geometry needs; 0 when the geometry is invalid
// (capacity not a power of two in [2, kRingMaxCapacity], entry_size not a
// multiple of 8 in [8, kRingMaxEntryBytes]).
size_t RingBytes(uint32_t capacity, uint32_t entry_size);

// Initialises an empty ring in `memory` (the creating side, normally the
// daemon, before the memory is shared). REQUIRES: `memory` is 64-byte
// aligned and `bytes >= RingBytes(capacity, entry_size)`; otherwise
// INVALID_ARGUMENT.
absl::Status FormatRing(void* memory, size_t bytes, uint32_t capacity,
                        uint32_t entry_size);

// The ring's geometry, checked and copied at attach time.
struct RingGeometry {
  uint32_t capacity = 0;
  uint32_t entry_size = 0;
};

// The two ends. Neither owns the memory: REQUIRES that it stays mapped while
// the end exists. Exactly one RingProducer and one RingConsumer may be
// attached to a ring at a time (one per process, or one per thread).
// Not thread-safe: each end is used by one thread at a time. Movable, not
// copyable.
//
// Attach validates the header (magic, version, geometry, size,
// `expected_entry_size`) and the counters, and fails with DATA_LOSS (bad
// header) or INVALID_ARGUMENT (misaligned memory, wrong entry size).

class RingProducer {
 public:
  RingProducer(RingProducer&&) = default;
  RingProducer& operator=(RingProducer&&) = default;
  RingProducer(const RingProducer&) = delete;
  RingProducer& operator=(const RingProducer&) = delete;

  static absl::StatusOr<RingProducer> Attach(void* memory, size_t bytes,
                                             uint32_t expected_entry_size);

  // Copies `entry` (geometry().entry_size bytes) into the ring.
  // true: pushed; false: full; error: the ring is corrupt.
  absl::StatusOr<bool> TryPush(const void* entry);

  // Blocks until there is room for at least one entry, or `timeout` passes
  // (DEADLINE_EXCEEDED; measured on the monotonic clock, at most a year, so
  // absl::InfiniteDuration() is fine). Spurious wake-ups are absorbed.
  absl::Status WaitForSpace(absl::Duration timeout);

  RingGeometry geometry() const { return geometry_; }

 private:
  RingProducer(RingHeader* header, uint8_t* entries, RingGeometry geometry,
               uint64_t head, uint64_t tail)
      : header_(header),
        entries_(entries),
        geometry_(geometry),
        head_(head),
        cached_tail_(tail) {}
  absl::Status RefreshTail();

  RingHeader* header_;
  uint8_t* entries_;
  RingGeometry geometry_;
  uint64_t head_;         // ours: the truth
  uint64_t cached_tail_;  // last validated value of the consumer's tail
  absl::Status broken_;
};

class RingConsumer {
 public:
  RingConsumer(RingConsumer&&) = default;
  RingConsumer& operator=(RingConsumer&&) = default;
  RingConsumer(const RingConsumer&) = delete;
  RingConsumer& operator=(const RingConsumer&) = delete;

  static absl::StatusOr<RingConsumer> Attach(void* memory, size_t bytes,
                                             uint32_t expected_entry_size);

  // Copies the oldest entry into `entry` (geometry().entry_size bytes).
  // true: popped; false: empty; error: the ring is corrupt.
  absl::StatusOr<bool> TryPop(void* entry);

  // Blocks until at least one entry is there, or `timeout` passes
  // (DEADLINE_EXCEEDED).
  absl::Status WaitForEntries(absl::Duration timeout);

  RingGeometry geometry() const { return geometry_; }

 private:
  RingConsumer(RingHeader* header, uint8_t* entries, RingGeometry geometry,
               uint64_t head, uint64_t tail)
      : header_(header),
        entries_(entries),
        geometry_(geometry),
        tail_(tail),
        cached_head_(head) {}
  absl::Status RefreshHead();

  RingHeader* header_;
  uint8_t* entries_;
  RingGeometry geometry_;
  uint64_t tail_;         // ours: the truth
  uint64_t cached_head_;  // last validated value of the producer's head
  absl::Status broken_;
};

}  // namespace lohan

#endif  // LOHAN_WIRE_RING_H_
