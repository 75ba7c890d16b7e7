#ifndef LOHAN_DAEMON_STORE_SSD_ARRAY_H_
#define LOHAN_DAEMON_STORE_SSD_ARRAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/block_device.h"
#include "daemon/store/extent_allocator.h"
#include "daemon/store/serial_worker.h"

namespace lohan {

// Where one tensor version lives. Its bytes, padded with zeros to the block
// size, are cut into stripe-unit chunks ("extents"); chunk i lives on device
// d = (first_device + i) % N, as that device's (i / N)-th stripe, so a large
// tensor spreads over the whole array and reading it keeps every device
// busy. A device's stripes of a version fill its runs in turn: normally one
// contiguous region (region_offset[d], region_length[d]), so the chunk is at
// region_offset[d] + (i / N) * stripe_unit; on a nearly full, fragmented
// SSD, where no free run was long enough, that region and then more_runs of
// the device, in order, each a whole number of stripe units but the last.
struct Placement {
  struct Run {
    uint32_t device = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool operator==(const Run&) const = default;
  };
  uint64_t bytes = 0;  // Logical size.
  uint32_t first_device = 0;
  std::vector<uint64_t> region_offset;  // Per device: its first run.
  std::vector<uint64_t> region_length;  // Per device; 0: unused.
  std::vector<Run> more_runs;           // Usually none.
  std::vector<uint32_t> chunk_crc;      // CRC32C of each padded chunk.

  bool operator==(const Placement&) const = default;
};

// Every run of `placement` that holds bytes: each device's region, then
// the more_runs, in order.
std::vector<Placement::Run> RunsOf(const Placement& placement);

struct DeviceStats {
  std::string path;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
};

// N block devices used as one striped array, with free space per device.
// Thread-safe: allocation is under a mutex; reads and writes of distinct
// placements run in parallel with no lock held.
class SsdArray {
  class Batch;  // the requests of one part in flight (ssd_array.cc)

 public:
  // REQUIRES (checked, INVALID_ARGUMENT): at least one device, all with the
  // same block size; stripe_unit a non-zero multiple of it.
  static absl::StatusOr<std::unique_ptr<SsdArray>> Create(
      std::vector<std::unique_ptr<BlockDevice>> devices, uint64_t stripe_unit);

  SsdArray(const SsdArray&) = delete;
  SsdArray& operator=(const SsdArray&) = delete;

  // Allocates space for `bytes` (> 0): one free run per device where one is
  // long enough, else several (see Placement). RESOURCE_EXHAUSTED naming the
  // device when one lacks space; nothing stays allocated then. chunk_crc is
  // sized but filled by Write.
  absl::StatusOr<Placement> Allocate(uint64_t bytes);
  // Marks a placement from the catalog used (replay). DATA_LOSS if it does
  // not fit the array or overlaps another.
  absl::Status Reserve(const Placement& placement);
  // REQUIRES: `placement` came from Allocate or Reserve and is not freed.
  void Free(const Placement& placement);

  // Writes data[0, placement.bytes) into the placement and sets chunk_crc.
  // `what` names the tensor in errors. Aligned source chunks go straight to
  // the device; unaligned ones and the padded tail go through bounce buffers.
  absl::Status Write(const void* data, Placement& placement,
                     absl::string_view what);
  // A part of one version's I/O on its way (SubmitWrite, SubmitRead).
  // Destroying it waits for it: its buffers are in use until then.
  class InFlight {
   public:
    ~InFlight();
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    // Waits for every request of the part; the first error.
    absl::Status Wait();
    // Whether a request of the part has failed already (does not wait).
    bool failed() const;

   private:
    friend class SsdArray;
    explicit InFlight(std::shared_ptr<Batch> batch);
    std::shared_ptr<Batch> batch_;
  };
  // Starts Write's part: chunks [first, end) of `data` (the whole tensor's
  // bytes), their chunk_crc set (sized for the placement if it is not),
  // and returns without waiting for the SSDs. `done`, if set, runs once
  // when the part's last request has completed (on a completion thread),
  // or at once if nothing was submitted. A version written part by part,
  // every part waited for, reads as Write's would. `data`, `placement` and
  // `what`'s bytes stay valid until the part is waited for.
  std::unique_ptr<InFlight> SubmitWrite(const void* data, Placement& placement,
                                        absl::string_view what, size_t first,
                                        size_t end,
                                        std::function<void()> done = {});
  // Reads the placement into dest[0, placement.bytes), checking every
  // chunk's CRC32C: a mismatch is DATA_LOSS naming `what`, the extent, the
  // device and offset. I/O errors name the device and offset too. With
  // `prefix` < placement.bytes, only dest[0, prefix): the chunks that hold
  // it are read (and checked) whole, the rest not at all. Each chunk is
  // checked on its device's checker thread, not the thread that completes
  // its I/O, which goes on feeding the device meanwhile.
  absl::Status Read(const Placement& placement, void* dest,
                    absl::string_view what, uint64_t prefix = UINT64_MAX);
  // Starts Read's part: chunks [first, end) into `dest` (the whole
  // tensor's buffer), those past `prefix` left out. `done` as
  // SubmitWrite's: it runs once the part's transfers are done, which may be
  // before their checks are; Wait waits for the checks too.
  std::unique_ptr<InFlight> SubmitRead(const Placement& placement, void* dest,
                                       absl::string_view what, uint64_t prefix,
                                       size_t first, size_t end,
                                       std::function<void()> done = {});
  // The stripe-unit chunks a version of `bytes` is cut into.
  size_t chunk_count(uint64_t bytes) const { return ChunkCount(bytes); }
  // fdatasync on every device.
  absl::Status FlushAll();

  size_t device_count() const { return devices_.size(); }
  uint64_t stripe_unit() const { return stripe_unit_; }
  uint32_t block_size() const { return block_size_; }
  std::vector<DeviceStats> Stats() const;

 private:
  SsdArray(std::vector<std::unique_ptr<BlockDevice>> devices,
           uint64_t stripe_unit);
  struct Chunk {
    uint32_t device;
    uint64_t device_offset;
    uint64_t logical_offset;
    uint64_t length;  // Padded, multiple of block_size_.
  };
  Chunk ChunkAt(const Placement& placement, size_t index) const;
  // Takes `need` bytes of device `d` in runs, longest first, into the
  // placement's region of d and more_runs; `taken` records each run.
  absl::Status GatherRunsLocked(uint32_t d, uint64_t need, Placement& p,
                                std::vector<Placement::Run>& taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t ChunkCount(uint64_t bytes) const;
  // Constant after construction. The checkers are destroyed after the
  // devices: a device's last completions may still post checks.
  std::vector<std::unique_ptr<SerialWorker>> checkers_;  // one per device
  const std::vector<std::unique_ptr<BlockDevice>> devices_;
  const uint64_t stripe_unit_;
  const uint32_t block_size_;
  const size_t max_in_flight_;

  mutable absl::Mutex mu_;
  std::vector<ExtentAllocator> allocators_ ABSL_GUARDED_BY(mu_);
  uint32_t next_first_device_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_SSD_ARRAY_H_
