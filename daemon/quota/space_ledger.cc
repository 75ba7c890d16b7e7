#include "daemon/quota/space_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"
#include "layout/byte_size.h"

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
  // Versions a reader still holds.
  UpdateLocked(found->second, Job{.used = found->second.used,
                                  .activations = found->second.activations});
  if (found->second.Held() == 0) jobs_.erase(found);
}

uint64_t SpaceLedger::HeldByLocked(uid_t uid) const {
  uint64_t held = 0;
  for (const auto& [name, job] : jobs_) {
    if (job.tracked && job.owner == uid) held += job.Held();
  }
  return held;
}

std::map<uid_t, ShareHolder> SpaceLedger::HoldersLocked() const {
  std::map<uid_t, ShareHolder> holders;
  for (const auto& [name, job] : jobs_) {
    if (!job.tracked) continue;
    ShareHolder& h = holders[job.owner];
    h.held += job.Held();
  }
  for (const auto& [uid, planes] : present_) {
    if (planes > 0) holders[uid].present = true;
  }
  for (auto& [uid, holder] : holders) {
    holder.weight = static_cast<double>(quotas_->For(uid).weight);
  }
  return holders;
}

bool SpaceLedger::WithinShareLocked(uid_t uid, uint64_t more) const {
  const std::map<uid_t, ShareHolder> holders = HoldersLocked();
  return HeldByLocked(uid) + more <= ShareOf(capacity_bytes_, uid, holders);
}

bool SpaceLedger::OthersOverShareLocked(uid_t uid) const {
  return !BeyondSharesLocked(uid).empty();
}

std::map<uid_t, uint64_t> SpaceLedger::BeyondSharesLocked(uid_t uid) const {
  const std::map<uid_t, ShareHolder> holders = HoldersLocked();
  std::map<uid_t, uint64_t> beyond;
  for (const auto& [other, holder] : holders) {
    const uint64_t share = ShareOf(capacity_bytes_, other, holders);
    if (other != uid && holder.held > share) {
      beyond[other] = holder.held - share;
    }
  }
  return beyond;
}

void SpaceLedger::SetReclaimer(Reclaimer reclaimer) {
  absl::MutexLock lock(&reclaimer_mu_);
  reclaimer_ = std::move(reclaimer);
}

void SpaceLedger::SetEndedJobs(EndedJobs ended) {
  absl::MutexLock lock(&ended_mu_);
  ended_jobs_ = std::move(ended);
}

bool SpaceLedger::PastOwnLimit(const Job& job, uint64_t held_after) {
  return job.tracked && job.limit != 0 && held_after > job.limit;
}

absl::Status SpaceLedger::WithEndedJobs(uid_t owner, absl::string_view asking,
                                        absl::Status refusal) {
  std::vector<EndedJob> ended;
  {
    absl::MutexLock lock(&ended_mu_);
    if (!ended_jobs_) return refusal;
    ended = ended_jobs_(owner);
  }
  std::vector<std::pair<uint64_t, const EndedJob*>> holding;
  uint64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const EndedJob& one : ended) {
      if (one.id == asking) continue;
      auto found = jobs_.find(one.id);
      // The owner's own only (whatever the lister said), and none with a
      // set-aside: its data plane is open.
      if (found == jobs_.end() || !found->second.tracked ||
          found->second.owner != owner || found->second.holder != 0) {
        continue;
      }
      const uint64_t held = found->second.Held();
      if (held == 0) continue;
      holding.emplace_back(held, &one);
      total += held;
    }
  }
  if (holding.empty()) return refusal;
  std::sort(holding.begin(), holding.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->id < b.second->id;
  });
  std::string note =
      absl::StrCat("; uid ", owner, "'s jobs that no process is attached to",
                   " hold ", FormatByteSize(total), ": ");
  uint64_t rest = 0;
  for (size_t i = 0; i < holding.size(); ++i) {
    const auto& [held, job] = holding[i];
    if (i >= kEndedJobsNamed) {
      rest += held;
      continue;
    }
    absl::StrAppend(&note, i == 0 ? "" : ", ", job->id, " '", job->name, "' ",
                    FormatByteSize(held));
  }
  if (holding.size() > kEndedJobsNamed) {
    absl::StrAppend(&note, " and ", holding.size() - kEndedJobsNamed, " more (",
                    FormatByteSize(rest), ")");
  }
  absl::StrAppend(&note,
                  "; delete those no longer needed ('lohanctl jobs delete "
                  "ID'; 'lohanctl jobs' shows when lohand deletes each on "
                  "its own)");
  return absl::Status(refusal.code(), absl::StrCat(refusal.message(), note));
}

