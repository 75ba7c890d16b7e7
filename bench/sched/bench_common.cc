#include "bench/sched/bench_common.h"

#include <ftw.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace sched_bench {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}

}  // namespace

void RemoveTree(const std::string& path) {
  ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t TotalParams(const Flags& flags) { return flags.params * flags.layers; }

std::string g_root;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "sched_bench: %s\n", message.c_str());
  if (!g_root.empty()) {
    RemoveTree(g_root);
  }
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

}  // namespace sched_bench
}  // namespace lohan
