#include "daemon/quota/space_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/common/byte_size.h"
#include "daemon/common/check.h"

namespace lohan {
namespace {

// "4194304 (4.0 MiB)": exact for scripts, readable for people.
std::string Bytes(uint64_t bytes) {
  return absl::StrCat(bytes, " (", FormatByteSize(bytes), ")");
}

}  // namespace

SpaceLedger::SpaceLedger(uint64_t capacity_bytes, const QuotaTable* quotas)
    : capacity_bytes_(capacity_bytes), quotas_(quotas) {
  LOHAN_CHECK(quotas != nullptr);
}

void SpaceLedger::Track(const std::string& job, uid_t owner,
                        uint64_t job_limit) {
  absl::MutexLock lock(&mu_);
  Job& entry = jobs_[job];
  entry.tracked = true;
  entry.owner = owner;
  entry.limit = job_limit;
}

void SpaceLedger::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end()) return;
  Job& entry = found->second;
  held_by_all_ -= entry.Held();
  entry = Job{.used = entry.used};  // versions a reader still holds
  held_by_all_ += entry.Held();
  if (entry.used == 0) jobs_.erase(found);
}

uint64_t SpaceLedger::HeldByLocked(uid_t uid) const {
  uint64_t held = 0;
  for (const auto& [name, job] : jobs_) {
    if (job.tracked && job.owner == uid) held += job.Held();
  }
  return held;
}

uint64_t SpaceLedger::RoomFor(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  const auto left = [](uint64_t limit, uint64_t held) {
    return limit > held ? limit - held : 0;
  };
  uint64_t room = left(capacity_bytes_, held_by_all_);
  auto found = jobs_.find(name);
  if (found == jobs_.end() || !found->second.tracked) return room;
  const Job& job = found->second;
  if (job.limit != 0) room = std::min(room, left(job.limit, job.Held()));
  const uint64_t quota = quotas_->For(job.owner).ssd_bytes;
  if (quota != 0) room = std::min(room, left(quota, HeldByLocked(job.owner)));
  return room;
}

absl::Status SpaceLedger::FitsLocked(const std::string& name, const Job& job,
                                     uint64_t held_after, uint64_t needed,
                                     const char* what) const {
  const uint64_t held = job.Held();
  if (held_after <= held) return absl::OkStatus();
  const uint64_t more = held_after - held;
  if (job.tracked && job.limit != 0 && held_after > job.limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
        ", the job holds ", Bytes(held), " and its limit is ", Bytes(job.limit),
        " (CreateJob ssd_bytes; free some, e.g. swapped activations, or "
        "create the job with more)"));
  }
  if (job.tracked) {
    const uint64_t quota = quotas_->For(job.owner).ssd_bytes;
    const uint64_t user_held = HeldByLocked(job.owner);
    if (quota != 0 && user_held + more > quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
          ", its owner (uid ", job.owner, ") holds ", Bytes(user_held),
          " over all their jobs and the quota is ", Bytes(quota),
          " ([quotas] ssd in lohand.toml; delete a job you no longer need "
          "with 'lohanctl delete')"));
    }
  }
  if (held_by_all_ + more > capacity_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
        " but the SSD array is full: jobs hold ", Bytes(held_by_all_),
        " of its ", Bytes(capacity_bytes_),
        " (running jobs' updates set aside included); space comes back as "
        "jobs end or are deleted"));
  }
  return absl::OkStatus();
}

absl::Status SpaceLedger::SetAside(const std::string& job, uint64_t bytes,
                                   uintptr_t holder) {
  absl::MutexLock lock(&mu_);
  Job& entry = jobs_[job];
  Job after = entry;
  after.set_aside = bytes;
  if (absl::Status fits = FitsLocked(job, entry, after.Held(), bytes,
                                     "the updates of its model");
      !fits.ok()) {
    if (entry.used == 0 && entry.set_aside == 0 && !entry.tracked) {
      jobs_.erase(job);
    }
    return fits;
  }
  held_by_all_ = held_by_all_ - entry.Held() + after.Held();
  entry.set_aside = bytes;
  entry.holder = holder;
  return absl::OkStatus();
}

void SpaceLedger::ClearSetAside(const std::string& job, uintptr_t holder) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end() || found->second.holder != holder) return;
  Job& entry = found->second;
  held_by_all_ -= entry.Held();
  entry.set_aside = 0;
  entry.holder = 0;
  held_by_all_ += entry.Held();
}

absl::Status SpaceLedger::Reserve(absl::string_view job, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Job& entry = jobs_[std::string(job)];
  Job after = entry;
  after.used += bytes;
  if (absl::Status fits =
          FitsLocked(std::string(job), entry, after.Held(), bytes, "a write");
      !fits.ok()) {
    return fits;
  }
  held_by_all_ = held_by_all_ - entry.Held() + after.Held();
  entry.used = after.used;
  return absl::OkStatus();
}

void SpaceLedger::Charge(absl::string_view job, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Job& entry = jobs_[std::string(job)];
  held_by_all_ -= entry.Held();
  entry.used += bytes;
  held_by_all_ += entry.Held();
}

void SpaceLedger::Release(absl::string_view job, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  // The store gives back only what it was granted.
  LOHAN_CHECK(found != jobs_.end() && found->second.used >= bytes);
  Job& entry = found->second;
  held_by_all_ -= entry.Held();
  entry.used -= bytes;
  held_by_all_ += entry.Held();
  if (!entry.tracked && entry.Held() == 0) jobs_.erase(found);
}

SpaceLedger::JobUsage SpaceLedger::UsageOf(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end()) return {};
  return {.used = found->second.used, .set_aside = found->second.set_aside};
}

std::optional<uid_t> SpaceLedger::OwnerOf(absl::string_view job) const {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end() || !found->second.tracked) return std::nullopt;
  return found->second.owner;
}

uint64_t SpaceLedger::HeldBy(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  return HeldByLocked(uid);
}

uint64_t SpaceLedger::HeldByAll() const {
  absl::MutexLock lock(&mu_);
  return held_by_all_;
}

}  // namespace lohan
