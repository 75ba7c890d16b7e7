#include "daemon/jobs/job_registry.h"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/log_text.h"
#include "layout/byte_size.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr size_t kMaxJobNameLength = 64;
constexpr size_t kMaxJobIdLength = 32;
constexpr char kRegistryFile[] = "jobs.binpb";
const QuotaTable kNoQuotas;

// Job names and run names: `what` names the field in the message.
absl::Status ValidateName(const char* what, const std::string& name) {
  if (name.empty() || name.size() > kMaxJobNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be 1 to ", kMaxJobNameLength,
                     " characters, got ", name.size()));
  }
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                         c == '-';
    if (!allowed) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", LogSafe(name, kMaxJobNameLength + 1),
                       "' may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

// JobSpec.run, when set (see DistributedRun in proto/lohan.proto).
absl::Status ValidateRun(const v1::JobSpec& spec) {
  if (!spec.has_run()) return absl::OkStatus();
  const v1::DistributedRun& run = spec.run();
  const std::string what = absl::StrCat("job '", spec.name(), "': run name");
  if (absl::Status named = ValidateName(what.c_str(), run.name());
      !named.ok()) {
    return named;
  }
  if (run.world_size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", spec.name(), "': run '", run.name(), "' has world_size ",
        run.world_size(),
        "; a distributed run has at least 2 ranks (leave run unset for a "
        "job on its own)"));
  }
  if (run.rank() >= run.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", spec.name(), "': run '", run.name(), "' rank ",
                     run.rank(), " is not below its world_size ",
                     run.world_size(), " (ranks are 0 to world_size - 1)"));
  }
  return absl::OkStatus();
}

// ALREADY_EXISTS when `existing`, a job of the caller's, has the name or the
// (run name, rank) `spec` asks for.
absl::Status CheckDistinct(const std::string& id, const v1::Job& existing,
                           const v1::JobSpec& spec) {
  if (existing.spec().name() == spec.name()) {
    return absl::AlreadyExistsError(
        absl::StrCat("you already have a job named '", spec.name(), "' (", id,
                     "); attach to it or delete it first"));
  }
  if (spec.has_run() && existing.spec().has_run() &&
      existing.spec().run().name() == spec.run().name() &&
      existing.spec().run().rank() == spec.run().rank()) {
    return absl::AlreadyExistsError(
        absl::StrCat("job '", spec.name(), "': rank ", spec.run().rank(),
                     " of run '", spec.run().name(), "' is already job ", id,
                     " ('", existing.spec().name(),
                     "') on this daemon; resume that job or delete it first"));
  }
  return absl::OkStatus();
}

std::string UserName(uid_t uid) {
  passwd entry{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &entry, buffer, sizeof(buffer), &found) == 0 &&
      found != nullptr) {
    return found->pw_name;
  }
  return absl::StrCat("uid ", uid);
}

absl::Status WriteFileDurably(const std::string& dir, const std::string& name,
                              const std::string& bytes) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string temp = absl::StrCat(path, ".tmp");
  // A partial file (a full disk, most likely) must not stay behind.
  auto failed = [&temp](const std::string& what) {
    absl::Status status = ErrnoToStatus(errno, absl::StrCat(what, temp));
    unlink(temp.c_str());
    return status;
  };
  {
    UniqueFd file(
        open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!file) return ErrnoToStatus(errno, absl::StrCat("creating ", temp));
    size_t written = 0;
    while (written < bytes.size()) {
      ssize_t n =
          write(file.get(), bytes.data() + written, bytes.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return failed("writing ");
      written += static_cast<size_t>(n);
    }
    if (fsync(file.get()) != 0) return failed("syncing ");
  }
  if (rename(temp.c_str(), path.c_str()) != 0) return failed("renaming ");
  UniqueFd directory(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!directory || fsync(directory.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("syncing directory ", dir));
  }
  return absl::OkStatus();
}

}  // namespace

JobRegistry::JobRegistry(Options options) : options_(std::move(options)) {
  if (options_.quotas == nullptr) options_.quotas = &kNoQuotas;
}

std::string JobRegistry::RegistryPath() const {
  return absl::StrCat(options_.state_dir, "/", kRegistryFile);
}

