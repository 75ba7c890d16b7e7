// A second user against a shared lohand: each test runs an attack as
// `nobody` (setpriv) while root's job trains, then checks that root's job
// is still attached, still trains, and lost nothing (its weights against the
// float64 AdamW reference, as in training_test), and that the attack got a
// clear, bounded refusal.
#include "tests/multi_user_fixture.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(MultiUserTest, ConnectionFloodsNeitherDetachNorStarveALiveJob) {
  StartDaemon();
  StartVictim();
  auto data_flood = BackgroundProcess::Start(
      Nobody({"flood-data", daemon_->socket(), "600"}));
  ASSERT_TRUE(data_flood.ok()) << data_flood.status();
  auto control_flood = BackgroundProcess::Start(
      Nobody({"flood-control", daemon_->socket(), "600"}));
  ASSERT_TRUE(control_flood.ok()) << control_flood.status();
  // Every connection past nobody's quotas (16 data planes, 64 control
  // connections) was answered or closed at once.
  for (const auto& [flood, quota] :
       {std::pair{data_flood->get(), 16}, {control_flood->get(), 64}}) {
    const std::string said = flood->first_line();
    const uint64_t connected = NumberAfter(said, "connected ");
    EXPECT_EQ(connected, 600u) << said;
    EXPECT_GE(NumberAfter(said, "answered or closed "), connected - quota)
        << said;
  }
  // Root is still served, and its job is still attached by its process.
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  const v1::Job victim = VictimJob();
  EXPECT_EQ(victim.state(), v1::JOB_STATE_ATTACHED);
  EXPECT_EQ(victim.attached_pid(), victim_->pid());
  // The refusals are in the log, a few lines of them, not 1,100.
  EXPECT_GE(LogLinesWith("refused to pid"), 2u);
  EXPECT_LE(LogLinesWith("refused to pid"), 20u);
  ResumeAndCheckVictim();
}

TEST_F(MultiUserTest, HostileRequestsGetClearCheapRefusals) {
  StartDaemon();
  StartVictim();
  const v1::Job victim = VictimJob();
  auto before = root_->GetStatus();
  ASSERT_TRUE(before.ok());

  // A million one-element layers: refused before anything is made.
  RunResult huge =
      RunCommand(Nobody({"register-huge", daemon_->socket(), "1000000"}));
  EXPECT_THAT(huge.out, HasSubstr("INVALID_ARGUMENT: ModelSpec layer_elements: "
                                  "a model has 1 to 65536 layers, got 1000000"))
      << huge.out << huge.err;
  auto after = root_->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->store().tensors(), before->store().tensors());

  // Jobs beyond the quota (64, one of them "huge").
  RunResult many =
      RunCommand(Nobody({"create-many", daemon_->socket(), "100"}));
  EXPECT_THAT(many.out, HasSubstr("created 63, then RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(many.out, HasSubstr("uid 65534 has 64 jobs and the quota is 64"));

  // Root's job, attached and with its data plane open, is to nobody exactly
  // a missing one: no code, word or pid tells them apart.
  RunResult probe =
      RunCommand(Nobody({"probe", daemon_->socket(), victim.id()}));
  std::vector<std::string> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(probe.out), '\n');
  ASSERT_EQ(lines.size(), 8u) << probe.out;
  for (int i = 0; i < 4; ++i) {
    std::string real = lines[i];
    real.replace(real.find(victim.id()), victim.id().size(), "j-999999");
    EXPECT_EQ(real, lines[i + 4]);
    EXPECT_THAT(lines[i], HasSubstr("NOT_FOUND"));
    EXPECT_THAT(lines[i], Not(HasSubstr(std::to_string(victim_->pid()))));
  }

  // Bytes that are no CreateJobRequest.
  RunResult garbage =
      RunCommand(Nobody({"raw-call", daemon_->socket(),
                         "/lohan.v1.Lohan/CreateJob", "\xff\xff"}));
  EXPECT_THAT(garbage.out, HasSubstr("INVALID_ARGUMENT")) << garbage.out;
  ResumeAndCheckVictim();
}

