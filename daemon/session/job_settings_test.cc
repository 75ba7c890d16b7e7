#include "daemon/session/job_settings.h"

#include <cmath>
#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

MemoryShares* const kReadAheadShares = reinterpret_cast<MemoryShares*>(0x10);
MemoryShares* const kTierShares = reinterpret_cast<MemoryShares*>(0x20);

JobDefaults Defaults() {
  return JobDefaults{.commit_interval = 8,
                     .durable_every_seconds = 0.0,
                     .read_ahead_bytes = 64 << 20,
                     .read_ahead_shares = kReadAheadShares,
                     .state_tier = {.shares = kTierShares}};
}

TEST(ResolveJobSettings, AppliesTheDefaultsWhenTheSpecSaysNone) {
  const v1::ModelSpec spec;  // commit_interval and durable_every 0
  absl::StatusOr<JobSettings> settings =
      ResolveJobSettings(spec, Defaults(),
                         {.expect_stored_states = true,
                          .weight = 3.0,
                          .fair_group = "uid 1000",
                          .state_tier_limit_bytes = 1 << 20});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 8u);
  EXPECT_EQ(settings->durable_every_seconds, 0.0);
  EXPECT_EQ(settings->clip_schedule, ClipSchedule::kDeferWhenCertain);
  EXPECT_EQ(settings->read_ahead_bytes, uint64_t{64} << 20);
  EXPECT_EQ(settings->read_ahead_shares, kReadAheadShares);
  EXPECT_EQ(settings->state_tier.shares, kTierShares);
  EXPECT_EQ(settings->state_tier.group_limit_bytes, uint64_t{1} << 20);
  EXPECT_TRUE(settings->expect_stored_states);
  EXPECT_FALSE(settings->keep_previous_commit);
  EXPECT_EQ(settings->weight, 3.0);
  EXPECT_EQ(settings->fair_group, "uid 1000");
}

