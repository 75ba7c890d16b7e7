// store_bench: our libaio engine (AioBlockDevice) against fio's libaio
// engine on the same files, same request size and queue depth, interleaved
// (an untimed warm-up pass, then ours, fio, ours, fio...), sequential write
// then sequential read, then both at once (a read stream over the first
// half of each file beside a write stream over the second, as an update
// pipeline reads one chunk while it writes the one before), for 1 path and
// for all paths at once. The mixed pass is also put against the serial sum
// (the same bytes read, then written, at this round's speeds). Also times
// the whole TensorStore (CRC32C, striping, fdatasync at commit) on the same
// array. Not a test: prints a table.
//
// Usage:
//   store_bench --paths=/mnt/a,/mnt/b,/mnt/c [--file_size=1GiB]
//       [--block_size=1MiB] [--queue_depth=32] [--rounds=3] [--fio=fio]
// Each path is a directory; the bench uses <dir>/lohan.data (created and
// preallocated if missing) and state dirs <first path>/bench_state_<n>.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/tensor_store.h"
#include "layout/byte_size.h"

namespace lohan {
namespace {

struct Flags {
  std::vector<std::string> paths;
  uint64_t file_size = 1ull << 30;
  uint64_t block_size = 1 << 20;
  uint32_t queue_depth = 32;
  int rounds = 3;
  std::string fio = "fio";
};

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "store_bench: %s\n", message.c_str());
  std::exit(1);
}

// One device's share of a pass: completion-driven, as fio's loop is. The
// first queue_depth requests are submitted up front, one per buffer; each
// completion submits the next block (in increasing offset order) from its
// callback, reusing its buffer. So at most queue_depth requests and
// queue_depth x block_size bytes of buffers are in use: fio's iodepth x bs.
// A pass covers the blocks from `first_block` on, `blocks` of them (all:
// the whole file).
class DevicePass {
 public:
  DevicePass(AioBlockDevice* device, AlignedBuffer* buffers, const Flags& f,
             IoRequest::Op op, uint64_t first_block = 0, uint64_t blocks = 0)
      : device_(device),
        buffers_(buffers),
        op_(op),
        block_(f.block_size),
        first_block_(first_block),
        requests_(blocks > 0 ? blocks : f.file_size / f.block_size) {}

  void Start() {
    for (size_t at = 0; at < buffers_->size(); at += block_) {
      Issue(buffers_->data() + at);
    }
  }
  // Returns the number of failed requests.
  uint64_t Wait() {
    mu_.LockWhen(absl::Condition(this, &DevicePass::Finished));
    mu_.Unlock();
    return failed_.load();
  }

 private:
  bool Finished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return completed_ == requests_;
  }
  void Issue(uint8_t* buffer) {
    const uint64_t index = next_.fetch_add(1);
    if (index >= requests_) return;
    IoRequest rq;
    rq.op = op_;
    rq.buffer = buffer;
    rq.length = block_;
    rq.offset = (first_block_ + index) * block_;
    rq.done = [this, buffer](const IoResult& r) {
      if (!r.status.ok()) failed_++;
      Issue(buffer);
      absl::MutexLock lock(&mu_);
      ++completed_;
    };
    device_->Submit(std::move(rq));
  }

  AioBlockDevice* const device_;
  AlignedBuffer* const buffers_;
  const IoRequest::Op op_;
  const uint64_t block_;
  const uint64_t first_block_;
  const uint64_t requests_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> failed_{0};
  absl::Mutex mu_;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Starts every pass at once; the seconds until the last is done.
double RunPasses(std::vector<std::unique_ptr<DevicePass>>& passes) {
  const double start = Now();
  for (auto& p : passes) p->Start();
  uint64_t failed = 0;
  for (auto& p : passes) failed += p->Wait();
  const double seconds = Now() - start;
  if (failed > 0) Die(absl::StrCat(failed, " requests failed"));
  return seconds;
}

