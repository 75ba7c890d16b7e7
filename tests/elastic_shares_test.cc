// Elastic shares (issue #47) with a real second uid: a running job whose
// arena is beyond its share of the host pool is asked to shrink when
// another user's plane needs that share, moves to a smaller arena at its
// next iteration's end and trains on (never closed, weights exact); it
// grows back when the pool has room again; a job that does not move is
// closed after the wait, as before shares bent. Clients that answer the
// asks wrongly: elastic_shares_hostile_test.cc.
#include <atomic>
#include <csignal>
#include <thread>

#include "tests/elastic_shares_fixture.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Root's job holds 40 of the 64 MiB pool. Nobody opens an idle 28 MiB
// plane: within its share (32) but not free (24). Root's job is asked to
// shrink, moves at its next iteration's end to its streamed arena and
// trains on; nobody's plane opens; nobody leaves and root's job, asked to
// grow at once (regrow_after = 0s), gets its whole arena back. Nobody's
// plane is never closed, root's job never fails, its weights are exact.
TEST_F(ElasticSharesTest, ARunningJobShrinksForAnotherUsersPlaneAndGrowsBack) {
  StartDaemon("[quotas]\nregrow_after = \"0s\"\n",
              {"--ssd-capacity", "512MiB"});
  StartTrainer("root");
  ASSERT_TRUE(Whole(PlaneOf()));
  ASSERT_GT(PlaneOf().wanted_arena_bytes(), uint64_t{32} << 20);
  const std::string told = dir_.path() + "/out/idle";
  auto idle = BackgroundProcess::Start(
      Nobody({"register-await", daemon_->socket(), "idle", told,
              std::to_string(28 << 20)}));
  ASSERT_TRUE(idle.ok()) << idle.status() << daemon_->Log();
  ASSERT_THAT((*idle)->first_line(), HasSubstr("registered j-"))
      << daemon_->Log();

  // Root's job moved: smaller, streamed, saying for whom.
  ASSERT_TRUE(AwaitPlane(Moved)) << daemon_->Log();
  const v1::SessionStatus shrunk = PlaneOf();
  EXPECT_LT(shrunk.arena_bytes(), shrunk.wanted_arena_bytes());
  EXPECT_LE(shrunk.arena_bytes() + (uint64_t{28} << 20), uint64_t{64} << 20);
  EXPECT_EQ(shrunk.grad_slots(), 8u);
  EXPECT_THAT(shrunk.arena_note(), HasSubstr("uid 65534's job"));
  EXPECT_THAT(shrunk.arena_note(), HasSubstr("asked to shrink"));
  // Counted with the job, across its planes (it is on its second).
  v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.arena_grow_asks(), 0u);
  EXPECT_EQ(job.planes_closed(), 0u);
  auto listed = root_->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::Job& each : *listed) {
    // ListJobs says the same; nobody's job was asked nothing.
    const bool trainer = each.spec().name() == "trainer";
    EXPECT_EQ(each.arena_shrink_asks(), trainer ? 1u : 0u) << each.id();
    EXPECT_EQ(each.planes_closed(), 0u) << each.id();
  }

  // Nobody leaves: root's job grows back whole, resident again.
  (*idle)->Stop(SIGKILL);
  ASSERT_TRUE(AwaitPlane(Whole)) << daemon_->Log();
  EXPECT_EQ(PlaneOf().grad_slots(), 40u);
  job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.arena_grow_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 0u);
  // lohand's optimizer time counts every plane the job had, and never goes
  // back when one closes.
  auto before = root_->GetStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  const double busy = before->optimizer().busy_seconds();
  EXPECT_GE(busy, PlaneOf().optimizer_seconds());
  EXPECT_GT(busy, 0.0);

  StopAndCheckTrainer();
  EXPECT_EQ(LogLinesWith("asked to shrink"), 1u) << daemon_->Log();
  EXPECT_EQ(LogLinesWith("asked to grow"), 1u) << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  EXPECT_EQ(access(told.c_str(), F_OK), -1) << "nobody's plane was closed";
  // With no plane open, the job keeps its counts.
  job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.arena_grow_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 0u);
  ASSERT_TRUE(AwaitPlane([](const v1::SessionStatus& s) {
    return s.job_id().empty();  // closed
  }));
  auto after = root_->GetStatus();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->optimizer().busy_seconds(), busy);
}

