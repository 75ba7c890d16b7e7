// SessionManager: the host pool's claims, shared among the users who train
// by their weights (fair_share.h): a plane takes what is free first (its
// model streamed if need be), and what users took beyond their shares
// of the pool or the SSD array taken back when another user needs its
// share, the newest first: a plane whose model streams asked to move to a
// smaller arena at its next iteration's end (and to grow back once the
// pool has had room for a while), the others closed, each at the end of
// its iteration. The rest of the class is in session_manager.cc.
#include <poll.h>

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/quota/fair_share.h"
#include "daemon/sched/activation_swap.h"
#include "daemon/session/arena_layout.h"
#include "daemon/session/session_manager.h"
#include "layout/byte_size.h"
#include "spdlog/spdlog.h"

namespace lohan {

std::map<uid_t, ShareHolder> SessionManager::PoolHoldersLocked(
    uint64_t& held_by_all) const {
  // Only use earns a share: a user is training (its share kept for it)
  // once one of its planes has begun an iteration; a plane that has not
  // counts only for the memory it holds.
  std::set<uint64_t> training;
  for (const auto& [id, live] : sessions_) {
    if (live.session != nullptr && live.session->HasBegunAnIteration()) {
      training.insert(live.claim_id);
    }
  }
  std::map<uid_t, ShareHolder> holders;
  held_by_all = 0;
  for (const auto& [id, claim] : pool_claims_) {
    ShareHolder& holder = holders[claim.owner];
    holder.held += claim.bytes;
    holder.present = holder.present || training.count(id) != 0;
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
  uint64_t wanted = job.spec().host_pool_bytes();
  // A job asked to shrink opens within what it was asked, until asked to
  // grow.
  if (auto cap = arena_caps_.find(job.id());
      cap != arena_caps_.end() && cap->second.bytes != 0) {
    wanted = std::min(wanted, cap->second.bytes);
  }
  DropStaleReservationsLocked();
  if (std::optional<ArenaClaim> reserved = TakeReservationLocked(job, wanted)) {
    return *reserved;
  }
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

bool SessionManager::AwaitGonePlanesLocked(absl::Duration patience) {
  std::set<uint64_t> gone;  // serials
  for (const auto& [id, live] : sessions_) {
    pollfd hung_up = {.fd = live.connection, .events = POLLRDHUP};
    if (live.session == nullptr ||
        (poll(&hung_up, 1, 0) == 1 &&
         (hung_up.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0)) {
      gone.insert(live.serial);
    }
  }
  if (gone.empty()) return false;
  auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, live] : sessions_) {
      if (gone.count(live.serial) != 0) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&closed), patience);
  return true;
}

namespace {
// How long a claim waits for the plane of a job that closed its own to
// move (its client opens the next one at once).
constexpr absl::Duration kMoveWait = absl::Seconds(30);
}  // namespace

void SessionManager::ReserveForMoveLocked(const std::string& job_id,
                                          uint64_t claim_id, uint64_t asked) {
  PoolClaim& claim = pool_claims_.at(claim_id);
  claim.bytes = std::min(claim.bytes, asked);
  reserved_[job_id] =
      Reservation{.claim_id = claim_id, .until = Now() + kMoveWait};
}

void SessionManager::DropStaleReservationsLocked() {
  const absl::Time now = Now();
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    if (now < it->second.until) {
      ++it;
      continue;
    }
    spdlog::info(
        "job {}: no data plane came within {} of its move; its "
        "reserved arena goes back to the pool",
        it->first, absl::FormatDuration(kMoveWait));
    pool_claims_.erase(it->second.claim_id);
    ActivationSwap(parts_.store, it->first).FreeAll();
    it = reserved_.erase(it);
  }
}

