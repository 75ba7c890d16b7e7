#ifndef LOHAN_DAEMON_QUOTA_SPACE_LEDGER_H_
#define LOHAN_DAEMON_QUOTA_SPACE_LEDGER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/quota/fair_share.h"
#include "daemon/quota/user_limits.h"
#include "daemon/store/space_budget.h"

namespace lohan {

// Who holds how much of the SSD array, and who may take more: the store's
// SpaceBudget for the daemon.
//
// A job holds max(used, set aside) + activations: `used` is the space its
// optimizer states' versions take now (its meta, chunk states, 16-bit
// copies, streamed gradients); `set aside` is what a job with an open data
// plane needs to run its updates, claimed when it registers its model and
// kept for it until the data plane closes; `activations` are its swapped
// activations (tensors "act.*", account kActivations), never inside the
// set-aside: a job's growing activations cannot eat the space its own
// updates need. A state write within the set-aside always succeeds,
// whatever anyone does; any other write, and a set-aside, must fit (1) the
// job's own limit (CreateJob's ssd_bytes, when not 0), (2) its owner's
// quota (UserLimits.ssd_bytes), and (3) its owner's fair share of the array
// (fair_share.h): what is free, but never what another training user's
// share (users with an open data plane, SetPresent) still has free.
//
// A job the ledger was not told about (Track) counts against the array
// alone. A refusal that the owner's own holdings stand behind (its quota,
// the array, its fair share: not the job's own limit) names the owner's
// ended jobs that hold space (SetEndedJobs). Thread-safe; never calls into
// the store.
class SpaceLedger : public SpaceBudget {
 public:
  // REQUIRES: `quotas` outlives the ledger.
  SpaceLedger(uint64_t capacity_bytes, const QuotaTable* quotas);

