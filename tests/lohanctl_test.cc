// lohanctl against a real daemon, in both output forms.
#include <google/protobuf/util/json_util.h>

#include <csignal>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "daemon/optim/tuning.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

class LohanctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    v1::JobSpec spec;
    spec.set_name("gpt-small");
    spec.set_host_pool_bytes(8 << 20);
    auto job = client_->CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
    ASSERT_TRUE(client_->AttachJob(job_id_).ok());
  }

  RunResult Lohanctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {Runfile("client/ctl/lohanctl"), "--socket",
                                     daemon_->socket()};
    for (const std::string& arg : args) argv.push_back(arg);
    return RunCommand(argv);
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
  std::string job_id_;
};

TEST_F(LohanctlTest, StatusText) {
  RunResult result = Lohanctl({"status"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("lohand 0.1.0 (protocol 1.0), pid " +
                                    std::to_string(daemon_->pid()) + ", up "));
  EXPECT_THAT(result.out, HasSubstr("  socket       " + daemon_->socket()));
  EXPECT_THAT(result.out,
              HasSubstr("  your quota   jobs 1 of 64, SSD 0 B held of no "
                        "limit, host pool no limit, data planes 16, control "
                        "connections 64, daemon memory 0 B held of "));
  EXPECT_THAT(result.out, HasSubstr("  SSD array    1 SSD, 1.0 MiB stripes, "
                                    "4096 B blocks, queue depth 32, 0 "
                                    "tensors"));
  EXPECT_THAT(result.out, HasSubstr("    " + dir_.path() + "/ssd0"));
  EXPECT_THAT(result.out, HasSubstr("0 B used of 64.0 MiB (0%)"));
  // The harness's daemons run the default tuning (no calibration).
  EXPECT_THAT(result.out,
              MatchesRegex("(.|\n)*  optimizer    [0-9]+ threads?, kernel "
                           "[a-z0-9+]+, prefetch=[0-9]+,stream=o[nf]+,"
                           "chunks=[0-9]+ \\(default\\)\n(.|\n)*"));
  EXPECT_THAT(result.out, HasSubstr("  host pool    64.0 MiB, 0 B in use "
                                    "(0 arenas of yours)"));
  // The harness's daemons take the default "auto" tier: its size is this
  // machine's.
  EXPECT_THAT(
      result.out,
      MatchesRegex("(.|\n)*  state tier   ([0-9.]+ [KMGT]?i?B for jobs' "
                   "fp32 masters and moments, durable every 1m by "
                   "default, less often when durable writes would take "
                   "over 10% of the time \\(durable_every\\)|off: every "
                   "job's "
                   "states on the SSDs)\n(.|\n)*"));
  EXPECT_THAT(result.out,
              HasSubstr("  jobs         1 on the daemon, 1 attached"));
  EXPECT_THAT(result.out, HasSubstr(job_id_ + "   gpt-small"));
  EXPECT_THAT(result.out, HasSubstr("attached  " + std::to_string(getpid())));
  EXPECT_THAT(result.out, HasSubstr("8.0 MiB"));
}

TEST_F(LohanctlTest, StatusJsonIsTheProtoSchema) {
  RunResult result = Lohanctl({"status", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  v1::GetStatusResponse status;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(result.out, &status).ok())
      << result.out;
  EXPECT_EQ(status.daemon_version(), "0.1.0");
  EXPECT_EQ(status.daemon_pid(), daemon_->pid());
  EXPECT_EQ(status.config().socket_path(), daemon_->socket());
  EXPECT_EQ(status.config().host_pool_bytes(), 64u << 20);
  ASSERT_EQ(status.store().ssds_size(), 1);
  EXPECT_EQ(status.store().ssds(0).path(), dir_.path() + "/ssd0");
  EXPECT_EQ(status.store().ssds(0).capacity_bytes(), 64u << 20);
  EXPECT_EQ(status.store().block_size(), 4096u);
  EXPECT_FALSE(status.optimizer().kernel().empty());
  EXPECT_GE(status.optimizer().threads(), 1u);
  EXPECT_EQ(status.optimizer().source(), "default");
  EXPECT_EQ(status.optimizer().tuning(), TuningName(KernelTuning{}));
  EXPECT_FALSE(status.optimizer().has_calibration());
  EXPECT_GE(status.uptime_seconds(), 0.0);
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).id(), job_id_);
  EXPECT_EQ(status.jobs(0).state(), v1::JOB_STATE_ATTACHED);
  EXPECT_EQ(status.jobs(0).attached_pid(), getpid());
  EXPECT_EQ(status.total_jobs(), 1u);
  EXPECT_EQ(status.attached_jobs(), 1u);
}

