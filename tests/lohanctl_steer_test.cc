// lohanctl watching and steering a real training job: status --watch while
// it trains, drain (the iteration in progress finishes, then the job is
// detached) and kill (it is rolled back); either way a new process resumes
// from what was committed and ends at the reference weights.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_split.h"
#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/dumped_weights.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<uint64_t> kLayers = {1000, 5000, 333};

class LohanctlSteerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::vector<std::string> Trainer(int iterations) {
    return {Runfile("tests/train_client"),
            "--socket",
            daemon_->socket(),
            "--job",
            "steered",
            "--layers",
            "1000,5000,333",
            "--iterations",
            std::to_string(iterations),
            "--out",
            dir_.path() + "/weights"};
  }

  // The trainer paused after 2 iterations (or half-way through the third).
  void StartPaused(bool mid_iteration) {
    std::vector<std::string> argv = Trainer(4);
    // Every iteration durable: the SSD counters move.
    for (const char* arg :
         {"--commit-interval", "1", "--pause-after", "2", "--resume-file"}) {
      argv.push_back(arg);
    }
    argv.push_back(dir_.path() + "/go");
    if (mid_iteration) argv.push_back("--pause-mid");
    auto trainer = BackgroundProcess::Start(argv);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = *std::move(trainer);
    // Its first line comes before the pause: wait for the pause itself.
    const std::string paused = dir_.path() + "/go.paused";
    for (int i = 0; i < 6000 && access(paused.c_str(), F_OK) != 0; ++i) {
      usleep(10 * 1000);
    }
    ASSERT_EQ(access(paused.c_str(), F_OK), 0) << daemon_->Log();
  }

  RunResult Lohanctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {Runfile("client/ctl/lohanctl"), "--socket",
                                     daemon_->socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  v1::Job Job() {
    auto jobs = client_->ListJobs();
    EXPECT_TRUE(jobs.ok() && jobs->size() == 1);
    return jobs.ok() && !jobs->empty() ? (*jobs)[0] : v1::Job();
  }

  // A new process resumes the job for `iterations`; the weights must be
  // the reference's after `total`.
  void ResumeAndCheck(int iterations, int total) {
    RunResult resumed = RunCommand(Trainer(iterations));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out << daemon_->Log();
    const absl::Status exact = CheckDumpedWeights(
        dir_.path() + "/weights", {.layers = kLayers, .iterations = total});
    EXPECT_TRUE(exact.ok()) << exact;
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
  std::unique_ptr<BackgroundProcess> trainer_;
};

TEST_F(LohanctlSteerTest, WatchShowsTheTrainingJobAndTheQuota) {
  StartPaused(false);
  const std::string id = Job().id();
  RunResult watch =
      Lohanctl({"status", "--watch", "--interval", "0.2", "--count", "2"});
  ASSERT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("READ GB/s"));
  EXPECT_THAT(watch.out, HasSubstr("QUEUED urg/bulk"));
  EXPECT_THAT(watch.out, HasSubstr("READ-AHEAD held/share"));
  EXPECT_THAT(watch.out, HasSubstr("STATES in RAM/all"));
  EXPECT_THAT(watch.out, HasSubstr("\n" + id + " "));
  // The second refresh has rates (nothing moves while it is paused).
  EXPECT_THAT(watch.out, HasSubstr("0.00"));
  EXPECT_THAT(watch.out, HasSubstr("your quota: jobs 1 of 64"));
  RunResult json = Lohanctl(
      {"status", "--watch", "--json", "--interval", "0.1", "--count", "2"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  std::vector<std::string> lines =
      absl::StrSplit(json.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << json.out;
  for (const std::string& line : lines) {
    v1::GetStatusResponse parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok())
        << line;
    ASSERT_EQ(parsed.sessions_size(), 1);
    EXPECT_EQ(parsed.sessions(0).session_iterations(), 2u);
    EXPECT_GT(parsed.sessions(0).ssd_written_bytes(), 0u);
    EXPECT_GT(parsed.sessions(0).ssd_set_aside_bytes(), 0u);
    EXPECT_EQ(parsed.quota().jobs_limit(), 64u);
  }
}

TEST_F(LohanctlSteerTest, DrainFinishesTheIterationThenDetaches) {
  StartPaused(/*mid_iteration=*/true);
  const std::string id = Job().id();
  // lohanctl drain says what it does, then waits for the detach.
  RunResult drain;
  std::thread drainer([&] { drain = Lohanctl({"drain", id}); });
  bool draining = false;
  for (int i = 0; i < 6000 && !draining; ++i) {
    auto status = client_->GetStatus();
    draining = status.ok() && status->sessions_size() == 1 &&
               status->sessions(0).draining();
    if (!draining) usleep(10 * 1000);
  }
  EXPECT_TRUE(draining);
  EXPECT_EQ(Job().state(), v1::JOB_STATE_ATTACHED);
  std::ofstream(dir_.path() + "/go") << "go\n";
  drainer.join();
  EXPECT_EQ(drain.exit_code, 0) << drain.out << drain.err;
  EXPECT_EQ(drain.out,
            id + ": draining: the data plane closes once iteration 3 ends\n" +
                id + ": detached\n");
  EXPECT_EQ(Job().state(), v1::JOB_STATE_DETACHED);
  // The trainer's third iteration committed; its fourth found the data
  // plane closed.
  EXPECT_NE(trainer_->Stop(0), 0);
  ResumeAndCheck(1, 4);
}

TEST_F(LohanctlSteerTest, KillRollsBackTheIterationInProgress) {
  StartPaused(/*mid_iteration=*/true);
  const std::string id = Job().id();
  RunResult kill = Lohanctl({"kill", id});
  ASSERT_EQ(kill.exit_code, 0) << kill.out << kill.err;
  EXPECT_THAT(kill.out, HasSubstr(id + ": killed: iteration 3 rolled back; "
                                       "the job keeps iteration 2\n"));
  EXPECT_THAT(kill.out, HasSubstr(id + ": detached\n"));
  std::ofstream(dir_.path() + "/go") << "go\n";
  EXPECT_NE(trainer_->Stop(0), 0);
  ResumeAndCheck(2, 4);
}

TEST_F(LohanctlSteerTest, DrainBetweenIterationsIsAtOnceAndUnknownJobsFail) {
  StartPaused(/*mid_iteration=*/false);
  const std::string id = Job().id();
  RunResult drain = Lohanctl({"drain", id});
  ASSERT_EQ(drain.exit_code, 0) << drain.out << drain.err;
  EXPECT_THAT(drain.out, HasSubstr(id + ": drained between iterations at 2"));
  std::ofstream(dir_.path() + "/go") << "go\n";
  EXPECT_NE(trainer_->Stop(0), 0);
  // Again, now that it has no data plane: it is only (still) detached.
  RunResult again = Lohanctl({"kill", id});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr(id + ": no data plane was open; detached"));
  RunResult missing = Lohanctl({"kill", "j-999999"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no job 'j-999999' of yours"));
  ResumeAndCheck(2, 4);
}

}  // namespace
}  // namespace lohan::testing