// Another user's job name with ESC, CR and LF: refused, and the refusal
// reaches root's log escaped, not as a forged line or a terminal command.
TEST_F(MultiUserTest, AJobNameWithControlBytesReachesTheLogEscaped) {
  StartDaemon();
  RunResult created = RunCommand(
      Nobody({"attach-hold", daemon_->socket(),
              "x\x1b[31mred\r\n2026-12-03 00:00:00 info FORGED", "1048576"}));
  EXPECT_NE(created.exit_code, 0);
  EXPECT_THAT(created.out + created.err, HasSubstr("may hold only letters"));
  const std::string log = daemon_->Log();
  EXPECT_THAT(log, HasSubstr("x\\x1b[31mred\\r\\n2026-12-03 00:00:00 info "
                             "FORGED"));
  EXPECT_EQ(log.find('\x1b'), std::string::npos);
  EXPECT_EQ(log.find('\r'), std::string::npos);
  EXPECT_EQ(log.find("\n2026-12-03 00:00:00 info FORGED"), std::string::npos);
}

// Another user holds the most plans its quota allows (a data plane each,
// each with the largest plan PlanJob makes): root's status still answers,
// small (plans summarised), and root can still read a whole plan.
TEST_F(MultiUserTest, RootsStatusAnswersWhileAnotherUserHoldsMaximalPlans) {
  StartDaemon("[quotas]\ndata_planes = 4\n");
  std::vector<std::unique_ptr<BackgroundProcess>> planners;
  for (int i = 0; i < 4; ++i) {
    auto planner = BackgroundProcess::Start(
        Nobody({"plan-hold", daemon_->socket(), absl::StrCat("plans-", i)}));
    ASSERT_TRUE(planner.ok()) << planner.status();
    planners.push_back(*std::move(planner));
  }
  uint64_t plan_bytes = 0;
  for (auto& planner : planners) {
    const std::string line = planner->first_line();
    ASSERT_THAT(line, HasSubstr("planned 65536 blocks")) << line;
    plan_bytes += NumberAfter(line, "blocks, ");
  }
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->sessions_size(), 4);
  uint32_t blocks = 0;
  for (const auto& [mode, count] :
       status->sessions(0).plan().block_mode_counts()) {
    blocks += count;
  }
  EXPECT_EQ(blocks, 65536u);
  EXPECT_EQ(status->sessions(0).plan().block_modes_size(), 0);
  EXPECT_EQ(status->sessions(0).plan().blocks_size(), 0);
  EXPECT_LT(status->ByteSizeLong(), 64u << 10);
  std::printf(
      "another user's 4 plans of %llu bytes in all; root's status: %zu "
      "bytes\n",
      static_cast<unsigned long long>(plan_bytes), status->ByteSizeLong());
  RunResult lohanctl = RunCommand({Runfile("client/ctl/lohanctl"), "--socket",
                                   daemon_->socket(), "status"});
  EXPECT_EQ(lohanctl.exit_code, 0) << lohanctl.err;
  EXPECT_THAT(lohanctl.out, HasSubstr("blocks: "));
  // The whole plan on request, for root (and the owner), not for others.
  auto plan = root_->GetJobPlan(status->sessions(0).job_id());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->block_modes_size(), 65536);
}

