#include "daemon/session/job_settings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spec/model_spec_checks.h"

namespace lohan {

absl::StatusOr<JobSettings> ResolveJobSettings(const v1::ModelSpec& spec,
                                               const JobDefaults& defaults,
                                               const JobContext& job) {
  if (absl::Status durability = CheckRequestedDurability(spec);
      !durability.ok()) {
    return durability;
  }
  if (job.data_parallel_rank &&
      (spec.commit_interval() > 1 || spec.durable_every_seconds() > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelSpec ",
        spec.durable_every_seconds() > 0.0 ? "durable_every_seconds"
                                           : "commit_interval",
        " asks for fewer durable steps, but a data-parallel rank's job makes "
        "every step durable (it keeps the commit its peers may go back to); "
        "leave durability to the default for ranks"));
  }
  JobSettings settings;
  settings.clip_schedule = spec.clip_schedule() == v1::CLIP_SCHEDULE_REDO_ALL
                               ? ClipSchedule::kRedoAll
                               : ClipSchedule::kDeferWhenCertain;
  settings.initial_iteration = spec.initial_iteration();
  settings.revert_last_commit = spec.revert_last_commit();
  settings.settle_in_background = spec.overlap_updates();
  settings.keep_previous_commit = job.data_parallel_rank;
  settings.expect_stored_states = job.expect_stored_states;
  settings.weight = job.weight;
  settings.fair_group = job.fair_group;
  settings.read_ahead_bytes = defaults.read_ahead_bytes;
  settings.read_ahead_adapts = defaults.read_ahead_adapts;
  settings.read_ahead_shares = defaults.read_ahead_shares;
  settings.state_tier = defaults.state_tier;
  settings.state_tier.group_limit_bytes = job.state_tier_limit_bytes;

  const bool every_iteration =
      settings.keep_previous_commit ||
      settings.clip_schedule != ClipSchedule::kDeferWhenCertain;
  if (every_iteration) {
    settings.commit_interval = 1;
    settings.durable_every_seconds = 0.0;
  } else if (spec.commit_interval() != 0 ||
             spec.durable_every_seconds() != 0.0) {
    settings.commit_interval = std::max(spec.commit_interval(), 1u);
    settings.durable_every_seconds = spec.durable_every_seconds();
  } else {
    settings.commit_interval = std::max(defaults.commit_interval, 1u);
    settings.durable_every_seconds =
        defaults.commit_interval != 0 ? 0.0 : defaults.durable_every_seconds;
    settings.durable_write_share = settings.durable_every_seconds > 0.0
                                       ? defaults.durable_write_share
                                       : 0.0;
  }
  return settings;
}

PipelineOptions PipelineOptionsFor(const JobSettings& settings,
                                   const ModelBuffers& buffers,
                                   FairQueue* queue) {
  PipelineOptions options;
  options.clip_schedule = settings.clip_schedule;
  options.commit_interval = settings.commit_interval;
  options.durable_every_seconds = settings.durable_every_seconds;
  options.durable_write_share = settings.durable_write_share;
  options.initial_iteration = settings.initial_iteration;
  options.keep_previous_commit = settings.keep_previous_commit;
  options.revert_last_commit = settings.revert_last_commit;
  options.expect_stored_states = settings.expect_stored_states;
  options.settle_in_background = settings.settle_in_background;
  options.read_ahead_bytes = settings.read_ahead_bytes;
  options.read_ahead_adapts = settings.read_ahead_adapts;
  options.read_ahead_shares = settings.read_ahead_shares;
  options.state_tier = settings.state_tier;
  options.optimizer_queue = queue;
  options.weight = settings.weight;
  options.fair_group = settings.fair_group;
  options.stream_gradients = buffers.streamed_grads;
  // An fp32 model has no 16-bit copy: FETCH_PARAMS reads the masters.
  options.stream_weight16 = buffers.streamed_weights && !buffers.fp32;
  // Resident fp32: the updates write the masters into the weight buffers.
  options.fp32_weights_out = !buffers.streamed_weights && buffers.fp32;
  // Streamed weights are fetched right after their update: from memory.
  options.hand_off_weights = buffers.streamed_weights;
  return options;
}

}  // namespace lohan
