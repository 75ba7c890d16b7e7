// crc_bench: CRC32C (what the store checks on every extent it reads and
// computes on every extent it writes) against memcpy of the same buffer,
// one core, interleaved round by round; also the portable table version.
// Not a test: prints a table.
//
// Usage: crc_bench [--bytes=1MiB] [--repeat=2000] [--rounds=3]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/store/crc32c.h"
#include "layout/byte_size.h"

namespace lohan {
namespace {

struct Flags {
  uint64_t bytes = uint64_t{1} << 20;
  int repeat = 2000;
  int rounds = 3;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool ok = false;
    if (arg.rfind("--bytes=", 0) == 0) {
      absl::StatusOr<uint64_t> v = ParseByteSize(arg.substr(8));
      ok = v.ok() && *v > 0;
      if (ok) f.bytes = *v;
    } else if (arg.rfind("--repeat=", 0) == 0) {
      ok = absl::SimpleAtoi(arg.substr(9), &f.repeat) && f.repeat > 0;
    } else if (arg.rfind("--rounds=", 0) == 0) {
      ok = absl::SimpleAtoi(arg.substr(9), &f.rounds) && f.rounds > 0;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "crc_bench: bad argument '%s' (--bytes=SIZE, --repeat=N, "
                   "--rounds=N, each positive)\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  return f;
}

// GB/s of `repeat` calls of `op` over the buffer.
template <typename Op>
double Rate(const Flags& f, Op op) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < f.repeat; ++i) op();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return static_cast<double>(f.bytes) * f.repeat / seconds / 1e9;
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  std::vector<uint8_t> source(f.bytes), dest(f.bytes);
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  uint32_t sink = 0;  // keeps the CRCs from being optimized away
  std::vector<double> crc, memcpy_rate, table;
  for (int r = 0; r < f.rounds; ++r) {
    memcpy_rate.push_back(Rate(f, [&] {
      std::memcpy(dest.data(), source.data(), f.bytes);
      sink ^= dest[sink % f.bytes];
    }));
    crc.push_back(Rate(f, [&] { sink ^= Crc32c(source.data(), f.bytes); }));
    // The table version is ~20x slower: a tenth of the calls.
    Flags fewer = f;
    fewer.repeat = std::max(1, f.repeat / 10);
    table.push_back(Rate(fewer, [&] {
      sink ^= Crc32cExtendPortable(0, source.data(), f.bytes);
    }));
    std::printf(
        "round %d: crc32c %.2f GB/s, memcpy %.2f GB/s (%.2fx), "
        "table %.2f GB/s\n",
        r + 1, crc.back(), memcpy_rate.back(), crc.back() / memcpy_rate.back(),
        table.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "crc32c on %s, %s: median %.2f GB/s, %.2fx memcpy's %.2f GB/s; table "
      "%.2f GB/s (sink %u)\n",
      FormatByteSize(f.bytes).c_str(),
      Crc32cIsHardwareAccelerated() ? "SSE4.2" : "table only", median(crc),
      median(crc) / median(memcpy_rate), median(memcpy_rate), median(table),
      sink);
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) { return lohan::Main(argc, argv); }
