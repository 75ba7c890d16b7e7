#ifndef LOHAN_CLIENT_TRAINING_STEPS_H_
#define LOHAN_CLIENT_TRAINING_STEPS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/model_channel.h"
#include "proto/training_steps.pb.h"

namespace lohan {

// A training process's optimizer steps on its registered model, one after
// another, as every plugin runs them: the committed-step count, the
// learning rate, the loss scaling, and the step in progress: begun when
// the plugin has its first gradient, each layer's gradient handed over
// (GRAD_READY, not waited for: the daemon's update of a layer runs while
// backward goes on), then ended (the daemon decides the global norm,
// clips or skips) or thrown away (the daemon rolls back the updates it
// ran). The plugin keeps what is torch's: the hooks that collect a
// layer's gradients, gradient accumulation, the copies into the model.
//
// A gradient buffer that several layers share (a streamed layout) is
// refilled only once the daemon has taken the previous gradient out of
// it: ClaimGradBuffer waits for that before the plugin writes into it.
//
// Not thread-safe: one thread at a time (autograd's device thread while
// the training thread waits in backward is fine). The channel must
// outlive this.
class TrainingSteps {
 public:
  // What the daemon decided at the end of a step.
  struct Outcome {
    double global_norm = 0.0;  // before clipping
    bool clipped = false;
    bool skipped = false;  // non-finite gradients: no update, not counted
  };

  // INVALID_ARGUMENT naming the field for an lr or loss scaling out of
  // range (see proto/training_steps.proto). The count starts at the
  // registration's committed iterations.
  static absl::StatusOr<std::unique_ptr<TrainingSteps>> Create(
      ModelChannel& channel, const v1::TrainingStepsOptions& options);

  TrainingSteps(const TrainingSteps&) = delete;
  TrainingSteps& operator=(const TrainingSteps&) = delete;

  // Committed steps (skipped ones do not count).
  uint64_t committed() const { return committed_; }
  // The daemon has begun a step that has not ended yet.
  bool active() const { return active_; }
  // The rate of the last step begun, or of the next one if set since.
  double learning_rate() const { return lr_; }
  // The rate of the steps begun from now on; INVALID_ARGUMENT unless
  // finite and >= 0.
  absl::Status SetLearningRate(double lr);
  const v1::LossScaling& loss_scaling() const { return loss_scaling_; }
  // Replaces the loss scaling state (a framework's saved scaler state);
  // checked as at Create.
  absl::Status SetLossScaling(const v1::LossScaling& loss_scaling);
  // The factor to multiply this step's loss by; the step's gradients then
  // carry it and the daemon divides it out (exact: a power of two when
  // dynamic).
  double ScaleLoss();

  // Begins a step unless one is in progress, at `lr` when given (checked
  // as SetLearningRate), else at learning_rate(). On the daemon's refusal
  // no step is in progress and the loss is unscaled again.
  absl::Status Begin(std::optional<double> lr = std::nullopt);

  // Waits until the layer's gradient buffer is free to write: every
  // GRAD_READY that used it (another layer's, in a shared buffer) has been
  // taken by the daemon. The first failure is returned.
  absl::Status ClaimGradBuffer(uint32_t layer);
  // The layer's gradient is in its buffer: GRAD_READY, not waited for.
  // FAILED_PRECONDITION outside a step.
  absl::Status GradReady(uint32_t layer);
  // The layer's gradient at `source` on CUDA device `device`: copied into
  // its buffer on `cuda_stream`, then GRAD_READY (ModelChannel's
  // GradReadyFromDevice). FAILED_PRECONDITION outside a step.
  absl::Status GradReadyFromDevice(uint32_t layer, int device,
                                   const void* source, uint64_t bytes,
                                   void* cuda_stream);

  // Ends the step: waits for every gradient handed over, then ITER_END.
  // `global_sum_squares` (data-parallel ranks whose jobs hold shards): the
  // sum over every rank of the squares of the gradients as handed over
  // (still carrying the loss scale), the same on every rank. A gradient's
  // failure throws the step away first (ITER_ABORT) and is returned; the
  // daemon's refusal of ITER_END is returned with the step rolled back.
  // Either way no step is in progress after. FAILED_PRECONDITION when
  // none is.
  absl::StatusOr<Outcome> End(
      std::optional<double> global_sum_squares = std::nullopt);
  // Throws the step in progress away (the updates the daemon ran with it
  // rolled back); a no-op between steps. Every hand-over is waited for
  // first, failures ignored; the daemon's refusal of the abort is
  // returned, this side clean all the same.
  absl::Status Discard();
  // Lets every hand-over in flight land or fail, up to `timeout` each,
  // failures ignored: before the arena goes.
  void Settle(absl::Duration timeout);

 private:
  TrainingSteps(ModelChannel& channel, const v1::TrainingStepsOptions& options);

  absl::Status Track(uint32_t layer,
                     const absl::StatusOr<ModelChannel::Ticket>& submitted);
  // Waits for every hand-over in flight (forgotten after); the first
  // failure.
  absl::Status WaitForHandOvers(absl::Duration timeout);
  // After a step the daemon skipped or committed.
  void UpdateLossScale(bool skipped);
  // What ITER_BEGIN's grad_scale says the gradients carry.
  float GradScale() const;

  ModelChannel& channel_;
  uint64_t committed_;
  double lr_;
  v1::LossScaling loss_scaling_;
  bool active_ = false;
  bool scaled_ = false;  // this step's loss was scaled
  // The GRAD_READYs in flight per gradient buffer (its address): one,
  // or more where copies from a GPU queue up behind each other (the data
  // plane orders those itself; nothing waits for them here).
  std::unordered_map<const uint8_t*, std::vector<ModelChannel::Ticket>>
      in_flight_;
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_TRAINING_STEPS_H_
