#include "daemon/store/ssd_array.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/check.h"
#include "daemon/common/test_point.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/crc32c.h"

namespace lohan {

// Counts the outstanding chunk I/Os of one part of a Read or Write, keeps
// at most `limit` unfinished (submitted and not yet checked), remembers the
// first error and, once sealed (everything submitted) and every request's
// I/O is done, runs `done`: the part is off the SSDs then, though a read's
// last checks may still run. Wait returns once every request is finished.
// Shared with the completion callbacks, so it outlives the call that made
// it.
class SsdArray::Batch {
 public:
  Batch(size_t limit, std::function<void()> done)
      : limit_(limit), done_(std::move(done)) {}

  void Acquire() {
    mu_.LockWhen(absl::Condition(
        +[](Batch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
          return b->unfinished_ < b->limit_;
        },
        this));
    ++unfinished_;
    ++io_in_flight_;
    mu_.Unlock();
  }
  // A request's transfer has completed (before its Finished).
  void IoDone() {
    std::function<void()> done;
    {
      absl::MutexLock lock(&mu_);
      --io_in_flight_;
      done = TakeDoneIfDrainedLocked();
    }
    RunDone(done);
  }
  void Finished(absl::Status status) {
    absl::MutexLock lock(&mu_);
    --unfinished_;
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
  }
  // Nothing more will be submitted.
  void Seal() {
    std::function<void()> done;
    {
      absl::MutexLock lock(&mu_);
      sealed_ = true;
      done = TakeDoneIfDrainedLocked();
    }
    RunDone(done);
  }
  bool failed() {
    absl::MutexLock lock(&mu_);
    return !first_error_.ok();
  }
  // Waits for every request and for `done` (REQUIRES: sealed).
  absl::Status Wait() {
    mu_.LockWhen(absl::Condition(
        +[](Batch* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
          return b->unfinished_ == 0 && !b->done_ && !b->done_running_;
        },
        this));
    absl::Status status = first_error_;
    mu_.Unlock();
    return status;
  }

 private:
  std::function<void()> TakeDoneIfDrainedLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!sealed_ || io_in_flight_ != 0 || !done_) return nullptr;
    done_running_ = true;
    return std::exchange(done_, nullptr);
  }
  // Runs `done` outside the lock (it may wake other threads), then lets
  // Wait return.
  void RunDone(std::function<void()>& done) {
    if (!done) return;
    done();
    done = nullptr;  // what it captured goes now, before Wait returns
    absl::MutexLock lock(&mu_);
    done_running_ = false;
  }

  const size_t limit_;
  absl::Mutex mu_;
  size_t unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  size_t io_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // <= unfinished_
  bool sealed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> done_ ABSL_GUARDED_BY(mu_);
  bool done_running_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

SsdArray::InFlight::InFlight(std::shared_ptr<Batch> batch)
    : batch_(std::move(batch)) {}

SsdArray::InFlight::~InFlight() { batch_->Wait().IgnoreError(); }

absl::Status SsdArray::InFlight::Wait() { return batch_->Wait(); }

bool SsdArray::InFlight::failed() const { return batch_->failed(); }

namespace {

bool IsAligned(const void* p, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

absl::Status Annotate(const absl::Status& status, absl::string_view what,
                      size_t chunk, uint32_t device) {
  return absl::Status(status.code(), absl::StrCat("tensor ", what, " extent ",
                                                  chunk, " (device ", device,
                                                  "): ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SsdArray>> SsdArray::Create(
    std::vector<std::unique_ptr<BlockDevice>> devices, uint64_t stripe_unit) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("an SSD array needs at least one path");
  }
  const uint32_t bs = devices[0]->block_size();
  for (const auto& d : devices) {
    if (d->block_size() != bs) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d->path(), " has block size ",
                       d->block_size(), ", others ", bs));
    }
  }
  if (stripe_unit == 0 || stripe_unit % bs != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stripe_unit ", stripe_unit,
                     " must be a non-zero multiple of the block"
                     " size ",
                     bs));
  }
  return std::unique_ptr<SsdArray>(
      new SsdArray(std::move(devices), stripe_unit));
}

