#include "wire/ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <new>

#include "absl/strings/str_cat.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

bool ValidGeometry(uint32_t capacity, uint32_t entry_size) {
  return capacity >= 2 && capacity <= kRingMaxCapacity &&
         (capacity & (capacity - 1)) == 0 && entry_size >= 8 &&
         entry_size <= kRingMaxEntryBytes && entry_size % 8 == 0;
}

// FUTEX_WAIT on a shared word until woken, the word differs from
// `expected`, or `timeout` (relative) passes. Returns 0 or an errno
// (ETIMEDOUT, EAGAIN, EINTR are normal).
int FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
              absl::Duration timeout) {
  timespec relative = absl::ToTimespec(timeout);
  const long result = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
                              FUTEX_WAIT, expected, &relative, nullptr, 0);
  return result == 0 ? 0 : errno;
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr,
          nullptr, 0);
}

// Rings `seq` if the other side said it sleeps. The caller has just
// published with a release store; the fence orders that store before the
// load of the flag (pairs with the fence in Sleep).
void Ring(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* waiting) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiting->load(std::memory_order_relaxed) != 0) {
    seq->fetch_add(1, std::memory_order_release);
    FutexWake(seq);
  }
}

// Waits until `ready()` (which refreshes from shared memory) says yes.
template <typename Ready>
absl::Status Sleep(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* waiting,
                   absl::Duration timeout, Ready ready) {
  // Monotonic: a wall-clock step must not stretch or cut the wait. Clamped
  // so that InfiniteDuration cannot overflow the time point.
  timeout = std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 365));
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (true) {
    absl::StatusOr<bool> now = ready();
    if (!now.ok()) return now.status();
    if (*now) return absl::OkStatus();
    const uint32_t observed = seq->load(std::memory_order_acquire);
    waiting->store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    now = ready();
    if (!now.ok() || *now) {
      waiting->store(0, std::memory_order_relaxed);
      return now.ok() ? absl::OkStatus() : now.status();
    }
    const absl::Duration left =
        absl::FromChrono(deadline - std::chrono::steady_clock::now());
    if (left <= absl::ZeroDuration()) {
      waiting->store(0, std::memory_order_relaxed);
      return absl::DeadlineExceededError("ring: wait timed out");
    }
    const int error = FutexWait(seq, observed, left);
    waiting->store(0, std::memory_order_relaxed);
    if (error != 0 && error != ETIMEDOUT && error != EAGAIN && error != EINTR) {
      return ErrnoToStatus(error, "futex wait");
    }
  }
}

struct Attached {
  RingHeader* header;
  uint8_t* entries;
  RingGeometry geometry;
  uint64_t head;
  uint64_t tail;
};

absl::StatusOr<Attached> AttachCommon(void* memory, size_t bytes,
                                      uint32_t expected_entry_size) {
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % 64 != 0) {
    return absl::InvalidArgumentError("ring memory must be 64-byte aligned");
  }
  if (bytes < kRingHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring region of ", bytes, " bytes has no room for a header"));
  }
  auto* header = static_cast<RingHeader*>(memory);
  // Copy the geometry once (volatile: exactly one read each); the peer could
  // change it later, and only these copies are used from here on.
  const volatile RingHeader* shared = header;
  const uint32_t magic = shared->magic;
  const uint32_t version = shared->version;
  const RingGeometry geometry{shared->capacity, shared->entry_size};
  if (magic != kRingMagic) {
    return absl::DataLossError(absl::StrCat("ring: bad magic ", magic));
  }
  if (version != kRingVersion) {
    return absl::DataLossError(
        absl::StrCat("ring: version ", version, ", expected ", kRingVersion));
  }
  if (!ValidGeometry(geometry.capacity, geometry.entry_size)) {
    return absl::DataLossError(absl::StrCat("ring: bad geometry, capacity ",
                                            geometry.capacity, ", entry size ",
                                            geometry.entry_size));
  }
  if (geometry.entry_size != expected_entry_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: entry size ", geometry.entry_size, ", expected ",
                     expected_entry_size));
  }
  if (RingBytes(geometry.capacity, geometry.entry_size) > bytes) {
    return absl::DataLossError(absl::StrCat(
        "ring: ", geometry.capacity, " entries of ", geometry.entry_size,
        " bytes do not fit in a ", bytes, " byte region"));
  }
  const uint64_t head = header->head.load(std::memory_order_acquire);
  const uint64_t tail = header->tail.load(std::memory_order_acquire);
  if (tail > head || head - tail > geometry.capacity) {
    return absl::DataLossError(
        absl::StrCat("ring: bad counters, head ", head, ", tail ", tail));
  }
  return Attached{header, static_cast<uint8_t*>(memory) + kRingHeaderBytes,
                  geometry, head, tail};
}

}  // namespace