TEST(ResolveJobSettings, DefaultIntervalZeroMeansDurableByTime) {
  JobDefaults defaults = Defaults();
  defaults.commit_interval = 0;
  defaults.durable_every_seconds = 300.0;
  absl::StatusOr<JobSettings> settings =
      ResolveJobSettings(v1::ModelSpec(), defaults, {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 1u);
  EXPECT_EQ(settings->durable_every_seconds, 300.0);
  EXPECT_EQ(settings->durable_write_share, 0.0);

  // "auto": the share comes with it.
  defaults.durable_write_share = 0.1;
  settings = ResolveJobSettings(v1::ModelSpec(), defaults, {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->durable_every_seconds, 300.0);
  EXPECT_EQ(settings->durable_write_share, 0.1);
  EXPECT_EQ(PipelineOptionsFor(*settings, {}, nullptr).durable_write_share,
            0.1);

  // A job's own durable_every is exact: no share.
  v1::ModelSpec timed;
  timed.set_durable_every_seconds(30.0);
  settings = ResolveJobSettings(timed, defaults, {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->durable_every_seconds, 30.0);
  EXPECT_EQ(settings->durable_write_share, 0.0);

  // A nonzero interval wins over durable_every.
  defaults.commit_interval = 2;
  settings = ResolveJobSettings(v1::ModelSpec(), defaults, {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 2u);
  EXPECT_EQ(settings->durable_every_seconds, 0.0);
  EXPECT_EQ(settings->durable_write_share, 0.0);
}

TEST(ResolveJobSettings, TheSpecOverridesTheDefaults) {
  v1::ModelSpec spec;
  spec.set_commit_interval(1);
  absl::StatusOr<JobSettings> settings =
      ResolveJobSettings(spec, Defaults(), {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 1u);
  EXPECT_EQ(settings->durable_every_seconds, 0.0);

  spec.set_commit_interval(0);
  spec.set_durable_every_seconds(60.0);
  settings = ResolveJobSettings(spec, Defaults(), {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 1u);
  EXPECT_EQ(settings->durable_every_seconds, 60.0);

  v1::ModelSpec request;
  request.set_initial_iteration(42);
  request.set_revert_last_commit(true);
  request.set_overlap_updates(true);
  settings = ResolveJobSettings(request, Defaults(), {});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->initial_iteration, 42u);
  EXPECT_TRUE(settings->revert_last_commit);
  EXPECT_TRUE(settings->settle_in_background);
}

TEST(ResolveJobSettings, RedoAllCommitsEveryIterationWhateverTheDefault) {
  v1::ModelSpec spec;
  spec.set_clip_schedule(v1::CLIP_SCHEDULE_REDO_ALL);
  JobDefaults defaults = Defaults();
  for (const auto& [interval, every] :
       {std::pair<uint32_t, double>{8, 0.0}, {0, 300.0}}) {
    defaults.commit_interval = interval;
    defaults.durable_every_seconds = every;
    absl::StatusOr<JobSettings> settings =
        ResolveJobSettings(spec, defaults, {});
    ASSERT_TRUE(settings.ok()) << settings.status();
    EXPECT_EQ(settings->clip_schedule, ClipSchedule::kRedoAll);
    EXPECT_EQ(settings->commit_interval, 1u);
    EXPECT_EQ(settings->durable_every_seconds, 0.0);
  }
}

TEST(ResolveJobSettings, ARankCommitsEveryIterationWhateverTheDefault) {
  absl::StatusOr<JobSettings> settings = ResolveJobSettings(
      v1::ModelSpec(), Defaults(), {.data_parallel_rank = true});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_TRUE(settings->keep_previous_commit);
  EXPECT_EQ(settings->commit_interval, 1u);
  EXPECT_EQ(settings->durable_every_seconds, 0.0);

  // A rank's spec may say every step (1), not fewer: refused, not
  // overridden.
  v1::ModelSpec every_step;
  every_step.set_commit_interval(1);
  settings =
      ResolveJobSettings(every_step, Defaults(), {.data_parallel_rank = true});
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->commit_interval, 1u);
  v1::ModelSpec by_time;
  by_time.set_durable_every_seconds(60.0);
  settings =
      ResolveJobSettings(by_time, Defaults(), {.data_parallel_rank = true});
  EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(settings.status().message()),
              HasSubstr("ModelSpec durable_every_seconds asks for fewer "
                        "durable steps, but a data-parallel rank's job"));
  v1::ModelSpec by_steps;
  by_steps.set_commit_interval(4);
  settings =
      ResolveJobSettings(by_steps, Defaults(), {.data_parallel_rank = true});
  EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(settings.status().message()),
              HasSubstr("ModelSpec commit_interval asks for fewer"));
  // The same specs on a job of its own are what they say.
  EXPECT_EQ(ResolveJobSettings(by_steps, Defaults(), {})->commit_interval, 4u);
}

TEST(ResolveJobSettings, RefusalsNameTheOption) {
  struct Case {
    const char* what;
    std::function<void(v1::ModelSpec&)> mutate;
    const char* message;
  };
  const Case cases[] = {
      {"interval too large", [](auto& s) { s.set_commit_interval(1000001); },
       "commit_interval must be at most 1000000"},
      {"negative every", [](auto& s) { s.set_durable_every_seconds(-1); },
       "durable_every_seconds must be from 0"},
      {"nan every", [](auto& s) { s.set_durable_every_seconds(std::nan("")); },
       "durable_every_seconds must be from 0"},
      {"both",
       [](auto& s) {
         s.set_commit_interval(4);
         s.set_durable_every_seconds(60);
       },
       "durable_every_seconds (60) and commit_interval (4) both set"},
      {"interval with redo-all",
       [](auto& s) {
         s.set_commit_interval(2);
         s.set_clip_schedule(v1::CLIP_SCHEDULE_REDO_ALL);
       },
       "commit_interval above 1 needs clip_schedule deferred"},
      {"every with redo-all",
       [](auto& s) {
         s.set_durable_every_seconds(60);
         s.set_clip_schedule(v1::CLIP_SCHEDULE_REDO_ALL);
       },
       "durable_every_seconds needs clip_schedule deferred"},
  };
  for (const Case& c : cases) {
    v1::ModelSpec spec;
    c.mutate(spec);
    absl::StatusOr<JobSettings> settings =
        ResolveJobSettings(spec, Defaults(), {});
    ASSERT_FALSE(settings.ok()) << c.what;
    EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
    EXPECT_THAT(settings.status().message(), HasSubstr(c.message)) << c.what;
  }
}

TEST(PipelineOptionsFor, FollowsTheSettingsAndTheBuffers) {
  absl::StatusOr<JobSettings> settings = ResolveJobSettings(
      v1::ModelSpec(), Defaults(),
      {.expect_stored_states = true, .weight = 2.0, .fair_group = "uid 7"});
  ASSERT_TRUE(settings.ok()) << settings.status();
  FairQueue* const queue = reinterpret_cast<FairQueue*>(0x30);

  PipelineOptions options = PipelineOptionsFor(*settings, {}, queue);
  EXPECT_EQ(options.commit_interval, 8u);
  EXPECT_EQ(options.clip_schedule, ClipSchedule::kDeferWhenCertain);
  EXPECT_EQ(options.read_ahead_bytes, uint64_t{64} << 20);
  EXPECT_EQ(options.read_ahead_shares, kReadAheadShares);
  EXPECT_EQ(options.state_tier.shares, kTierShares);
  EXPECT_TRUE(options.expect_stored_states);
  EXPECT_EQ(options.optimizer_queue, queue);
  EXPECT_EQ(options.weight, 2.0);
  EXPECT_EQ(options.fair_group, "uid 7");
  EXPECT_FALSE(options.stream_gradients);
  EXPECT_FALSE(options.stream_weight16);
  EXPECT_FALSE(options.fp32_weights_out);

  options = PipelineOptionsFor(
      *settings, {.streamed_grads = true, .streamed_weights = true}, queue);
  EXPECT_TRUE(options.stream_gradients);
  EXPECT_TRUE(options.stream_weight16);
  EXPECT_FALSE(options.fp32_weights_out);

  // An fp32 model: its masters, never a 16-bit copy.
  options = PipelineOptionsFor(*settings,
                               {.streamed_weights = true, .fp32 = true}, queue);
  EXPECT_FALSE(options.stream_weight16);
  EXPECT_FALSE(options.fp32_weights_out);
  options = PipelineOptionsFor(*settings, {.fp32 = true}, queue);
  EXPECT_TRUE(options.fp32_weights_out);
}

}  // namespace
}  // namespace lohan