// A training session with an activation plan (PlanJob) gets one line
// under its row: the plan against the iterations since; --json carries it.
TEST_F(LohanctlTest, StatusShowsASessionsPlan) {
  constexpr absl::Duration kTimeout = absl::Seconds(60);
  auto plane = DataPlane::Open(client_->hello().data_socket_path(), job_id_);
  ASSERT_TRUE(plane.ok()) << plane.status();
  constexpr uint32_t kLayers = 3;
  v1::RegisterModelRequest registration;
  registration.set_job_id(job_id_);
  for (uint32_t l = 0; l < kLayers; ++l) {
    registration.mutable_model()->add_layer_elements(64);
  }
  registration.mutable_model()->set_dtype(v1::DTYPE_FP32);
  registration.mutable_model()->mutable_adam()->set_lr(1e-3);
  registration.mutable_model()->mutable_adam()->set_beta1(0.9);
  registration.mutable_model()->mutable_adam()->set_beta2(0.999);
  registration.mutable_model()->mutable_adam()->set_eps(1e-8);
  auto layout = client_->RegisterModel(registration);
  ASSERT_TRUE(layout.ok()) << layout.status();
  (*plane)->SetErrorText(layout->error_text_offset(),
                         layout->error_text_bytes());
  for (uint32_t l = 0; l < kLayers; ++l) {
    SubmissionEntry init{};
    init.op = static_cast<uint16_t>(RingOp::kInitWeights);
    init.layer = l;
    init.slot_offset = layout->staging_offset();
    init.length = 64 * 4;
    ASSERT_TRUE((*plane)->Call(init, kTimeout).ok());
  }
  // Without a plan, no plan line.
  EXPECT_THAT(Lohanctl({"status"}).out, Not(HasSubstr("plan: ")));

  // 2 blocks of 2 saved tensors, the first always offloaded, the second
  // dear to recompute; a device with room for everything: every block
  // kept.
  v1::PlanJobRequest request;
  request.set_job_id(job_id_);
  request.set_activation_host_bytes(1 << 20);
  v1::ClientProfile* profile = request.mutable_profile();
  profile->set_device_bytes(uint64_t{1} << 30);
  profile->set_device_flops(1e12);
  profile->set_host_to_device_bytes_per_second(1e10);
  profile->set_device_to_host_bytes_per_second(1e10);
  profile->set_blocks(2);
  profile->set_parameters(192);
  profile->set_block_parameters(64);
  profile->set_largest_layer_parameters(64);
  profile->set_head_parameters(64);
  profile->set_first_layer_parameters(64);
  profile->set_forward_flops(1e6);
  profile->set_block_forward_flops(4e5);
  profile->set_batch(1);
  profile->set_seq(16);
  for (bool always : {true, false}) {
    v1::MeasuredTensor* tensor = profile->add_block_tensors();
    tensor->set_bytes(4096);
    tensor->set_recompute_flops(1e12);  // dear to make again
    tensor->set_always_offloaded(always);
  }
  absl::StatusOr<v1::JobPlan> plan = client_->PlanJob(request);
  for (int tries = 0; absl::IsUnavailable(plan.status()) && tries < 1200;
       ++tries) {
    absl::SleepFor(absl::Milliseconds(50));  // lohand is still measuring
    plan = client_->PlanJob(request);
  }
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->block_modes_size(), 2);
  EXPECT_EQ(plan->block_modes(0), "keep");
  EXPECT_THAT(Lohanctl({"status"}).out,
              HasSubstr("plan: case " + std::to_string(plan->search_case()) +
                        ", predicted "));
  EXPECT_THAT(Lohanctl({"status"}).out,
              HasSubstr("no iteration measured since; blocks: 2 keep\n"));

  for (uint64_t i = 0; i < 2; ++i) {
    SubmissionEntry begin{};
    begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
    begin.iteration = layout->iteration() + i;
    ASSERT_TRUE((*plane)->Call(begin, kTimeout).ok());
    for (uint32_t l = kLayers; l-- > 0;) {
      SubmissionEntry ready{};
      ready.op = static_cast<uint16_t>(RingOp::kGradReady);
      ready.dtype = static_cast<uint16_t>(RingDtype::kFp32);
      ready.layer = l;
      ready.slot_offset = layout->layers(l).grad_offset();
      ready.length = layout->layers(l).bytes();
      ASSERT_TRUE((*plane)->Call(ready, kTimeout).ok());
    }
    SubmissionEntry end{};
    end.op = static_cast<uint16_t>(RingOp::kIterEnd);
    end.iteration = begin.iteration;
    ASSERT_TRUE((*plane)->Call(end, kTimeout).ok());
  }
  RunResult text = Lohanctl({"status"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out,
              MatchesRegex("(.|\n)*\n           plan: case [123], predicted "
                           "[0-9.e+-]+ s/iteration \\(bound by [a-zA-Z -]+ / "
                           "[a-zA-Z -]+\\), measured [0-9.e+-]+ s over 2 "
                           "iterations \\([0-9.e+-]+x\\); blocks: 2 "
                           "keep\n(.|\n)*"))
      << text.out;

  RunResult json = Lohanctl({"status", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"planned_iterations\": \"2\""));
  EXPECT_THAT(json.out, HasSubstr("\"predicted_iteration_seconds\""));
  v1::GetStatusResponse status;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json.out, &status).ok());
  ASSERT_EQ(status.sessions_size(), 1);
  EXPECT_EQ(status.sessions(0).plan().search_case(), plan->search_case());
  // Summarised: blocks per mode; `lohanctl jobs plan` has the whole plan.
  EXPECT_EQ(status.sessions(0).plan().blocks_size(), 0);
  EXPECT_EQ(status.sessions(0).plan().block_mode_counts().at("keep"), 2u);
  EXPECT_EQ(status.sessions(0).planned_iterations(), 2u);
  RunResult whole = Lohanctl({"jobs", "plan", job_id_});
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  v1::JobPlan kept;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(whole.out, &kept).ok());
  EXPECT_EQ(kept.blocks_size(), 2);
  EXPECT_EQ(kept.block_modes(0), "keep");
  RunResult missing = Lohanctl({"jobs", "plan", "j-999999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no job 'j-999999'"));
  EXPECT_GT(status.sessions(0).planned_mean_iteration_seconds(), 0);
}