std::optional<SessionManager::ArenaClaim> SessionManager::TakeReservationLocked(
    const v1::Job& job, uint64_t wanted) {
  auto found = reserved_.find(job.id());
  if (found == reserved_.end()) return std::nullopt;
  const uint64_t claim_id = found->second.claim_id;
  reserved_.erase(found);
  PoolClaim& claim = pool_claims_.at(claim_id);
  if (wanted > claim.bytes && job.spec().has_model()) {
    // A grow: as much of it as its owner may still claim.
    const uint64_t room = PoolRoomLocked(claim.owner);
    absl::StatusOr<ArenaChoice> choice =
        ChooseArena(job.spec().model(),
                    ArenaLimit{.bytes = std::min(wanted, claim.bytes + room)});
    if (choice.ok() && choice->arena_bytes > claim.bytes) {
      claim.bytes = choice->arena_bytes;
    }
  }
  return ArenaClaim{
      .claim_id = claim_id, .bytes = claim.bytes, .reserved = true};
}

absl::StatusOr<bool> SessionManager::ReclaimPoolLocked(
    const std::string& job_id, uid_t owner, uint64_t bytes, bool at_once,
    bool shrink_only) {
  DropStaleReservationsLocked();
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
  // The newest first: the ones that came last while nobody else wanted
  // the pool; none within its grace.
  uint64_t needed = held_by_all + bytes - capacity;
  // Each with what its user held, what it is told, and the arena it is
  // asked to shrink to (none: closed).
  struct Taken {
    Candidate c;
    std::string what_for;
    std::optional<uint64_t> shrink_to;
  };
  std::vector<Taken> taken;
  for (const Candidate& c : OthersNewestFirstLocked(owner)) {
    if (needed == 0) break;
    ShareHolder& holder = holders.at(c.uid);
    const uint64_t share = ShareOf(capacity, c.uid, holders);
    if (holder.held <= share) continue;
    const bool in_grace = InGraceLocked(c);
    const uint64_t kept = in_grace ? GraceArenaLocked(c) : 0;
    if (in_grace && c.bytes <= kept) continue;
    std::optional<uint64_t> shrink_to;
    if (!at_once) {
      shrink_to =
          ShrinkTargetLocked(c, std::min(needed, holder.held - share), kept);
    }
    // Within its grace it only shrinks, never below what the grace keeps;
    // for a plane that trains already, others only shrink.
    if (!shrink_to.has_value() && (in_grace || shrink_only)) continue;
    const uint64_t freed = c.bytes - shrink_to.value_or(0);
    taken.push_back(
        {c,
         absl::StrCat("the host pool (uid ", c.uid, "'s data planes held ",
                      FormatByteSize(holder.held), ", beyond its share of ",
                      FormatByteSize(share), "; this job's arena was ",
                      FormatByteSize(c.bytes), ")"),
         shrink_to});
    holder.held -= freed;
    needed -= std::min(needed, freed);
  }
  if (taken.empty()) return false;
  if (absl::Status allowed = ReclaimAllowedLocked(owner, job_id, at_once);
      !allowed.ok()) {
    return allowed;
  }
  for (const auto& [c, what_for, shrink_to] : taken) {
    if (shrink_to.has_value()) {
      AskShrinkLocked(owner, job_id, c, *shrink_to, what_for);
      continue;
    }
    ClosePlaneForLocked(
        owner, job_id, c, at_once, what_for,
        absl::StrCat("its data plane (", FormatByteSize(c.bytes),
                     " of host pool, beyond uid ", c.uid, "'s fair share)"),
        "open it again with a smaller arena (host_pool_bytes), "
        "or when the pool is free");
  }
  return true;
}

