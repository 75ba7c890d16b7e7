#ifndef LOHAN_DAEMON_STORE_TEST_UTIL_H_
#define LOHAN_DAEMON_STORE_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lohan {
namespace testing_util {

// A fresh directory under $TEST_TMPDIR (or /tmp), removed with its contents
// on destruction. Move-only.
class TempDir {
 public:
  TempDir();
  TempDir(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }
  // Creates and returns `<path>/<name>`.
  std::string Subdir(const std::string& name) const;

 private:
  std::string path_;
};

// Deterministic bytes from (seed, index): the crash test and its helper
// agree on content without talking.
void FillPattern(uint64_t seed, uint8_t* data, size_t size);
std::vector<uint8_t> Pattern(uint64_t seed, size_t size);

// The whole content of a file (empty on error).
std::string ReadWholeFile(const std::string& path);
// Replaces the file's content with `data` (a test's files: errors show as
// the next read's).
void WriteWholeFile(const std::string& path, const std::string& data);

}  // namespace testing_util
}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_TEST_UTIL_H_
