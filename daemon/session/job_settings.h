#ifndef LOHAN_DAEMON_SESSION_JOB_SETTINGS_H_
#define LOHAN_DAEMON_SESSION_JOB_SETTINGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/sched/state_tier.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The daemon's per-job defaults (lohand.toml's [pool] and [optimizer] keys),
// built once when lohand starts and the same for every job. A job's request
// (its ModelSpec) is resolved against them by ResolveJobSettings alone.
struct JobDefaults {
  // The durability of a job whose spec states none (ModelSpec.commit_interval
  // and durable_every_seconds both 0): [pool] commit_interval (>= 1), or,
  // that 0, [pool] durable_every (seconds, > 0), with durable_write_share
  // > 0 where it is "auto" (kAutoDurableWriteShare).
  uint32_t commit_interval = 1;
  double durable_every_seconds = 0.0;
  double durable_write_share = 0.0;
  // [optimizer] read_ahead: host memory each job may fill with states read
  // ahead of updates that wait for the norm (PipelineOptions::
  // read_ahead_bytes), and that memory shared among jobs by their owners'
  // weights (may be null: each job up to read_ahead_bytes); "auto": each
  // job reads ahead what its backward fills (PipelineOptions::
  // read_ahead_adapts).
  uint64_t read_ahead_bytes = 0;
  bool read_ahead_adapts = false;
  MemoryShares* read_ahead_shares = nullptr;
  // [pool] state_tier and state_tier_updates: the host memory for optimizer
  // states all jobs share (no shares: no tier). Its group_limit_bytes is
  // each job's owner's (JobContext::state_tier_limit_bytes).
  StateTierMemory state_tier;
};

// What the daemon knows of a job beside its request: its registry entry and
// its owner's quotas.
struct JobContext {
  // A data-parallel rank's job (JobSpec.run): each commit keeps the states
  // it replaced until the next ITER_BEGIN.
  bool data_parallel_rank = false;
  // The registry says the store has held the job's states (Job.has_states).
  bool expect_stored_states = false;
  // The owner's share of the optimizer ([quotas] weight) and its group.
  double weight = 1.0;
  std::string fair_group;
  // The owner's [quotas] state_tier (0: no limit of its own).
  uint64_t state_tier_limit_bytes = 0;
};

// One job's settings: its request resolved against the daemon's defaults
// and what the daemon knows of the job. Every field holds a value the
// pipeline accepts (JobPipeline::Open's checks).
struct JobSettings {
  ClipSchedule clip_schedule = ClipSchedule::kDeferWhenCertain;
  // Durability: every commit_interval (>= 1) iterations, or, when
  // durable_every_seconds > 0, by time instead (PipelineOptions::
  // durable_write_share may stretch it: lohand's "auto" only).
  uint32_t commit_interval = 1;
  double durable_every_seconds = 0.0;
  double durable_write_share = 0.0;
  bool keep_previous_commit = false;
  bool revert_last_commit = false;
  bool expect_stored_states = false;
  uint64_t initial_iteration = 0;
  bool settle_in_background = false;
  uint64_t read_ahead_bytes = 0;
  bool read_ahead_adapts = false;
  MemoryShares* read_ahead_shares = nullptr;
  StateTierMemory state_tier;
  double weight = 1.0;
  std::string fair_group;
};

// Resolves `spec` against `defaults` for the job `job`:
//   - the clip schedule, initial iteration, revert_last_commit and
//     overlap_updates (settle_in_background) are the spec's;
//   - durability is the spec's when it states one (commit_interval or
//     durable_every_seconds nonzero), else the daemon's;
//   - a job that must commit every iteration durably does so, whatever the
//     daemon's default: a data-parallel rank's job (its kept commit is the
//     one its peers may go back to) and a job on the redo-all clip
//     schedule; a spec of either that asks for more than every iteration
//     is refused, not overridden (see below);
//   - the read-ahead memory and the state tier are the daemon's, the tier
//     limited to the owner's quota of it.
// INVALID_ARGUMENT naming the option when the spec's request cannot work
// (CheckRequestedDurability, spec/model_spec_checks.h), or cannot work for
// this job (a rank's job asking for commit_interval > 1 or
// durable_every_seconds).
absl::StatusOr<JobSettings> ResolveJobSettings(const v1::ModelSpec& spec,
                                               const JobDefaults& defaults,
                                               const JobContext& job);

// How the arena holds a registered model's buffers, which the pipeline's
// options follow.
struct ModelBuffers {
  bool streamed_grads = false;
  bool streamed_weights = false;
  bool fp32 = false;  // an fp32 model: no 16-bit copy of its weights
};

// The options a job's pipeline runs with: `settings`, the model's
// `buffers`, and the optimizer's `queue` (may be null).
PipelineOptions PipelineOptionsFor(const JobSettings& settings,
                                   const ModelBuffers& buffers,
                                   FairQueue* queue);

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_JOB_SETTINGS_H_