void SessionManager::ClosePlaneForLocked(uid_t owner, const std::string& job_id,
                                         const Candidate& c, bool at_once,
                                         absl::string_view what_for,
                                         absl::string_view plane,
                                         absl::string_view advice) {
  Closing closing{
      .reason = ClosingReason::kGaveWay,
      .why = absl::StrCat("lohand closed this job's data plane to give uid ",
                          owner, "'s job ", job_id, " its share of ", what_for),
      .advice = absl::StrCat(
          "open it again (lohan.init(..., resume=True)); lohand does not close "
          "it again for another user's share for ",
          absl::FormatDuration(parts_.reclaim_grace),
          " ([quotas] reclaim_grace)")};
  const std::string how =
      StopSessionLocked(c.job_id, *c.session, !at_once, std::move(closing));
  const std::string why =
      absl::StrCat(plane, " was closed for uid ", owner, "'s job ", job_id,
                   ", within that user's share (", how, "); ", advice);
  spdlog::info("job {}: {}", c.job_id, why);
  parts_.jobs->NoteFailure(c.job_id, absl::ResourceExhaustedError(why));
  NoteReclaimedLocked(owner, c);
  JobShareCounts& counts = share_counts_[c.job_id];
  if (counts.closed_serial != c.serial) {
    counts.closed_serial = c.serial;
    ++counts.counts.planes_closed;
  }
}

absl::Time SessionManager::Now() const {
  return parts_.clock ? parts_.clock() : absl::Now();
}

absl::Status SessionManager::ReclaimAllowedLocked(uid_t owner,
                                                  const std::string& job_id,
                                                  bool at_once) {
  Reclaimer& reclaimer = reclaimers_[owner];
  if (at_once && reclaimer.allowed_for == job_id) return absl::OkStatus();
  const absl::Time now = Now();
  const absl::Time next = reclaimer.last + parts_.reclaim_interval;
  if (parts_.reclaim_interval == absl::ZeroDuration() || now >= next) {
    reclaimer.allowed_for = job_id;
    return absl::OkStatus();
  }
  reclaimer.allowed_for.clear();
  return absl::ResourceExhaustedError(absl::StrCat(
      "lohand takes back from other users for uid ", owner,
      " at most once per ", absl::FormatDuration(parts_.reclaim_interval),
      " ([quotas] reclaim_interval) and last did ",
      absl::FormatDuration(absl::Trunc(now - reclaimer.last, absl::Seconds(1))),
      " ago: job ", job_id, " may take its share back in ",
      absl::FormatDuration(absl::Ceil(next - now, absl::Seconds(1))), " (at ",
      absl::FormatTime(next), "), or gets what is free before"));
}

bool SessionManager::InGraceLocked(const Candidate& c) const {
  auto found = gave_way_.find(c.job_id);
  return found != gave_way_.end() && found->second.serial != c.serial &&
         Now() < found->second.at + parts_.reclaim_grace;
}

uint64_t SessionManager::GraceArenaLocked(const Candidate& c) const {
  auto found = gave_way_.find(c.job_id);
  return found == gave_way_.end() ? 0 : found->second.kept;
}

std::optional<uint64_t> SessionManager::ShrinkTargetLocked(
    const Candidate& c, uint64_t give, uint64_t keep) const {
  const LiveSession& live = sessions_.at(c.job_id);
  if (!live.model.has_value() || !c.session->registered()) return std::nullopt;
  const uint64_t floor = std::max(SmallestArena(*live.model), keep);
  const uint64_t limit = std::max(c.bytes > give ? c.bytes - give : 0, floor);
  absl::StatusOr<ArenaChoice> choice =
      ChooseArena(*live.model, ArenaLimit{.bytes = limit});
  if (!choice.ok() || choice->arena_bytes >= c.bytes ||
      choice->arena_bytes < keep) {
    return std::nullopt;
  }
  return choice->arena_bytes;
}

void SessionManager::AskShrinkLocked(uid_t owner, const std::string& job_id,
                                     const Candidate& c, uint64_t target,
                                     absl::string_view what_for) {
  LiveSession& live = sessions_.at(c.job_id);
  live.arena_asked = target;
  live.room_since = absl::InfiniteFuture();
  const std::string why = absl::StrCat(
      "asked to shrink from ", FormatByteSize(c.bytes), " to ",
      FormatByteSize(target), " of host pool at ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", Now(), absl::LocalTimeZone()),
      " to give uid ", owner, "'s job ", job_id, " its share of ", what_for);
  arena_caps_[c.job_id] = ArenaCap{.bytes = target, .at = Now(), .why = why};
  spdlog::info("job {}: {}", c.job_id, why);
  NoteReclaimedLocked(owner, c, target);
  ++share_counts_[c.job_id].counts.shrink_asks;
}

