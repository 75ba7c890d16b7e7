// Fair shares between users of one lohand, with a real second uid: what a
// user may take of the SSD array and the host pool beside another's
// running job, what is taken back and how the job that gave way is told,
// and a plane that opens at what is free before anyone is closed.
#include <csignal>

#include "tests/multi_user_fixture.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Root trains (its share of the array is kept for it); nobody swaps out
// activations until the daemon says no and keeps them: it gets its share
// (and what is free beyond the shares), never root's, so root's next job
// still registers, and root's running job never fails a step.
TEST_F(MultiUserTest, ASecondUserCannotFillTheSsdsUnderARunningJob) {
  StartDaemon();
  StartVictim();
  auto greedy = BackgroundProcess::Start(
      Nobody({"fill-ssd", daemon_->socket(), "greedy", "1048576"}));
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  const std::string said = (*greedy)->first_line();
  EXPECT_THAT(said, HasSubstr("RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(said, HasSubstr("beyond uid 65534's share of the SSD array"));
  // Its share of the 64 MiB array is half, less its own job's set-aside.
  const uint64_t stored = NumberAfter(said, "stored ");
  EXPECT_GE(stored, uint64_t{24} << 20) << said;
  EXPECT_LE(stored, uint64_t{32} << 20) << said;
  // The operator sees it in the daemon's log, once, not per refusal.
  const std::string log = daemon_->Log();
  EXPECT_THAT(log, HasSubstr("failed: RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(log, HasSubstr("share of the SSD array"));
  // And `lohanctl jobs` says why under the job; the victim has none.
  auto jobs = root_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  bool found = false;
  for (const v1::Job& job : *jobs) {
    if (job.spec().name() != "greedy") continue;
    found = true;
    EXPECT_THAT(job.last_failure(), HasSubstr("RESOURCE_EXHAUSTED: "));
    EXPECT_THAT(job.last_failure(), HasSubstr("share of the SSD array"));
    EXPECT_GT(job.last_failure_unix_seconds(), 0);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(VictimJob().last_failure(), "");
  // Root's new job registers in root's share.
  EXPECT_THAT(RootsNewJobSays(), HasSubstr("registered j-"));
  // Root's job runs its next two iterations beside the full share.
  ResumeAndCheckVictim();
}

// Nobody swaps out activations while alone until the array is full: it
// may take all of it. Then root registers a model within its share: lohand
// closes nobody's data plane (between iterations: at once), whose
// activations come back, and root's job registers without waiting out the
// patience; nobody's job says why.
TEST_F(MultiUserTest, AUserWhoFilledTheSsdsAloneGivesANewcomerItsShare) {
  StartDaemon();
  auto greedy = BackgroundProcess::Start(
      Nobody({"fill-ssd", daemon_->socket(), "greedy", "1048576"}));
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  const std::string said = (*greedy)->first_line();
  EXPECT_THAT(said, HasSubstr("is full")) << said;
  // Alone, it took the 64 MiB array but for its own job's set-aside.
  EXPECT_GE(NumberAfter(said, "stored "), uint64_t{48} << 20) << said;
  // Nobody never frees what it holds: without the reclaim this waits out
  // the 60 s patience and is refused.
  EXPECT_THAT(RootsNewJobSays(), HasSubstr("registered j-"));
  auto jobs = root_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  bool told = false;
  for (const v1::Job& job : *jobs) {
    if (job.spec().name() != "greedy") continue;
    told = true;
    EXPECT_THAT(job.last_failure(),
                HasSubstr("its data plane was closed for uid 0's job"));
    EXPECT_THAT(job.last_failure(), HasSubstr("beyond its fair share"));
  }
  EXPECT_TRUE(told);
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  for (const v1::SessionStatus& session : status->sessions()) {
    EXPECT_EQ(session.swapped_activation_bytes(), 0u) << session.job_id();
  }
}

// Root trains (a data plane open); nobody opens data planes until the
// daemon says no: it gets its share of the pool, and root's new data
// plane still opens.
TEST_F(MultiUserTest, AnotherUsersPlanesLeaveATrainingUsersShareOfThePool) {
  StartDaemon();
  StartVictim();
  std::vector<std::unique_ptr<BackgroundProcess>> planes;
  const std::string refusal = OpenNobodysPlanesUntilRefused(8, planes);
  EXPECT_THAT(refusal, HasSubstr("beyond uid 65534's share of the host pool"));
  EXPECT_GE(planes.size(), 1u);
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_LT(status->pool().used_bytes(), status->pool().capacity_bytes());
  EXPECT_THAT(RootsNewJobSays(), HasSubstr("registered j-"));
  ResumeAndCheckVictim();
}

// Nobody opens data planes while alone until the pool is full: it may take
// all of it. Then root opens one within its share: nobody's newest planes
// beyond its share are closed (between iterations: at once), each job told
// why, and root's opens; nobody keeps its share.
TEST_F(MultiUserTest, AUserWhoFilledThePoolAloneGivesANewcomerItsShare) {
  StartDaemon();
  std::vector<std::unique_ptr<BackgroundProcess>> planes;
  const std::string refusal = OpenNobodysPlanesUntilRefused(16, planes);
  EXPECT_THAT(refusal, HasSubstr("host pool"));
  ASSERT_GE(planes.size(), 2u);
  auto full = root_->GetStatus();
  ASSERT_TRUE(full.ok()) << full.status();
  const uint64_t capacity = full->pool().capacity_bytes();
  ASSERT_GT(full->pool().used_bytes() + capacity / planes.size(), capacity)
      << "nobody's planes should have filled the pool";
  EXPECT_THAT(RootsNewJobSays(), HasSubstr("registered j-"));
  // Nobody's closed planes say why; it keeps at least half the pool.
  auto jobs = root_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  int closed = 0;
  for (const v1::Job& job : *jobs) {
    if (job.owner_uid() != 65534) continue;
    if (job.last_failure().find("fair share") == std::string::npos) continue;
    ++closed;
    EXPECT_THAT(job.last_failure(), HasSubstr("was closed for uid 0's job"));
  }
  EXPECT_GE(closed, 1);
  EXPECT_LT(closed, static_cast<int>(planes.size()));
  auto after = root_->GetStatus();
  ASSERT_TRUE(after.ok()) << after.status();
  uint64_t nobodys = 0;
  for (const v1::SessionStatus& session : after->sessions()) {
    for (const v1::Job& job : *jobs) {
      if (job.id() == session.job_id() && job.owner_uid() == 65534) {
        nobodys += session.arena_bytes();
      }
    }
  }
  EXPECT_GE(nobodys, capacity / 2 - capacity / planes.size());
  EXPECT_THAT(daemon_->Log(), HasSubstr("beyond uid 65534's fair share"));
}

// As above, nobody's processes using their planes: each one closed for
// root's job learns why from its next request (ABORTED, naming root's uid
// and job, the share and the iteration its job keeps), not "lohand lost".
TEST_F(MultiUserTest, AJobClosedForAnotherUsersShareIsToldWhy) {
  StartDaemon();
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask: nobody writes
  std::vector<std::unique_ptr<BackgroundProcess>> planes;
  std::map<std::string, std::string> out_of_job;  // job id -> its file
  for (int i = 0; i < 16; ++i) {
    const std::string file = absl::StrCat(out, "/plane-", i);
    auto plane =
        BackgroundProcess::Start(Nobody({"register-await", daemon_->socket(),
                                         absl::StrCat("plane-", i), file}));
    if (!plane.ok() || (*plane)->first_line().find("registered ") != 0) break;
    out_of_job[(*plane)->first_line().substr(11)] = file;
    planes.push_back(*std::move(plane));
  }
  ASSERT_GE(planes.size(), 2u);
  const std::string said = RootsNewJobSays();
  ASSERT_THAT(said, HasSubstr("registered j-"));
  const std::string roots_job = said.substr(said.find("j-"));
  auto jobs = root_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  int closed = 0;
  for (const v1::Job& job : *jobs) {
    if (job.owner_uid() != 65534 ||
        job.last_failure().find("fair share") == std::string::npos) {
      continue;
    }
    ++closed;
    ASSERT_EQ(out_of_job.count(job.id()), 1u) << job.id();
    const std::string file = out_of_job[job.id()];
    ASSERT_TRUE(WaitForFile(file)) << job.id() << "'s process heard nothing";
    std::ifstream in(file);
    std::string told;
    std::getline(in, told);
    EXPECT_THAT(told, HasSubstr("ABORTED: lohand closed this job's data "
                                "plane to give uid 0's job " +
                                roots_job + " its share of the host pool"));
    EXPECT_THAT(told, HasSubstr("uid 65534's data planes held "));
    EXPECT_THAT(told, HasSubstr("the job keeps iteration 0: open it again "
                                "(lohan.init(..., resume=True))"));
  }
  EXPECT_GE(closed, 1);
  EXPECT_LT(closed, static_cast<int>(planes.size()));
}

// Issue #47: nobody holds 56 of the 64 MiB pool alone (beyond its share
// of 32 once root trains), using its plane. Root's job was sized for its
// model resident (10 MiB); 8 are free, and its model takes them with its
// weights resident and its gradients streamed through four shared
// buffers: the plane opens at that, nobody's plane is
// not closed (its first failing request is root's drain, long after), and
// root trains on to exact weights in the arena it got.
TEST_F(MultiUserTest, APlaneTakesWhatIsFreeBeforeAnyoneIsClosed) {
  StartDaemon();
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask: nobody writes
  const std::string told_file = out + "/holder";
  auto holder = BackgroundProcess::Start(
      Nobody({"register-await", daemon_->socket(), "holder", told_file,
              std::to_string(56 << 20)}));
  ASSERT_TRUE(holder.ok()) << holder.status();
  ASSERT_THAT((*holder)->first_line(), HasSubstr("registered j-"));
  const std::string holders_job = (*holder)->first_line().substr(11);

  const std::vector<uint64_t> layers(8, 128 << 10);  // fp32: 512 KiB each
  std::vector<std::string> argv = {Runfile("tests/train_client"),
                                   "--socket",
                                   daemon_->socket(),
                                   "--job",
                                   "newcomer",
                                   "--layers",
                                   absl::StrJoin(layers, ","),
                                   "--resume-file",
                                   dir_.path() + "/go",
                                   "--out",
                                   dir_.path() + "/weights"};
  for (const char* arg :
       {"--grad-slots", "4", "--weight-slots", "4", "--fit-arena",
        "--iterations", "3", "--pause-after", "1"}) {
    argv.push_back(arg);
  }
  auto job = BackgroundProcess::Start(argv);
  ASSERT_TRUE(job.ok()) << job.status() << daemon_->Log();
  EXPECT_EQ((*job)->first_line(), "buffers 4 gradient 8 weight");
  ASSERT_TRUE(WaitForFile(dir_.path() + "/go.paused")) << daemon_->Log();

  // Both planes open: root's granted 8 MiB of the 10 its job asks for.
  auto status = root_->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  std::map<std::string, v1::SessionStatus> sessions;
  for (const v1::SessionStatus& open : status->sessions()) {
    sessions[open.job_id()] = open;
  }
  ASSERT_EQ(sessions.count(holders_job), 1u) << daemon_->Log();
  EXPECT_EQ(sessions[holders_job].arena_bytes(), uint64_t{56} << 20);
  ASSERT_EQ(sessions.size(), 2u);
  sessions.erase(holders_job);
  const v1::SessionStatus& newcomer = sessions.begin()->second;
  EXPECT_EQ(newcomer.wanted_arena_bytes(), uint64_t{10} << 20);
  EXPECT_EQ(newcomer.arena_bytes(), uint64_t{8} << 20);
  EXPECT_EQ(newcomer.grad_slots(), 4u);
  EXPECT_THAT(daemon_->Log(),
              HasSubstr("of the 10485760 its job asks for: what the pool had "
                        "free for it"));
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid 0's job")));

  std::ofstream(dir_.path() + "/go") << "go\n";
  EXPECT_EQ((*job)->Stop(0), 0) << daemon_->Log();
  const absl::Status exact = CheckDumpedWeights(
      dir_.path() + "/weights", {.layers = layers, .iterations = 3});
  EXPECT_TRUE(exact.ok()) << exact;

  // Nobody's plane served every request until root drained it now.
  EXPECT_EQ(access(told_file.c_str(), F_OK), -1) << "closed before the drain";
  ASSERT_TRUE(root_->StopJob(holders_job, /*drain=*/true).ok());
  ASSERT_TRUE(WaitForFile(told_file));
  std::ifstream in(told_file);
  std::string told;
  std::getline(in, told);
  EXPECT_THAT(told, HasSubstr("ABORTED: lohand closed this job's data plane: "
                              "`lohanctl drain` by uid 0"));
  auto jobs = root_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  for (const v1::Job& j : *jobs) {
    EXPECT_THAT(j.last_failure(), Not(HasSubstr("fair share"))) << j.id();
  }
}

// Issue #47, only use earns a share: a plane that has not begun an
// iteration counts only for the memory it holds. Nobody's idle 8 MiB plane
// leaves root the rest of the pool (its job's whole arena, beyond half the
// pool, opens); once nobody's plane trains, nobody's share is kept for it
// and root's next plane of the same job shape gets only what is free of
// root's own share (32 MiB), streamed.
TEST_F(MultiUserTest, AnIdlePlaneEarnsNoShare) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});  // root's states fit
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask: nobody writes
  auto idle = BackgroundProcess::Start(
      Nobody({"register-await", daemon_->socket(), "idle", out + "/idle",
              std::to_string(8 << 20)}));
  ASSERT_TRUE(idle.ok()) << idle.status();
  ASSERT_THAT((*idle)->first_line(), HasSubstr("registered j-"));

  const std::vector<uint64_t> layers(40, 128 << 10);  // fp32: 512 KiB each
  auto roots_plane = [&](const std::string& name) -> v1::SessionStatus {
    const std::string go = dir_.path() + "/go-" + name;
    std::vector<std::string> argv = {Runfile("tests/train_client"),
                                     "--socket",
                                     daemon_->socket(),
                                     "--job",
                                     name,
                                     "--layers",
                                     absl::StrJoin(layers, ","),
                                     "--resume-file",
                                     go,
                                     "--out",
                                     dir_.path() + "/weights-" + name,
                                     "--fit-arena",
                                     "--grad-slots",
                                     "8",
                                     "--weight-slots",
                                     "8",
                                     "--iterations",
                                     "2",
                                     "--pause-after",
                                     "1"};
    auto job = BackgroundProcess::Start(argv);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    EXPECT_TRUE(WaitForFile(go + ".paused")) << daemon_->Log();
    std::string id;
    auto jobs = root_->ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    for (const v1::Job& listed : jobs.ok() ? *jobs : std::vector<v1::Job>{}) {
      if (listed.spec().name() == name) id = listed.id();
    }
    v1::SessionStatus mine;
    auto status = root_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    for (const v1::SessionStatus& open : status->sessions()) {
      if (open.job_id() == id) mine = open;
    }
    std::ofstream(go) << "go\n";
    EXPECT_EQ((*job)->Stop(0), 0) << daemon_->Log();
    const absl::Status exact = CheckDumpedWeights(
        dir_.path() + "/weights-" + name, {.layers = layers, .iterations = 2});
    EXPECT_TRUE(exact.ok()) << exact;
    return mine;
  };

  const v1::SessionStatus beside_idle = roots_plane("wide");
  ASSERT_GT(beside_idle.wanted_arena_bytes(), uint64_t{32} << 20);
  EXPECT_EQ(beside_idle.arena_bytes(), beside_idle.wanted_arena_bytes())
      << daemon_->Log();

  (*idle)->Stop(SIGKILL);
  auto training = BackgroundProcess::Start(Nobody(
      {"begin-hold", daemon_->socket(), "training", std::to_string(8 << 20)}));
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_THAT((*training)->first_line(), HasSubstr("began j-"));
  const v1::SessionStatus beside_training = roots_plane("wide-again");
  EXPECT_EQ(beside_training.wanted_arena_bytes(),
            beside_idle.wanted_arena_bytes());
  EXPECT_LE(beside_training.arena_bytes(), uint64_t{32} << 20)
      << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid 0's job")));
}

// Issue #47, bounded disruption: with [quotas] reclaim_interval = 1h (no
// grace), nobody's first plane that needs its share of the pool closes
// root's plane beyond root's share, once; root opens a new one in what is
// then free; nobody's second plane within the hour needs a reclaim too but
// closes nothing: it is refused, naming reclaim_interval and when.
TEST_F(MultiUserTest, AUserTakesBackFromOthersAtMostOncePerReclaimInterval) {
  StartDaemon("[quotas]\nreclaim_interval = \"1h\"\nreclaim_grace = \"0s\"\n");
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask: nobody writes
  auto roots = [&](const std::string& name) {
    return BackgroundProcess::Start({bin_ + "/hostile_client", "register-await",
                                     daemon_->socket(), name, out + "/" + name,
                                     std::to_string(56 << 20)});
  };
  auto first_root = roots("root-1");  // alone: 56 of the 64 MiB
  ASSERT_TRUE(first_root.ok()) << first_root.status();
  ASSERT_THAT((*first_root)->first_line(), HasSubstr("registered j-"));

  auto first = BackgroundProcess::Start(Nobody(
      {"register-await", daemon_->socket(), "nobody-1", out + "/nobody-1"}));
  ASSERT_TRUE(first.ok()) << first.status() << daemon_->Log();
  ASSERT_THAT((*first)->first_line(), HasSubstr("registered j-"));
  ASSERT_TRUE(WaitForFile(out + "/root-1")) << daemon_->Log();
  EXPECT_EQ(LogLinesWith("was closed for uid 65534's job"), 1u);

  // Nobody's plane goes; root opens again, alone: 56 MiB.
  (*first)->Stop(SIGKILL);
  absl::StatusOr<std::unique_ptr<BackgroundProcess>> second_root;
  std::string roots_second;        // its name: its told file
  for (int i = 0; i < 100; ++i) {  // until nobody's arena is back
    roots_second = absl::StrCat("root-2-", i);
    second_root = roots(roots_second);
    if (second_root.ok() &&
        (*second_root)->first_line().find("registered j-") == 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(second_root.ok()) << second_root.status() << daemon_->Log();
  ASSERT_THAT((*second_root)->first_line(), HasSubstr("registered j-"));

  // Nobody's 16 MiB again: within its share (32) but not free: a
  // reclaim, which the hour does not allow yet.
  auto second = BackgroundProcess::Start(Nobody(
      {"register-await", daemon_->socket(), "nobody-2", out + "/nobody-2"}));
  const std::string said = second.ok() ? (*second)->first_line()
                                       : std::string(second.status().message());
  EXPECT_THAT(said, HasSubstr("[quotas] reclaim_interval"));
  EXPECT_THAT(said, HasSubstr("at most once per 1h"));
  EXPECT_THAT(said, HasSubstr("may take its share back in "));
  EXPECT_EQ(access((out + "/" + roots_second).c_str(), F_OK), -1)
      << "root's new plane was closed";
  EXPECT_EQ(LogLinesWith("was closed for uid 65534's job"), 1u);
}

}  // namespace
}  // namespace lohan::testing