SsdArray::SsdArray(std::vector<std::unique_ptr<BlockDevice>> devices,
                   uint64_t stripe_unit)
    : devices_(std::move(devices)),
      stripe_unit_(stripe_unit),
      block_size_(devices_[0]->block_size()),
      max_in_flight_(32 * devices_.size()) {
  for (size_t d = 0; d < devices_.size(); ++d) {
    checkers_.push_back(std::make_unique<SerialWorker>());
  }
  absl::MutexLock lock(&mu_);
  for (const auto& d : devices_) {
    allocators_.emplace_back(d->capacity(), block_size_);
  }
}

size_t SsdArray::ChunkCount(uint64_t bytes) const {
  const uint64_t padded = (bytes + block_size_ - 1) / block_size_ * block_size_;
  return static_cast<size_t>((padded + stripe_unit_ - 1) / stripe_unit_);
}

SsdArray::Chunk SsdArray::ChunkAt(const Placement& p, size_t i) const {
  const size_t n = devices_.size();
  const uint64_t padded =
      (p.bytes + block_size_ - 1) / block_size_ * block_size_;
  Chunk c;
  c.device = static_cast<uint32_t>((p.first_device + i) % n);
  c.logical_offset = i * stripe_unit_;
  c.length = std::min<uint64_t>(stripe_unit_, padded - c.logical_offset);
  uint64_t at = (i / n) * stripe_unit_;  // into the device's runs
  c.device_offset = p.region_offset[c.device] + at;
  if (at >= p.region_length[c.device]) {
    at -= p.region_length[c.device];
    for (const Placement::Run& run : p.more_runs) {
      if (run.device != c.device) continue;
      if (at < run.length) {
        c.device_offset = run.offset + at;
        break;
      }
      at -= run.length;
    }
  }
  return c;
}

absl::Status SsdArray::GatherRunsLocked(uint32_t d, uint64_t need, Placement& p,
                                        std::vector<Placement::Run>& taken) {
  uint64_t remaining = need;
  bool first = true;
  while (remaining > 0) {
    const uint64_t largest = allocators_[d].largest_free_run();
    // A run before the last must end on a stripe boundary: a chunk never
    // spans two runs.
    const uint64_t take = remaining <= largest
                              ? remaining
                              : largest / stripe_unit_ * stripe_unit_;
    if (take == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no room for ", need, " bytes (", remaining,
                       " still wanted, largest free run ", largest, " bytes)"));
    }
    absl::StatusOr<uint64_t> offset = allocators_[d].Allocate(take);
    LOHAN_CHECK(offset.ok());
    taken.push_back(Placement::Run{d, *offset, take});
    if (first) {
      p.region_offset[d] = *offset;
      p.region_length[d] = take;
      first = false;
    } else {
      p.more_runs.push_back(Placement::Run{d, *offset, take});
    }
    remaining -= take;
  }
  return absl::OkStatus();
}

absl::StatusOr<Placement> SsdArray::Allocate(uint64_t bytes) {
  LOHAN_CHECK(bytes > 0);
  const size_t n = devices_.size();
  Placement p;
  p.bytes = bytes;
  p.region_offset.assign(n, 0);
  p.region_length.assign(n, 0);
  const size_t chunks = ChunkCount(bytes);
  p.chunk_crc.assign(chunks, 0);

  absl::MutexLock lock(&mu_);
  p.first_device = next_first_device_;
  next_first_device_ = static_cast<uint32_t>((next_first_device_ + 1) % n);
  for (size_t i = 0; i < chunks; ++i) {
    p.region_length[(p.first_device + i) % n] += ChunkAt(p, i).length;
  }
  std::vector<Placement::Run> taken;
  for (size_t d = 0; d < n; ++d) {
    const uint64_t need = p.region_length[d];
    if (need == 0) continue;
    absl::StatusOr<uint64_t> offset = allocators_[d].Allocate(need);
    if (offset.ok()) {
      p.region_offset[d] = *offset;
      taken.push_back(Placement::Run{static_cast<uint32_t>(d), *offset, need});
      continue;
    }
    // No free run is long enough: a fragmented device still holds the
    // version if its free runs add up.
    absl::Status gathered =
        GatherRunsLocked(static_cast<uint32_t>(d), need, p, taken);
    if (!gathered.ok()) {
      for (const Placement::Run& run : taken) {
        allocators_[run.device].Free(run.offset, run.length);
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "SSD ", devices_[d]->path(), " is full: ", gathered.message()));
    }
  }
  return p;
}

