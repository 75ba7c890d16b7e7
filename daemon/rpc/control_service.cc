#include "daemon/rpc/control_service.h"

#include <algorithm>
#include <ctime>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"
#include "daemon/common/log_text.h"
#include "daemon/common/memory_release.h"
#include "daemon/quota/daemon_memory.h"
#include "daemon/rpc/job_removal.h"
#include "daemon/session/arena_layout.h"
#include "layout/durability.h"
#include "plan/job_plan.h"
#include "spdlog/spdlog.h"
#include "spec/model_spec_checks.h"
#include "wire/version.h"

namespace lohan {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// How much of a client's free text (its name) a log line or an error
// message quotes (LogSafe).
constexpr size_t kMaxEchoedBytes = 64;

// GetStatus's bounds (GetStatusResponse.jobs_not_listed): whatever other
// users hold, root's status stays small enough for any client.
constexpr size_t kMaxStatusJobs = 256;
constexpr size_t kMaxStatusFailureBytes = 256;

// The jobs GetStatus lists: the caller's own first, then the others (root
// sees all), each in id order, at most kMaxStatusJobs.
std::vector<v1::Job> StatusJobs(std::vector<v1::Job> jobs, uid_t caller,
                                uint32_t* not_listed) {
  std::stable_partition(jobs.begin(), jobs.end(), [caller](const v1::Job& j) {
    return j.owner_uid() == caller;
  });
  *not_listed = 0;
  if (jobs.size() > kMaxStatusJobs) {
    *not_listed = static_cast<uint32_t>(jobs.size() - kMaxStatusJobs);
    jobs.resize(kMaxStatusJobs);
  }
  for (v1::Job& job : jobs) {
    if (job.last_failure().size() > kMaxStatusFailureBytes) {
      job.set_last_failure(
          absl::StrCat(job.last_failure().substr(0, kMaxStatusFailureBytes),
                       "... (lohanctl jobs shows it whole)"));
    }
  }
  return jobs;
}

void SetProtocol(v1::ProtocolVersion* version) {
  version->set_major(kProtocolMajor);
  version->set_minor(kProtocolMinor);
}

}  // namespace

ControlService::ControlService(const DaemonParts& parts, const PeerTable* peers)
    : parts_(parts),
      config_(parts.config),
      peers_(peers),
      jobs_(parts.jobs),
      started_(std::chrono::steady_clock::now()),
      started_unix_seconds_(time(nullptr)) {
  LOHAN_CHECK(parts.config != nullptr && parts.jobs != nullptr &&
              parts.store != nullptr && parts.optimizer != nullptr &&
              parts.pool != nullptr && parts.sessions != nullptr &&
              parts.quotas != nullptr && parts.ledger != nullptr &&
              peers != nullptr);
}

// Every handler starts here: no credentials, no service.
#define LOHAN_IDENTIFY_CALLER(context, caller)                            \
  absl::StatusOr<Caller> caller##_or = peers_->Lookup((context)->peer()); \
  if (!caller##_or.ok()) return ToGrpc(caller##_or.status());             \
  const Caller& caller = *caller##_or

grpc::Status ControlService::Hello(grpc::ServerContext* context,
                                   const v1::HelloRequest* request,
                                   v1::HelloResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  const uint32_t client_major = request->client_protocol().major();
  if (client_major != kProtocolMajor) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat(
            "client '", LogSafe(request->client_name(), kMaxEchoedBytes),
            "' speaks protocol ", client_major, ".x but lohand ", kLohanVersion,
            " speaks ", kProtocolMajor, ".x; install matching versions"));
  }
  spdlog::debug("hello from '{}' (uid {}, pid {})",
                LogSafe(request->client_name(), kMaxEchoedBytes), caller.uid,
                caller.pid);
  SetProtocol(response->mutable_daemon_protocol());
  response->set_daemon_version(kLohanVersion);
  response->add_capabilities("jobs");
  response->add_capabilities("peer-credentials");
  response->add_capabilities("store");
  response->add_capabilities(
      absl::StrCat("optimizer:", parts_.optimizer->kernel_name()));
  response->set_caller_uid(caller.uid);
  response->set_caller_pid(caller.pid);
  response->set_data_socket_path(DataSocketPath(*config_));
  return grpc::Status::OK;
}

