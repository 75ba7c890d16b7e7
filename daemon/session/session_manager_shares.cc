// SessionManager: the host pool's claims, shared among the users who train
// by their weights (fair_share.h): a plane takes what is free first (its
// model streamed if need be), and what users took beyond their shares
// of the pool or the SSD array taken back when another user needs its
// share: their data planes closed, the newest first, each at the end of its
// iteration. The rest of the class is in session_manager.cc.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/common/byte_size.h"
#include "daemon/quota/fair_share.h"
#include "daemon/session/arena_layout.h"
#include "daemon/session/session_manager.h"
#include "spdlog/spdlog.h"

namespace lohan {

std::map<uid_t, ShareHolder> SessionManager::PoolHoldersLocked(
    uint64_t& held_by_all) const {
  std::map<uid_t, ShareHolder> holders;
  held_by_all = 0;
  for (const auto& [id, claim] : pool_claims_) {
    ShareHolder& holder = holders[claim.owner];
    holder.held += claim.bytes;
    holder.present = true;
    held_by_all += claim.bytes;
  }
  for (auto& [uid, holder] : holders) {
    holder.weight = static_cast<double>(parts_.quotas->For(uid).weight);
  }
  return holders;
}

absl::Status SessionManager::PoolClaimRefusalLocked(const std::string& job_id,
                                                    uid_t owner,
                                                    uint64_t bytes) const {
  const uint64_t limit = parts_.quotas->For(owner).host_pool_bytes;
  uint64_t held_by_all = 0;
  std::map<uid_t, ShareHolder> holders = PoolHoldersLocked(held_by_all);
  const uint64_t held = holders.count(owner) ? holders.at(owner).held : 0;
  if (limit != 0 && held + bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id, "'s arena needs ", bytes, " bytes (",
        FormatByteSize(bytes), ") of host pool; uid ", owner, " holds ", held,
        " (", FormatByteSize(held), ") in open data planes and the quota is ",
        limit, " (", FormatByteSize(limit),
        ", [quotas] host_pool); close another data plane first"));
  }
  // What is free, but never what another training user's share still has
  // free.
  holders[owner].weight = static_cast<double>(parts_.quotas->For(owner).weight);
  return FitsFairShare(parts_.pool->GetStats().capacity_bytes, held_by_all,
                       owner, bytes, holders,
                       absl::StrCat("job ", job_id, "'s arena"), "host pool");
}

absl::StatusOr<uint64_t> SessionManager::ClaimPoolLocked(
    const std::string& job_id, uid_t owner, uint64_t bytes) {
  if (absl::Status refused = PoolClaimRefusalLocked(job_id, owner, bytes);
      !refused.ok()) {
    return refused;
  }
  const uint64_t id = ++last_claim_;
  pool_claims_[id] = PoolClaim{.owner = owner, .bytes = bytes};
  return id;
}

uint64_t SessionManager::PoolRoomLocked(uid_t owner) const {
  uint64_t held_by_all = 0;
  std::map<uid_t, ShareHolder> holders = PoolHoldersLocked(held_by_all);
  holders[owner].weight = static_cast<double>(parts_.quotas->For(owner).weight);
  uint64_t room = FairShareRoom(parts_.pool->GetStats().capacity_bytes,
                                held_by_all, owner, holders);
  const uint64_t limit = parts_.quotas->For(owner).host_pool_bytes;
  const uint64_t held = holders.at(owner).held;
  if (limit != 0) room = std::min(room, limit > held ? limit - held : 0);
  return room;
}

uint64_t SessionManager::ArenaFloor(const v1::Job& job) {
  const uint64_t wanted = job.spec().host_pool_bytes();
  if (!job.spec().has_model()) return wanted;
  return std::min(wanted, SmallestArena(job.spec().model()));
}

absl::StatusOr<SessionManager::ArenaClaim> SessionManager::ClaimArenaLocked(
    const v1::Job& job) {
  const uid_t owner = job.owner_uid();
  const uint64_t wanted = job.spec().host_pool_bytes();
  absl::StatusOr<uint64_t> whole = ClaimPoolLocked(job.id(), owner, wanted);
  if (whole.ok()) return ArenaClaim{.claim_id = *whole, .bytes = wanted};
  if (!absl::IsResourceExhausted(whole.status()) || !job.spec().has_model()) {
    return whole.status();
  }
  // What is free for it, laid out as RegisterModel will (ARENA_FIT_MOST:
  // resident if it fits, else the most shared buffers that do).
  const uint64_t room = std::min(wanted, PoolRoomLocked(owner));
  absl::StatusOr<ArenaChoice> choice =
      ChooseArena(job.spec().model(), ArenaLimit{.bytes = room});
  if (room == 0 || !choice.ok() || choice->arena_bytes > room) {
    return whole.status();
  }
  absl::StatusOr<uint64_t> smaller =
      ClaimPoolLocked(job.id(), owner, choice->arena_bytes);
  if (!smaller.ok()) return whole.status();
  return ArenaClaim{.claim_id = *smaller, .bytes = choice->arena_bytes};
}