// [quotas] daemon_memory bounds what lohand holds for a user: a model
// whose store tensors would pass it, or a plan that would, is refused
// before anything is made, naming the quota; root's job trains on.
TEST_F(MultiUserTest, DaemonMemoryQuotaRefusesModelsAndPlansBeforeAnything) {
  StartDaemon("[quotas.user.nobody]\ndaemon_memory = \"3MiB\"\n");
  StartVictim();
  RunResult huge =
      RunCommand(Nobody({"register-loop", daemon_->socket(), "65536", "1"}));
  EXPECT_THAT(huge.out,
              HasSubstr("refused 1 (RESOURCE_EXHAUSTED: job j-000002's model "
                        "(65536 layers, 131073 store tensors) needs 192.0 MiB "
                        "of lohand's memory; uid 65534's jobs and plans hold "
                        "0 B of it and the quota is 3.0 MiB ([quotas] "
                        "daemon_memory"))
      << huge.out << huge.err;
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  for (const v1::Job& job : status->jobs()) {
    if (job.owner_uid() == 65534) {
      EXPECT_EQ(job.ssd_bytes(), 0u) << job.id();
    }
  }
  RunResult plan = RunCommand(Nobody({"plan-hold", daemon_->socket(), "p"}));
  EXPECT_THAT(plan.out, HasSubstr("plan failed: RESOURCE_EXHAUSTED: job "));
  EXPECT_THAT(plan.out, HasSubstr("'s activation plan needs 3.8 MiB of "
                                  "lohand's memory"));
  ResumeAndCheckVictim();
}

// A client that breaks its own submission ring: lohand stops serving that
// data plane, closes it, and says why under the job; root's job trains on.
TEST_F(MultiUserTest, ABrokenRingEndsItsOwnPlaneWithTheReasonShown) {
  StartDaemon();
  StartVictim();
  auto broken = BackgroundProcess::Start(
      Nobody({"corrupt-ring", daemon_->socket(), "broken"}));
  ASSERT_TRUE(broken.ok()) << broken.status();
  ASSERT_THAT((*broken)->first_line(), HasSubstr("corrupted j-"));
  const std::string job_id = (*broken)->first_line().substr(10);
  std::string failure;
  for (int i = 0; i < 1000 && failure.empty(); ++i) {
    auto jobs = root_->ListJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    for (const v1::Job& job : *jobs) {
      if (job.id() == job_id) failure = job.last_failure();
    }
    usleep(10 * 1000);
  }
  EXPECT_THAT(failure, HasSubstr("DATA_LOSS: the submission ring of its data "
                                 "plane was broken by its client"));
  // Its data plane is closed, not left open unserved.
  bool open = true;
  for (int i = 0; i < 1000 && open; ++i) {
    auto status = root_->GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    open = false;
    for (const v1::SessionStatus& session : status->sessions()) {
      open = open || session.job_id() == job_id;
    }
    usleep(10 * 1000);
  }
  EXPECT_FALSE(open);
  ResumeAndCheckVictim();
}

TEST_F(MultiUserTest, IdleControlConnectionsAreClosed) {
  StartDaemon("[daemon]\ncontrol_idle_timeout = 1\n");
  RunResult idle = RunCommand(Nobody({"idle", daemon_->socket(), "30"}));
  EXPECT_THAT(idle.out, HasSubstr("closed after ")) << idle.out << idle.err;
  // Root's client, idle as long, reconnects by itself on its next call.
  sleep(2);
  auto status = root_->GetStatus();
  EXPECT_TRUE(status.ok()) << status.status();
}

TEST_F(MultiUserTest, AnAttachedJobWithoutADataPlaneHoldsNoPool) {
  StartDaemon();
  // nobody's job asks for 48 of the 64 MiB pool and never opens its data
  // plane; root's 16 MiB arena still fits beside it.
  auto idle = BackgroundProcess::Start(
      Nobody({"attach-hold", daemon_->socket(), "idle", "50331648"}));
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_THAT((*idle)->first_line(), HasSubstr("attached "));
  StartVictim();
  ResumeAndCheckVictim();
}

