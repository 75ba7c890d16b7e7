#include "daemon/store/record_log.h"

#include <fcntl.h>
#include <unistd.h>

#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing_util::TempDir;

TEST(RecordLogTest, MissingFileIsEmpty) {
  TempDir dir;
  auto c = RecordLog::Read(dir.path() + "/log");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->records.empty());
  EXPECT_FALSE(c->torn_tail);
}

TEST(RecordLogTest, RewriteAppendAndReadBack) {
  TempDir dir;
  const std::string path = dir.path() + "/log";
  auto log = RecordLog::Rewrite(path, {"a", std::string(1000, 'b')});
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Append("third").ok());
  ASSERT_TRUE((*log)->Append("").ok());
  ASSERT_TRUE((*log)->Sync().ok());
  auto c = RecordLog::Read(path);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->records.size(), 4u);
  EXPECT_EQ(c->records[0], "a");
  EXPECT_EQ(c->records[1], std::string(1000, 'b'));
  EXPECT_EQ(c->records[2], "third");
  EXPECT_EQ(c->records[3], "");
  EXPECT_FALSE(c->torn_tail);
  EXPECT_EQ(::access((path + ".tmp").c_str(), F_OK), -1);
}

TEST(RecordLogTest, TornTailIsIgnoredAtEveryCutPoint) {
  TempDir dir;
  const std::string path = dir.path() + "/log";
  {
    auto log = RecordLog::Rewrite(path, {"first", "second"});
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append("third record").ok());
  }
  const std::string full = testing_util::ReadWholeFile(path);
  const size_t two = 8 + 5 + 8 + 6;
  for (size_t cut = two; cut < full.size(); ++cut) {
    {
      auto log = RecordLog::Rewrite(path, {"first", "second"});
      ASSERT_TRUE(log.ok());
      ASSERT_TRUE((*log)->Append("third record").ok());
    }
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    auto c = RecordLog::Read(path);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->records.size(), 2u) << cut;
    EXPECT_EQ(c->torn_tail, cut != two) << cut;
    EXPECT_EQ(c->valid_bytes, two);
  }
}

TEST(RecordLogTest, ZeroFilledTailIsNotARecord) {
  TempDir dir;
  const std::string path = dir.path() + "/log";
  ASSERT_TRUE(RecordLog::Rewrite(path, {"one"}).ok());
  ASSERT_EQ(::truncate(path.c_str(), 8 + 3 + 4096), 0);
  auto c = RecordLog::Read(path);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->records.size(), 1u);
  EXPECT_TRUE(c->torn_tail);
}

TEST(RecordLogTest, CorruptRecordEndsTheLog) {
  TempDir dir;
  const std::string path = dir.path() + "/log";
  ASSERT_TRUE(RecordLog::Rewrite(path, {"one", "two", "three"}).ok());
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char x = 'X';
  ASSERT_EQ(::pwrite(fd, &x, 1, 8 + 3 + 8), 1);  // First byte of "two".
  ::close(fd);
  auto c = RecordLog::Read(path);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->records.size(), 1u);
  EXPECT_TRUE(c->torn_tail);
}

}  // namespace
}  // namespace lohan