size_t RingBytes(uint32_t capacity, uint32_t entry_size) {
  if (!ValidGeometry(capacity, entry_size)) return 0;
  return kRingHeaderBytes + size_t{capacity} * entry_size;
}

absl::Status FormatRing(void* memory, size_t bytes, uint32_t capacity,
                        uint32_t entry_size) {
  const size_t needed = RingBytes(capacity, entry_size);
  if (needed == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: bad geometry, capacity ", capacity, ", entry size ",
                     entry_size));
  }
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % 64 != 0) {
    return absl::InvalidArgumentError("ring memory must be 64-byte aligned");
  }
  if (bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring needs ", needed, " bytes, region has ", bytes));
  }
  std::memset(memory, 0, needed);
  auto* header = new (memory) RingHeader{};
  header->magic = kRingMagic;
  header->version = kRingVersion;
  header->capacity = capacity;
  header->entry_size = entry_size;
  header->head.store(0, std::memory_order_relaxed);
  header->tail.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- producer

absl::StatusOr<RingProducer> RingProducer::Attach(
    void* memory, size_t bytes, uint32_t expected_entry_size) {
  absl::StatusOr<Attached> a = AttachCommon(memory, bytes, expected_entry_size);
  if (!a.ok()) return a.status();
  return RingProducer(a->header, a->entries, a->geometry, a->head, a->tail);
}

absl::Status RingProducer::RefreshTail() {
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  if (tail < cached_tail_ || tail > head_) {
    broken_ = absl::DataLossError(absl::StrCat("ring corrupt: consumer tail ",
                                               tail, " outside [", cached_tail_,
                                               ", ", head_, "]"));
    return broken_;
  }
  cached_tail_ = tail;
  return absl::OkStatus();
}

absl::StatusOr<bool> RingProducer::TryPush(const void* entry) {
  if (!broken_.ok()) return broken_;
  if (head_ - cached_tail_ >= geometry_.capacity) {
    absl::Status status = RefreshTail();
    if (!status.ok()) return status;
    if (head_ - cached_tail_ >= geometry_.capacity) return false;
  }
  const uint64_t slot = head_ & (geometry_.capacity - 1);
  std::memcpy(entries_ + slot * geometry_.entry_size, entry,
              geometry_.entry_size);
  ++head_;
  header_->head.store(head_, std::memory_order_release);
  Ring(&header_->not_empty_seq, &header_->consumer_waiting);
  return true;
}

absl::Status RingProducer::WaitForSpace(absl::Duration timeout) {
  if (!broken_.ok()) return broken_;
  return Sleep(&header_->not_full_seq, &header_->producer_waiting, timeout,
               [this]() -> absl::StatusOr<bool> {
                 absl::Status status = RefreshTail();
                 if (!status.ok()) return status;
                 return head_ - cached_tail_ < geometry_.capacity;
               });
}

// ---------------------------------------------------------------- consumer

absl::StatusOr<RingConsumer> RingConsumer::Attach(
    void* memory, size_t bytes, uint32_t expected_entry_size) {
  absl::StatusOr<Attached> a = AttachCommon(memory, bytes, expected_entry_size);
  if (!a.ok()) return a.status();
  return RingConsumer(a->header, a->entries, a->geometry, a->head, a->tail);
}

absl::Status RingConsumer::RefreshHead() {
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  if (head < cached_head_ || head - tail_ > geometry_.capacity) {
    broken_ = absl::DataLossError(
        absl::StrCat("ring corrupt: producer head ", head, " outside [",
                     cached_head_, ", ", tail_ + geometry_.capacity, "]"));
    return broken_;
  }
  cached_head_ = head;
  return absl::OkStatus();
}

absl::StatusOr<bool> RingConsumer::TryPop(void* entry) {
  if (!broken_.ok()) return broken_;
  if (cached_head_ == tail_) {
    absl::Status status = RefreshHead();
    if (!status.ok()) return status;
    if (cached_head_ == tail_) return false;
  }
  const uint64_t slot = tail_ & (geometry_.capacity - 1);
  std::memcpy(entry, entries_ + slot * geometry_.entry_size,
              geometry_.entry_size);
  ++tail_;
  header_->tail.store(tail_, std::memory_order_release);
  Ring(&header_->not_full_seq, &header_->producer_waiting);
  return true;
}

absl::Status RingConsumer::WaitForEntries(absl::Duration timeout) {
  if (!broken_.ok()) return broken_;
  return Sleep(&header_->not_empty_seq, &header_->consumer_waiting, timeout,
               [this]() -> absl::StatusOr<bool> {
                 absl::Status status = RefreshHead();
                 if (!status.ok()) return status;
                 return cached_head_ != tail_;
               });
}

}  // namespace lohan
