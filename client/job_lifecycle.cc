#include "client/job_lifecycle.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

constexpr std::chrono::milliseconds kPoll{10};

// The caller's job named `name`; NOT_FOUND when there is none.
absl::StatusOr<v1::Job> FindJob(ControlClient& client,
                                const std::string& name) {
  absl::StatusOr<std::vector<v1::Job>> jobs = client.ListJobs();
  if (!jobs.ok()) return jobs.status();
  for (v1::Job& job : *jobs) {
    if (job.spec().name() == name &&
        job.owner_uid() == client.hello().caller_uid()) {
      return std::move(job);
    }
  }
  return absl::NotFoundError(
      absl::StrCat("you have no job named \"", name, "\" on this daemon"));
}

absl::StatusOr<v1::OpenJobResponse> FindOrCreate(
    ControlClient& client, const v1::OpenJobRequest& request) {
  v1::OpenJobResponse response;
  if (request.resume()) {
    absl::StatusOr<v1::Job> job = FindJob(client, request.spec().name());
    if (!job.ok()) return job.status();
    *response.mutable_job() = *std::move(job);
    return response;
  }
  absl::StatusOr<v1::CreateJobResponse> created =
      client.CreateJobReply(request.spec());
  if (!created.ok()) return created.status();
  *response.mutable_job() = created->job();
  *response.mutable_arena() = created->arena();
  response.set_created(true);
  return response;
}

}  // namespace

absl::StatusOr<OpenedJob> OpenJob(ControlClient& client,
                                  const v1::OpenJobRequest& request) {
  absl::StatusOr<v1::OpenJobResponse> found = FindOrCreate(client, request);
  if (!found.ok()) return found.status();
  const std::string& job_id = found->job().id();
  const absl::Status attached = client.AttachJob(job_id).status();
  absl::StatusOr<std::unique_ptr<DataPlane>> plane =
      attached.ok() ? OpenDataPlane(client, job_id)
                    : absl::StatusOr<std::unique_ptr<DataPlane>>(attached);
  if (!plane.ok()) {
    if (found->created()) (void)client.DeleteJob(job_id);
    return plane.status();
  }
  return OpenedJob{*std::move(found), *std::move(plane)};
}

absl::StatusOr<std::unique_ptr<DataPlane>> OpenDataPlane(
    ControlClient& client, const std::string& job_id) {
  const std::string& path = client.hello().data_socket_path();
  if (path.empty()) {
    return absl::UnimplementedError(
        "this lohand has no data plane; upgrade it");
  }
  const auto deadline = std::chrono::steady_clock::now() + kArenaReturnTimeout;
  while (true) {
    absl::StatusOr<std::unique_ptr<DataPlane>> plane =
        DataPlane::Open(path, job_id);
    if (plane.ok() ||
        plane.status().code() != absl::StatusCode::kAlreadyExists ||
        std::chrono::steady_clock::now() > deadline) {
      return plane;
    }
    std::this_thread::sleep_for(kPoll);
  }
}

absl::StatusOr<std::unique_ptr<DataPlane>> ReopenDataPlane(
    ControlClient& client, const std::string& job_id) {
  if (absl::Status returned = WaitForArenaReturn(client, job_id);
      !returned.ok()) {
    return returned;
  }
  return OpenDataPlane(client, job_id);
}

absl::Status WaitForArenaReturn(ControlClient& client,
                                const std::string& job_id) {
  const auto deadline = std::chrono::steady_clock::now() + kArenaReturnTimeout;
  while (true) {
    absl::StatusOr<v1::GetStatusResponse> status = client.GetStatus();
    if (!status.ok()) return status.status();
    bool held = false;
    for (const auto& arena : status->pool().arenas()) {
      held = held || arena.job_id() == job_id;
    }
    if (!held) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lohand still holds the arena of job ", job_id, " ",
          kArenaReturnTimeout.count(), " s after its data plane closed"));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

absl::Status CloseJob(ControlClient& client, const std::string& job_id,
                      bool delete_job) {
  absl::Status status = WaitForArenaReturn(client, job_id);
  absl::Status detached = client.DetachJob(job_id).status();
  if (status.ok()) status = detached;
  if (delete_job) {
    absl::Status deleted = client.DeleteJob(job_id);
    if (status.ok()) status = deleted;
  }
  return status;
}

}  // namespace lohan