std::vector<Placement::Run> RunsOf(const Placement& p) {
  std::vector<Placement::Run> runs;
  for (size_t d = 0; d < p.region_offset.size() && d < p.region_length.size();
       ++d) {
    if (p.region_length[d] == 0) continue;
    runs.push_back(Placement::Run{static_cast<uint32_t>(d), p.region_offset[d],
                                  p.region_length[d]});
  }
  for (const Placement::Run& run : p.more_runs) {
    if (run.length > 0) runs.push_back(run);
  }
  return runs;
}

absl::Status SsdArray::Reserve(const Placement& p) {
  const size_t n = devices_.size();
  if (p.bytes == 0 || p.region_offset.size() != n ||
      p.region_length.size() != n || p.first_device >= n ||
      p.chunk_crc.size() != ChunkCount(p.bytes)) {
    return absl::DataLossError(absl::StrCat(
        "catalog placement does not fit an array of ", n, " devices"));
  }
  // Every run of a device but its last must be whole stripes, and the
  // runs must add up to the device's share of the chunks.
  std::vector<uint64_t> expected(n, 0);
  for (size_t i = 0; i < p.chunk_crc.size(); ++i) {
    expected[(p.first_device + i) % n] += ChunkAt(p, i).length;
  }
  for (const Placement::Run& run : p.more_runs) {
    if (run.device >= n || run.length == 0 ||
        p.region_length[run.device] == 0) {
      return absl::DataLossError("catalog placement has a bad extra run");
    }
  }
  const std::vector<Placement::Run> runs = RunsOf(p);
  std::vector<uint64_t> total(n, 0);
  for (const Placement::Run& run : runs) {
    if (total[run.device] % stripe_unit_ != 0) {
      return absl::DataLossError(
          "catalog placement has a run that does not end on a stripe");
    }
    total[run.device] += run.length;
  }
  if (expected != total) {
    return absl::DataLossError("catalog placement has inconsistent lengths");
  }
  absl::MutexLock lock(&mu_);
  for (size_t r = 0; r < runs.size(); ++r) {
    const Placement::Run& run = runs[r];
    absl::Status s = allocators_[run.device].Reserve(run.offset, run.length);
    if (!s.ok()) {
      for (size_t u = 0; u < r; ++u) {
        allocators_[runs[u].device].Free(runs[u].offset, runs[u].length);
      }
      return absl::DataLossError(absl::StrCat(
          "device ", devices_[run.device]->path(), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void SsdArray::Free(const Placement& p) {
  absl::MutexLock lock(&mu_);
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (p.region_length[d] > 0) {
      allocators_[d].Free(p.region_offset[d], p.region_length[d]);
    }
  }
  for (const Placement::Run& run : p.more_runs) {
    allocators_[run.device].Free(run.offset, run.length);
  }
}

absl::Status SsdArray::Write(const void* data, Placement& p,
                             absl::string_view what) {
  const size_t chunks = ChunkCount(p.bytes);
  p.chunk_crc.assign(chunks, 0);
  return SubmitWrite(data, p, what, 0, chunks)->Wait();
}

std::unique_ptr<SsdArray::InFlight> SsdArray::SubmitWrite(
    const void* data, Placement& p, absl::string_view what, size_t first,
    size_t end, std::function<void()> done) {
  const size_t chunks = ChunkCount(p.bytes);
  if (p.chunk_crc.size() != chunks) p.chunk_crc.assign(chunks, 0);
  end = std::min(end, chunks);
  auto batch = std::make_shared<Batch>(max_in_flight_, std::move(done));
  auto name = std::make_shared<std::string>(what);
  const uint8_t* src_base = static_cast<const uint8_t*>(data);
  for (size_t i = first; i < end; ++i) {
    if (batch->failed()) break;
    const Chunk c = ChunkAt(p, i);
    const uint8_t* src = src_base + c.logical_offset;
    const uint64_t avail = std::min(c.length, p.bytes - c.logical_offset);
    std::shared_ptr<AlignedBuffer> bounce;
    void* buffer = const_cast<uint8_t*>(src);
    if (avail != c.length || !IsAligned(src, block_size_)) {
      bounce = std::make_shared<AlignedBuffer>(c.length, block_size_);
      std::memcpy(bounce->data(), src, avail);
      buffer = bounce->data();
    }
    p.chunk_crc[i] = Crc32c(buffer, c.length);
    batch->Acquire();
    IoRequest request;
    request.op = IoRequest::Op::kWrite;
    request.buffer = buffer;
    request.length = c.length;
    request.offset = c.device_offset;
    request.done = [batch, bounce, name, i, c](const IoResult& r) {
      batch->IoDone();
      batch->Finished(r.status.ok() ? absl::OkStatus()
                                    : Annotate(r.status, *name, i, c.device));
    };
    devices_[c.device]->Submit(std::move(request));
  }
  batch->Seal();
  return absl::WrapUnique(new InFlight(std::move(batch)));
}

absl::Status SsdArray::Read(const Placement& p, void* dest,
                            absl::string_view what, uint64_t prefix) {
  return SubmitRead(p, dest, what, prefix, 0, ChunkCount(p.bytes))->Wait();
}

std::unique_ptr<SsdArray::InFlight> SsdArray::SubmitRead(
    const Placement& p, void* dest, absl::string_view what, uint64_t prefix,
    size_t first, size_t end, std::function<void()> done) {
  const size_t chunks = ChunkCount(p.bytes);
  LOHAN_CHECK(p.chunk_crc.size() == chunks);
  end = std::min(end, chunks);
  const uint64_t wanted = std::min(prefix, p.bytes);
  auto batch = std::make_shared<Batch>(max_in_flight_, std::move(done));
  auto name = std::make_shared<std::string>(what);
  uint8_t* dest_base = static_cast<uint8_t*>(dest);
  for (size_t i = first; i < end; ++i) {
    if (batch->failed()) break;
    const Chunk c = ChunkAt(p, i);
    if (c.logical_offset >= wanted) break;  // chunks are in logical order
    uint8_t* dst = dest_base + c.logical_offset;
    const uint64_t avail = std::min(c.length, wanted - c.logical_offset);
    std::shared_ptr<AlignedBuffer> bounce;
    void* buffer = dst;
    if (avail != c.length || !IsAligned(dst, block_size_)) {
      bounce = std::make_shared<AlignedBuffer>(c.length, block_size_);
      buffer = bounce->data();
    }
    const uint32_t expected = p.chunk_crc[i];
    const std::string device_path = devices_[c.device]->path();
    batch->Acquire();
    IoRequest request;
    request.op = IoRequest::Op::kRead;
    request.buffer = buffer;
    request.length = c.length;
    request.offset = c.device_offset;
    SerialWorker* checker = checkers_[c.device].get();
    request.done = [batch, bounce, name, i, c, buffer, dst, avail, expected,
                    device_path, checker](const IoResult& r) {
      batch->IoDone();
      if (!r.status.ok()) {
        batch->Finished(Annotate(r.status, *name, i, c.device));
        return;
      }
      checker->Post([batch, bounce, name, i, c, buffer, dst, avail, expected,
                     device_path] {
        TestPoint("ssd_array.check");
        const uint32_t actual = Crc32c(buffer, c.length);
        if (actual != expected) {
          batch->Finished(absl::DataLossError(absl::StrFormat(
              "tensor %s extent %d (device %d %s offset %d length %d): "
              "checksum mismatch, stored crc32c 0x%08x, read 0x%08x",
              *name, i, c.device, device_path, c.device_offset, c.length,
              expected, actual)));
          return;
        }
        if (bounce) std::memcpy(dst, bounce->data(), avail);
        batch->Finished(absl::OkStatus());
      });
    };
    devices_[c.device]->Submit(std::move(request));
  }
  batch->Seal();
  return absl::WrapUnique(new InFlight(std::move(batch)));
}

absl::Status SsdArray::FlushAll() {
  for (const auto& d : devices_) {
    absl::Status s = d->Flush();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<DeviceStats> SsdArray::Stats() const {
  absl::MutexLock lock(&mu_);
  std::vector<DeviceStats> stats;
  for (size_t d = 0; d < devices_.size(); ++d) {
    stats.push_back(DeviceStats{devices_[d]->path(), allocators_[d].capacity(),
                                allocators_[d].used()});
  }
  return stats;
}

}  // namespace lohan