// Sequential pass over every device at once with our engine; GB/s.
double OursPass(std::vector<std::unique_ptr<AioBlockDevice>>& devices,
                std::vector<AlignedBuffer>& all_buffers, const Flags& f,
                IoRequest::Op op) {
  std::vector<std::unique_ptr<DevicePass>> passes;
  for (size_t d = 0; d < devices.size(); ++d) {
    passes.push_back(
        std::make_unique<DevicePass>(devices[d].get(), &all_buffers[d], f, op));
  }
  const double seconds = RunPasses(passes);
  return devices.size() * f.file_size / seconds / 1e9;
}

// Mixed: per device a read stream over the first half of its blocks and a
// write stream over the second, each at the queue depth with buffers of
// its own, all at once; GB/s of both together.
double OursMixedPass(std::vector<std::unique_ptr<AioBlockDevice>>& devices,
                     std::vector<AlignedBuffer>& read_buffers,
                     std::vector<AlignedBuffer>& write_buffers,
                     const Flags& f) {
  const uint64_t half = f.file_size / f.block_size / 2;
  std::vector<std::unique_ptr<DevicePass>> passes;
  for (size_t d = 0; d < devices.size(); ++d) {
    passes.push_back(std::make_unique<DevicePass>(
        devices[d].get(), &read_buffers[d], f, IoRequest::Op::kRead, 0, half));
    passes.push_back(
        std::make_unique<DevicePass>(devices[d].get(), &write_buffers[d], f,
                                     IoRequest::Op::kWrite, half, half));
  }
  const double seconds = RunPasses(passes);
  return devices.size() * 2 * half * f.block_size / seconds / 1e9;
}

// What fio does: a sequential read or write pass over each file, or
// (mixed) both at once as OursMixedPass does them.
enum class FioMode { kRead, kWrite, kMixed };

// Runs fio on the same files: one job per file and stream, each at the
// queue depth. Returns fio's own aggregate bandwidth (bw_bytes of reads
// and writes, group_reporting), GB/s.
double FioPass(const std::vector<std::string>& files, const Flags& f,
               FioMode mode) {
  std::vector<std::string> args = {
      f.fio,
      "--output-format=json",
      "--ioengine=libaio",
      "--direct=1",
      absl::StrCat("--bs=", f.block_size),
      absl::StrCat("--iodepth=", f.queue_depth),
      "--group_reporting",
  };
  const uint64_t half = f.file_size / f.block_size / 2 * f.block_size;
  for (size_t i = 0; i < files.size(); ++i) {
    if (mode != FioMode::kMixed) {
      args.push_back(absl::StrCat("--name=dev", i));
      args.push_back("--filename=" + files[i]);
      args.push_back(mode == FioMode::kRead ? "--rw=read" : "--rw=write");
      args.push_back(absl::StrCat("--size=", f.file_size));
      continue;
    }
    for (const bool read : {true, false}) {
      args.push_back(absl::StrCat("--name=dev", i, read ? "r" : "w"));
      args.push_back("--filename=" + files[i]);
      args.push_back(read ? "--rw=read" : "--rw=write");
      args.push_back(absl::StrCat("--offset=", read ? 0 : half));
      args.push_back(absl::StrCat("--size=", half));
    }
  }
  int out[2];
  if (::pipe(out) != 0) Die("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string json;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof(buf))) > 0) json.append(buf, n);
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("fio failed: " + absl::StrJoin(args, " "));
  }
  uint64_t bw = 0;
  for (const char* rw : {"read", "write"}) {
    const size_t section = json.find(absl::StrCat("\"", rw, "\" : {"));
    const size_t key = json.find("\"bw_bytes\" : ", section);
    if (section == std::string::npos || key == std::string::npos) {
      Die("cannot parse fio output");
    }
    bw += std::strtoull(json.c_str() + key + 13, nullptr, 10);
  }
  return bw / 1e9;
}

struct Figures {
  std::vector<double> ours_w, fio_w, ours_r, fio_r, ours_m, fio_m;
};

