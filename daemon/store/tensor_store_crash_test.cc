// Kills a process that writes and commits versions (crash_helper) with
// SIGKILL at random moments, many times; after each kill the store must
// reopen with every acknowledged commit intact and bit-exact, and with the
// space of uncommitted versions reclaimed.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "daemon/store/crash_helper_config.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

std::string HelperPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string base = srcdir ? srcdir : ".";
  return base + "/" + (workspace ? workspace : "lohan") +
         "/daemon/store/crash_helper";
}

// tensor -> highest version the helper reported committed.
std::map<size_t, uint64_t> ReadProgress(const std::string& path) {
  std::map<size_t, uint64_t> last;
  std::istringstream in(testing_util::ReadWholeFile(path));
  size_t t;
  uint64_t v;
  while (in >> t >> v) last[t] = std::max(last[t], v);
  return last;
}

TEST(TensorStoreCrashTest, KilledWriterNeverLosesOrTearsACommit) {
  testing_util::TempDir dir;
  const std::string state_dir = dir.path() + "/state";
  const std::string progress = dir.path() + "/progress";
  std::vector<std::string> ssds;
  for (int i = 0; i < 3; ++i)
    ssds.push_back(dir.Subdir("ssd" + std::to_string(i)));
  StoreOptions options = CrashStoreOptions(state_dir);
  options.ssd_paths = ssds;

  std::mt19937 rng(12345);
  constexpr int kKills = 20;
  uint64_t total_commits_seen = 0;
  for (int round = 0; round < kKills; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::vector<std::string> args = {HelperPath(), state_dir, progress};
      args.insert(args.end(), ssds.begin(), ssds.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const int delay_ms = std::uniform_int_distribution<int>(20, 300)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0)
        << "helper exited early with status " << status;
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    auto store = TensorStore::Open(options);
    ASSERT_TRUE(store.ok()) << "round " << round << ": " << store.status();
    const auto acknowledged = ReadProgress(progress);
    const auto& sizes = CrashTensorSizes();
    uint64_t expected_used = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const std::string name = CrashTensorName(t);
      auto info = (*store)->Stat(kCrashJob, name);
      const uint64_t acked = acknowledged.count(t) ? acknowledged.at(t) : 0;
      if (!info.ok()) {
        // Creates are durable only with a later commit.
        EXPECT_EQ(acked, 0u) << name;
        continue;
      }
      EXPECT_EQ(info->pending_version, 0u);
      // Every acknowledged commit survived; at most the one in flight at
      // the kill is newer.
      EXPECT_GE(info->committed_version, acked)
          << "round " << round << " " << name;
      if (info->committed_version == 0) continue;
      std::vector<uint8_t> back(sizes[t]);
      auto v = (*store)->Read(kCrashJob, name, absl::MakeSpan(back));
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(back, testing_util::Pattern(CrashSeed(t, *v), sizes[t]))
          << "round " << round << " " << name << " version " << *v;
      expected_used += (sizes[t] + 4095) / 4096 * 4096;
      total_commits_seen += *v;
    }
    uint64_t used = 0;
    for (const auto& d : (*store)->Stats().devices) used += d.used_bytes;
    EXPECT_EQ(used, expected_used) << "round " << round;
  }
  std::printf("sum of committed versions over %d rounds: %llu\n", kKills,
              static_cast<unsigned long long>(total_commits_seen));
  // The helper made progress across the rounds.
  EXPECT_GT(total_commits_seen, 0u);
}

}  // namespace
}  // namespace lohan
