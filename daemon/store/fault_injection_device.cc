#include "daemon/store/fault_injection_device.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/store/aligned_buffer.h"
#include "wire/errno_status.h"

namespace lohan {

FaultInjectionDevice::FaultInjectionDevice(std::unique_ptr<BlockDevice> base)
    : base_(std::move(base)) {}

void FaultInjectionDevice::Inject(const Rule& rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(rule);
}

void FaultInjectionDevice::ClearFaults() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
}

absl::Status FaultInjectionDevice::Flush() {
  // Taken first: a write forwarded while the flush runs may not be in it.
  std::vector<Range> flushed;
  {
    absl::MutexLock lock(&mu_);
    flushed.swap(unsynced_);
  }
  absl::Status s = base_->Flush();
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    unsynced_.insert(unsynced_.begin(), flushed.begin(), flushed.end());
  }
  return s;
}

absl::StatusOr<size_t> FaultInjectionDevice::PowerCut() {
  std::vector<Range> lost;
  {
    absl::MutexLock lock(&mu_);
    lost.swap(unsynced_);
  }
  for (const Range& range : lost) {
    AlignedBuffer garbage(range.length, block_size());
    std::memset(garbage.data(), 0xee, range.length);
    absl::Notification done;
    absl::Status status;
    IoRequest request;
    request.op = IoRequest::Op::kWrite;
    request.buffer = garbage.data();
    request.length = range.length;
    request.offset = range.offset;
    request.done = [&](const IoResult& r) {
      status = r.status;
      done.Notify();
    };
    base_->Submit(std::move(request));
    done.WaitForNotification();
    if (!status.ok()) return status;
  }
  if (absl::Status s = base_->Flush(); !s.ok()) return s;
  return lost.size();
}

uint64_t FaultInjectionDevice::faults_fired() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

void FaultInjectionDevice::Submit(IoRequest request) {
  std::optional<Fault> fault;
  int delay_ms = 0;
  {
    absl::MutexLock lock(&mu_);
    for (Rule& rule : rules_) {
      if (rule.count == 0 || rule.op != request.op) continue;
      if (request.offset >= rule.end ||
          request.offset + request.length <= rule.begin) {
        continue;
      }
      --rule.count;
      ++fired_;
      fault = rule.fault;
      delay_ms = rule.delay_ms;
      break;
    }
  }
  if (!fault.has_value()) {
    if (request.op == IoRequest::Op::kWrite) {
      absl::MutexLock lock(&mu_);
      unsynced_.push_back(Range{request.offset, request.length});
    }
    base_->Submit(std::move(request));
    return;
  }
  const char* op = request.op == IoRequest::Op::kRead ? "read" : "write";
  const std::string where =
      absl::StrCat(op, " ", path(), " at offset ", request.offset, " length ",
                   request.length, " (injected)");
  switch (*fault) {
    case Fault::kDelay:
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      base_->Submit(std::move(request));
      return;
    case Fault::kEio:
    case Fault::kEnospc: {
      const int error = *fault == Fault::kEio ? EIO : ENOSPC;
      request.done(IoResult{ErrnoToStatus(error, where), request.length, 0});
      return;
    }
    case Fault::kShortTransfer: {
      auto done = std::move(request.done);
      const uint64_t bs = block_size();
      request.done = [done = std::move(done), where, bs](const IoResult& r) {
        if (!r.status.ok()) return done(r);
        IoResult shorter = r;
        shorter.transferred = r.requested / 2 / bs * bs;
        shorter.status = absl::DataLossError(absl::StrCat(
            "short ", where, ": ", shorter.transferred, " of ", r.requested,
            " bytes (residual ", shorter.residual(), ")"));
        done(shorter);
      };
      base_->Submit(std::move(request));
      return;
    }
    case Fault::kBitFlip: {
      const uint64_t flip_at = request.length / 2;
      if (request.op == IoRequest::Op::kRead) {
        auto done = std::move(request.done);
        uint8_t* buffer = static_cast<uint8_t*>(request.buffer);
        request.done = [done = std::move(done), buffer,
                        flip_at](const IoResult& r) {
          if (r.status.ok()) buffer[flip_at] ^= 0x08;
          done(r);
        };
        base_->Submit(std::move(request));
        return;
      }
      // Write a corrupted copy; the caller's buffer stays as it was.
      auto copy = std::make_shared<AlignedBuffer>(request.length, block_size());
      std::memcpy(copy->data(), request.buffer, request.length);
      copy->data()[flip_at] ^= 0x08;
      request.buffer = copy->data();
      auto done = std::move(request.done);
      request.done = [done = std::move(done), copy](const IoResult& r) {
        done(r);
      };
      base_->Submit(std::move(request));
      return;
    }
  }
}

}  // namespace lohan