// The same with the users' places exchanged: nobody's job shrinks for
// root's plane, stays small while that plane is open (its whole arena does
// not fit beside it) and grows back once it is gone.
TEST_F(ElasticSharesTest, NobodysRunningJobShrinksForRootsPlane) {
  StartDaemon("[quotas]\nregrow_after = \"0s\"\n",
              {"--ssd-capacity", "512MiB"});
  StartTrainer("nobody");
  auto roots = BackgroundProcess::Start(
      {bin_ + "/hostile_client", "register-await", daemon_->socket(), "roots",
       dir_.path() + "/out/roots", std::to_string(28 << 20)});
  ASSERT_TRUE(roots.ok()) << roots.status() << daemon_->Log();
  ASSERT_THAT((*roots)->first_line(), HasSubstr("registered j-"))
      << daemon_->Log();
  ASSERT_TRUE(AwaitPlane(Moved)) << daemon_->Log();
  const v1::SessionStatus shrunk = PlaneOf();
  EXPECT_LT(shrunk.arena_bytes(), shrunk.wanted_arena_bytes());
  EXPECT_THAT(shrunk.arena_note(), HasSubstr("uid 0's job"));
  // While root's plane stays, nobody's job trains on, small.
  const uint64_t at = shrunk.iteration();
  ASSERT_TRUE(AwaitPlane(
      [at](const v1::SessionStatus& s) { return s.iteration() >= at + 5; }));
  EXPECT_LT(PlaneOf().arena_bytes(), PlaneOf().wanted_arena_bytes());
  (*roots)->Stop(SIGKILL);
  ASSERT_TRUE(AwaitPlane(Whole)) << daemon_->Log();
  StopAndCheckTrainer();
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  const v1::Job job = JobNamed("trainer");
  EXPECT_GE(job.arena_shrink_asks(), 1u);
  EXPECT_GE(job.arena_grow_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 0u);
}

// Only use earns a share: root's job holds 50 of the 64 MiB pool alone.
// Nobody's job (its model 22 MiB resident) opens at what is free, streamed,
// taking nothing back; once it trains, it takes back from root what its
// share lets it use: root's job is asked to shrink, nobody's to grow to its
// whole arena. Both train on, exact, nobody closed.
TEST_F(ElasticSharesTest, ATrainingNewcomerTakesBackWhatItUses) {
  StartDaemon("[quotas]\nregrow_after = \"0s\"\n",
              {"--ssd-capacity", "512MiB"});
  const std::vector<uint64_t> wide(48, 128 << 10);
  const std::vector<uint64_t> narrow(20, 128 << 10);
  StartTrainer("root", {}, "wide", wide);
  ASSERT_TRUE(Whole(PlaneOf("wide")));
  StartTrainer("nobody", {}, "narrow", narrow);
  // It opened at what was free; nobody was asked anything before it
  // trained, then it took back what it uses.
  ASSERT_TRUE(AwaitPlane(Moved, "wide")) << daemon_->Log();
  ASSERT_TRUE(AwaitPlane(Whole, "narrow")) << daemon_->Log();
  EXPECT_THAT(PlaneOf("wide").arena_note(), HasSubstr("uid 65534's job"));
  EXPECT_THAT(daemon_->Log(), HasSubstr("took back from other users what it "
                                        "would use"));
  EXPECT_THAT(daemon_->Log(),
              HasSubstr("of the 23068672 its job asks for: what the pool "
                        "had free for it"));
  const uint64_t at = PlaneOf("narrow").iteration();
  ASSERT_TRUE(AwaitPlane(
      [at](const v1::SessionStatus& s) { return s.iteration() >= at + 3; },
      "narrow"));
  StopAndCheckTrainer("narrow");
  StopAndCheckTrainer("wide");
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  // Root's job was asked to shrink, nobody's (which opened smaller) to
  // grow; neither was closed.
  EXPECT_GE(JobNamed("wide").arena_shrink_asks(), 1u);
  EXPECT_EQ(JobNamed("wide").planes_closed(), 0u);
  EXPECT_EQ(JobNamed("narrow").arena_shrink_asks(), 0u);
  EXPECT_GE(JobNamed("narrow").arena_grow_asks(), 1u);
  EXPECT_EQ(JobNamed("narrow").planes_closed(), 0u);
}

