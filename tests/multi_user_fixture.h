#ifndef LOHAN_TESTS_MULTI_USER_FIXTURE_H_
#define LOHAN_TESTS_MULTI_USER_FIXTURE_H_

// A shared lohand with root's job training and a second user (`nobody`,
// through setpriv) against it: the fixture of multi_user_test and
// fair_share_users_test.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/dumped_weights.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {

inline const std::vector<uint64_t> kLayers = {1000, 5000, 333};

class MultiUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as nobody";
    // nobody cannot reach Bazel's output tree: the attacker's binary goes
    // into the public test directory.
    bin_ = dir_.path() + "/bin";
    ASSERT_EQ(mkdir(bin_.c_str(), 0755), 0);
    ASSERT_NE(CopyForOtherUsers("tests/hostile_client", bin_), "");
  }

  // `flags`: lohand's, after the harness's own (the last of a flag wins).
  void StartDaemon(const std::string& config_toml = "",
                   std::vector<std::string> flags = {}) {
    std::vector<std::string> extra = std::move(flags);
    if (!config_toml.empty()) {
      const std::string path = dir_.path() + "/lohand.toml";
      std::ofstream(path) << config_toml;
      extra.insert(extra.end(), {"--config", path});
    }
    auto daemon = DaemonProcess::Start(dir_.path(), extra);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    root_ = *std::move(client);
  }

  std::vector<std::string> Nobody(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {bin_ + "/hostile_client"};
    argv.insert(argv.end(), args.begin(), args.end());
    return AsNobody(argv);
  }

  // Root's job: trains `iterations` of the synthetic model, pausing after
  // the first two (data plane open, model registered) until Resume().
  void StartVictim(int iterations = 4) {
    auto victim = BackgroundProcess::Start(
        {Runfile("tests/train_client"), "--socket", daemon_->socket(), "--job",
         "victim", "--layers", "1000,5000,333", "--iterations",
         std::to_string(iterations), "--pause-after", "2", "--resume-file",
         dir_.path() + "/go", "--out", dir_.path() + "/weights"});
    ASSERT_TRUE(victim.ok()) << victim.status();
    victim_ = *std::move(victim);
    ASSERT_TRUE(WaitForFile(dir_.path() + "/go.paused"));
  }

  // Lets the victim finish; it must exit cleanly with exact weights.
  void ResumeAndCheckVictim(int iterations = 4) {
    std::ofstream(dir_.path() + "/go") << "go\n";
    EXPECT_EQ(victim_->Stop(0), 0) << daemon_->Log();
    const absl::Status exact =
        CheckDumpedWeights(dir_.path() + "/weights",
                           {.layers = kLayers, .iterations = iterations});
    EXPECT_TRUE(exact.ok()) << exact;
  }

  static bool WaitForFile(const std::string& path) {
    for (int i = 0; i < 12000; ++i) {
      if (access(path.c_str(), F_OK) == 0) return true;
      usleep(10 * 1000);
    }
    return false;
  }

  v1::Job VictimJob() {
    auto jobs = root_->ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    for (const v1::Job& job : *jobs) {
      if (job.spec().name() == "victim") return job;
    }
    ADD_FAILURE() << "no victim job";
    return {};
  }

  // Root's new job "next" (a one-layer model registered, its data plane
  // held open): the first line it says.
  std::string RootsNewJobSays() {
    auto job = BackgroundProcess::Start(
        {bin_ + "/hostile_client", "register-hold", daemon_->socket(), "next"});
    if (!job.ok()) return std::string(job.status().message());
    const std::string said = (*job)->first_line();
    roots_jobs_.push_back(*std::move(job));
    return said;
  }

  // Nobody opens data planes (a one-layer model registered in each) until
  // one is refused, at most `most`: the planes, and the refusal's text.
  std::string OpenNobodysPlanesUntilRefused(
      int most, std::vector<std::unique_ptr<BackgroundProcess>>& planes) {
    for (int i = 0; i < most; ++i) {
      auto plane = BackgroundProcess::Start(Nobody(
          {"register-hold", daemon_->socket(), absl::StrCat("plane-", i)}));
      // A refused one says so and ends (perhaps before the harness looks).
      const std::string said = plane.ok()
                                   ? (*plane)->first_line()
                                   : std::string(plane.status().message());
      if (!plane.ok() || said.find("registered") != 0) return said;
      planes.push_back(*std::move(plane));
    }
    return "";
  }

  // The leading number of `text` after `prefix` ("stored 123 bytes" -> 123).
  static uint64_t NumberAfter(const std::string& text,
                              const std::string& prefix) {
    const size_t at = text.find(prefix);
    if (at == std::string::npos) return 0;
    std::string rest = text.substr(at + prefix.size());
    rest = rest.substr(0, rest.find_first_not_of("0123456789"));
    uint64_t value = 0;
    (void)absl::SimpleAtoi(rest, &value);
    return value;
  }

  size_t LogLinesWith(const std::string& needle) {
    std::istringstream log(daemon_->Log());
    size_t count = 0;
    for (std::string line; std::getline(log, line);) {
      if (line.find(needle) != std::string::npos) ++count;
    }
    return count;
  }

  PublicTempDir dir_;
  std::string bin_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> root_;
  std::unique_ptr<BackgroundProcess> victim_;
  std::vector<std::unique_ptr<BackgroundProcess>> roots_jobs_;
};

// Root trains (its share of the array is kept for it); nobody swaps out
// activations until the daemon says no and keeps them: it gets its share
// (and what is free beyond the shares), never root's, so root's next job

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_MULTI_USER_FIXTURE_H_
