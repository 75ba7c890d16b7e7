#include "daemon/common/thread_name.h"

#include <pthread.h>

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace lohan {
namespace {

std::string NameOfThisThread() {
  char name[16] = {};
  EXPECT_EQ(pthread_getname_np(pthread_self(), name, sizeof(name)), 0);
  return name;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnlyCutToFifteenBytes) {
  const std::string before = NameOfThisThread();
  std::string inside, inside_long;
  std::thread named([&] {
    NameThisThread("lohan-read");
    inside = NameOfThisThread();
    NameThisThread("lohan-a-name-longer-than-fifteen");
    inside_long = NameOfThisThread();
  });
  named.join();
  EXPECT_EQ(inside, "lohan-read");
  EXPECT_EQ(inside_long, "lohan-a-name-lo");
  EXPECT_EQ(NameOfThisThread(), before);
}

}  // namespace
}  // namespace lohan
