#include "daemon/store/fault_injection_device.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/common/errno_status.h"
#include "daemon/store/aligned_buffer.h"

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