// Ranks 0 and 1 of a run of 3 (rank 2 on another daemon): one entry in the
// text forms, every job with its run in JSON. The daemon refuses a second
// job for rank 1, naming the first.
TEST_F(LohanctlTest, ARunsJobsAreOneEntry) {
  std::vector<std::string> ids;
  for (uint32_t rank : {1u, 0u}) {
    v1::JobSpec spec;
    spec.set_name(absl::StrCat("dp.rank", rank));
    spec.set_host_pool_bytes(1 << 20);
    spec.mutable_run()->set_name("dp");
    spec.mutable_run()->set_rank(rank);
    spec.mutable_run()->set_world_size(3);
    auto job = client_->CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ids.insert(ids.begin(), job->id());
  }
  ASSERT_TRUE(client_->AttachJob(ids[1]).ok());
  v1::JobSpec again;
  again.set_name("dp-again");
  again.mutable_run()->set_name("dp");
  again.mutable_run()->set_rank(1);
  again.mutable_run()->set_world_size(3);
  absl::Status refused = client_->CreateJob(again).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("rank 1 of run 'dp' is already job " + ids[1]));

  for (const char* command : {"status", "jobs"}) {
    RunResult text = Lohanctl({command});
    ASSERT_EQ(text.exit_code, 0) << text.err;
    // The job on its own as before; the run's two jobs as one row.
    EXPECT_THAT(text.out, HasSubstr(job_id_ + "   gpt-small"));
    EXPECT_THAT(text.out, Not(HasSubstr("dp.rank")));
    EXPECT_THAT(text.out,
                MatchesRegex("(.|\n)*\ndistributed runs \\(one job per "
                             "rank; ranks not listed are on other "
                             "daemons\\)\nRUN +OWNER +WORLD +RANKS HERE "
                             "+STATE +[A-Z ]+\ndp +[^ ]+ +3 +0,1 +1 of 2 "
                             "attached +[-0-9 ]*2.0 MiB +0 B +" +
                             ids[0] + " " + ids[1] + "\n(.|\n)*"))
        << text.out;
  }
  RunResult json = Lohanctl({"jobs", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &jobs).ok())
      << json.out;
  ASSERT_EQ(jobs.jobs_size(), 3);
  EXPECT_FALSE(jobs.jobs(0).spec().has_run());
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(jobs.jobs(i).spec().run().name(), "dp");
    EXPECT_EQ(jobs.jobs(i).spec().run().world_size(), 3u);
  }
  EXPECT_EQ(jobs.jobs(1).spec().run().rank(), 1u);
  EXPECT_EQ(jobs.jobs(2).spec().run().rank(), 0u);
}