bool SessionManager::ReclaimPoolLocked(const std::string& job_id, uid_t owner,
                                       uint64_t bytes, bool at_once) {
  const uint64_t capacity = parts_.pool->GetStats().capacity_bytes;
  uint64_t held_by_all = 0;
  std::map<uid_t, ShareHolder> holders = PoolHoldersLocked(held_by_all);
  ShareHolder& requester = holders[owner];
  const uint64_t limit = parts_.quotas->For(owner).host_pool_bytes;
  if (limit != 0 && requester.held + bytes > limit) return false;
  requester.weight = static_cast<double>(parts_.quotas->For(owner).weight);
  requester.present = true;  // it is about to train
  if (requester.held + bytes > ShareOf(capacity, owner, holders) ||
      held_by_all + bytes <= capacity) {
    return false;  // beyond its own share, or not for want of room
  }
  uint64_t needed = held_by_all + bytes - capacity;
  bool asked = false;
  // The newest first: the ones that came last while nobody else wanted
  // the pool.
  for (const Candidate& c : OthersNewestFirstLocked(owner)) {
    if (needed == 0) break;
    ShareHolder& holder = holders.at(c.uid);
    const uint64_t share = ShareOf(capacity, c.uid, holders);
    if (holder.held <= share) continue;
    Closing closing{
        .reason = ClosingReason::kGaveWay,
        .why = absl::StrCat(
            "lohand closed this job's data plane to give uid ", owner,
            "'s job ", job_id, " its share of the host pool (uid ", c.uid,
            "'s data planes held ", FormatByteSize(holder.held),
            ", beyond its share of ", FormatByteSize(share),
            "; this job's arena was ", FormatByteSize(c.bytes), ")"),
        .advice =
            "open it again (lohan.init(..., resume=True)) when the "
            "pool has room, or with a smaller arena"};
    const std::string how =
        StopSessionLocked(c.job_id, *c.session, !at_once, std::move(closing));
    const std::string why = absl::StrCat(
        "its data plane (", FormatByteSize(c.bytes),
        " of host pool, beyond uid ", c.uid,
        "'s fair share) was closed for uid ", owner, "'s job ", job_id,
        ", within that user's share (", how,
        "); open it again with a smaller arena (host_pool_bytes), or when "
        "the pool is free");
    spdlog::info("job {}: {}", c.job_id, why);
    parts_.jobs->NoteFailure(c.job_id, absl::ResourceExhaustedError(why));
    holder.held -= c.bytes;
    needed -= std::min(needed, c.bytes);
    asked = true;
  }
  return asked;
}

std::vector<SessionManager::Candidate> SessionManager::OthersNewestFirstLocked(
    uid_t owner) const {
  std::vector<Candidate> candidates;
  for (const auto& [id, live] : sessions_) {
    auto claim = pool_claims_.find(live.claim_id);
    if (live.session == nullptr || claim == pool_claims_.end() ||
        claim->second.owner == owner) {
      continue;
    }
    candidates.push_back({live.serial, id, live.session, claim->second.owner,
                          claim->second.bytes});
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              return a.serial > b.serial;
            });
  return candidates;
}

void SessionManager::ReclaimSsd(uid_t for_uid, const std::string& job_id,
                                const std::map<uid_t, uint64_t>& beyond,
                                bool at_once) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || parts_.ledger == nullptr) return;
  std::map<uid_t, uint64_t> left = beyond;
  for (const Candidate& c : OthersNewestFirstLocked(for_uid)) {
    auto over = left.find(c.uid);
    if (over == left.end() || over->second == 0) continue;
    // What closing it gives back: its swapped activations and the part of
    // its set-aside its states do not fill.
    const SpaceLedger::JobUsage usage = parts_.ledger->UsageOf(c.job_id);
    const uint64_t freed =
        usage.activations +
        (usage.set_aside > usage.used ? usage.set_aside - usage.used : 0);
    if (freed == 0) continue;
    Closing closing{
        .reason = ClosingReason::kGaveWay,
        .why = absl::StrCat(
            "lohand closed this job's data plane to give uid ", for_uid,
            "'s job ", job_id, " its share of the SSD array (uid ", c.uid,
            " held ", FormatByteSize(over->second),
            " beyond its share; closing this job gives back ",
            FormatByteSize(freed),
            ": its swapped activations, which are gone, and the unused part "
            "of its set-aside)"),
        .advice =
            "open it again (lohan.init(..., resume=True)): it gets its "
            "share of the array"};
    const std::string how =
        StopSessionLocked(c.job_id, *c.session, !at_once, std::move(closing));
    const std::string why = absl::StrCat(
        "its data plane was closed for uid ", for_uid, "'s job ", job_id,
        ", within that user's share of the SSD array: uid ", c.uid, " held ",
        FormatByteSize(over->second), " beyond its fair share (", how,
        "; its swapped activations, ", FormatByteSize(usage.activations),
        ", are gone); open it again: it gets its share");
    spdlog::info("job {}: {}", c.job_id, why);
    parts_.jobs->NoteFailure(c.job_id, absl::ResourceExhaustedError(why));
    over->second -= std::min(over->second, freed);
  }
}

}  // namespace lohan
