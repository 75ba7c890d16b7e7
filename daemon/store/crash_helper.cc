// Test helper for tensor_store_crash_test: opens a store and writes and
// commits versions of a few tensors forever, until killed. Content is
// Pattern(CrashSeed(tensor, version)), so a verifier needs no other input.
// After each commit returns it appends "<tensor> <version>\n" to the
// progress file (page cache is enough: the test kills, not the power).
//
// Usage: crash_helper <state_dir> <progress_file> <ssd_path>...

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/store/crash_helper_config.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"

namespace lohan {
namespace {

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "crash_helper: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Run(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s state_dir progress_file ssd_path...\n",
                 argv[0]);
    return 2;
  }
  StoreOptions options = CrashStoreOptions(argv[1]);
  for (int i = 3; i < argc; ++i) options.ssd_paths.push_back(argv[i]);
  int progress = ::open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (progress < 0) return 1;

  auto store = TensorStore::Open(options);
  if (!store.ok()) return Fail(store.status(), "open");
  const auto& sizes = CrashTensorSizes();
  for (size_t t = 0; t < sizes.size(); ++t) {
    absl::Status s = (*store)->Create(kCrashJob, CrashTensorName(t), sizes[t]);
    if (!s.ok() && s.code() != absl::StatusCode::kAlreadyExists) {
      return Fail(s, "create");
    }
  }
  for (uint64_t round = 0;; ++round) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      const std::string name = CrashTensorName(t);
      auto info = (*store)->Stat(kCrashJob, name);
      if (!info.ok()) return Fail(info.status(), "stat");
      const uint64_t v = info->next_version;
      auto data = testing_util::Pattern(CrashSeed(t, v), sizes[t]);
      auto written = (*store)->Write(kCrashJob, name, data);
      if (!written.ok()) return Fail(written.status(), "write");
      if (*written != v) {
        std::fprintf(stderr, "crash_helper: expected version %llu, got %llu\n",
                     static_cast<unsigned long long>(v),
                     static_cast<unsigned long long>(*written));
        return 1;
      }
      if ((round + t) % 5 == 4) {
        // Leave this one uncommitted or roll it back: its space must come
        // back either way.
        if (round % 2 == 0) {
          absl::Status s = (*store)->Rollback(kCrashJob, name);
          if (!s.ok()) return Fail(s, "rollback");
        }
        continue;
      }
      absl::Status s = (*store)->Commit(kCrashJob, name);
      if (!s.ok()) return Fail(s, "commit");
      const std::string line = absl::StrCat(t, " ", v, "\n");
      if (::write(progress, line.data(), line.size()) !=
          static_cast<ssize_t>(line.size())) {
        return 1;
      }
    }
  }
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) { return lohan::Run(argc, argv); }