TEST_F(LohanctlTest, JobsBothForms) {
  RunResult table = Lohanctl({"jobs"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("ID         NAME"));
  EXPECT_THAT(table.out, HasSubstr(job_id_));

  RunResult json = Lohanctl({"jobs", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &jobs).ok())
      << json.out;
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).spec().name(), "gpt-small");
  EXPECT_EQ(jobs.jobs(0).owner_uid(), getuid());
}

TEST_F(LohanctlTest, DeleteRefusesAttachedThenDeletes) {
  RunResult refused = Lohanctl({"jobs", "delete", job_id_});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("is attached by process"));
  // The owner unbinds it from the process holding it (here: this test).
  RunResult detached = Lohanctl({"jobs", "detach", job_id_});
  EXPECT_EQ(detached.exit_code, 0) << detached.err;
  EXPECT_EQ(detached.out, "detached " + job_id_ + "\n");
  EXPECT_THAT(Lohanctl({"jobs"}).out, HasSubstr("detached"));
  EXPECT_EQ(Lohanctl({"jobs", "detach", "j-999999"}).exit_code, 1);
  RunResult deleted = Lohanctl({"jobs", "delete", job_id_});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_THAT(Lohanctl({"jobs"}).out, HasSubstr("no jobs"));
}

// Each ended job says when lohand deletes it ([jobs] keep_ended: 7 days by
// default), a pinned one "kept", an attached one "-"; `jobs keep` pins and
// `jobs keep --off` unpins.
TEST_F(LohanctlTest, JobsSayWhenLohandDeletesEndedJobs) {
  v1::JobSpec spec;
  spec.set_name("finished");
  auto finished = client_->CreateJob(spec);
  ASSERT_TRUE(finished.ok()) << finished.status();
  const std::string id = finished->id();
  // Never attached: ended when created.
  EXPECT_EQ(finished->ended_unix_seconds(), finished->created_unix_seconds());

  auto listed = [&](const std::string& job_id) {
    RunResult json = Lohanctl({"jobs", "--json"});
    EXPECT_EQ(json.exit_code, 0) << json.err;
    v1::ListJobsResponse jobs;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(json.out, &jobs).ok());
    for (const v1::Job& job : jobs.jobs()) {
      if (job.id() == job_id) return job;
    }
    ADD_FAILURE() << "no job " << job_id << " in " << json.out;
    return v1::Job();
  };
  const v1::Job ended = listed(id);
  EXPECT_EQ(ended.delete_after_unix_seconds(),
            ended.ended_unix_seconds() + 7 * 86400);
  EXPECT_FALSE(ended.kept());
  EXPECT_EQ(listed(job_id_).delete_after_unix_seconds(), 0);
  EXPECT_EQ(listed(job_id_).ended_unix_seconds(), 0);

  const std::string time = "[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}";
  RunResult table = Lohanctl({"jobs"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("CREATED             DELETED AFTER\n"));
  EXPECT_THAT(table.out, ContainsRegex(job_id_ +
                                       " +gpt-small +[^ ]+ +attached "
                                       "+[0-9]+ .* " +
                                       time + " -\n"));
  EXPECT_THAT(table.out, ContainsRegex(id +
                                       " +finished +[^ ]+ +detached +- "
                                       ".* " +
                                       time + " " + time + "\n"));

  RunResult kept = Lohanctl({"jobs", "keep", id});
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(kept.out,
            "kept " + id + ": lohand will not delete it on its own\n");
  EXPECT_TRUE(listed(id).kept());
  EXPECT_EQ(listed(id).delete_after_unix_seconds(), 0);
  EXPECT_THAT(Lohanctl({"jobs"}).out,
              ContainsRegex(id + " +finished .* " + time + " kept\n"));
  // Pins survive a restart of lohand.
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  auto daemon = DaemonProcess::Start(dir_.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  daemon_ = *std::move(daemon);
  EXPECT_TRUE(listed(id).kept());

  RunResult unkept = Lohanctl({"jobs", "keep", "--off", id});
  ASSERT_EQ(unkept.exit_code, 0) << unkept.err;
  EXPECT_THAT(unkept.out, MatchesRegex(id +
                                       " no longer kept: lohand deletes "
                                       "it after " +
                                       time + "\n"));
  EXPECT_FALSE(listed(id).kept());
  EXPECT_EQ(listed(id).delete_after_unix_seconds(),
            ended.ended_unix_seconds() + 7 * 86400);

  RunResult missing = Lohanctl({"jobs", "keep", "j-999999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no job 'j-999999'"));
  EXPECT_NE(Lohanctl({"jobs", "keep"}).exit_code, 0);
}

TEST_F(LohanctlTest, LongJobNamesKeepTheColumns) {
  const std::string name(64, 'n');
  v1::JobSpec spec;
  spec.set_name(name);
  ASSERT_TRUE(client_->CreateJob(spec).ok());
  RunResult table = Lohanctl({"jobs"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  // Every row's OWNER column starts where the header's does.
  const size_t header = table.out.find("OWNER");
  std::istringstream lines(table.out);
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    ASSERT_GT(line.size(), header) << line;
    EXPECT_NE(line[header], ' ') << line;
    EXPECT_EQ(line[header - 1], ' ') << line;
  }
}

TEST_F(LohanctlTest, NoDaemonNamesTheSocket) {
  const std::string socket = dir_.path() + "/elsewhere.sock";
  for (const char* command : {"status", "jobs"}) {
    RunResult result = RunCommand(
        {Runfile("client/ctl/lohanctl"), "--socket", socket, command});
    EXPECT_EQ(result.exit_code, 1);
    EXPECT_THAT(result.err, HasSubstr("no lohand answers at " + socket));
    EXPECT_EQ(result.out, "");
  }
  // LOHAN_SOCKET is honoured when --socket is absent.
  RunResult from_env = RunCommand({Runfile("client/ctl/lohanctl"), "status"},
                                  {"LOHAN_SOCKET=" + socket});
  EXPECT_THAT(from_env.err, HasSubstr(socket));
}

TEST_F(LohanctlTest, UsageErrors) {
  RunResult none = Lohanctl({});
  EXPECT_NE(none.exit_code, 0);
  RunResult unknown = Lohanctl({"frobnicate"});
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err + unknown.out, HasSubstr("frobnicate"));
  RunResult interval = Lohanctl({"status", "--watch", "--interval", "0"});
  EXPECT_NE(interval.exit_code, 0);
  EXPECT_THAT(interval.err + interval.out, HasSubstr("--interval"));
  RunResult count = Lohanctl({"status", "--watch", "--count", "-1"});
  EXPECT_NE(count.exit_code, 0);
  RunResult drain = Lohanctl({"drain"});
  EXPECT_NE(drain.exit_code, 0);
  EXPECT_THAT(drain.err + drain.out, HasSubstr("job_id"));
  RunResult malformed = Lohanctl({"kill", std::string(40, 'j')});
  EXPECT_EQ(malformed.exit_code, 1);
  EXPECT_THAT(malformed.err, HasSubstr("a job id is 1 to 32 characters"));
  // The daemon serves on.
  EXPECT_EQ(Lohanctl({"status"}).exit_code, 0);
}

}  // namespace
}  // namespace lohan::testing
