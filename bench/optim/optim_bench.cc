// Optimizer throughput against the memory-bandwidth bound.
//
// Measures, in one run: memcpy bandwidth (1 and 2 threads, counted as bytes
// read + bytes written), then AdamW steps on one large tensor with bf16
// gradients in, fp32 weight and moments updated in place and a bf16 weight
// copy out (28 bytes of traffic per parameter), for each thread count, and
// prints parameters per second beside the bound = memcpy bandwidth / 28.
// The same with bf16 moments (20 bytes per parameter).
//
// Usage: optim_bench [--params=N] [--repeats=R] [--isa=avx512|avx2|scalar]
//                    [--calibrate [--small-pages]]
// --calibrate: instead, lohand's kernel calibration (calibration.h) on 1
// and 2 threads, printing every candidate tuning's rate.
// torch.optim.AdamW(fused=True) on the same sizes: bench/optim/optim_bench.py.

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/calibration.h"
#include "daemon/optim/half.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/worker_pool.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;

// Page-aligned, pre-faulted buffer.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    madvise(p, bytes, MADV_HUGEPAGE);
    data_ = static_cast<char*>(p);
    std::memset(data_, 0, bytes);
  }
  ~Buffer() { munmap(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  char* data_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// memcpy bandwidth in bytes/s, read + write, with `threads` threads each
// copying its share.
double MemcpyBandwidth(Buffer& src, Buffer& dst, int threads, int repeats) {
  std::vector<double> secs;
  const std::size_t share = src.bytes() / threads;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::memcpy(dst.as<char>() + t * share, src.as<char>() + t * share,
                    share);
      });
    }
    for (std::thread& w : workers) w.join();
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) secs.push_back(s);  // the first is a warm-up
  }
  return 2.0 * static_cast<double>(share * threads) / Median(secs);
}

struct Result {
  double params_per_s;
  double bytes_per_param;
};

Result TimeAdam(std::size_t n, int threads, std::optional<Isa> isa,
                DType moments, int repeats) {
  const std::size_t msize = DTypeSize(moments);
  Buffer w(n * 4), m(n * msize), v(n * msize), g(n * 2), out(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    w.as<float>()[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
    g.as<uint16_t>()[i] = FloatToBf16(1e-3f * static_cast<float>(i % 77));
  }
  auto pool = WorkerPool::Create({threads, true});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    std::exit(1);
  }
  auto updater = AdamUpdater::Create(pool->get(), isa);
  if (!updater.ok()) {
    std::fprintf(stderr, "%s\n", updater.status().ToString().c_str());
    std::exit(1);
  }
  AdamTensor t;
  t.size = n;
  t.weight = w.as<float>();
  t.exp_avg = m.as<void>();
  t.exp_avg_sq = v.as<void>();
  t.moment_dtype = moments;
  AdamOptions o;
  o.weight_decay = 0.01;
  const GradientView grad{g.as<void>(), DType::kBFloat16, 1.0f};
  const HalfOutput half{out.as<void>(), DType::kBFloat16};
  std::vector<double> secs;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto start = Clock::now();
    auto st = updater->Step(o, t, grad, half);
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
      std::exit(1);
    }
    if (r > 0) secs.push_back(s);
  }
  return Result{static_cast<double>(n) / Median(secs),
                static_cast<double>(2 + 4 * 2 + msize * 4 + 2)};
}

