#include "client/training_steps.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

absl::Status CheckLearningRate(double lr) {
  if (lr >= 0.0 && std::isfinite(lr)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("learning rate ", lr, ": it must be finite and >= 0"));
}

absl::Status CheckLossScaling(const v1::LossScaling& scaling) {
  if (!(scaling.scale() > 0.0) || !std::isfinite(scaling.scale())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_scaling.scale ", scaling.scale(), ": it must be finite and > 0"));
  }
  if (scaling.dynamic() && scaling.growth_interval() == 0) {
    return absl::InvalidArgumentError(
        "loss_scaling.growth_interval is 0: a dynamic scale needs >= 1 good "
        "steps before it grows");
  }
  return absl::OkStatus();
}

// The state to start from: a dynamic scale goes on where the resumed run
// left it (else a resumed fp16 run would start again at its initial scale
// and skip steps finding its way down).
v1::LossScaling StartingScaling(const v1::TrainingStepsOptions& options) {
  v1::LossScaling scaling = options.loss_scaling();
  if (scaling.dynamic() && options.has_resumed() &&
      options.resumed().scale() > 0.0) {
    scaling.set_scale(options.resumed().scale());
    scaling.set_good_steps(options.resumed().good_steps());
  }
  return scaling;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingSteps>> TrainingSteps::Create(
    ModelChannel& channel, const v1::TrainingStepsOptions& options) {
  if (absl::Status lr = CheckLearningRate(options.lr()); !lr.ok()) return lr;
  if (absl::Status scaling = CheckLossScaling(StartingScaling(options));
      !scaling.ok()) {
    return scaling;
  }
  return std::unique_ptr<TrainingSteps>(new TrainingSteps(channel, options));
}

TrainingSteps::TrainingSteps(ModelChannel& channel,
                             const v1::TrainingStepsOptions& options)
    : channel_(channel),
      committed_(channel.iteration()),
      lr_(options.lr()),
      loss_scaling_(StartingScaling(options)) {}

absl::Status TrainingSteps::SetLearningRate(double lr) {
  if (absl::Status checked = CheckLearningRate(lr); !checked.ok()) {
    return checked;
  }
  lr_ = lr;
  return absl::OkStatus();
}

absl::Status TrainingSteps::SetLossScaling(const v1::LossScaling& scaling) {
  if (absl::Status checked = CheckLossScaling(scaling); !checked.ok()) {
    return checked;
  }
  loss_scaling_ = scaling;
  return absl::OkStatus();
}

double TrainingSteps::ScaleLoss() {
  scaled_ = true;
  return loss_scaling_.scale();
}

float TrainingSteps::GradScale() const {
  return scaled_ ? static_cast<float>(1.0 / loss_scaling_.scale()) : 1.0f;
}

absl::Status TrainingSteps::Begin(std::optional<double> lr) {
  if (active_) return absl::OkStatus();
  if (lr.has_value()) {
    if (absl::Status checked = SetLearningRate(*lr); !checked.ok()) {
      return checked;
    }
  }
  if (absl::Status begun = channel_.IterBegin(GradScale(), lr_); !begun.ok()) {
    scaled_ = false;  // the next backward starts clean
    return begun;
  }
  active_ = true;
  return absl::OkStatus();
}

absl::Status TrainingSteps::ClaimGradBuffer(uint32_t layer) {
  absl::StatusOr<uint8_t*> buffer = channel_.GradBuffer(layer);
  if (!buffer.ok()) return buffer.status();
  const auto found = in_flight_.find(*buffer);
  if (found == in_flight_.end()) return absl::OkStatus();
  const std::vector<ModelChannel::Ticket> tickets = std::move(found->second);
  in_flight_.erase(found);
  absl::Status first;
  for (const ModelChannel::Ticket ticket : tickets) {
    first.Update(channel_.Wait(ticket, ModelChannel::kCallTimeout));
  }
  return first;
}

absl::Status TrainingSteps::Track(
    uint32_t layer, const absl::StatusOr<ModelChannel::Ticket>& submitted) {
  if (!submitted.ok()) return submitted.status();
  absl::StatusOr<uint8_t*> buffer = channel_.GradBuffer(layer);
  if (!buffer.ok()) return buffer.status();
  in_flight_[*buffer].push_back(*submitted);
  return absl::OkStatus();
}

absl::Status TrainingSteps::GradReady(uint32_t layer) {
  if (!active_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GRAD_READY of layer ", layer, " outside a step: begin it first"));
  }
  return Track(layer, channel_.SubmitGradReady(layer));
}

absl::Status TrainingSteps::GradReadyFromDevice(uint32_t layer, int device,
                                                const void* source,
                                                uint64_t bytes,
                                                void* cuda_stream) {
  if (!active_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GRAD_READY of layer ", layer, " outside a step: begin it first"));
  }
  return Track(layer, channel_.GradReadyFromDevice(layer, device, source, bytes,
                                                   cuda_stream));
}

absl::Status TrainingSteps::WaitForHandOvers(absl::Duration timeout) {
  absl::Status first;
  for (const auto& [buffer, tickets] : in_flight_) {
    for (const ModelChannel::Ticket ticket : tickets) {
      first.Update(channel_.Wait(ticket, timeout));
    }
  }
  in_flight_.clear();
  return first;
}

absl::StatusOr<TrainingSteps::Outcome> TrainingSteps::End(
    std::optional<double> global_sum_squares) {
  if (!active_) {
    return absl::FailedPreconditionError(
        "no step in progress: its first gradient begins it");
  }
  // GRAD_READYs posted once a GPU copy is done must reach the daemon
  // before ITER_END does.
  if (absl::Status handed = WaitForHandOvers(ModelChannel::kCallTimeout);
      !handed.ok()) {
    Discard().IgnoreError();  // the first failure is the one to report
    return handed;
  }
  if (global_sum_squares.has_value()) {
    // As the daemon counts them: times this step's gradient scale.
    const double scale = GradScale();
    *global_sum_squares *= scale * scale;
  }
  absl::StatusOr<ModelChannel::IterEndResult> ended =
      channel_.IterEnd(global_sum_squares);
  // Over either way: on an error the daemon rolled the step back.
  active_ = false;
  scaled_ = false;
  if (!ended.ok()) return ended.status();
  if (!ended->skipped) ++committed_;
  UpdateLossScale(ended->skipped);
  return Outcome{ended->global_norm, ended->clipped, ended->skipped};
}

void TrainingSteps::UpdateLossScale(bool skipped) {
  if (!loss_scaling_.dynamic()) return;
  if (skipped) {
    loss_scaling_.set_scale(std::max(loss_scaling_.scale() / 2.0, 1.0));
    loss_scaling_.set_good_steps(0);
    return;
  }
  loss_scaling_.set_good_steps(loss_scaling_.good_steps() + 1);
  if (loss_scaling_.good_steps() >= loss_scaling_.growth_interval()) {
    loss_scaling_.set_scale(loss_scaling_.scale() * 2.0);
    loss_scaling_.set_good_steps(0);
  }
}

absl::Status TrainingSteps::Discard() {
  WaitForHandOvers(ModelChannel::kCallTimeout).IgnoreError();
  scaled_ = false;
  if (!active_) return absl::OkStatus();
  active_ = false;
  return channel_.IterAbort();
}

void TrainingSteps::Settle(absl::Duration timeout) {
  WaitForHandOvers(timeout).IgnoreError();
}

}  // namespace lohan
