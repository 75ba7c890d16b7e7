#ifndef LOHAN_DAEMON_STORE_FAULT_INJECTION_DEVICE_H_
#define LOHAN_DAEMON_STORE_FAULT_INJECTION_DEVICE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/block_device.h"

namespace lohan {

// Wraps a BlockDevice and makes chosen requests fail or corrupt data, for
// tests of the layers above. With no armed rule it forwards everything.
// Injected EIO/ENOSPC complete on the caller's thread, inside Submit.
// Thread-safe.
class FaultInjectionDevice final : public BlockDevice {
 public:
  enum class Fault {
    kEio,            // Completes with EIO (nothing transferred).
    kEnospc,         // Completes with ENOSPC (nothing transferred).
    kShortTransfer,  // Does the I/O, reports half of it done (DATA_LOSS).
    kBitFlip,        // Read: flips a bit of the data returned. Write: stores
                     // the data with one bit flipped; both report success.
    kDelay,          // Sleeps delay_ms on the submitting thread, then does
                     // the I/O (a slow device, for tests of ordering).
  };
  struct Rule {
    Fault fault = Fault::kEio;
    IoRequest::Op op = IoRequest::Op::kRead;
    // How many matching requests this rule hits before it disarms.
    uint64_t count = 1;
    // Only requests overlapping [begin, end) match.
    uint64_t begin = 0;
    uint64_t end = std::numeric_limits<uint64_t>::max();
    int delay_ms = 0;  // kDelay
  };

  // Takes ownership of `base`.
  explicit FaultInjectionDevice(std::unique_ptr<BlockDevice> base);
  FaultInjectionDevice(const FaultInjectionDevice&) = delete;
  FaultInjectionDevice& operator=(const FaultInjectionDevice&) = delete;
  ~FaultInjectionDevice() override = default;

  void Inject(const Rule& rule);
  void ClearFaults();
  // How many requests a rule has hit so far.
  uint64_t faults_fired() const;

  // A power cut, LevelDB-style: every write forwarded since the last
  // successful Flush is lost. PowerCut overwrites those ranges with a
  // garbage pattern (what an unsynced write leaves after a power loss:
  // anything), synchronously, and forgets them. Returns how many writes
  // it undid.
  absl::StatusOr<size_t> PowerCut();

  const std::string& path() const override { return base_->path(); }
  uint64_t capacity() const override { return base_->capacity(); }
  uint32_t block_size() const override { return base_->block_size(); }
  void Submit(IoRequest request) override;
  absl::Status Flush() override;

 private:
  const std::unique_ptr<BlockDevice> base_;

  mutable absl::Mutex mu_;
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  uint64_t fired_ ABSL_GUARDED_BY(mu_) = 0;
  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  std::vector<Range> unsynced_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_FAULT_INJECTION_DEVICE_H_
