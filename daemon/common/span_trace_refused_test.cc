// LOHAN_TRACE naming a file that exists, or a link: lohand (root) writes
// nothing through it and records no spans. Its own binary: the trace file
// is chosen at the process's first span.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/common/span_trace.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SpanTraceRefusedTest, ALinkInThePlaceOfTheTraceFileIsNotFollowed) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(dir != nullptr ? dir : "/tmp") + "/";
  const std::string victim = base + "victim";
  std::ofstream(victim) << "keep me\n";
  const std::string prefix = base + "spans";
  const std::string trace = prefix + "." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), trace.c_str()), 0);
  ASSERT_EQ(::setenv("LOHAN_TRACE", prefix.c_str(), 1), 0);

  EXPECT_FALSE(SpanTraceOn());
  RecordSpan("write", 1.0, 2.0, 3);
  FlushSpans();
  EXPECT_EQ(Contents(victim), "keep me\n");
  struct stat link;
  ASSERT_EQ(::lstat(trace.c_str(), &link), 0);
  EXPECT_TRUE(S_ISLNK(link.st_mode));  // left as it was
}

}  // namespace
}  // namespace lohan
