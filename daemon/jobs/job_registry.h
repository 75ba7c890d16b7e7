#ifndef LOHAN_DAEMON_JOBS_JOB_REGISTRY_H_
#define LOHAN_DAEMON_JOBS_JOB_REGISTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/caller.h"
#include "daemon/common/process_identity.h"
#include "daemon/quota/user_limits.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The daemon's jobs. Every call takes the caller and enforces ownership: a job
// belongs to the uid that created it; to any other non-root uid it does not
// exist (NOT_FOUND, word for word as for a missing id); root may act on
// every job.
//
// A job has ended when no process is attached to it; it ended when it was
// last detached, its attached process was found gone, or (for one attached
// when lohand stopped) lohand started again; a job never attached ended
// when it was created (Job.ended_unix_seconds, durable). With
// Options.keep_ended, a job ended that long ago and not pinned (Keep) is
// due for deletion (Expired); the daemon deletes it (DeleteExpired).
// Thread-safe.
class JobRegistry {
 public:
  struct Options {
    // Directory for jobs.binpb; must exist.
    std::string state_dir;
    // A job may not ask for more host pool (JobSpec.host_pool_bytes) or
    // SSD space (JobSpec.ssd_bytes) than these; 0: no bound. The pool is
    // claimed when a data plane opens (daemon/session), not here: an idle
    // or attached job without one holds none of it.
    uint64_t host_pool_capacity_bytes = 0;
    uint64_t ssd_capacity_bytes = 0;
    // Per-user limits (jobs, and what one job may ask for); null: none.
    // REQUIRES: outlives the registry.
    const QuotaTable* quotas = nullptr;
    // How long an ended job is kept before it is due for deletion
    // ([jobs] keep_ended); zero: never due (deleted by hand only).
    absl::Duration keep_ended = absl::ZeroDuration();
  };

  // Loads the registry from options.state_dir (empty if there is none yet).
  // DATA_LOSS when the file exists but cannot be parsed.
  static absl::StatusOr<std::unique_ptr<JobRegistry>> Open(Options options);

  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // INVALID_ARGUMENT for a bad name or JobSpec.run (see DistributedRun);
  // ALREADY_EXISTS when the caller has a job of that name, or one that is
  // the same rank of the same run (the message names it); RESOURCE_EXHAUSTED
  // when the caller has its quota of jobs, or asks for more pool or SSD space
  // than the daemon has or the caller's quota allows (the message has the
  // numbers). Durable before it returns.
  absl::StatusOr<v1::Job> Create(const Caller& caller, const v1::JobSpec& spec);

  // Binds the job to the calling process. Idempotent for the same process;
  // FAILED_PRECONDITION while another live process holds it. That it is no
  // longer ended is durable before it returns (a restart must not find it
  // ended long ago).
  absl::StatusOr<v1::Job> Attach(const Caller& caller,
                                 const std::string& job_id);

  // Unbinds the job; the owner (or root) may detach any process's attachment.
  absl::StatusOr<v1::Job> Detach(const Caller& caller,
                                 const std::string& job_id);

  // The job, if the calling process is the one attached to it (the data
  // plane is only for that process). NOT_FOUND as elsewhere;
  // FAILED_PRECONDITION when another process, or none, holds it.
  absl::StatusOr<v1::Job> CheckAttachedBy(const Caller& caller,
                                          const std::string& job_id);

  // The job, if the caller may see it (its owner, or root); NOT_FOUND as
  // elsewhere.
  absl::StatusOr<v1::Job> Get(const Caller& caller, const std::string& job_id);

  // FAILED_PRECONDITION while attached. Durable before it returns.
  absl::Status Delete(const Caller& caller, const std::string& job_id);

  // Pins (`keep`) or unpins the job: a pinned job is never due for
  // deletion (Expired). The owner or root only (NOT_FOUND as elsewhere).
  // Durable before it returns; the job as List shows it.
  absl::StatusOr<v1::Job> Keep(const Caller& caller, const std::string& job_id,
                               bool keep);

  // The jobs due for deletion at `now`: ended (no process attached), not
  // pinned, ended at least Options.keep_ended before `now`; none when
  // keep_ended is zero. In id order, as List shows them.
  std::vector<v1::Job> Expired(absl::Time now);

  // Deletes the job if it is still due for deletion at `now` (Expired):
  // FAILED_PRECONDITION, nothing done, when it no longer is (attached or
  // pinned meanwhile); NOT_FOUND when it is gone. Durable before it
  // returns.
  absl::Status DeleteExpired(const std::string& job_id, absl::Time now);

  // `owner`'s ended jobs (no process attached), in id order, each with
  // its id, name, owner, state, ended_unix_seconds, kept and
  // delete_after_unix_seconds only: what a refusal of SSD space names to
  // its owner.
  std::vector<v1::Job> EndedOf(uid_t owner);

  // The jobs the caller may see (all for root), ordered by id, each with
  // its last noted failure, when it is due for deletion
  // (Job.delete_after_unix_seconds) and without its kept JobSpec.model
  // (Get and CheckAttachedBy have it).
  std::vector<v1::Job> List(const Caller& caller);

  // Notes, durably, that the store now holds the job's states (its model
  // registered): Job.has_states. A job that is gone (deleted meanwhile):
  // OK, nothing done.
  absl::Status NoteStatesStored(const std::string& job_id);

  // Notes a failure on the daemon's side of the job's requests (shown as
  // Job.last_failure, kept in memory only). A job that is gone: ignored.
  void NoteFailure(const std::string& job_id, const absl::Status& failure);

  struct Counts {
    uint32_t total = 0;
    uint32_t attached = 0;
  };
  Counts CountAll();

 private:
  struct Entry {
    v1::Job job;
    ProcessIdentity attached_process;  // valid when job.state() == ATTACHED
    std::string last_failure;          // NoteFailure's, never persisted
    int64_t last_failure_unix_seconds = 0;
  };

  explicit JobRegistry(Options options);

  // Detaches jobs whose attached process is gone (ended now).
  void ReapDeadAttachments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the entry detached and ended at `now`.
  static void EndLocked(Entry& entry, int64_t now);
  // Saves jobs_ when only the ended times changed: a failure is left for
  // the next save (until then a restart takes such jobs for ended at the
  // restart, which only keeps them longer).
  void PersistEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the job is due for deletion (Job.delete_after_unix_seconds); 0:
  // never (attached, pinned, or keep_ended zero).
  int64_t DeleteAfterLocked(const v1::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry's job as List shows it.
  v1::Job ShownLocked(const Entry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The caller's job quota and what `spec` asks for (see Create).
  absl::Status CheckRequestLocked(const Caller& caller,
                                  const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND (missing or not the caller's), else the entry.
  absl::StatusOr<Entry*> FindOwned(const Caller& caller,
                                   const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `jobs` and `next_job_number` atomically to jobs.binpb.
  absl::Status Persist(const std::map<std::string, Entry>& jobs,
                       uint64_t next_job_number)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string RegistryPath() const;

  // Constant after construction.
  Options options_;

  absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_JOBS_JOB_REGISTRY_H_
