#ifndef LOHAN_CLIENT_JOB_LIFECYCLE_H_
#define LOHAN_CLIENT_JOB_LIFECYCLE_H_

// A training process's hold on its job, the same for every plugin: open
// (find or create, attach, map the arena) and close (give the arena back,
// detach, maybe delete), each waiting out the daemon's return of a
// previous arena of the job.

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "proto/job_open.pb.h"

namespace lohan {

// How long an open waits for a previous data plane's arena to come back,
// and a close for its own (the daemon takes an arena back as soon as it
// sees the plane's connection close: milliseconds).
inline constexpr std::chrono::seconds kArenaReturnTimeout{30};

struct OpenedJob {
  v1::OpenJobResponse response;
  std::unique_ptr<DataPlane> plane;
};

// Finds the caller's job named request.spec.name (request.resume:
// NOT_FOUND when there is none) or creates it (ALREADY_EXISTS when it
// exists; the arena sized for request.spec.model), attaches it and opens
// its data plane. A job created here is deleted again when attaching or
// opening fails.
absl::StatusOr<OpenedJob> OpenJob(ControlClient& client,
                                  const v1::OpenJobRequest& request);

// The job's data plane (this process attached the job), waiting while the
// daemon still holds the arena of a plane just closed.
absl::StatusOr<std::unique_ptr<DataPlane>> OpenDataPlane(
    ControlClient& client, const std::string& job_id);

// The job's data plane again after this process closed it: waits until
// the daemon has seen the close (the arena back; until then it counts the
// plane as open), then opens.
absl::StatusOr<std::unique_ptr<DataPlane>> ReopenDataPlane(
    ControlClient& client, const std::string& job_id);

// Returns once the daemon no longer lists an arena of the job (its plane
// closed); DEADLINE_EXCEEDED after kArenaReturnTimeout.
absl::Status WaitForArenaReturn(ControlClient& client,
                                const std::string& job_id);

// After the job's data plane closed: waits for its arena's return,
// detaches the job and, with `delete_job`, deletes it. The first error.
absl::Status CloseJob(ControlClient& client, const std::string& job_id,
                      bool delete_job);

}  // namespace lohan

#endif  // LOHAN_CLIENT_JOB_LIFECYCLE_H_