  // `job` belongs to `owner`; `job_limit` is its own cap (0: none).
  void Track(const std::string& job, uid_t owner, uint64_t job_limit)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a deleted job (its space is given back by the store).
  void Forget(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets aside `bytes` for the job on behalf of `holder` (a token unique
  // among live holders, e.g. the session's address), replacing what it had
  // set aside, or RESOURCE_EXHAUSTED naming the limit it would pass, with
  // the numbers (needed, held, limit), and changes nothing. When only space
  // that other users hold beyond their shares stands in the way (their
  // swapped activations, freed as their iterations end; meanwhile they may
  // take no more), it waits up to `patience` for it.
  absl::Status SetAside(const std::string& job, uint64_t bytes,
                        uintptr_t holder,
                        absl::Duration patience = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);

  // `uid` starts (true) or stops (false) training: a data plane of one of
  // its jobs opens or closes. A user with any open is present: its fair
  // share is kept for it.
  void SetPresent(uid_t uid, bool present) ABSL_LOCKS_EXCLUDED(mu_);

  // The accounts of a job's versions (SpaceBudget::AccountOf).
  static constexpr uint8_t kStates = 0;
  static constexpr uint8_t kActivations = 1;
  // Gives the set-aside back if `holder` still holds it (a newer session of
  // the job may have set aside its own since).
  void ClearSetAside(const std::string& job, uintptr_t holder)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct JobUsage {
    uint64_t used = 0;  // optimizer states' versions
    uint64_t set_aside = 0;
    uint64_t activations = 0;
  };
  JobUsage UsageOf(const std::string& job) const ABSL_LOCKS_EXCLUDED(mu_);
  // The owner Track gave `job`, if any.
  std::optional<uid_t> OwnerOf(absl::string_view job) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What `uid`'s jobs hold (max of used and set aside, summed).
  uint64_t HeldBy(uid_t uid) const ABSL_LOCKS_EXCLUDED(mu_);
  // What every job holds.
  uint64_t HeldByAll() const ABSL_LOCKS_EXCLUDED(mu_);
  // How much more `job` may come to hold now: the least of what its own
  // limit, its owner's quota and its owner's fair share of the array leave
  // beside what is held (the array's alone for a job not tracked). What the
  // planner may put of the job's activations on the SSDs.
  uint64_t RoomFor(const std::string& job) const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  // Set-asides waiting for space now (SetAside's patience).
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

  // Told, when a set-aside of `job` (owned by `for_uid`) starts waiting for
  // space other users hold beyond their shares, what each of them holds
  // beyond its share: the daemon then closes their data planes, whose
  // swapped activations and set-asides come back, each at the end of its
  // iteration; told again (`at_once`) if half the patience passed without
  // room: close them now, their iterations rolled back. Called without
  // the ledger's lock, at most twice per SetAside; must not call SetAside.
  // A refusal (nothing may be taken back now: lohand's reclaim_interval)
  // ends the wait: SetAside is refused at once, with that reason.
  using Reclaimer = std::function<absl::Status(
      uid_t for_uid, const std::string& job,
      const std::map<uid_t, uint64_t>& beyond_share, bool at_once)>;
  // Replaces the reclaimer (empty: none). A call under way finishes first.
  void SetReclaimer(Reclaimer reclaimer) ABSL_LOCKS_EXCLUDED(reclaimer_mu_);

  // One of a user's jobs that no process is attached to.
  struct EndedJob {
    std::string id;
    std::string name;
  };
  // Where a user's ended jobs are found (the daemon's job registry). A
  // refusal for SSD space that the owner's holdings stand behind (SetAside,
  // Reserve, NoRoom) then ends with the owner's ended jobs that hold space
  // (none with a set-aside: its data plane is open), largest first, each
  // with what it holds (a few, then how many more), and how to free them;
  // never another user's job, whatever the lister answers. Called without
  // the ledger's lock, at most once per refusal; must not call into the
  // ledger. Empty: nothing named. A call under way finishes first.
  using EndedJobs = std::function<std::vector<EndedJob>(uid_t owner)>;
  void SetEndedJobs(EndedJobs ended) ABSL_LOCKS_EXCLUDED(ended_mu_);
  // The most ended jobs a refusal names one by one.
  static constexpr size_t kEndedJobsNamed = 3;

  // SpaceBudget.
  uint8_t AccountOf(absl::string_view name) const override;
  absl::Status Reserve(absl::string_view job, uint8_t account,
                       uint64_t bytes) override ABSL_LOCKS_EXCLUDED(mu_);
  void Charge(absl::string_view job, uint8_t account, uint64_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(absl::string_view job, uint8_t account, uint64_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status NoRoom(absl::string_view job, absl::Status refusal) override
      ABSL_LOCKS_EXCLUDED(mu_, ended_mu_);

 private:
  struct Job {
    bool tracked = false;
    uid_t owner = 0;
    uint64_t limit = 0;
    uint64_t used = 0;
    uint64_t activations = 0;
    uint64_t set_aside = 0;
    uintptr_t holder = 0;
    uint64_t Held() const {
      return (used > set_aside ? used : set_aside) + activations;
    }
  };

  // SetAside without the note on ended jobs.
  absl::Status TrySetAside(const std::string& job, uint64_t bytes,
                           uintptr_t holder, absl::Duration patience)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `job` holding `held_after` passes its own limit (a refusal
  // the owner's other jobs do not stand behind).
  static bool PastOwnLimit(const Job& job, uint64_t held_after);
  // `refusal` with the ended jobs of `owner` that hold space named
  // (SetEndedJobs), `asking` left out.
  absl::Status WithEndedJobs(uid_t owner, absl::string_view asking,
                             absl::Status refusal)
      ABSL_LOCKS_EXCLUDED(mu_, ended_mu_);
  // Its own limits: the job's cap and its owner's quota (waiting for
  // others cannot help with these).
  absl::Status OwnLimitsLocked(const std::string& name, const Job& job,
                               uint64_t held_after, uint64_t needed,
                               const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `uid` holding `more` stays within its fair share of the array.
  bool WithinShareLocked(uid_t uid, uint64_t more) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `job` may go from holding job.Held() to `held_after`: its own
  // limits, the array, its owner's fair share.
  absl::Status FitsLocked(const std::string& name, const Job& job,
                          uint64_t held_after, uint64_t needed,
                          const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t HeldByLocked(uid_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every user's holding, weight and presence (fair_share.h).
  std::map<uid_t, ShareHolder> HoldersLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a user other than `uid` holds more than its share.
  bool OthersOverShareLocked(uid_t uid) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What each user other than `uid` holds beyond its share (those who do).
  std::map<uid_t, uint64_t> BeyondSharesLocked(uid_t uid) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job`'s entry after `change`, with held_by_all_ kept in step.
  void UpdateLocked(Job& job, const Job& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_bytes_;
  const QuotaTable* const quotas_;

  mutable absl::Mutex mu_;
  std::map<std::string, Job, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t held_by_all_ ABSL_GUARDED_BY(mu_) = 0;
  // Open data planes by user (SetPresent).
  std::map<uid_t, int> present_ ABSL_GUARDED_BY(mu_);
  // Signalled whenever anything is given back (SetAside's patience).
  absl::CondVar released_;
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  // Held while the reclaimer runs (never with mu_).
  absl::Mutex reclaimer_mu_;
  Reclaimer reclaimer_ ABSL_GUARDED_BY(reclaimer_mu_);
  // Held while the ended-jobs lister runs (never with mu_).
  absl::Mutex ended_mu_;
  EndedJobs ended_jobs_ ABSL_GUARDED_BY(ended_mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_QUOTA_SPACE_LEDGER_H_