absl::StatusOr<std::unique_ptr<JobRegistry>> JobRegistry::Open(
    Options options) {
  std::unique_ptr<JobRegistry> registry(new JobRegistry(std::move(options)));
  std::ifstream file(registry->RegistryPath(), std::ios::binary);
  if (!file) return registry;  // first start
  std::stringstream bytes;
  bytes << file.rdbuf();
  v1::JobRegistryRecord record;
  if (!record.ParseFromString(bytes.str())) {
    return absl::DataLossError(
        absl::StrCat("job registry ", registry->RegistryPath(),
                     " is corrupt; move it aside to start with no jobs"));
  }
  absl::MutexLock lock(&registry->mu_);
  registry->next_job_number_ = record.next_job_number();
  const int64_t now = time(nullptr);
  bool ended_now = false;
  for (v1::Job& job : *record.mutable_jobs()) {
    // Attachments do not survive a daemon restart; clients re-attach.
    job.set_state(v1::JOB_STATE_DETACHED);
    job.clear_attached_pid();
    job.clear_attached_unix_seconds();
    if (job.ended_unix_seconds() == 0) {
      // Attached when lohand stopped (or saved before jobs had an end):
      // ended now, not when it was last detached before that.
      job.set_ended_unix_seconds(now);
      ended_now = true;
    }
    std::string id = job.id();
    registry->jobs_.emplace(std::move(id), Entry{.job = std::move(job)});
  }
  if (ended_now) registry->PersistEndedLocked();
  return registry;
}

absl::Status JobRegistry::Persist(const std::map<std::string, Entry>& jobs,
                                  uint64_t next_job_number) {
  v1::JobRegistryRecord record;
  record.set_next_job_number(next_job_number);
  for (const auto& [id, entry] : jobs) {
    v1::Job* job = record.add_jobs();
    *job = entry.job;
    job->clear_state();
    job->clear_attached_pid();
    job->clear_attached_unix_seconds();
    job->clear_delete_after_unix_seconds();
  }
  std::string bytes;
  if (!record.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the job registry");
  }
  absl::Status status =
      WriteFileDurably(options_.state_dir, kRegistryFile, bytes);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("saving the job registry: ",
                                                    status.message()));
  }
  return absl::OkStatus();
}

void JobRegistry::EndLocked(Entry& entry, int64_t now) {
  entry.job.set_state(v1::JOB_STATE_DETACHED);
  entry.job.clear_attached_pid();
  entry.job.clear_attached_unix_seconds();
  entry.job.set_ended_unix_seconds(now);
  entry.attached_process = {};
}

void JobRegistry::PersistEndedLocked() {
  (void)Persist(jobs_, next_job_number_);
}

void JobRegistry::ReapDeadAttachments() {
  bool reaped = false;
  for (auto& [id, entry] : jobs_) {
    // Only a process known to be gone is; one the daemon cannot look at
    // now (short of file descriptors, say) stays attached.
    if (entry.job.state() == v1::JOB_STATE_ATTACHED &&
        CheckRunning(entry.attached_process) == ProcessState::kGone) {
      EndLocked(entry, time(nullptr));
      reaped = true;
    }
  }
  if (reaped) PersistEndedLocked();
}

int64_t JobRegistry::DeleteAfterLocked(const v1::Job& job) const {
  if (options_.keep_ended <= absl::ZeroDuration() || job.kept() ||
      job.state() == v1::JOB_STATE_ATTACHED) {
    return 0;
  }
  return job.ended_unix_seconds() + absl::ToInt64Seconds(absl::Ceil(
                                        options_.keep_ended, absl::Seconds(1)));
}

v1::Job JobRegistry::ShownLocked(const Entry& entry) const {
  v1::Job job = entry.job;
  // The kept model's arena fields are lohand's own (its sessions'): a
  // listing stays small whatever the models.
  job.mutable_spec()->clear_model();
  job.set_last_failure(entry.last_failure);
  job.set_last_failure_unix_seconds(entry.last_failure_unix_seconds);
  job.set_delete_after_unix_seconds(DeleteAfterLocked(entry.job));
  return job;
}

absl::StatusOr<JobRegistry::Entry*> JobRegistry::FindOwned(
    const Caller& caller, const std::string& job_id) {
  if (job_id.empty() || job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job id is 1 to ", kMaxJobIdLength,
                     " characters (e.g. j-000001), got ", job_id.size()));
  }
  auto found = jobs_.find(job_id);
  // Another user's job is answered exactly as a missing one: job ids must
  // not tell anyone which jobs exist.
  if (found == jobs_.end() ||
      (!caller.is_root() && found->second.job.owner_uid() != caller.uid)) {
    return absl::NotFoundError(
        absl::StrCat("no job '", LogSafe(job_id, 64),
                     "' of yours; 'lohanctl jobs' lists the jobs you can see"));
  }
  return &found->second;
}