uint64_t SessionManager::ArenaAsked(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto found = sessions_.find(job_id);
  if (found == sessions_.end() || found->second.session == nullptr) return 0;
  LiveSession& live = found->second;
  if (live.arena_asked != 0) return live.arena_asked;
  return GrowAskLocked(job_id, live);
}

uint64_t SessionManager::GrowAskLocked(const std::string& job_id,
                                       LiveSession& live) {
  auto claim = pool_claims_.find(live.claim_id);
  if (!live.model.has_value() || claim == pool_claims_.end() ||
      claim->second.bytes >= live.wanted_arena_bytes) {
    return 0;
  }
  const absl::Time now = Now();
  auto cap = arena_caps_.find(job_id);
  if (cap != arena_caps_.end() && now < cap->second.at + parts_.regrow_after) {
    return 0;  // damped: not soon after a shrink
  }
  const uint64_t held = claim->second.bytes;
  const uint64_t room = PoolRoomLocked(claim->second.owner);
  absl::StatusOr<ArenaChoice> choice = ChooseArena(
      *live.model,
      ArenaLimit{.bytes = std::min(live.wanted_arena_bytes, held + room)});
  if (!choice.ok() || choice->arena_bytes <= held) {
    live.room_since = absl::InfiniteFuture();
    TakeBackForUseLocked(job_id, live, held, claim->second.owner);
    return 0;
  }
  if (live.room_since == absl::InfiniteFuture()) live.room_since = now;
  if (now < live.room_since + parts_.regrow_after) return 0;
  live.arena_asked = choice->arena_bytes;
  const bool whole = choice->arena_bytes >= live.wanted_arena_bytes;
  const std::string why = absl::StrCat(
      "asked to grow from ", FormatByteSize(held), " to ",
      FormatByteSize(choice->arena_bytes), " of host pool at ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S", now, absl::LocalTimeZone()),
      whole ? " (its whole arena)" : "", ": the pool has had room for it for ",
      absl::FormatDuration(now - live.room_since));
  arena_caps_[job_id] =
      ArenaCap{.bytes = whole ? 0 : choice->arena_bytes, .at = now, .why = why};
  spdlog::info("job {}: {}", job_id, why);
  ++share_counts_[job_id].counts.grow_asks;
  return live.arena_asked;
}

void SessionManager::TakeBackForUseLocked(const std::string& job_id,
                                          const LiveSession& live,
                                          uint64_t held, uid_t owner) {
  if (!live.session->HasBegunAnIteration()) return;  // only use earns it
  uint64_t held_by_all = 0;
  std::map<uid_t, ShareHolder> holders = PoolHoldersLocked(held_by_all);
  ShareHolder& mine = holders[owner];
  mine.weight = static_cast<double>(parts_.quotas->For(owner).weight);
  mine.present = true;
  const uint64_t share =
      ShareOf(parts_.pool->GetStats().capacity_bytes, owner, holders);
  const uint64_t others_of_mine = mine.held - held;
  const uint64_t may_hold = share > others_of_mine ? share - others_of_mine : 0;
  absl::StatusOr<ArenaChoice> within_share = ChooseArena(
      *live.model,
      ArenaLimit{.bytes = std::min(live.wanted_arena_bytes, may_hold)});
  if (!within_share.ok() || within_share->arena_bytes <= held) return;
  // Others hold beyond their shares what this job's share needs: they are
  // asked to shrink (or closed), rate-limited as any taking-back; this job
  // grows once the room is there (regrow_after later).
  absl::StatusOr<bool> asked =
      ReclaimPoolLocked(job_id, owner, within_share->arena_bytes - held,
                        /*at_once=*/false, /*shrink_only=*/true);
  if (asked.ok() && *asked) {
    spdlog::info(
        "job {}: training below its share of the host pool ({} of "
        "{}): took back from other users what it would use",
        job_id, FormatByteSize(held),
        FormatByteSize(within_share->arena_bytes));
  }
}