TEST_F(MultiUserTest, PerUserQuotasFromTheConfigBoundTheirUser) {
  StartDaemon(
      "[quotas.user.nobody]\n"
      "ssd = \"8MiB\"\n"
      "host_pool = \"16MiB\"\n");
  StartVictim();
  auto greedy = BackgroundProcess::Start(
      Nobody({"fill-ssd", daemon_->socket(), "greedy", "1048576"}));
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  const std::string said = (*greedy)->first_line();
  EXPECT_THAT(said, HasSubstr("its owner (uid 65534) holds "));
  EXPECT_THAT(said, HasSubstr("the quota is 8388608 (8.0 MiB)"));
  EXPECT_GE(NumberAfter(said, "stored "), uint64_t{6} << 20) << said;
  RunResult big =
      RunCommand(Nobody({"attach-hold", daemon_->socket(), "big", "33554432"}));
  EXPECT_THAT(big.out, HasSubstr("uid 65534's quota ([quotas] host_pool) is "
                                 "16777216 (16.0 MiB)"))
      << big.out;
  ResumeAndCheckVictim();
}

// The read-ahead memory is the daemon's: split by the users' weights
// among the jobs that read ahead, and whole again for the one left.
TEST_F(MultiUserTest, ReadAheadMemoryIsSharedByTheUsersWeights) {
  StartDaemon(
      "[optimizer]\n"
      "read_ahead = \"12MiB\"\n"
      "[quotas.user.root]\n"
      "weight = 2\n");
  StartVictim();
  auto share_of = [&](const std::string& job_id) -> uint64_t {
    auto status = root_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return 0;
    for (const v1::SessionStatus& session : status->sessions()) {
      if (session.job_id() == job_id) {
        EXPECT_LE(session.read_ahead_held_bytes(),
                  session.read_ahead_share_bytes());
        return session.read_ahead_share_bytes();
      }
    }
    ADD_FAILURE() << "no session of " << job_id;
    return 0;
  };
  const std::string victim = VictimJob().id();
  EXPECT_EQ(share_of(victim), uint64_t{12} << 20);
  auto other = BackgroundProcess::Start(
      Nobody({"register-hold", daemon_->socket(), "reader"}));
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string said = (*other)->first_line();
  ASSERT_THAT(said, HasSubstr("registered ")) << said;
  const std::string reader = said.substr(said.find(' ') + 1);
  EXPECT_EQ(share_of(victim), uint64_t{8} << 20);  // 2 of 3
  EXPECT_EQ(share_of(reader), uint64_t{4} << 20);
  other->reset();  // killed: its session ends, its share with it
  for (int i = 0; i < 3000 && share_of(victim) != uint64_t{12} << 20; ++i) {
    usleep(10 * 1000);
  }
  EXPECT_EQ(share_of(victim), uint64_t{12} << 20);
  ResumeAndCheckVictim();
}

// The state tier is the daemon's too: split by the users' weights among the
// jobs that train (each keeps the longest prefix of its chunks that fits
// its share), a newcomer's share given back by the others at their next
// iteration, and a user's [quotas] state_tier caps what their jobs hold.
class StateTierUsersTest : public MultiUserTest {
 protected:
  void SetUp() override {
    MultiUserTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_NE(CopyForOtherUsers("tests/train_client", bin_), "");
    out_ = dir_.path() + "/out";
    ASSERT_EQ(mkdir(out_.c_str(), 0777), 0);
    ASSERT_EQ(chmod(out_.c_str(), 0777), 0);
  }

  // A job of 40 chunks of 5000 parameters (60000-byte states: 2.4 MB, more
  // than any share below) training 4 iterations, pausing after 2 until
  // Resume(name), then holding its data plane open.
  std::unique_ptr<BackgroundProcess> Train(const std::string& name,
                                           bool as_nobody) {
    std::vector<std::string> argv = {
        as_nobody ? bin_ + "/train_client" : Runfile("tests/train_client"),
        "--socket",
        daemon_->socket(),
        "--job",
        name,
        "--layers",
        "200000",
        "--chunk",
        "5000",
        "--iterations",
        "4",
        "--pause-after",
        "2",
        "--resume-file",
        out_ + "/" + name,
        "--out",
        out_ + "/" + name + ".weights",
        "--hold"};
    auto job = BackgroundProcess::Start(as_nobody ? AsNobody(argv) : argv);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(WaitForFile(out_ + "/" + name + ".paused")) << daemon_->Log();
    return job.ok() ? *std::move(job) : nullptr;
  }
  void Resume(const std::string& name) {
    std::ofstream(out_ + "/" + name) << "go\n";
  }

