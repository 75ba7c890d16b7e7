#include "daemon/metrics/textfile_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

class TextfileWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string templ =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/textfile-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    path_ = dir_ + "/lohan.prom";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Contents(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static bool Exists(const std::string& path) {
    struct stat info {};
    return lstat(path.c_str(), &info) == 0;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(TextfileWriterTest, WritesTheWholeTextReadableByAnyone) {
  const mode_t old_umask = umask(077);
  ASSERT_TRUE(TextfileWriter::WriteAtomically(path_, "a 1\n").ok());
  umask(old_umask);
  EXPECT_EQ(Contents(path_), "a 1\n");
  struct stat info {};
  ASSERT_EQ(stat(path_.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);
  EXPECT_FALSE(Exists(path_ + ".tmp"));
  ASSERT_TRUE(TextfileWriter::WriteAtomically(path_, "b 2\n").ok());
  EXPECT_EQ(Contents(path_), "b 2\n");
}

TEST_F(TextfileWriterTest, NeverWritesThroughASymlink) {
  const std::string target = dir_ + "/target";
  std::ofstream(target) << "precious\n";
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  ASSERT_EQ(symlink(target.c_str(), (path_ + ".tmp").c_str()), 0);
  ASSERT_TRUE(TextfileWriter::WriteAtomically(path_, "a 1\n").ok());
  EXPECT_EQ(Contents(target), "precious\n");
  EXPECT_EQ(Contents(path_), "a 1\n");
  struct stat info {};
  ASSERT_EQ(lstat(path_.c_str(), &info), 0);
  EXPECT_TRUE(S_ISREG(info.st_mode));
}

TEST_F(TextfileWriterTest, AMissingDirectoryFailsTheStart) {
  auto writer =
      TextfileWriter::Start({.path = dir_ + "/missing/lohan.prom",
                             .interval = absl::Seconds(1),
                             .render = [] { return std::string("a 1\n"); }});
  ASSERT_FALSE(writer.ok());
  EXPECT_THAT(std::string(writer.status().message()),
              HasSubstr(dir_ + "/missing/lohan.prom.tmp"));
}

TEST_F(TextfileWriterTest, RewritesEveryIntervalAndStopsAtOnce) {
  std::atomic<int> renders{0};
  auto writer = TextfileWriter::Start(
      {.path = path_, .interval = absl::Milliseconds(20), .render = [&renders] {
         return absl::StrCat("lohan_renders ", ++renders, "\n");
       }});
  ASSERT_TRUE(writer.ok()) << writer.status();
  // Written before Start returns.
  EXPECT_EQ(Contents(path_), "lohan_renders 1\n");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (renders.load() < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(renders.load(), 4);
  (*writer)->Stop();
  EXPECT_FALSE(Exists(path_));  // a stopped daemon exports nothing
  EXPECT_FALSE(Exists(path_ + ".tmp"));
  const int after_stop = renders.load();
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_EQ(renders.load(), after_stop);
  (*writer)->Stop();  // idempotent
}

TEST_F(TextfileWriterTest, StopDoesNotWaitOutALongInterval) {
  auto writer = TextfileWriter::Start(
      {.path = path_, .interval = absl::Hours(1), .render = [] {
         return std::string("a 1\n");
       }});
  ASSERT_TRUE(writer.ok()) << writer.status();
  const absl::Time start = absl::Now();
  writer->reset();  // the destructor stops and joins
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(Exists(path_));
}

TEST_F(TextfileWriterTest, AFailedWriteIsRetriedAtTheNextInterval) {
  const std::string sub = dir_ + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0755), 0);
  const std::string path = sub + "/lohan.prom";
  std::atomic<int> renders{0};
  auto writer = TextfileWriter::Start(
      {.path = path, .interval = absl::Milliseconds(20), .render = [&renders] {
         return absl::StrCat("lohan_renders ", ++renders, "\n");
       }});
  ASSERT_TRUE(writer.ok()) << writer.status();
  // The directory goes away (writes fail), then comes back.
  std::filesystem::remove_all(sub);
  const int before = renders.load();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (renders.load() < before + 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_FALSE(Exists(path));
  ASSERT_EQ(mkdir(sub.c_str(), 0755), 0);
  while (!Exists(path) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(Exists(path));
}

}  // namespace
}  // namespace lohan
