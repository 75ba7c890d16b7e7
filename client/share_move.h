#ifndef LOHAN_CLIENT_SHARE_MOVE_H_
#define LOHAN_CLIENT_SHARE_MOVE_H_

// A job's data plane moved to another arena between iterations, in place:
// lohand asks for it at an ITER_END (CompletionEntry::arena_asked, issue
// #47's elastic shares) when the job holds more of the shared host pool
// than its owner's share while another user needs it (a shrink: the model
// then streams through fewer shared buffers), or when the pool has room
// again (a grow). The plane is closed and opened again (lohand grants the
// arena it asked), the model registered again as it was and the arena
// pinned again for CUDA where the old one was. The objects the caller holds
// stay (the plane's owner, its ArenaPinning, the ModelChannel and whatever
// holds that, e.g. TrainingSteps); what they hold of the plane is replaced.
// The C ABI's lohan_job_follow_share translates FollowShare.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/arena_pinning.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "client/model_channel.h"
#include "proto/lohan.pb.h"

namespace lohan {

// What a move asks of lohand's control plane for one job: its data plane
// again, and the model registered over it. ControlFor is the real one;
// tests play it.
class MoveControl {
 public:
  virtual ~MoveControl() = default;
  // The job's data plane again after this process closed its last one,
  // once lohand has taken that one's arena back.
  virtual absl::StatusOr<std::unique_ptr<DataPlane>> ReopenPlane() = 0;
  // Registers the job's model as `spec` over the plane ReopenPlane opened.
  virtual absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::ModelSpec& spec) = 0;
};

// `control`'s calls for `job_id` (ReopenDataPlane, RegisterModel). Both
// must outlive it.
std::unique_ptr<MoveControl> ControlFor(ControlClient& control,
                                        const std::string& job_id);

// How long a move waits for CUDA copies to or from the old arena still to
// call back (as lohan_data_plane_destroy does).
inline constexpr absl::Duration kMoveCallbackPatience = absl::Seconds(60);

// The spec a model registered as `spec` is registered with again on its
// job's new plane: the same, resuming at the job's committed iteration
// (initial_iteration 0: a job with states refuses any other; no
// revert_last_commit: the job is where it was).
v1::ModelSpec SpecToRegisterAgain(const v1::ModelSpec& spec);

// Moves the job's data plane to a new one with the arena lohand grants now,
// whether or not it asked (FollowShare is the caller that checks): waits
// for the last iteration's commit (ITER_COMMITTED), detaches `model` and
// `pinning` from `*plane` and closes it, opens the job's plane again, then
// registers the model again (SpecToRegisterAgain(model.spec()): laid out
// anew in the new arena, its iterations numbered from the job's committed
// count) and pins the new arena on the device the old one was pinned on.
// Every pointer into the old arena is invalid afterwards.
// REQUIRES: `model` is registered over `*plane` and `pinning` holds it;
// nobody uses any of them meanwhile.
// Nothing done (FAILED_PRECONDITION unless said): no plane (`plane` null),
// INVALID_ARGUMENT for a model registered over another plane, an iteration
// in progress, a request with its ticket not yet waited for, CUDA copies
// still calling back after kMoveCallbackPatience, or the commit's failure.
// A later failure says which step failed and leaves the job without a
// data plane: `plane` null, `model` and `pinning` detached (their calls
// fail with FAILED_PRECONDITION saying so); the job keeps its committed
// iterations for an open with resume.
absl::Status MoveDataPlane(MoveControl& control,
                           std::unique_ptr<DataPlane>& plane,
                           ArenaPinning& pinning, ModelChannel& model);

// When lohand asked at the last ITER_END (model.arena_asked() not 0):
// MoveDataPlane, then true. False, nothing done, when it asked nothing.
// Errors as MoveDataPlane's.
absl::StatusOr<bool> FollowShare(MoveControl& control,
                                 std::unique_ptr<DataPlane>& plane,
                                 ArenaPinning& pinning, ModelChannel& model);
// The same over `control` for `job_id`.
absl::StatusOr<bool> FollowShare(ControlClient& control,
                                 const std::string& job_id,
                                 std::unique_ptr<DataPlane>& plane,
                                 ArenaPinning& pinning, ModelChannel& model);

}  // namespace lohan

#endif  // LOHAN_CLIENT_SHARE_MOVE_H_