// Median of the per-round ratios ours/fio: robust to one noisy round.
double MedianRatio(const std::vector<double>& ours,
                   const std::vector<double>& fio) {
  std::vector<double> r;
  for (size_t i = 0; i < ours.size(); ++i) r.push_back(ours[i] / fio[i]);
  std::sort(r.begin(), r.end());
  const size_t n = r.size();
  return n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

void RunEngineVsFio(const Flags& f, size_t npaths) {
  std::vector<std::unique_ptr<AioBlockDevice>> devices;
  std::vector<std::string> files;
  for (size_t i = 0; i < npaths; ++i) {
    AioDeviceOptions o;
    o.path = f.paths[i];
    o.capacity_bytes = f.file_size;
    o.queue_depth = f.queue_depth;
    auto d = AioBlockDevice::Open(o);
    if (!d.ok()) Die(d.status().ToString());
    files.push_back((*d)->file_path());
    devices.push_back(*std::move(d));
  }
  // Per device and stream one region of queue_depth x block_size, as fio
  // allocates (the mixed pass's write stream has the second).
  std::vector<AlignedBuffer> buffers, write_buffers;
  for (size_t d = 0; d < 2 * npaths; ++d) {
    auto& set = d < npaths ? buffers : write_buffers;
    set.emplace_back(size_t{f.queue_depth} * f.block_size, 4096);
    std::memset(set.back().data(), 0x5A, set.back().size());
  }
  // Per direction: one untimed pass (for writes it also turns fallocate's
  // unwritten extents into written ones), then ours, fio, ours, fio... so
  // every timed pass follows a pass of the same kind over the same blocks
  // (the host and device caches see the same history for both sides).
  Figures fig;
  for (IoRequest::Op op : {IoRequest::Op::kWrite, IoRequest::Op::kRead}) {
    const bool write = op == IoRequest::Op::kWrite;
    const FioMode mode = write ? FioMode::kWrite : FioMode::kRead;
    FioPass(files, f, mode);
    auto& ours = write ? fig.ours_w : fig.ours_r;
    auto& fio = write ? fig.fio_w : fig.fio_r;
    for (int r = 0; r < f.rounds; ++r) {
      ours.push_back(OursPass(devices, buffers, f, op));
      fio.push_back(FioPass(files, f, mode));
      std::printf("  %s round %d: ours %.3f GB/s, fio %.3f GB/s\n",
                  write ? "write" : "read ", r + 1, ours.back(), fio.back());
    }
  }
  // Reads beside writes, each round right after the read rounds' history.
  for (int r = 0; r < f.rounds; ++r) {
    fig.ours_m.push_back(OursMixedPass(devices, buffers, write_buffers, f));
    fig.fio_m.push_back(FioPass(files, f, FioMode::kMixed));
    std::printf("  mixed round %d: ours %.3f GB/s, fio %.3f GB/s\n", r + 1,
                fig.ours_m.back(), fig.fio_m.back());
  }
  std::printf(
      "paths=%zu bs=%s qd=%u size/path=%s\n"
      "  WRITE ours %.3f GB/s fio %.3f GB/s ratio of means %.3f, median "
      "per-round ratio %.3f\n"
      "  READ  ours %.3f GB/s fio %.3f GB/s ratio of means %.3f, median "
      "per-round ratio %.3f\n",
      npaths, FormatByteSize(f.block_size).c_str(), f.queue_depth,
      FormatByteSize(f.file_size).c_str(), Mean(fig.ours_w), Mean(fig.fio_w),
      Mean(fig.ours_w) / Mean(fig.fio_w), MedianRatio(fig.ours_w, fig.fio_w),
      Mean(fig.ours_r), Mean(fig.fio_r), Mean(fig.ours_r) / Mean(fig.fio_r),
      MedianRatio(fig.ours_r, fig.fio_r));
  // The serial sum moves the same bytes, half read then half written, at
  // the mean read and write speeds: 2 / (1/read + 1/write).
  auto serial = [](double read, double write) {
    return 2.0 / (1.0 / read + 1.0 / write);
  };
  const double ours_serial = serial(Mean(fig.ours_r), Mean(fig.ours_w));
  const double fio_serial = serial(Mean(fig.fio_r), Mean(fig.fio_w));
  std::printf(
      "  MIXED ours %.3f GB/s fio %.3f GB/s ratio of means %.3f, median "
      "per-round ratio %.3f; time against the serial sum: ours %.3f "
      "(%.3f GB/s serial), fio %.3f (%.3f GB/s serial)\n",
      Mean(fig.ours_m), Mean(fig.fio_m), Mean(fig.ours_m) / Mean(fig.fio_m),
      MedianRatio(fig.ours_m, fig.fio_m), ours_serial / Mean(fig.ours_m),
      ours_serial, fio_serial / Mean(fig.fio_m), fio_serial);
  std::fflush(stdout);
}

// Whole-store figures: one tensor of half the array, written+committed
// (CRC32C, striping, fdatasync) and read back (CRC check).
void RunStore(const Flags& f, size_t npaths) {
  StoreOptions o;
  o.ssd_paths.assign(f.paths.begin(), f.paths.begin() + npaths);
  o.state_dir = absl::StrCat(f.paths[0], "/bench_state_", npaths);
  o.stripe_unit = f.block_size;
  o.queue_depth = f.queue_depth;
  o.device_capacity_bytes = f.file_size;
  auto store = TensorStore::Open(o);
  if (!store.ok()) Die(store.status().ToString());
  const uint64_t bytes = npaths * f.file_size / 2 / f.block_size * f.block_size;
  (void)(*store)->Delete("bench", "t");
  if (auto s = (*store)->Create("bench", "t", bytes); !s.ok())
    Die(s.ToString());
  AlignedBuffer data(bytes, 4096);
  for (uint64_t i = 0; i < bytes; i += 4096) data.data()[i] = uint8_t(i >> 12);
  std::vector<double> w, r;
  for (int round = 0; round < f.rounds; ++round) {
    double start = Now();
    auto v =
        (*store)->Write("bench", "t", absl::MakeConstSpan(data.data(), bytes));
    if (!v.ok()) Die(v.status().ToString());
    if (auto s = (*store)->Commit("bench", "t"); !s.ok()) Die(s.ToString());
    w.push_back(bytes / (Now() - start) / 1e9);
    start = Now();
    auto got = (*store)->Read("bench", "t", absl::MakeSpan(data.data(), bytes));
    if (!got.ok()) Die(got.status().ToString());
    r.push_back(bytes / (Now() - start) / 1e9);
  }
  (void)(*store)->Delete("bench", "t");
  std::printf(
      "TensorStore paths=%zu tensor=%s stripe=%s qd=%u | write+commit %.3f "
      "GB/s | read+verify %.3f GB/s\n",
      npaths, FormatByteSize(bytes).c_str(),
      FormatByteSize(f.block_size).c_str(), f.queue_depth, Mean(w), Mean(r));
  std::fflush(stdout);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) Die("bad " + arg);
    std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    auto size = [&] {
      auto s = ParseByteSize(value);
      if (!s.ok()) Die(s.status().ToString());
      return *s;
    };
    if (key == "paths") {
      f.paths = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (key == "file_size") {
      f.file_size = size();
    } else if (key == "block_size") {
      f.block_size = size();
    } else if (key == "queue_depth") {
      if (!absl::SimpleAtoi(value, &f.queue_depth)) Die("bad " + arg);
    } else if (key == "rounds") {
      if (!absl::SimpleAtoi(value, &f.rounds)) Die("bad " + arg);
    } else if (key == "fio") {
      f.fio = value;
    } else {
      Die("unknown flag " + arg);
    }
  }
  if (f.paths.empty()) Die("--paths=dir1[,dir2...] is required");
  if (f.block_size % 4096 != 0 || f.file_size % f.block_size != 0) {
    Die("block_size must be a multiple of 4096 dividing file_size");
  }
  return f;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  lohan::Flags f = lohan::ParseFlags(argc, argv);
  std::printf(
      "store_bench: %zu path(s), file %s per path, bs %s, qd %u, %d "
      "rounds, interleaved ours/fio\n",
      f.paths.size(), lohan::FormatByteSize(f.file_size).c_str(),
      lohan::FormatByteSize(f.block_size).c_str(), f.queue_depth, f.rounds);
  lohan::RunEngineVsFio(f, 1);
  if (f.paths.size() > 1) lohan::RunEngineVsFio(f, f.paths.size());
  lohan::RunStore(f, 1);
  if (f.paths.size() > 1) lohan::RunStore(f, f.paths.size());
  return 0;
}