void SessionManager::NoteReclaimedLocked(uid_t owner, const Candidate& c,
                                         uint64_t kept) {
  const absl::Time now = Now();
  reclaimers_[owner].last = now;
  for (auto it = gave_way_.begin(); it != gave_way_.end();) {
    it = now >= it->second.at + parts_.reclaim_grace ? gave_way_.erase(it)
                                                     : std::next(it);
  }
  if (parts_.reclaim_grace > absl::ZeroDuration()) {
    gave_way_[c.job_id] = GaveWay{.at = now, .serial = c.serial, .kept = kept};
  }
}

std::map<std::string, SessionManager::ShareCounts>
SessionManager::ShareCountsByJob() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, ShareCounts> by_job;
  for (const auto& [job_id, counted] : share_counts_) {
    by_job.emplace(job_id, counted.counts);
  }
  return by_job;
}

void SessionManager::ForgetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  share_counts_.erase(job_id);
  arena_caps_.erase(job_id);
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

absl::Status SessionManager::ReclaimSsd(uid_t for_uid,
                                        const std::string& job_id,
                                        const std::map<uid_t, uint64_t>& beyond,
                                        bool at_once) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || parts_.ledger == nullptr) return absl::OkStatus();
  std::map<uid_t, uint64_t> left = beyond;
  // Each with what it is told and what closing it gives back.
  struct Closed {
    Candidate c;
    std::string what_for;
    SpaceLedger::JobUsage usage;
  };
  std::vector<Closed> closing;
  for (const Candidate& c : OthersNewestFirstLocked(for_uid)) {
    auto over = left.find(c.uid);
    if (over == left.end() || over->second == 0 || InGraceLocked(c)) continue;
    // What closing it gives back: its swapped activations and the part of
    // its set-aside its states do not fill.
    const SpaceLedger::JobUsage usage = parts_.ledger->UsageOf(c.job_id);
    // A training job whose swapped activations cover what its user holds
    // beyond its share keeps its plane: it may swap no more beyond its
    // share while the set-aside waits (its next ones stay in its host
    // memory), and those it holds come back as its iterations free them.
    // Closed only if they have not by half the wait (`at_once`).
    if (!at_once && c.session->HasBegunAnIteration() &&
        usage.activations >= over->second) {
      spdlog::info(
          "job {}: swaps no more beyond uid {}'s share of the SSD array while "
          "uid {}'s job {} waits for its share; its {} of swapped "
          "activations come back as its iterations free them",
          c.job_id, c.uid, for_uid, job_id, FormatByteSize(usage.activations));
      over->second = 0;
      continue;
    }
    const uint64_t freed =
        usage.activations +
        (usage.set_aside > usage.used ? usage.set_aside - usage.used : 0);
    if (freed == 0) continue;
    closing.push_back(
        {c,
         absl::StrCat("the SSD array (uid ", c.uid, " held ",
                      FormatByteSize(over->second),
                      " beyond its share; closing this job gives back ",
                      FormatByteSize(freed),
                      ": its swapped activations, which are gone, and the "
                      "unused part of its set-aside)"),
         usage});
    over->second -= std::min(over->second, freed);
  }
  if (closing.empty()) return absl::OkStatus();
  if (absl::Status allowed = ReclaimAllowedLocked(for_uid, job_id, at_once);
      !allowed.ok()) {
    spdlog::info("job {}: SSD space not taken back: {}", job_id,
                 std::string(allowed.message()));
    return allowed;
  }
  for (const Closed& closed : closing) {
    ClosePlaneForLocked(
        for_uid, job_id, closed.c, at_once, closed.what_for, "its data plane",
        absl::StrCat("of the SSD array: uid ", closed.c.uid,
                     " held more than its share, beyond its fair share; its "
                     "swapped activations, ",
                     FormatByteSize(closed.usage.activations),
                     ", are gone; open it again: it gets its share"));
  }
  return absl::OkStatus();
}

}  // namespace lohan