absl::Status JobRegistry::CheckRequestLocked(const Caller& caller,
                                             const v1::JobSpec& spec) const {
  const UserLimits& limits = options_.quotas->For(caller.uid);
  uint32_t owned = 0;
  for (const auto& [id, entry] : jobs_) {
    if (entry.job.owner_uid() == caller.uid) ++owned;
  }
  if (limits.jobs != 0 && owned >= limits.jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", spec.name(), "': uid ", caller.uid, " has ", owned,
        " jobs and the quota is ", limits.jobs,
        " ([quotas] jobs in lohand.toml); delete one you no longer need "
        "('lohanctl jobs delete ID')"));
  }
  auto too_large = [&](const char* what, uint64_t asked, uint64_t limit,
                       const std::string& which) -> absl::Status {
    if (limit == 0 || asked <= limit) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat("job '", spec.name(), "' asks for ", asked, " bytes (",
                     FormatByteSize(asked), ") of ", what, " but ", which,
                     " is ", limit, " (", FormatByteSize(limit), ")"));
  };
  if (absl::Status s =
          too_large("host pool", spec.host_pool_bytes(),
                    options_.host_pool_capacity_bytes, "the whole pool");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = too_large(
          "host pool", spec.host_pool_bytes(), limits.host_pool_bytes,
          absl::StrCat("uid ", caller.uid, "'s quota ([quotas] host_pool)"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          too_large("SSD space", spec.ssd_bytes(), options_.ssd_capacity_bytes,
                    "the whole SSD array");
      !s.ok()) {
    return s;
  }
  return too_large("SSD space", spec.ssd_bytes(), limits.ssd_bytes,
                   absl::StrCat("uid ", caller.uid, "'s quota ([quotas] ssd)"));
}

absl::StatusOr<v1::Job> JobRegistry::Create(const Caller& caller,
                                            const v1::JobSpec& spec) {
  if (absl::Status status = ValidateName("job name", spec.name());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateRun(spec); !status.ok()) return status;
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  for (const auto& [id, entry] : jobs_) {
    if (entry.job.owner_uid() != caller.uid) continue;
    if (absl::Status distinct = CheckDistinct(id, entry.job, spec);
        !distinct.ok()) {
      return distinct;
    }
  }
  if (absl::Status fits = CheckRequestLocked(caller, spec); !fits.ok()) {
    return fits;
  }
  v1::Job job;
  job.set_id(absl::StrFormat("j-%06d", next_job_number_));
  *job.mutable_spec() = spec;
  job.set_owner_uid(caller.uid);
  job.set_owner_name(UserName(caller.uid));
  job.set_state(v1::JOB_STATE_DETACHED);
  job.set_created_unix_seconds(time(nullptr));
  job.set_ended_unix_seconds(job.created_unix_seconds());

  std::map<std::string, Entry> next = jobs_;
  next.emplace(job.id(), Entry{.job = job});
  if (absl::Status status = Persist(next, next_job_number_ + 1); !status.ok()) {
    return status;
  }
  jobs_ = std::move(next);
  ++next_job_number_;
  return job;
}

absl::StatusOr<v1::Job> JobRegistry::Attach(const Caller& caller,
                                            const std::string& job_id) {
  absl::StatusOr<ProcessIdentity> process = IdentifyProcess(caller.pid);
  if (absl::IsUnavailable(process.status())) {
    return absl::UnavailableError(
        absl::StrCat("lohand cannot look at calling process ", caller.pid,
                     " now (", process.status().message(), "); try again"));
  }
  if (!process.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("calling process ", caller.pid, " is gone"));
  }
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  v1::Job& job = (*entry)->job;
  if (job.state() == v1::JOB_STATE_ATTACHED) {
    if ((*entry)->attached_process == *process) return job;
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is attached by process ", job.attached_pid(),
        "; detach it there (engine.close()), end that process, or 'lohanctl "
        "jobs detach ",
        job_id, "' as its owner"));
  }
  // No longer ended, durably: a restart must not find it ended when it
  // was last detached, days ago perhaps.
  std::map<std::string, Entry> next = jobs_;
  next[job_id].job.set_ended_unix_seconds(0);
  if (absl::Status status = Persist(next, next_job_number_); !status.ok()) {
    return status;
  }
  job.set_ended_unix_seconds(0);
  job.set_state(v1::JOB_STATE_ATTACHED);
  job.set_attached_pid(caller.pid);
  job.set_attached_unix_seconds(time(nullptr));
  (*entry)->attached_process = *process;
  return job;
}

absl::StatusOr<v1::Job> JobRegistry::Detach(const Caller& caller,
                                            const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  if ((*entry)->job.state() == v1::JOB_STATE_ATTACHED) {
    EndLocked(**entry, time(nullptr));
    PersistEndedLocked();
  }
  return (*entry)->job;
}

absl::StatusOr<v1::Job> JobRegistry::CheckAttachedBy(
    const Caller& caller, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  const v1::Job& job = (*entry)->job;
  if (job.state() != v1::JOB_STATE_ATTACHED ||
      job.attached_pid() != caller.pid) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is not attached by process ", caller.pid,
                     "; attach it (AttachJob) from this process first"));
  }
  return job;
}

