// A save is all or nothing: killed at any of its durable steps it leaves
// the previous checkpoint or the new one, whole; a switch interrupted
// between its two renames (a filesystem without rename exchange) says
// where the previous checkpoint is.
#include "client/checkpoint/checkpoint_save.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "client/checkpoint/checkpoint_reader.h"
#include "client/checkpoint/manifest.h"
#include "client/checkpoint/save_directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr int kLayers = 3;
constexpr uint64_t kElements = 5;

// Three layers of two tensors each; every element of part k is value + k.
absl::Status Save(const fs::path& directory, float value, uint64_t iteration) {
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save =
      CheckpointSave::Begin(directory.string());
  if (!save.ok()) return save.status();
  v1::CheckpointContents contents;
  contents.set_iteration(iteration);
  for (const char* part : {"weights", "exp_avg", "exp_avg_sq"}) {
    contents.add_parts(part);
  }
  for (int l = 0; l < kLayers; ++l) {
    v1::CheckpointLayer* layer = contents.add_layers();
    layer->set_elements(kElements);
    v1::CheckpointTensor* weight = layer->add_tensors();
    weight->set_name("l" + std::to_string(l) + ".w");
    weight->add_shape(4);
    v1::CheckpointTensor* bias = layer->add_tensors();
    bias->set_name("l" + std::to_string(l) + ".b");
    bias->add_shape(1);
    bias->set_offset(4);
  }
  if (absl::Status opened = (*save)->Open(contents); !opened.ok())
    return opened;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (int p = 0; p < contents.parts_size(); ++p) {
      const std::vector<float> flat(kElements, value + p);
      if (absl::Status written = (*save)->writer()->Write(
              l, contents.parts(p), flat.data(), kElements);
          !written.ok()) {
        return written;
      }
    }
  }
  if (absl::Status closed = (*save)->CloseFiles().status(); !closed.ok()) {
    return closed;
  }
  return (*save)->Commit("{\"iteration\": " + std::to_string(iteration) + "}",
                         {});
}

// The (iteration, value) the checkpoint holds; every tensor of every part
// must agree (value + part), else the test fails.
std::pair<uint64_t, float> Contents(const fs::path& directory) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(directory.string(), /*verify=*/true);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {0, -1};
  float value = -1;
  const std::vector<std::string> parts = {"weights", "exp_avg", "exp_avg_sq"};
  for (const auto& [name, shape] : (*reader)->Parameters()) {
    for (size_t p = 0; p < parts.size(); ++p) {
      std::vector<float> data(Elements(shape));
      EXPECT_TRUE(
          (*reader)->Read(name, parts[p], data.data(), data.size()).ok());
      for (float x : data) {
        if (value < 0) value = x - p;
        EXPECT_EQ(x, value + p) << name << " " << parts[p];
      }
    }
  }
  return {(*reader)->iteration(), value};
}

class CheckpointSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lohan-checkpoint-save-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    target_ = root_ / "ckpt";
  }
  void TearDown() override {
    SetSaveFaultsForTesting({});
    fs::remove_all(root_);
  }

  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(root_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  fs::path root_;
  fs::path target_;
};

// Forks a child that saves (value 2, iteration 20) over the checkpoint and
// SIGKILLs itself before its kill_at-th durable step; returns how many
// steps a whole save takes when kill_at is past them all (0 when killed).
int KilledSave(const fs::path& target, int kill_at) {
  int out[2];
  EXPECT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    int steps = 0;
    SetSaveFaultsForTesting({[&] {
      if (++steps == kill_at) ::kill(::getpid(), SIGKILL);
    }});
    const bool saved = Save(target, 2.0f, 20).ok();
    const std::string total = saved ? std::to_string(steps) : "failed";
    (void)!::write(out[1], total.data(), total.size());
    ::_exit(0);
  }
  ::close(out[1]);
  char text[32] = {};
  const ssize_t got = ::read(out[0], text, sizeof(text) - 1);
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (got <= 0) {
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    return 0;
  }
  EXPECT_STRNE(text, "failed");
  return std::atoi(text);
}

TEST_F(CheckpointSaveTest, ASaveKilledAtAnyStepLeavesOneWholeCheckpoint) {
  ASSERT_TRUE(Save(target_, 1.0f, 10).ok());
  const int total = KilledSave(target_, 0);  // counts the steps
  // Every tensor of two files, their fsyncs, lohan.json, the switch.
  ASSERT_GT(total, 2 * kLayers * 3);
  int old_seen = 0, new_seen = 0;
  for (int kill_at = 1; kill_at <= total; ++kill_at) {
    ASSERT_TRUE(Save(target_, 1.0f, 10).ok());
    EXPECT_EQ(KilledSave(target_, kill_at), 0) << kill_at;
    const std::pair<uint64_t, float> found = Contents(target_);
    if (found == std::make_pair<uint64_t, float>(10, 1.0f)) {
      ++old_seen;
    } else {
      EXPECT_EQ(found, (std::make_pair<uint64_t, float>(20, 2.0f))) << kill_at;
      ++new_seen;
    }
  }
  // Killed before its switch: the previous one; after: the new one.
  EXPECT_GT(old_seen, 0);
  EXPECT_GT(new_seen, 0);
  std::printf(
      "save killed at each of its %d steps: previous checkpoint %d "
      "times, new %d, mixed or torn 0\n",
      total, old_seen, new_seen);
  // The next save clears what the killed ones left beside it.
  ASSERT_TRUE(Save(target_, 3.0f, 30).ok());
  EXPECT_EQ(Entries(), std::vector<std::string>{"ckpt"});
}

TEST_F(CheckpointSaveTest, AnInterruptedTwoRenameSwitchNamesThePrevious) {
  ASSERT_TRUE(Save(target_, 1.0f, 10).ok());
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The switch's steps: sync staging, switch, (first rename), second
    // rename: killed just before the second.
    int steps = 0, total = 0;
    SetSaveFaultsForTesting({[&] { ++total; }, /*no_exchange=*/true});
    (void)Save(root_ / "count", 0.0f, 0);  // a first save: one rename only
    SetSaveFaultsForTesting({[&] {
                               if (++steps == total) {
                                 ::kill(::getpid(), SIGKILL);
                               }
                             },
                             /*no_exchange=*/true});
    (void)Save(target_, 2.0f, 20);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the save was not interrupted";
  fs::remove_all(root_ / "count");
  const absl::Status missing =
      CheckpointReader::Open(target_.string(), false).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()),
              MatchesRegex(".*previous checkpoint is whole in .*\\.ckpt\\."
                           "lohan-old-.* \\(rename it to ckpt\\)"));
  fs::path old;
  for (const auto& entry : fs::directory_iterator(root_)) {
    if (entry.path().filename().string().rfind(".ckpt.lohan-old-", 0) == 0) {
      old = entry.path();
    }
  }
  ASSERT_FALSE(old.empty());
  fs::rename(old, target_);
  EXPECT_EQ(Contents(target_), (std::make_pair<uint64_t, float>(10, 1.0f)));
  SetSaveFaultsForTesting({nullptr, /*no_exchange=*/true});
  ASSERT_TRUE(Save(target_, 3.0f, 30).ok());  // the two renames complete
  EXPECT_EQ(Contents(target_), (std::make_pair<uint64_t, float>(30, 3.0f)));
  EXPECT_EQ(Entries(), std::vector<std::string>{"ckpt"});
}

}  // namespace
}  // namespace lohan::checkpoint
