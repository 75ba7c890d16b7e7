#ifndef LOHAN_DAEMON_RPC_CONTROL_SERVICE_H_
#define LOHAN_DAEMON_RPC_CONTROL_SERVICE_H_

#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>

#include "daemon/common/log_limiter.h"
#include "daemon/config/config.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/optim/adam.h"
#include "daemon/pool/host_pool.h"
#include "daemon/profile/host_profile.h"
#include "daemon/rpc/peer_table.h"
#include "daemon/session/session_manager.h"
#include "daemon/store/tensor_store.h"
#include "proto/lohan.grpc.pb.h"

namespace lohan {

// The daemon's long-lived parts the control plane reports on or acts
// through. Borrowed: each must outlive the service.
struct DaemonParts {
  const DaemonConfig* config = nullptr;
  JobRegistry* jobs = nullptr;
  TensorStore* store = nullptr;
  const AdamUpdater* optimizer = nullptr;
  uint32_t optimizer_threads = 0;
  // The optimizer as GetStatus reports it (kernel, tuning and where they
  // come from); may be null (threads and kernel name alone).
  const v1::OptimizerStatus* optimizer_status = nullptr;
  const HostPool* pool = nullptr;
  SessionManager* sessions = nullptr;
  // The state tier's size ([pool] state_tier resolved; 0: off).
  uint64_t state_tier_bytes = 0;
  const QuotaTable* quotas = nullptr;
  SpaceLedger* ledger = nullptr;
  // The machine's profile, for GetStatus and PlanJob; may be null.
  const HostProfiler* profiler = nullptr;
  // Called with a job's id once it is deleted (the fair queues forget its
  // flow, the session manager its counts); may be empty.
  std::function<void(const std::string& job_id)> job_deleted;
};

// The lohan.v1.Lohan gRPC service: identifies the caller, translates requests
// into JobRegistry calls and maps absl::Status codes one to one onto gRPC's.
// Holds no logic of its own.
class ControlService final : public v1::Lohan::Service {
 public:
  // REQUIRES: `peers` and everything in `parts` outlive the service.
  ControlService(const DaemonParts& parts, const PeerTable* peers);

  grpc::Status Hello(grpc::ServerContext* context,
                     const v1::HelloRequest* request,
                     v1::HelloResponse* response) override;
  grpc::Status CreateJob(grpc::ServerContext* context,
                         const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override;
  grpc::Status AttachJob(grpc::ServerContext* context,
                         const v1::AttachJobRequest* request,
                         v1::AttachJobResponse* response) override;
  grpc::Status DetachJob(grpc::ServerContext* context,
                         const v1::DetachJobRequest* request,
                         v1::DetachJobResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status KeepJob(grpc::ServerContext* context,
                       const v1::KeepJobRequest* request,
                       v1::KeepJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  // What GetStatus answers `caller` (root: every job). Thread-safe, as the
  // handlers are; lohand's metrics (daemon/main, metrics/) read it as root.
  v1::GetStatusResponse StatusFor(const Caller& caller);
  grpc::Status RegisterModel(grpc::ServerContext* context,
                             const v1::RegisterModelRequest* request,
                             v1::RegisterModelResponse* response) override;
  grpc::Status StopJob(grpc::ServerContext* context,
                       const v1::StopJobRequest* request,
                       v1::StopJobResponse* response) override;
  // The caller's own job, attached by the calling process, with its model
  // registered (SessionManager::PlanJob's checks); then the plan from the
  // request's profile, lohand's HostProfile (UNAVAILABLE while it is still
  // measuring), the session's layout and registered layers (its weight
  // unit: WeightUnitsOf) and the SSD room the ledger and the store leave
  // the job (plan/job_plan.h).
  grpc::Status PlanJob(grpc::ServerContext* context,
                       const v1::PlanJobRequest* request,
                       v1::PlanJobResponse* response) override;
  // The whole plan kept with a job's session (SessionManager::KeptPlan).
  grpc::Status GetJobPlan(grpc::ServerContext* context,
                          const v1::GetJobPlanRequest* request,
                          v1::PlanJobResponse* response) override;

 private:
  // The job, created with the request's spec; with JobSpec.model, its arena
  // sized for the model first (SizeJobArena), reported in `response`.
  absl::StatusOr<v1::Job> CreateSized(const Caller& caller,
                                      const v1::CreateJobRequest& request,
                                      v1::CreateJobResponse* response);
  // NOT_FOUND (as JobRegistry says it) unless the caller owns the job or
  // is root.
  absl::Status CheckOwned(const Caller& caller, const std::string& job_id);
  // The caller's limits and holdings (`jobs_owned`: the caller's own jobs).
  void FillQuota(const Caller& caller, uint32_t jobs_owned,
                 v1::QuotaStatus* quota);
  // Job `job_id`'s entry of TensorStore::BytesByJob (0 when absent).
  static uint64_t SsdBytesOf(const std::map<std::string, uint64_t>& by_job,
                             const std::string& job_id);
  // Sets `job`'s share counts from SessionManager::ShareCountsByJob
  // (zeros when absent).
  static void SetShareCounts(
      const std::map<std::string, SessionManager::ShareCounts>& by_job,
      v1::Job& job);

  const DaemonParts parts_;
  const DaemonConfig* const config_;
  const PeerTable* const peers_;
  JobRegistry* const jobs_;
  const std::chrono::steady_clock::time_point started_;
  const int64_t started_unix_seconds_;
  // Refused CreateJobs are logged (the operator sees why a user's job did
  // not start), a few per user per minute.
  LogLimiter refusal_log_{3, absl::Seconds(60)};
  // Held while a plan is made (PlanJob): one at a time.
  absl::Mutex plan_mu_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_CONTROL_SERVICE_H_
