#include "daemon/common/span_trace.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lohan {
namespace {

// The file the spans of this process go to (LOHAN_TRACE set before the
// first span is recorded, as lohand's environment would have it).
std::string TracePath() {
  static const std::string prefix = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string p = std::string(dir != nullptr ? dir : "/tmp") + "/spans";
    ::setenv("LOHAN_TRACE", p.c_str(), 1);
    return p;
  }();
  return prefix + "." + std::to_string(::getpid());
}

std::vector<std::string> Lines() {
  std::ifstream in(TracePath());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(SpanTraceTest, SpansFromEveryThreadReachTheFileOnFlush) {
  const std::string path = TracePath();
  ASSERT_TRUE(SpanTraceOn());
  RecordSpan("read", 1.5, 2.25, 3, 4, 5);
  { SpanScope scope("write", 7); }
  std::thread other([] { RecordSpan("begin", 9.0, 9.0, 0); });
  other.join();
  EXPECT_TRUE(Lines().empty());  // buffered until flushed
  FlushSpans();
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 3u);
  std::istringstream read(lines[0]);
  std::string name;
  double start, end;
  long thread;
  int64_t a, b, c;
  read >> name >> start >> end >> thread >> a >> b >> c;
  EXPECT_EQ(name, "read");
  EXPECT_EQ(start, 1.5);
  EXPECT_EQ(end, 2.25);
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 4);
  EXPECT_EQ(c, 5);
  std::istringstream write(lines[1]);
  long write_thread;
  write >> name >> start >> end >> write_thread >> a;
  EXPECT_EQ(name, "write");
  EXPECT_LE(start, end);
  EXPECT_EQ(a, 7);
  std::istringstream begin(lines[2]);
  long begin_thread;
  begin >> name >> start >> end >> begin_thread;
  EXPECT_EQ(name, "begin");
  EXPECT_EQ(write_thread, thread);
  EXPECT_NE(begin_thread, thread);  // the other thread's own id
}

}  // namespace
}  // namespace lohan