grpc::Status ControlService::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest* request,
                                       v1::CreateJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::Job> job = CreateSized(caller, *request, response);
  if (!job.ok()) {
    if (std::optional<uint64_t> dropped =
            refusal_log_.Admit(absl::StrCat("create_job:", caller.uid))) {
      spdlog::info("job '{}' of uid {} (pid {}) not created: {}{}",
                   LogSafe(request->spec().name()), caller.uid, caller.pid,
                   LogSafe(job.status().ToString(), 1000),
                   *dropped == 0 ? ""
                                 : absl::StrCat(" (", *dropped,
                                                " more refusals not logged)"));
    }
    return ToGrpc(job.status());
  }
  parts_.ledger->Track(job->id(), job->owner_uid(), job->spec().ssd_bytes());
  spdlog::info("job {} '{}' created by uid {} (pid {})", job->id(),
               LogSafe(job->spec().name()), caller.uid, caller.pid);
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

absl::StatusOr<v1::Job> ControlService::CreateSized(
    const Caller& caller, const v1::CreateJobRequest& request,
    v1::CreateJobResponse* response) {
  if (!request.spec().has_model()) return jobs_->Create(caller, request.spec());
  const v1::ModelSpec& model = request.spec().model();
  if (request.spec().host_pool_bytes() != 0) {
    return absl::InvalidArgumentError(
        "JobSpec: give host_pool_bytes or the model to size it for, not "
        "both");
  }
  if (absl::Status checked = CheckModelSpec(model); !checked.ok()) {
    return checked;
  }
  absl::StatusOr<v1::ArenaSizing> sizing =
      SizeJobArena(model, caller.uid, config_->host_pool_bytes,
                   parts_.quotas->For(caller.uid).host_pool_bytes);
  if (!sizing.ok()) {
    return absl::Status(sizing.status().code(),
                        absl::StrCat("job '", request.spec().name(),
                                     "': ", sizing.status().message()));
  }
  // What the arena depends on stays with the job: a data plane opened when
  // the pool has less free takes the largest arena that fits
  // (SessionManager).
  v1::JobSpec sized = request.spec();
  *sized.mutable_model() = ArenaFieldsOf(model);
  sized.set_host_pool_bytes(sizing->arena_bytes());
  absl::StatusOr<v1::Job> job = jobs_->Create(caller, sized);
  if (job.ok()) *response->mutable_arena() = *std::move(sizing);
  return job;
}