// Runs the calibration on 1 and 2 threads and prints each candidate: every
// vector path unless --isa forces one.
int Calibrate(std::optional<Isa> isa, int rounds, bool huge_pages) {
  std::printf("last-level cache %zu MiB; %s pages\n",
              LastLevelCacheBytes() >> 20, huge_pages ? "huge" : "4 KiB");
  for (int threads : {1, 2}) {
    auto pool = WorkerPool::Create({threads, true});
    if (!pool.ok()) return 1;
    CalibrationOptions options;
    options.rounds = rounds;
    options.huge_pages = huge_pages;
    const auto start = Clock::now();
    absl::StatusOr<Calibration> c =
        CalibrateAdam(pool->get(), CalibrationIsas(isa), options);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 1;
    }
    const double took =
        std::chrono::duration<double>(Clock::now() - start).count();
    std::printf(
        "%d thread(s): %zu M parameters a step, %.1f s; chosen %s %s "
        "(%.3fx the default)\n",
        threads, c->parameters_per_step >> 20, took,
        std::string(IsaName(c->isa)).c_str(), TuningName(c->tuning).c_str(),
        c->speedup_over_default);
    std::printf("  %-41s %14s %14s\n", "path, tuning", "fp32 Mp/s",
                "bf16+copy Mp/s");
    const double n = static_cast<double>(c->parameters_per_step);
    for (const TuningTime& t : c->measured) {
      const bool chosen = t.isa == c->isa && t.tuning == c->tuning;
      std::printf("  %-6s %-34s %14.1f %14.1f%s\n",
                  std::string(IsaName(t.isa)).c_str(),
                  TuningName(t.tuning).c_str(), n / t.fp32_seconds / 1e6,
                  n / t.bf16_seconds / 1e6, chosen ? "  <" : "");
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::size_t n = std::size_t{64} << 20;
  int repeats = 7;
  std::optional<Isa> isa;
  bool calibrate = false, huge_pages = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--calibrate") {
      calibrate = true;
    } else if (arg == "--small-pages") {
      huge_pages = false;
    } else if (absl::StartsWith(arg, "--params=")) {
      if (!absl::SimpleAtoi(arg.substr(9), &n) || n == 0) return 2;
    } else if (absl::StartsWith(arg, "--repeats=")) {
      if (!absl::SimpleAtoi(arg.substr(10), &repeats) || repeats < 1) return 2;
    } else if (absl::StartsWith(arg, "--isa=")) {
      auto parsed = ParseIsa(arg.substr(6));
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
        return 2;
      }
      isa = *parsed;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--params=N] [--repeats=R] [--isa=NAME] "
                   "[--calibrate [--small-pages]]\n",
                   argv[0]);
      return 2;
    }
  }
  if (calibrate) return Calibrate(isa, repeats, huge_pages);
  auto resolved = ResolveIsa(isa);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s\n", resolved.status().ToString().c_str());
    return 1;
  }
  std::printf("params %zu (%.1f M), repeats %d (median), isa %s%s\n", n,
              n / 1048576.0, repeats, std::string(IsaName(*resolved)).c_str(),
              *resolved == Isa::kAvx512 && CpuSupportsAvx512Bf16()
                  ? " (+avx512_bf16)"
                  : "");
  double bandwidth[3] = {0, 0, 0};
  {
    Buffer src(std::size_t{1} << 30), dst(std::size_t{1} << 30);
    for (int threads : {1, 2}) {
      bandwidth[threads] = MemcpyBandwidth(src, dst, threads, repeats);
      std::printf("memcpy %d thread(s): %.2f GB/s (read + write)\n", threads,
                  bandwidth[threads] / 1e9);
    }
  }
  std::printf("%-28s %7s %12s %12s %9s\n", "case", "threads", "Mparams/s",
              "bound", "ours/bound");
  for (DType moments : {DType::kFloat32, DType::kBFloat16}) {
    for (int threads : {1, 2}) {
      const Result r = TimeAdam(n, threads, *resolved, moments, repeats);
      const double bound = bandwidth[threads] / r.bytes_per_param;
      std::printf("%-28s %7d %12.1f %12.1f %9.2f\n",
                  moments == DType::kFloat32 ? "adamw bf16 grad, fp32 m/v"
                                             : "adamw bf16 grad, bf16 m/v",
                  threads, r.params_per_s / 1e6, bound / 1e6,
                  r.params_per_s / bound);
    }
  }
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) { return lohan::Main(argc, argv); }