absl::StatusOr<v1::Job> JobRegistry::Get(const Caller& caller,
                                         const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  return (*entry)->job;
}

absl::Status JobRegistry::Delete(const Caller& caller,
                                 const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  if ((*entry)->job.state() == v1::JOB_STATE_ATTACHED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is attached by process ",
                     (*entry)->job.attached_pid(), "; detach it first"));
  }
  std::map<std::string, Entry> next = jobs_;
  next.erase(job_id);
  if (absl::Status status = Persist(next, next_job_number_); !status.ok()) {
    return status;
  }
  jobs_ = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobRegistry::Keep(const Caller& caller,
                                          const std::string& job_id,
                                          bool keep) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  absl::StatusOr<Entry*> entry = FindOwned(caller, job_id);
  if (!entry.ok()) return entry.status();
  if ((*entry)->job.kept() != keep) {
    std::map<std::string, Entry> next = jobs_;
    next[job_id].job.set_kept(keep);
    if (absl::Status status = Persist(next, next_job_number_); !status.ok()) {
      return status;
    }
    (*entry)->job.set_kept(keep);
  }
  return ShownLocked(**entry);
}

std::vector<v1::Job> JobRegistry::Expired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  std::vector<v1::Job> due;
  for (const auto& [id, entry] : jobs_) {
    const int64_t after = DeleteAfterLocked(entry.job);
    if (after != 0 && after <= absl::ToUnixSeconds(now)) {
      due.push_back(ShownLocked(entry));
    }
  }
  return due;
}

absl::Status JobRegistry::DeleteExpired(const std::string& job_id,
                                        absl::Time now) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is gone"));
  }
  const int64_t after = DeleteAfterLocked(found->second.job);
  if (after == 0 || after > absl::ToUnixSeconds(now)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is no longer due for deletion"));
  }
  std::map<std::string, Entry> next = jobs_;
  next.erase(job_id);
  if (absl::Status status = Persist(next, next_job_number_); !status.ok()) {
    return status;
  }
  jobs_ = std::move(next);
  return absl::OkStatus();
}

std::vector<v1::Job> JobRegistry::EndedOf(uid_t owner) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  std::vector<v1::Job> ended;
  for (const auto& [id, entry] : jobs_) {
    if (entry.job.owner_uid() != owner ||
        entry.job.state() == v1::JOB_STATE_ATTACHED) {
      continue;
    }
    // Not the whole job: a refusal asks, perhaps often, and a kept model
    // may be large.
    v1::Job& one = ended.emplace_back();
    one.set_id(entry.job.id());
    one.mutable_spec()->set_name(entry.job.spec().name());
    one.set_owner_uid(entry.job.owner_uid());
    one.set_state(entry.job.state());
    one.set_ended_unix_seconds(entry.job.ended_unix_seconds());
    one.set_kept(entry.job.kept());
    one.set_delete_after_unix_seconds(DeleteAfterLocked(entry.job));
  }
  return ended;
}

std::vector<v1::Job> JobRegistry::List(const Caller& caller) {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  std::vector<v1::Job> visible;
  for (const auto& [id, entry] : jobs_) {
    if (caller.is_root() || entry.job.owner_uid() == caller.uid) {
      visible.push_back(ShownLocked(entry));
    }
  }
  return visible;
}

absl::Status JobRegistry::NoteStatesStored(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end() || found->second.job.has_states()) {
    return absl::OkStatus();
  }
  std::map<std::string, Entry> next = jobs_;
  next[job_id].job.set_has_states(true);
  if (absl::Status status = Persist(next, next_job_number_); !status.ok()) {
    return status;
  }
  jobs_ = std::move(next);
  return absl::OkStatus();
}

void JobRegistry::NoteFailure(const std::string& job_id,
                              const absl::Status& failure) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.find(job_id);
  if (found == jobs_.end()) return;
  // Shown by root's lohanctl: whatever of a client's it quotes, escaped.
  found->second.last_failure =
      absl::StrCat(absl::StatusCodeToString(failure.code()), ": ",
                   LogSafe(failure.message(), 1000));
  found->second.last_failure_unix_seconds = absl::ToUnixSeconds(absl::Now());
}

JobRegistry::Counts JobRegistry::CountAll() {
  absl::MutexLock lock(&mu_);
  ReapDeadAttachments();
  Counts counts;
  for (const auto& [id, entry] : jobs_) {
    ++counts.total;
    if (entry.job.state() == v1::JOB_STATE_ATTACHED) ++counts.attached;
  }
  return counts;
}

}  // namespace lohan
