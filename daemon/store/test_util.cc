#include "daemon/store/test_util.h"

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "daemon/common/check.h"

namespace lohan {
namespace testing_util {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ =
      std::string(base && *base ? base : "/tmp") + "/lohan_store_XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  LOHAN_CHECK(::mkdtemp(buf.data()) != nullptr);
  path_ = buf.data();
}

TempDir::TempDir(TempDir&& other) noexcept
    : path_(std::exchange(other.path_, "")) {}

TempDir::~TempDir() {
  if (path_.empty()) return;
  ::nftw(
      path_.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        return ::remove(p);
      },
      16, FTW_DEPTH | FTW_PHYS);
}

std::string TempDir::Subdir(const std::string& name) const {
  std::string p = path_ + "/" + name;
  LOHAN_CHECK(::mkdir(p.c_str(), 0700) == 0 || errno == EEXIST);
  return p;
}

void FillPattern(uint64_t seed, uint8_t* data, size_t size) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  size_t i = 0;
  while (i < size) {
    // splitmix64
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const size_t n = size - i < 8 ? size - i : 8;
    std::memcpy(data + i, &z, n);
    i += n;
  }
}

std::vector<uint8_t> Pattern(uint64_t seed, size_t size) {
  std::vector<uint8_t> v(size);
  FillPattern(seed, v.data(), size);
  return v;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteWholeFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

}  // namespace testing_util
}  // namespace lohan
