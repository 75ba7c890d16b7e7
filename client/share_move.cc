#include "client/share_move.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/job_lifecycle.h"
#include "client/plane_gone.h"

namespace lohan {
namespace {

class ControlClientMoves : public MoveControl {
 public:
  ControlClientMoves(ControlClient& control, const std::string& job_id)
      : control_(control), job_id_(job_id) {}

  absl::StatusOr<std::unique_ptr<DataPlane>> ReopenPlane() override {
    return ReopenDataPlane(control_, job_id_);
  }

  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::ModelSpec& spec) override {
    v1::RegisterModelRequest request;
    request.set_job_id(job_id_);
    *request.mutable_model() = spec;
    return control_.RegisterModel(request);
  }

 private:
  ControlClient& control_;
  const std::string job_id_;
};

// `status` with the step of the move that failed in front of its text.
absl::Status AtStep(absl::string_view step, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("moving the data plane to another arena: ",
                                   step, ": ", status.message()));
}

// The refusals that leave everything as it was (see MoveDataPlane).
absl::Status CheckMovable(const DataPlane* plane, const ArenaPinning& pinning,
                          const ModelChannel& model) {
  if (plane == nullptr) return PlaneGoneError("moving the data plane");
  if (model.plane() != plane) {
    return absl::InvalidArgumentError(
        "moving the data plane: the model is not registered over this data "
        "plane");
  }
  if (model.in_iteration()) {
    return absl::FailedPreconditionError(
        "moving the data plane: an iteration is in progress; move between "
        "iterations, after its ITER_END");
  }
  if (const size_t pending = plane->outstanding(); pending > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "moving the data plane: ", pending,
        " requests have not been waited for; wait for every ticket first"));
  }
  if (!pinning.AwaitCallbacks(kMoveCallbackPatience)) {
    return absl::FailedPreconditionError(
        absl::StrCat("moving the data plane: ", pinning.callbacks_left(),
                     " CUDA copies to or from the arena have not completed"));
  }
  return absl::OkStatus();
}

// The model registered over `plane` (just opened) and the arena pinned
// where the old one was (`pinned`); on failure neither holds `plane`.
absl::Status Reattach(MoveControl& control, DataPlane& plane,
                      ArenaPinning& pinning, ModelChannel& model,
                      std::optional<int> pinned) {
  absl::StatusOr<v1::RegisterModelResponse> registration =
      control.RegisterModel(SpecToRegisterAgain(model.spec()));
  if (!registration.ok()) {
    return AtStep("registering the model again", registration.status());
  }
  if (absl::Status attached =
          model.AttachPlane(plane, *std::move(registration));
      !attached.ok()) {
    return AtStep("registering the model again", attached);
  }
  pinning.Attach(plane);
  if (!pinned.has_value()) return absl::OkStatus();
  absl::Status repinned = pinning.Register(*pinned, "pinning the new arena");
  if (!repinned.ok()) {
    model.DetachPlane();
    pinning.Detach();
    return AtStep("pinning the new arena for CUDA", repinned);
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<MoveControl> ControlFor(ControlClient& control,
                                        const std::string& job_id) {
  return std::make_unique<ControlClientMoves>(control, job_id);
}

v1::ModelSpec SpecToRegisterAgain(const v1::ModelSpec& spec) {
  v1::ModelSpec again = spec;
  again.clear_initial_iteration();
  again.clear_revert_last_commit();
  return again;
}

absl::Status MoveDataPlane(MoveControl& control,
                           std::unique_ptr<DataPlane>& plane,
                           ArenaPinning& pinning, ModelChannel& model) {
  if (absl::Status movable = CheckMovable(plane.get(), pinning, model);
      !movable.ok()) {
    return movable;
  }
  // With overlap_updates the last iteration's updates may still run: a
  // plane closed under them would lose the iteration.
  if (absl::Status committed = model.AwaitCommitted().status();
      !committed.ok()) {
    return AtStep("waiting for the last iteration's commit", committed);
  }
  const std::optional<int> pinned = pinning.pinned_device();
  model.DetachPlane();
  pinning.Detach();  // unpins while the old arena is still mapped
  plane.reset();     // closes it: lohand takes its arena back
  absl::StatusOr<std::unique_ptr<DataPlane>> reopened = control.ReopenPlane();
  if (!reopened.ok()) {
    return AtStep("opening the data plane again", reopened.status());
  }
  if (absl::Status attached =
          Reattach(control, **reopened, pinning, model, pinned);
      !attached.ok()) {
    return attached;  // the new plane closes here
  }
  plane = *std::move(reopened);
  return absl::OkStatus();
}

absl::StatusOr<bool> FollowShare(MoveControl& control,
                                 std::unique_ptr<DataPlane>& plane,
                                 ArenaPinning& pinning, ModelChannel& model) {
  if (model.arena_asked() == 0) return false;
  if (absl::Status moved = MoveDataPlane(control, plane, pinning, model);
      !moved.ok()) {
    return moved;
  }
  return true;
}

absl::StatusOr<bool> FollowShare(ControlClient& control,
                                 const std::string& job_id,
                                 std::unique_ptr<DataPlane>& plane,
                                 ArenaPinning& pinning, ModelChannel& model) {
  std::unique_ptr<MoveControl> moves = ControlFor(control, job_id);
  return FollowShare(*moves, plane, pinning, model);
}

}  // namespace lohan