// A job whose client does not follow the ask (an old client, or one that
// claims to and does not) is closed at once after half the newcomer's
// wait, its iteration rolled back, as when shares did not bend; the
// newcomer opens.
TEST_F(ElasticSharesTest, AJobThatDoesNotShrinkIsClosedAfterTheWait) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});
  StartTrainer("root", {"--ignore-share"});
  auto idle = BackgroundProcess::Start(
      Nobody({"register-await", daemon_->socket(), "idle",
              dir_.path() + "/out/idle", std::to_string(28 << 20)}));
  ASSERT_TRUE(idle.ok()) << idle.status() << daemon_->Log();
  ASSERT_THAT((*idle)->first_line(), HasSubstr("registered j-"))
      << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), HasSubstr("asked to shrink"));
  EXPECT_EQ(LogLinesWith("was closed for uid 65534's job"), 1u)
      << daemon_->Log();
  // The trainer was told why and exits with the error.
  EXPECT_NE(trainers_.at("trainer").process->Stop(0), 0);
  // Asked once, then closed once, after the wait.
  const v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u) << daemon_->Log();
  EXPECT_EQ(job.arena_grow_asks(), 0u);
  EXPECT_EQ(job.planes_closed(), 1u) << daemon_->Log();
  EXPECT_EQ(JobNamed("idle").planes_closed(), 0u);
}