absl::Status SpaceLedger::NoRoom(absl::string_view job, absl::Status refusal) {
  const std::optional<uid_t> owner = OwnerOf(job);
  if (!owner.has_value()) return refusal;
  return WithEndedJobs(*owner, job, std::move(refusal));
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
  // The most the fair share lets it take: what leaves the other training
  // users' shares free, or what is left of its own share (bisected: the
  // rule is monotone in the bytes asked).
  const std::map<uid_t, ShareHolder> holders = HoldersLocked();
  uint64_t low = 0, high = room;
  while (low < high) {
    const uint64_t mid = low + (high - low + 1) / 2;
    if (FitsFairShare(capacity_bytes_, held_by_all_, job.owner, mid, holders,
                      "", "")
            .ok()) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

absl::Status SpaceLedger::OwnLimitsLocked(const std::string& name,
                                          const Job& job, uint64_t held_after,
                                          uint64_t needed,
                                          const char* what) const {
  const uint64_t held = job.Held();
  if (held_after <= held || !job.tracked) return absl::OkStatus();
  const uint64_t more = held_after - held;
  if (job.limit != 0 && held_after > job.limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
        ", the job holds ", Bytes(held), " and its limit is ", Bytes(job.limit),
        " (CreateJob ssd_bytes; free some, e.g. swapped activations, or "
        "create the job with more)"));
  }
  const uint64_t quota = quotas_->For(job.owner).ssd_bytes;
  const uint64_t user_held = HeldByLocked(job.owner);
  if (quota != 0 && user_held + more > quota) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
        ", its owner (uid ", job.owner, ") holds ", Bytes(user_held),
        " over all their jobs and the quota is ", Bytes(quota),
        " ([quotas] ssd in lohand.toml; delete a job you no longer need "
        "with 'lohanctl jobs delete ID')"));
  }
  return absl::OkStatus();
}

absl::Status SpaceLedger::FitsLocked(const std::string& name, const Job& job,
                                     uint64_t held_after, uint64_t needed,
                                     const char* what) const {
  if (absl::Status own = OwnLimitsLocked(name, job, held_after, needed, what);
      !own.ok()) {
    return own;
  }
  const uint64_t held = job.Held();
  if (held_after <= held) return absl::OkStatus();
  const uint64_t more = held_after - held;
  if (held_by_all_ + more > capacity_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SSD space for job ", name, ": ", what, " needs ", Bytes(needed),
        " but the SSD array is full: jobs hold ", Bytes(held_by_all_),
        " of its ", Bytes(capacity_bytes_),
        " (running jobs' updates set aside included); space comes back as "
        "jobs end or are deleted"));
  }
  if (job.tracked) {
    if (absl::Status fair = FitsFairShare(
            capacity_bytes_, held_by_all_, job.owner, more, HoldersLocked(),
            absl::StrCat("SSD space for job ", name, ": ", what), "SSD array");
        !fair.ok()) {
      return fair;
    }
  }
  return absl::OkStatus();
}

void SpaceLedger::UpdateLocked(Job& job, const Job& after) {
  held_by_all_ = held_by_all_ - job.Held() + after.Held();
  const bool gave_back = after.Held() < job.Held();
  job = after;
  if (gave_back) released_.SignalAll();
}

void SpaceLedger::SetPresent(uid_t uid, bool present) {
  absl::MutexLock lock(&mu_);
  int& planes = present_[uid];
  planes += present ? 1 : -1;
  if (planes <= 0) present_.erase(uid);
  released_.SignalAll();  // shares changed
}

uint8_t SpaceLedger::AccountOf(absl::string_view name) const {
  return name.rfind("act.", 0) == 0 ? kActivations : kStates;
}

absl::Status SpaceLedger::SetAside(const std::string& job, uint64_t bytes,
                                   uintptr_t holder, absl::Duration patience) {
  absl::Status status = TrySetAside(job, bytes, holder, patience);
  if (!absl::IsResourceExhausted(status)) return status;
  std::optional<uid_t> owner;
  {
    absl::MutexLock lock(&mu_);
    auto found = jobs_.find(job);
    if (found != jobs_.end() && found->second.tracked) {
      Job after = found->second;
      after.set_aside = bytes;
      if (!PastOwnLimit(found->second, after.Held())) {
        owner = found->second.owner;
      }
    }
  }
  return owner.has_value() ? WithEndedJobs(*owner, job, std::move(status))
                           : status;
}