  // The session of process `pid` once it has committed `iteration`.
  v1::SessionStatus SessionAt(pid_t pid, uint64_t iteration) {
    for (int i = 0; i < 6000; ++i) {
      auto status = root_->GetStatus();
      if (!status.ok()) break;
      for (const v1::SessionStatus& session : status->sessions()) {
        if (session.pid() == pid &&
            session.committed_iteration() >= iteration) {
          return session;
        }
      }
      usleep(10 * 1000);
    }
    ADD_FAILURE() << "pid " << pid << " never reached iteration " << iteration;
    return {};
  }

  static constexpr uint64_t kChunkState = 5000 * 12;
  std::string out_;
};

TEST_F(StateTierUsersTest, SharedByTheUsersWeights) {
  StartDaemon(
      "[pool]\nstate_tier = \"3MiB\"\n[quotas.user.root]\nweight = 2\n");
  std::unique_ptr<BackgroundProcess> root = Train("roots", false);
  ASSERT_NE(root, nullptr);
  // Alone: every state in RAM.
  EXPECT_EQ(SessionAt(root->pid(), 2).state_tier_bytes(), 40 * kChunkState);
  std::unique_ptr<BackgroundProcess> other = Train("others", true);
  ASSERT_NE(other, nullptr);
  // The newcomer got what was free; root gives back its excess at its next
  // iteration, the newcomer takes its share at its own.
  EXPECT_LT(SessionAt(other->pid(), 2).state_tier_bytes(),
            SessionAt(other->pid(), 2).state_tier_share_bytes());
  Resume("roots");
  const v1::SessionStatus roots = SessionAt(root->pid(), 4);
  Resume("others");
  const v1::SessionStatus others = SessionAt(other->pid(), 4);
  EXPECT_EQ(roots.state_tier_share_bytes(), uint64_t{2} << 20);  // 2 of 3
  EXPECT_EQ(others.state_tier_share_bytes(), uint64_t{1} << 20);
  const double ratio = static_cast<double>(roots.state_tier_bytes()) /
                       static_cast<double>(others.state_tier_bytes());
  EXPECT_NEAR(ratio, 2.0, 0.2)
      << roots.state_tier_bytes() << " : " << others.state_tier_bytes();
  // Each holds the prefix of whole chunks its share holds.
  EXPECT_EQ(roots.state_tier_bytes(), ((2 << 20) / kChunkState) * kChunkState);
  EXPECT_EQ(others.state_tier_bytes(), ((1 << 20) / kChunkState) * kChunkState);
}

TEST_F(StateTierUsersTest, AUsersQuotaCapsWhatTheirJobsHold) {
  StartDaemon(
      "[pool]\nstate_tier = \"3MiB\"\n"
      "[quotas.user.nobody]\nstate_tier = \"512KiB\"\n");
  std::unique_ptr<BackgroundProcess> other = Train("capped", true);
  ASSERT_NE(other, nullptr);
  Resume("capped");
  const v1::SessionStatus capped = SessionAt(other->pid(), 4);
  EXPECT_EQ(capped.state_tier_share_bytes(), uint64_t{512} << 10);
  EXPECT_EQ(capped.state_tier_bytes(),
            ((512 << 10) / kChunkState) * kChunkState);
  // Root, beside it, may take the rest.
  std::unique_ptr<BackgroundProcess> root = Train("roots", false);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(SessionAt(root->pid(), 2).state_tier_share_bytes(),
            (uint64_t{3} << 20) - (uint64_t{512} << 10));
  EXPECT_EQ(SessionAt(root->pid(), 2).state_tier_bytes(), 40 * kChunkState);
}

}  // namespace
}  // namespace lohan::testing
