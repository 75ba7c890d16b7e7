// Jobs that ended against a real lohand: [jobs] keep_ended deletes them and
// gives their SSD space back (never a pinned or an attached one), and a
// refusal for SSD space names the asker's own ended jobs that hold it,
// never another user's.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"
#include "tests/multi_user_fixture.h"

namespace lohan::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// Every wait here is for an effect lohand shows; this only keeps a broken
// daemon from hanging the test.
constexpr absl::Duration kFailsafe = absl::Seconds(120);

// Two layers of 300000 fp32 parameters: about 7 MiB of states on the SSDs
// once trained, about 14 MiB set aside while its data plane is open.
constexpr char kLayers[] = "300000,300000";

bool WaitUntil(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + kFailsafe;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

// One iteration of job `name` (created if it does not exist), as `argv0`
// (train_client, or a copy another user may run); its output.
std::vector<std::string> TrainArgs(const std::string& argv0,
                                   const std::string& socket,
                                   const std::string& name,
                                   const std::string& out_dir) {
  return {argv0,
          "--socket",
          socket,
          "--job",
          name,
          "--layers",
          kLayers,
          "--iterations",
          "1",
          "--out",
          out_dir + "/" + name + ".weights"};
}

// Whether `log` says job `id`'s data plane closed (its set-aside given
// back); waits for it first.
bool PlaneClosed(const std::function<std::string()>& log,
                 const std::string& id) {
  return WaitUntil([&] {
    return log().find("data plane closed for job " + id + " ") !=
           std::string::npos;
  });
}

class EndedJobsTest : public ::testing::Test {
 protected:
  void StartDaemon(const std::string& config_toml) {
    const std::string path = dir_.path() + "/lohand.toml";
    std::ofstream(path) << config_toml;
    auto daemon = DaemonProcess::Start(dir_.path(), {"--config", path});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  RunResult Train(const std::string& name) {
    return RunCommand(TrainArgs(Runfile("tests/train_client"),
                                daemon_->socket(), name, dir_.path()));
  }

  std::optional<v1::Job> Find(const std::string& name) {
    auto jobs = client_->ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (!jobs.ok()) return std::nullopt;
    for (const v1::Job& job : *jobs) {
      if (job.spec().name() == name) return job;
    }
    return std::nullopt;
  }

  v1::GetStatusResponse Status() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::GetStatusResponse();
  }

  // What the SSD array holds, as `lohanctl status` shows it.
  uint64_t SsdUsed() {
    const v1::GetStatusResponse status = Status();
    return status.store().ssds_size() == 1 ? status.store().ssds(0).used_bytes()
                                           : ~uint64_t{0};
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
};

// keep_ended "2s": a job that trained and ended is deleted and its space
// comes back; a pinned job that ended before it stays (the pass that
// deleted the other found it due too), until unpinned; a job a process is
// attached to stays whatever.
TEST_F(EndedJobsTest, EndedJobsGoTheirSpaceComesBackPinnedAndAttachedStay) {
  StartDaemon("[jobs]\nkeep_ended = \"2s\"\n");
  EXPECT_THAT(daemon_->Log(),
              HasSubstr("jobs no process has been attached to for 2s are "
                        "deleted unless pinned"));
  v1::JobSpec attached_spec;
  attached_spec.set_name("attached");
  auto attached = client_->CreateJob(attached_spec);
  ASSERT_TRUE(attached.ok()) << attached.status();
  ASSERT_TRUE(client_->AttachJob(attached->id()).ok());  // this process

  // Pinned before it trains (it could go as soon as it ends).
  v1::JobSpec pinned_spec;
  pinned_spec.set_name("pinned");
  pinned_spec.set_host_pool_bytes(16 << 20);
  auto pinned = client_->CreateJob(pinned_spec);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto kept = client_->KeepJob(pinned->id(), true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->kept());
  RunResult trained = Train("pinned");
  ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  // Its data plane closed (its set-aside given back): what it keeps.
  ASSERT_TRUE(PlaneClosed([&] { return daemon_->Log(); }, pinned->id()))
      << daemon_->Log();
  const uint64_t pinned_used = SsdUsed();
  EXPECT_GT(pinned_used, uint64_t{1} << 20);

  trained = Train("ended");
  ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  // Logged once its space is freed.
  ASSERT_TRUE(WaitUntil([&] {
    return daemon_->Log().find("'ended' of uid 0 deleted by lohand") !=
           std::string::npos;
  })) << daemon_->Log();
  EXPECT_FALSE(Find("ended").has_value());
  EXPECT_THAT(daemon_->Log(),
              ContainsRegex("job j-[0-9]+ 'ended' of uid 0 deleted by lohand: "
                            "no process attached since [^(]+ \\(\\[jobs\\] "
                            "keep_ended 2s\\), [1-9][0-9]* bytes \\("));
  EXPECT_EQ(SsdUsed(), pinned_used);

  std::optional<v1::Job> still = Find("pinned");
  ASSERT_TRUE(still.has_value());
  EXPECT_TRUE(still->kept());
  EXPECT_EQ(still->state(), v1::JOB_STATE_DETACHED);
  EXPECT_EQ(still->delete_after_unix_seconds(), 0);
  EXPECT_GT(still->ssd_bytes(), 0u);
  still = Find("attached");
  ASSERT_TRUE(still.has_value());
  EXPECT_EQ(still->state(), v1::JOB_STATE_ATTACHED);
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("'pinned' of uid 0 deleted")));

  // Unpinned: it goes too, and the array is empty again.
  RunResult unpinned =
      RunCommand({Runfile("client/ctl/lohanctl"), "--socket", daemon_->socket(),
                  "jobs", "keep", "--off", pinned->id()});
  ASSERT_EQ(unpinned.exit_code, 0) << unpinned.err;
  ASSERT_TRUE(WaitUntil([&] {
    return daemon_->Log().find("'pinned' of uid 0 deleted by lohand") !=
           std::string::npos;
  })) << daemon_->Log();
  EXPECT_FALSE(Find("pinned").has_value());
  EXPECT_EQ(SsdUsed(), 0u);
  EXPECT_EQ(Status().quota().ssd_held_bytes(), 0u);
  // The attached one outlived every pass.
  still = Find("attached");
  ASSERT_TRUE(still.has_value());
  EXPECT_EQ(still->state(), v1::JOB_STATE_ATTACHED);
}