absl::Status SpaceLedger::TrySetAside(const std::string& job, uint64_t bytes,
                                      uintptr_t holder,
                                      absl::Duration patience) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + patience;
  const absl::Time at_once_after = absl::Now() + patience / 2;
  // Reclaims asked: none yet, at the end of their iterations, at once.
  int reclaims = patience == absl::ZeroDuration() ? 2 : 0;
  absl::Status refused;  // by the reclaimer: nothing may be taken back
  while (true) {
    Job& entry = jobs_[job];
    Job after = entry;
    after.set_aside = bytes;
    absl::Status fits =
        FitsLocked(job, entry, after.Held(), bytes, "the updates of its model");
    if (fits.ok()) {
      after.holder = holder;
      UpdateLocked(entry, after);
      return absl::OkStatus();
    }
    // Worth waiting only for space others hold beyond their shares: they
    // may take no more meanwhile, and their activations come back as their
    // iterations end.
    const bool waiting_helps =
        absl::IsResourceExhausted(fits) && entry.tracked &&
        OwnLimitsLocked(job, entry, after.Held(), bytes, "").ok() &&
        WithinShareLocked(
            entry.owner, after.Held() - std::min(after.Held(), entry.Held())) &&
        OthersOverShareLocked(entry.owner);
    if (waiting_helps &&
        (reclaims == 0 || (reclaims == 1 && absl::Now() >= at_once_after))) {
      // Those beyond their shares are asked to give it back (at the end of
      // their iterations, then at once), and the set-aside tried again.
      const bool at_once = reclaims == 1;
      ++reclaims;
      const uid_t owner = entry.owner;
      const std::map<uid_t, uint64_t> beyond = BeyondSharesLocked(owner);
      mu_.Unlock();
      absl::Status asked;
      {
        absl::MutexLock reclaiming(&reclaimer_mu_);
        if (reclaimer_) asked = reclaimer_(owner, job, beyond, at_once);
      }
      mu_.Lock();
      if (asked.ok()) continue;
      // Nothing may be taken back now: waiting would not help.
      refused = absl::ResourceExhaustedError(
          absl::StrCat(fits.message(), "; ", asked.message()));
    }
    bool timed_out = !waiting_helps || !refused.ok();
    if (waiting_helps && refused.ok()) {
      ++waiting_;
      timed_out = released_.WaitWithDeadline(
          &mu_, reclaims == 1 ? at_once_after : deadline);
      --waiting_;
      if (timed_out && reclaims == 1) continue;  // the second reclaim
    }
    if (timed_out) {
      Job& now = jobs_[job];
      if (now.used == 0 && now.set_aside == 0 && now.activations == 0 &&
          !now.tracked) {
        jobs_.erase(job);
      }
      if (!refused.ok()) return refused;
      if (waiting_helps) {
        return absl::Status(
            fits.code(),
            absl::StrCat(fits.message(), " (waited ",
                         absl::FormatDuration(patience), " for it)"));
      }
      return fits;
    }
  }
}

void SpaceLedger::ClearSetAside(const std::string& job, uintptr_t holder) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end() || found->second.holder != holder) return;
  Job after = found->second;
  after.set_aside = 0;
  after.holder = 0;
  UpdateLocked(found->second, after);
}

absl::Status SpaceLedger::Reserve(absl::string_view job, uint8_t account,
                                  uint64_t bytes) {
  absl::Status fits;
  std::optional<uid_t> owner;  // whose ended jobs the refusal names
  {
    absl::MutexLock lock(&mu_);
    Job& entry = jobs_[std::string(job)];
    Job after = entry;
    (account == kActivations ? after.activations : after.used) += bytes;
    fits = FitsLocked(
        std::string(job), entry, after.Held(), bytes,
        account == kActivations ? "a swapped activation" : "a write");
    if (fits.ok()) {
      UpdateLocked(entry, after);
      return absl::OkStatus();
    }
    if (entry.tracked && !PastOwnLimit(entry, after.Held())) {
      owner = entry.owner;
    }
  }
  return owner.has_value() ? WithEndedJobs(*owner, job, std::move(fits)) : fits;
}

void SpaceLedger::Charge(absl::string_view job, uint8_t account,
                         uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Job& entry = jobs_[std::string(job)];
  Job after = entry;
  (account == kActivations ? after.activations : after.used) += bytes;
  UpdateLocked(entry, after);
}

void SpaceLedger::Release(absl::string_view job, uint8_t account,
                          uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  // The store gives back only what it was granted.
  LOHAN_CHECK(found != jobs_.end());
  Job after = found->second;
  uint64_t& counted = account == kActivations ? after.activations : after.used;
  LOHAN_CHECK(counted >= bytes);
  counted -= bytes;
  UpdateLocked(found->second, after);
  if (!after.tracked && after.Held() == 0) jobs_.erase(found);
}

SpaceLedger::JobUsage SpaceLedger::UsageOf(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job);
  if (found == jobs_.end()) return {};
  return {.used = found->second.used,
          .set_aside = found->second.set_aside,
          .activations = found->second.activations};
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

size_t SpaceLedger::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

uint64_t SpaceLedger::HeldByAll() const {
  absl::MutexLock lock(&mu_);
  return held_by_all_;
}

}  // namespace lohan