// The SSD side: root's job, alone, swaps 42 MiB of activations per
// iteration through the 64 MiB array, beyond half of it. It pauses between
// a forward and its backward, holding them; nobody registers a model whose
// set-aside fits its share (32 MiB) but not what is free. Root's plane,
// training, is not closed: it swaps no more beyond its share while the
// set-aside waits, and once its backward frees its activations (root
// resumed), nobody's model registers. Root trains on, its puts beyond its
// share refused and kept in its own memory, and ends with exact weights.
TEST_F(ElasticSharesTest,
       ASwappingJobKeepsTrainingWhileANewcomerTakesItsSsdShare) {
  StartDaemon();  // the harness's 64 MiB array and host pool
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);         // past the umask
  constexpr uint64_t kSwap = uint64_t{14} << 20;  // per layer
  Trainer& trainer = trainers_["swapper"];
  trainer.name = "swapper";
  trainer.layers = kLayers;
  trainer.stop = out + "/stop-swapper";
  trainer.weights = out + "/weights-swapper";
  const std::string resume = out + "/resume-swapper";
  const std::string swaps = out + "/swaps-swapper";
  auto started = BackgroundProcess::Start({Runfile("tests/train_client"),
                                           "--socket",
                                           daemon_->socket(),
                                           "--job",
                                           "swapper",
                                           "--layers",
                                           absl::StrJoin(kLayers, ","),
                                           "--iterations",
                                           "1000000",
                                           "--until-file",
                                           trainer.stop,
                                           "--out",
                                           trainer.weights,
                                           "--swap-bytes",
                                           std::to_string(kSwap),
                                           "--swap-file",
                                           swaps,
                                           "--pause-after",
                                           "3",
                                           "--pause-after-forward",
                                           "--resume-file",
                                           resume});
  ASSERT_TRUE(started.ok()) << started.status() << daemon_->Log();
  trainer.process = *std::move(started);
  // Paused with its 42 MiB of activations swapped out, alone: none refused.
  ASSERT_TRUE(WaitForFile(resume + ".paused")) << daemon_->Log();
  const v1::SessionStatus paused = PlaneOf("swapper");
  ASSERT_EQ(paused.swapped_activation_bytes(), 3 * kSwap) << daemon_->Log();
  const uint64_t roots =
      paused.swapped_activation_bytes() + paused.ssd_set_aside_bytes();
  ASSERT_GT(roots, uint64_t{32} << 20);

  // Root resumes once lohand said its plane keeps training (well before
  // half the newcomer's 60 s wait).
  std::atomic<bool> told{false};
  std::thread resumer([&] {
    for (int i = 0; i < 2000 && !told; ++i) {
      if (daemon_->Log().find("swaps no more beyond uid 0's share") !=
          std::string::npos) {
        told = true;
        break;
      }
      usleep(10 * 1000);
    }
    std::ofstream(resume) << "go\n";
  });
  auto newcomer = BackgroundProcess::Start(AsNobody(
      {CopyForOtherUsers("tests/train_client", bin_), "--socket",
       daemon_->socket(), "--job", "newcomer", "--layers",
       "262144,262144,262144,262144", "--chunk", "65536", "--iterations", "2",
       "--out", out + "/weights-newcomer", "--hold"}));
  resumer.join();
  ASSERT_TRUE(newcomer.ok()) << newcomer.status() << daemon_->Log();
  EXPECT_THAT((*newcomer)->first_line(), HasSubstr("buffers"))
      << daemon_->Log();
  EXPECT_TRUE(told) << daemon_->Log();
  // Its set-aside (27 MiB) was within its share, but more than was free.
  const v1::SessionStatus newcomers = PlaneOf("newcomer");
  EXPECT_LE(newcomers.ssd_set_aside_bytes(), uint64_t{32} << 20);
  EXPECT_GT(newcomers.ssd_set_aside_bytes() + roots, uint64_t{64} << 20)
      << "set aside " << newcomers.ssd_set_aside_bytes() << ", root held "
      << roots;

  // Root trains on beside it, within its share.
  const uint64_t at = PlaneOf("swapper").iteration();
  ASSERT_TRUE(AwaitPlane(
      [at](const v1::SessionStatus& s) { return s.iteration() >= at + 3; },
      "swapper"))
      << daemon_->Log();
  EXPECT_LE(PlaneOf("swapper").swapped_activation_bytes(), uint64_t{32} << 20);
  StopAndCheckTrainer("swapper");
  std::ifstream said(swaps);
  std::string puts_word, refused_word;
  uint64_t puts = 0, refused = 0;
  ASSERT_TRUE(said >> puts_word >> puts >> refused_word >> refused)
      << "no " << swaps;
  EXPECT_GT(refused, 0u) << puts << " puts";
  EXPECT_LT(refused, puts);
  EXPECT_EQ(LogLinesWith("swaps no more beyond uid 0's share"), 1u)
      << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  EXPECT_EQ(JobNamed("swapper").planes_closed(), 0u);
  (*newcomer)->Stop(SIGKILL);
}

// A process that dies (a crash, a restart by torchrun) while its plane
// holds most of the pool, and one that opens right after it: its plane is
// not refused for the dead one's arena, which is about to be free (lohand
// may not have seen the hang-up yet); it waits for that plane to close.
// Ten times in a row, each open right after the kill.
TEST_F(ElasticSharesTest, APlaneOpenedRightAfterAnotherDiedWaitsForItsArena) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask
  const std::string told = out + "/told";
  for (int i = 0; i < 10; ++i) {
    auto plane = BackgroundProcess::Start(
        Nobody({"register-await", daemon_->socket(), absl::StrCat("run-", i),
                told, std::to_string(40 << 20)}));
    ASSERT_TRUE(plane.ok()) << plane.status() << daemon_->Log();
    ASSERT_THAT((*plane)->first_line(), HasSubstr("registered j-"))
        << "run " << i << "\n"
        << daemon_->Log();
    (*plane)->Stop(SIGKILL);
  }
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("data plane refused")));
}

}  // namespace
}  // namespace lohan::testing