// "0s": ended jobs stay until deleted by hand.
TEST_F(EndedJobsTest, ZeroKeepsEndedJobs) {
  StartDaemon("[jobs]\nkeep_ended = \"0s\"\n");
  EXPECT_THAT(daemon_->Log(), HasSubstr("ended jobs are kept until deleted"));
  v1::JobSpec spec;
  spec.set_name("forever");
  auto job = client_->CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Job> listed = Find("forever");
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(listed->delete_after_unix_seconds(), 0);
  EXPECT_GT(listed->ended_unix_seconds(), 0);
}

// A 24 MiB array: root's and nobody's ended jobs hold 7 MiB each; a new
// job of either, needing about 14 MiB set aside, does not fit. Each
// refusal names the asker's own ended job with its size and how to free
// it, never the other user's.
class EndedJobsRefusalTest : public MultiUserTest {};

TEST_F(EndedJobsRefusalTest, ARefusalNamesTheAskersOwnEndedJobsOnly) {
  ASSERT_NE(CopyForOtherUsers("tests/train_client", bin_), "");
  ASSERT_NE(CopyForOtherUsers("client/ctl/lohanctl", bin_), "");
  const std::string out = dir_.path() + "/out";
  ASSERT_EQ(mkdir(out.c_str(), 0777), 0);
  ASSERT_EQ(chmod(out.c_str(), 0777), 0);
  StartDaemon("", {"--ssd-capacity", "24MiB"});
  auto train = [&](const std::string& name, bool as_nobody) {
    const std::vector<std::string> argv = TrainArgs(
        as_nobody ? bin_ + "/train_client" : Runfile("tests/train_client"),
        daemon_->socket(), name, out);
    return RunCommand(as_nobody ? AsNobody(argv) : argv);
  };
  // Each trains, then waits for its data plane to close (its set-aside
  // given back): the job's id.
  auto trained_job = [&](const std::string& name, bool as_nobody) {
    RunResult trained = train(name, as_nobody);
    EXPECT_EQ(trained.exit_code, 0) << trained.out << trained.err;
    auto jobs = root_->ListJobs();  // root sees every job
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    std::string id;
    for (const v1::Job& job : jobs.ok() ? *jobs : std::vector<v1::Job>{}) {
      if (job.spec().name() == name) id = job.id();
    }
    EXPECT_TRUE(PlaneClosed([&] { return daemon_->Log(); }, id))
        << daemon_->Log();
    return id;
  };
  const std::string nobodys_old = trained_job("nobodys-old", true);
  const std::string roots_old = trained_job("roots-old", false);
  ASSERT_FALSE(roots_old.empty() || nobodys_old.empty());

  RunResult nobodys = train("nobodys-new", true);
  EXPECT_EQ(nobodys.exit_code, 1) << nobodys.out << nobodys.err;
  EXPECT_THAT(nobodys.out, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(nobodys.out, HasSubstr("the SSD array is full"));
  EXPECT_THAT(nobodys.out,
              ContainsRegex("; uid 65534's jobs that no process is attached "
                            "to hold [0-9.]+ MiB: " +
                            nobodys_old +
                            " 'nobodys-old' [0-9.]+ MiB; delete "
                            "those no longer needed \\('lohanctl jobs "
                            "delete ID'"));
  EXPECT_THAT(nobodys.out, Not(HasSubstr(roots_old)));
  EXPECT_THAT(nobodys.out, Not(HasSubstr("roots-old")));

  RunResult roots = train("roots-new", false);
  EXPECT_EQ(roots.exit_code, 1) << roots.out << roots.err;
  EXPECT_THAT(roots.out, HasSubstr("the SSD array is full"));
  EXPECT_THAT(roots.out,
              ContainsRegex("; uid 0's jobs that no process is "
                            "attached to hold [0-9.]+ MiB: " +
                            roots_old + " 'roots-old' [0-9.]+ MiB;"));
  EXPECT_THAT(roots.out, Not(HasSubstr(nobodys_old)));
  EXPECT_THAT(roots.out, Not(HasSubstr("nobodys-old")));

  // Nobody cannot pin or unpin root's job: it does not exist for them,
  // and root's job stays as it was.
  for (const char* off : {"", "--off"}) {
    std::vector<std::string> argv = {bin_ + "/lohanctl", "--socket",
                                     daemon_->socket(), "jobs", "keep"};
    if (*off != '\0') argv.push_back(off);
    argv.push_back(roots_old);
    RunResult pinned = RunCommand(AsNobody(argv));
    EXPECT_EQ(pinned.exit_code, 1) << pinned.out << pinned.err;
    EXPECT_THAT(pinned.err, HasSubstr("no job '" + roots_old + "'"));
  }
  auto after = root_->ListJobs();
  ASSERT_TRUE(after.ok()) << after.status();
  for (const v1::Job& job : *after) {
    if (job.id() == roots_old) {
      EXPECT_FALSE(job.kept());
    }
  }

  // Freed as the refusal says, nobody's next job fits.
  RunResult deleted =
      RunCommand(AsNobody({bin_ + "/lohanctl", "--socket", daemon_->socket(),
                           "jobs", "delete", nobodys_old}));
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  nobodys = train("nobodys-new", true);
  EXPECT_EQ(nobodys.exit_code, 0) << nobodys.out << nobodys.err;
}

}  // namespace
}  // namespace lohan::testing
