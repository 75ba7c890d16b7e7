#include "daemon/sched/grad_scratch.h"

#include <utility>

namespace lohan {

GradScratch::GradScratch(std::string job, std::vector<uint64_t> chunk_bytes,
                         const StateTierMemory& memory, bool enabled)
    : job_(std::move(job)),
      chunk_bytes_(std::move(chunk_bytes)),
      memory_(memory),
      enabled_(enabled && memory.shares != nullptr),
      regions_(chunk_bytes_.size()) {}

GradScratch::~GradScratch() { Fit(0); }

void GradScratch::Fit(uint64_t room) {
  absl::MutexLock lock(&mu_);
  room_ = memory_.ShortOf(0) ? 0 : room;
  for (size_t flat = regions_.size(); flat-- > 0 && held_ > room_;) {
    FreeLocked(flat);
  }
}

uint8_t* GradScratch::Take(size_t flat) {
  if (!enabled_) return nullptr;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<LockedRegion>& region = regions_[flat];
  if (region != nullptr) return region->data();
  const uint64_t bytes = chunk_bytes_[flat];
  if (held_ + bytes > room_ || memory_.ShortOf(bytes)) return nullptr;
  if (!memory_.shares->TryTake(job_, bytes)) return nullptr;
  region = LockedRegion::Map(bytes);
  if (region == nullptr) {
    memory_.shares->Give(job_, bytes);
    return nullptr;
  }
  held_ += bytes;
  return region->data();
}

const uint8_t* GradScratch::Find(size_t flat) const {
  absl::MutexLock lock(&mu_);
  return regions_[flat] == nullptr ? nullptr : regions_[flat]->data();
}

uint64_t GradScratch::bytes_held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void GradScratch::FreeLocked(size_t flat) {
  if (regions_[flat] == nullptr) return;
  regions_[flat].reset();
  held_ -= chunk_bytes_[flat];
  memory_.shares->Give(job_, chunk_bytes_[flat]);
}

}  // namespace lohan