grpc::Status ControlService::AttachJob(grpc::ServerContext* context,
                                       const v1::AttachJobRequest* request,
                                       v1::AttachJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::Job> job = jobs_->Attach(caller, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  spdlog::info("job {} attached by pid {} (uid {})", job->id(), caller.pid,
               caller.uid);
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status ControlService::DetachJob(grpc::ServerContext* context,
                                       const v1::DetachJobRequest* request,
                                       v1::DetachJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::Job> job = jobs_->Detach(caller, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  spdlog::info("job {} detached by pid {} (uid {})", job->id(), caller.pid,
               caller.uid);
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status ControlService::DeleteJob(grpc::ServerContext* context,
                                       const v1::DeleteJobRequest* request,
                                       v1::DeleteJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  // Ownership first: whether another user's job is running is not the
  // caller's to learn (JobRegistry::Delete answers NOT_FOUND for it).
  const bool owned = CheckOwned(caller, request->job_id()).ok();
  if (std::optional<pid_t> plane =
          parts_.sessions->DataPlaneOf(request->job_id());
      owned && plane.has_value()) {
    return ToGrpc(absl::FailedPreconditionError(absl::StrCat(
        "job ", request->job_id(), " has an open data plane (process ", *plane,
        "); close it first (a process that ended: its data "
        "plane closes in a moment)")));
  }
  absl::Status status = jobs_->Delete(caller, request->job_id());
  if (!status.ok()) return ToGrpc(status);
  const uint64_t bytes = FreeDeletedJob(parts_.store, parts_.ledger,
                                        parts_.job_deleted, request->job_id());
  spdlog::info("job {} deleted by uid {} (pid {}), {} bytes freed on the SSDs",
               request->job_id(), caller.uid, caller.pid, bytes);
  return grpc::Status::OK;
}

grpc::Status ControlService::KeepJob(grpc::ServerContext* context,
                                     const v1::KeepJobRequest* request,
                                     v1::KeepJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::Job> job =
      jobs_->Keep(caller, request->job_id(), request->keep());
  if (!job.ok()) return ToGrpc(job.status());
  spdlog::info("job {} {} by uid {} (pid {})", job->id(),
               request->keep() ? "pinned" : "unpinned", caller.uid, caller.pid);
  job->set_ssd_bytes(SsdBytesOf(parts_.store->BytesByJob(), job->id()));
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status ControlService::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  const std::map<std::string, uint64_t> ssd = parts_.store->BytesByJob();
  const std::map<std::string, SessionManager::ShareCounts> shares =
      parts_.sessions->ShareCountsByJob();
  for (v1::Job& job : jobs_->List(caller)) {
    job.set_ssd_bytes(SsdBytesOf(ssd, job.id()));
    SetShareCounts(shares, job);
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

uint64_t ControlService::SsdBytesOf(
    const std::map<std::string, uint64_t>& by_job, const std::string& job_id) {
  auto it = by_job.find(job_id);
  return it == by_job.end() ? 0 : it->second;
}

void ControlService::SetShareCounts(
    const std::map<std::string, SessionManager::ShareCounts>& by_job,
    v1::Job& job) {
  auto it = by_job.find(job.id());
  if (it == by_job.end()) return;
  job.set_arena_shrink_asks(it->second.shrink_asks);
  job.set_arena_grow_asks(it->second.grow_asks);
  job.set_planes_closed(it->second.planes_closed);
}

grpc::Status ControlService::GetStatus(grpc::ServerContext* context,
                                       const v1::GetStatusRequest* request,
                                       v1::GetStatusResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  *response = StatusFor(caller);
  return grpc::Status::OK;
}

v1::GetStatusResponse ControlService::StatusFor(const Caller& caller) {
  v1::GetStatusResponse status;
  v1::GetStatusResponse* response = &status;
  response->set_daemon_version(kLohanVersion);
  SetProtocol(response->mutable_daemon_protocol());
  response->set_daemon_pid(getpid());
  response->set_started_unix_seconds(started_unix_seconds_);
  response->set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_)
          .count());
  v1::ConfigSummary* summary = response->mutable_config();
  summary->set_socket_path(config_->socket_path);
  summary->set_state_dir(config_->state_dir);
  for (const std::string& path : config_->ssd_paths) {
    summary->add_ssd_paths(path);
  }
  summary->set_host_pool_bytes(config_->host_pool_bytes);
  summary->set_optimizer_threads(parts_.optimizer_threads);
  summary->set_log_level(config_->log_level);
  std::set<std::string> visible;
  uint32_t jobs_owned = 0;
  const std::map<std::string, uint64_t> ssd = parts_.store->BytesByJob();
  const std::map<std::string, SessionManager::ShareCounts> shares =
      parts_.sessions->ShareCountsByJob();
  std::vector<v1::Job> all = jobs_->List(caller);
  for (const v1::Job& job : all) jobs_owned += job.owner_uid() == caller.uid;
  uint32_t not_listed = 0;
  for (v1::Job& job : StatusJobs(std::move(all), caller.uid, &not_listed)) {
    visible.insert(job.id());
    job.set_ssd_bytes(SsdBytesOf(ssd, job.id()));
    SetShareCounts(shares, job);
    *response->add_jobs() = std::move(job);
  }
  std::vector<v1::SessionStatus> sessions = parts_.sessions->Status();
  response->set_data_planes(static_cast<uint32_t>(sessions.size()));
  for (v1::SessionStatus& session : sessions) {
    if (visible.count(session.job_id()) != 0) {
      *response->add_sessions() = std::move(session);
    }
  }
  response->set_jobs_not_listed(not_listed);
  const JobRegistry::Counts counts = jobs_->CountAll();
  response->set_total_jobs(counts.total);
  response->set_attached_jobs(counts.attached);
  v1::StoreStatus* store = response->mutable_store();
  const StoreStats stats = parts_.store->Stats();
  for (const DeviceStats& device : stats.devices) {
    v1::SsdStatus* ssd = store->add_ssds();
    ssd->set_path(device.path);
    ssd->set_capacity_bytes(device.capacity_bytes);
    ssd->set_used_bytes(device.used_bytes);
  }
  store->set_tensors(stats.tensors);
  store->set_stripe_unit_bytes(config_->stripe_unit_bytes);
  store->set_block_size(config_->block_size);
  store->set_queue_depth(config_->queue_depth);
  store->set_buffered_io(config_->allow_buffered_io);
  const HostPool::Stats pool = parts_.pool->GetStats();
  v1::PoolStatus* pool_status = response->mutable_pool();
  pool_status->set_capacity_bytes(pool.capacity_bytes);
  pool_status->set_used_bytes(pool.used_bytes);
  pool_status->set_state_tier_bytes(parts_.state_tier_bytes);
  pool_status->set_commit_interval(config_->commit_interval);
  pool_status->set_durable_every_seconds(
      absl::ToDoubleSeconds(config_->durable_every));
  pool_status->set_durable_write_share(config_->durable_write_share);
  for (const HostPool::JobUse& use : pool.jobs) {
    // Other users' jobs count in used_bytes but are not named.
    if (visible.count(use.job_id) == 0) continue;
    v1::ArenaStatus* arena = pool_status->add_arenas();
    arena->set_job_id(use.job_id);
    arena->set_bytes(use.bytes);
    arena->set_huge_pages(use.huge_pages);
  }
  if (parts_.optimizer_status != nullptr) {
    *response->mutable_optimizer() = *parts_.optimizer_status;
  } else {
    response->mutable_optimizer()->set_threads(parts_.optimizer_threads);
    response->mutable_optimizer()->set_kernel(parts_.optimizer->kernel_name());
  }
  response->mutable_optimizer()->set_busy_seconds(
      parts_.sessions->OptimizerSeconds());
  if (parts_.profiler != nullptr) {
    if (std::optional<v1::HostProfile> profile = parts_.profiler->Get()) {
      *response->mutable_profile() = *std::move(profile);
    }
  }
  FillQuota(caller, jobs_owned, response->mutable_quota());
  return status;
}

grpc::Status ControlService::RegisterModel(
    grpc::ServerContext* context, const v1::RegisterModelRequest* request,
    v1::RegisterModelResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::RegisterModelResponse> registered =
      parts_.sessions->RegisterModel(caller, *request);
  if (!registered.ok()) return ToGrpc(registered.status());
  *response = *std::move(registered);
  return grpc::Status::OK;
}

grpc::Status ControlService::StopJob(grpc::ServerContext* context,
                                     const v1::StopJobRequest* request,
                                     v1::StopJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  if (absl::Status owned = CheckOwned(caller, request->job_id()); !owned.ok()) {
    return ToGrpc(owned);
  }
  absl::StatusOr<std::string> outcome = parts_.sessions->StopSession(
      request->job_id(), request->drain(), caller.uid);
  if (absl::IsNotFound(outcome.status())) {
    // No data plane: an attachment alone is ended by detaching.
    absl::StatusOr<v1::Job> job = jobs_->Detach(caller, request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    outcome = std::string("no data plane was open; detached");
  }
  if (!outcome.ok()) return ToGrpc(outcome.status());
  spdlog::info("job {}: {} by uid {} (pid {}): {}", request->job_id(),
               request->drain() ? "drain" : "kill", caller.uid, caller.pid,
               *outcome);
  response->set_outcome(*std::move(outcome));
  return grpc::Status::OK;
}

grpc::Status ControlService::PlanJob(grpc::ServerContext* context,
                                     const v1::PlanJobRequest* request,
                                     v1::PlanJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  // One plan is made at a time, whoever asks: a large plan's working
  // memory (tens of MiB) is then bounded by one, not by the callers.
  absl::MutexLock planning(&plan_mu_);
  // The last plan's reply, freed once it was sent, goes back first.
  ReleaseFreedMemory();
  absl::StatusOr<v1::JobPlan> plan = parts_.sessions->PlanJob(
      caller, request->job_id(),
      PlanBytesEstimate(
          request->profile().blocks(),
          static_cast<uint64_t>(request->profile().block_tensors_size())),
      [&](const std::string& job_id,
          const SessionManager::SessionLayout& layout)
          -> absl::StatusOr<v1::JobPlan> {
        std::optional<v1::HostProfile> host;
        if (parts_.profiler != nullptr) host = parts_.profiler->Get();
        if (!host.has_value()) {
          return absl::UnavailableError(
              "lohand is still measuring its machine (its SSDs, memcpy and "
              "optimizer) for the planner; ask again shortly");
        }
        // The SSD space the job may still take: its limit, its owner's
        // quota, what the array has left (the ledger's), and what the
        // store's devices have free (block rounding).
        uint64_t free_bytes = 0;
        for (const DeviceStats& device : parts_.store->Stats().devices) {
          free_bytes += device.capacity_bytes -
                        std::min(device.capacity_bytes, device.used_bytes);
        }
        // The unit its weights stream at: the job's registered layers
        // say it, not the request.
        absl::StatusOr<WeightUnits> weights = WeightUnitsOf(layout.layers);
        if (!weights.ok()) return weights.status();
        const JobFacts facts{
            .arena_bytes = layout.arena_bytes,
            .weights_resident = layout.weights_resident,
            .ssd_room_bytes =
                std::min(free_bytes, parts_.ledger->RoomFor(job_id)),
            .state_tier_bytes = layout.tier.share_bytes,
            // Durable by time: a durable write now and then, not each
            // iteration's (the planner leaves it out).
            .commit_interval = layout.tier.durable_every_seconds > 0.0
                                   ? kMaxCommitInterval
                                   : layout.tier.commit_interval,
            .weights = *std::move(weights)};
        return PlanForJob(*request, *host, facts, time(nullptr));
      });
  ReleaseFreedMemory();  // the planner's working memory
  if (!plan.ok()) return ToGrpc(plan.status());
  spdlog::info(
      "job {}: activation plan (case {}) for pid {}: predicted {:.3f} "
      "s/iteration",
      request->job_id(), plan->search_case(), caller.pid,
      plan->predicted_iteration_seconds());
  *response->mutable_plan() = *std::move(plan);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetJobPlan(grpc::ServerContext* context,
                                        const v1::GetJobPlanRequest* request,
                                        v1::PlanJobResponse* response) {
  LOHAN_IDENTIFY_CALLER(context, caller);
  absl::StatusOr<v1::JobPlan> plan =
      parts_.sessions->KeptPlan(caller, request->job_id());
  if (!plan.ok()) return ToGrpc(plan.status());
  *response->mutable_plan() = *std::move(plan);
  return grpc::Status::OK;
}

#undef LOHAN_IDENTIFY_CALLER

absl::Status ControlService::CheckOwned(const Caller& caller,
                                        const std::string& job_id) {
  for (const v1::Job& job : jobs_->List(caller)) {
    if (job.id() == job_id) return absl::OkStatus();
  }
  // Not the caller's: the registry's own words for it (NOT_FOUND, or
  // INVALID_ARGUMENT for a malformed id).
  absl::Status status = jobs_->CheckAttachedBy(caller, job_id).status();
  return status.ok() ? absl::NotFoundError("no such job") : status;
}

void ControlService::FillQuota(const Caller& caller, uint32_t jobs_owned,
                               v1::QuotaStatus* quota) {
  const UserLimits& limits = parts_.quotas->For(caller.uid);
  quota->set_jobs_limit(limits.jobs);
  quota->set_data_planes_limit(limits.data_planes);
  quota->set_control_connections_limit(limits.control_connections);
  quota->set_host_pool_limit_bytes(limits.host_pool_bytes);
  quota->set_ssd_limit_bytes(limits.ssd_bytes);
  quota->set_jobs(jobs_owned);
  quota->set_ssd_held_bytes(parts_.ledger->HeldBy(caller.uid));
  quota->set_daemon_memory_limit_bytes(limits.daemon_memory_bytes);
  quota->set_state_tier_limit_bytes(limits.state_tier_bytes);
  quota->set_daemon_memory_held_bytes(
      parts_.sessions->DaemonMemoryHeld(caller.uid, "", ""));
}

}  // namespace lohan
