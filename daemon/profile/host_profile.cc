#include "daemon/profile/host_profile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/config/host_check.h"
#include "daemon/optim/tuning.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/aligned_buffer.h"
#include "spdlog/spdlog.h"

namespace lohan {
namespace {

constexpr uint64_t kTransferBytes = uint64_t{1} << 20;
constexpr char kCacheFile[] = "host_profile.pb";

// One probe file on one SSD, written or read end to end with
// `queue_depth` transfers in flight (each completion submits the next).
class Probe {
 public:
  static absl::StatusOr<std::unique_ptr<Probe>> Open(
      const std::string& ssd_path, const ProfileOptions& options) {
    struct stat info;
    if (stat(ssd_path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(ssd_path,
                       " is not a directory: its SSD is not measured (the "
                       "probe file needs one)"));
    }
    auto probe = std::unique_ptr<Probe>(new Probe);
    probe->file_ = ssd_path + "/lohan.probe";
    // An empty file the device grows (fallocate) to the probe's size.
    const int created =
        open(probe->file_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (created < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create ", probe->file_, ": ", std::strerror(errno)));
    }
    close(created);
    absl::StatusOr<std::unique_ptr<AioBlockDevice>> device =
        AioBlockDevice::Open({.path = probe->file_,
                              .capacity_bytes = options.probe_bytes,
                              .block_size = options.block_size,
                              .queue_depth = options.queue_depth,
                              .allow_buffered_io = options.allow_buffered_io});
    if (!device.ok()) {
      unlink(probe->file_.c_str());
      return absl::Status(
          device.status().code(),
          absl::StrCat("probing ", ssd_path, ": ", device.status().message()));
    }
    probe->device_ = *std::move(device);
    probe->depth_ = options.queue_depth;
    // One region, a transfer's slot each, as the store's transfers land in
    // its large chunk buffers: on some hosts (a VM's) transfers into many
    // small allocations run measurably slower than into one region.
    probe->buffers_ =
        AlignedBuffer(size_t{probe->depth_} * kTransferBytes,
                      std::max<size_t>(options.block_size, kTransferBytes));
    for (uint32_t i = 0; i < probe->depth_; ++i) {
      std::memset(probe->Slot(i), 0x5a + i, kTransferBytes);
    }
    return probe;
  }

  ~Probe() {
    device_.reset();  // waits for what is in flight
    unlink(file_.c_str());
  }

  // Starts a pass over the whole file; Wait() for its end.
  void Start(IoRequest::Op op) {
    std::vector<uint64_t> offsets;
    {
      absl::MutexLock lock(&mu_);
      next_offset_ = 0;
      error_ = absl::OkStatus();
      started_ = absl::Now();
      for (uint32_t i = 0; i < depth_; ++i) {
        std::optional<uint64_t> offset = TakeOffsetLocked();
        if (!offset.has_value()) break;
        offsets.push_back(*offset);
      }
    }
    for (size_t i = 0; i < offsets.size(); ++i) {
      Submit(op, static_cast<uint32_t>(i), offsets[i]);
    }
  }

  // Seconds the pass took (a write pass includes its fdatasync).
  absl::StatusOr<double> Wait(IoRequest::Op op) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Probe* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
          return p->in_flight_ == 0 &&
                 (p->next_offset_ >= p->device_->capacity() || !p->error_.ok());
        },
        this));
    if (!error_.ok()) return error_;
    mu_.Unlock();
    absl::Status flushed =
        op == IoRequest::Op::kWrite ? device_->Flush() : absl::OkStatus();
    mu_.Lock();
    if (!flushed.ok()) return flushed;
    return absl::ToDoubleSeconds(absl::Now() - started_);
  }

  uint64_t bytes() const { return device_->capacity(); }

 private:
  Probe() = default;

  uint8_t* Slot(uint32_t slot) {
    return buffers_.data() + size_t{slot} * kTransferBytes;
  }

  // The next transfer's offset, counted in flight; none when the pass is
  // over (or failed).
  std::optional<uint64_t> TakeOffsetLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (next_offset_ >= device_->capacity() || !error_.ok()) {
      return std::nullopt;
    }
    const uint64_t offset = next_offset_;
    next_offset_ += kTransferBytes;
    ++in_flight_;
    return offset;
  }

  void Submit(IoRequest::Op op, uint32_t slot, uint64_t offset) {
    device_->Submit(
        {.op = op,
         .buffer = Slot(slot),
         .length = std::min(kTransferBytes, device_->capacity() - offset),
         .offset = offset,
         .done = [this, op, slot](const IoResult& result) {
           std::optional<uint64_t> next;
           {
             // Done and the next one taken at once: in_flight_ reaches 0
             // only when no completion will submit again.
             absl::MutexLock lock(&mu_);
             --in_flight_;
             if (!result.status.ok() && error_.ok()) error_ = result.status;
             next = TakeOffsetLocked();
           }
           if (next.has_value()) Submit(op, slot, *next);
         }});
  }

  std::string file_;
  std::unique_ptr<AioBlockDevice> device_;
  uint32_t depth_ = 1;
  AlignedBuffer buffers_;  // depth_ transfers' slots
  absl::Mutex mu_;
  uint64_t next_offset_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Time started_ ABSL_GUARDED_BY(mu_);
};

// Bytes per second of one pass of `op` over every probe at once.
absl::StatusOr<double> Pass(const std::vector<Probe*>& probes,
                            IoRequest::Op op) {
  const absl::Time start = absl::Now();
  for (Probe* probe : probes) probe->Start(op);
  uint64_t bytes = 0;
  absl::Status first;
  for (Probe* probe : probes) {
    absl::StatusOr<double> seconds = probe->Wait(op);
    if (!seconds.ok() && first.ok()) first = seconds.status();
    bytes += probe->bytes();
  }
  if (!first.ok()) return first;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return static_cast<double>(bytes) / std::max(seconds, 1e-9);
}

// Timed write and read passes over `probes` (each alone, or all at once).
constexpr int kProbeRounds = 3;

struct Speeds {
  double write = 0.0;
  double read = 0.0;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The median of kProbeRounds write and read passes, after an untimed write
// pass: a fresh probe file's first write also converts its unwritten
// extents, which the store's long-used data file no longer does, and one
// pass on a shared machine is at the mercy of whatever else ran then.
absl::StatusOr<Speeds> MeasurePasses(const std::vector<Probe*>& probes) {
  if (absl::StatusOr<double> warm = Pass(probes, IoRequest::Op::kWrite);
      !warm.ok()) {
    return warm.status();
  }
  std::vector<double> writes, reads;
  for (int round = 0; round < kProbeRounds; ++round) {
    absl::StatusOr<double> write = Pass(probes, IoRequest::Op::kWrite);
    if (!write.ok()) return write.status();
    absl::StatusOr<double> read = Pass(probes, IoRequest::Op::kRead);
    if (!read.ok()) return read.status();
    writes.push_back(*write);
    reads.push_back(*read);
  }
  return Speeds{.write = Median(writes), .read = Median(reads)};
}

absl::Status MeasureSsds(const ProfileOptions& options,
                         v1::HostProfile& profile) {
  std::vector<std::unique_ptr<Probe>> probes;
  for (const std::string& path : options.ssd_paths) {
    absl::StatusOr<std::unique_ptr<Probe>> probe = Probe::Open(path, options);
    if (!probe.ok()) return probe.status();
    probes.push_back(*std::move(probe));
  }
  std::vector<Probe*> all;
  for (size_t i = 0; i < probes.size(); ++i) {
    v1::SsdProfile* ssd = profile.add_ssds();
    ssd->set_path(options.ssd_paths[i]);
    absl::StatusOr<Speeds> speeds = MeasurePasses({probes[i].get()});
    if (!speeds.ok()) return speeds.status();
    ssd->set_write_bytes_per_second(speeds->write);
    ssd->set_read_bytes_per_second(speeds->read);
    all.push_back(probes[i].get());
  }
  if (all.size() == 1) {
    profile.set_array_read_bytes_per_second(
        profile.ssds(0).read_bytes_per_second());
    profile.set_array_write_bytes_per_second(
        profile.ssds(0).write_bytes_per_second());
    return absl::OkStatus();
  }
  absl::StatusOr<Speeds> speeds = MeasurePasses(all);
  if (!speeds.ok()) return speeds.status();
  profile.set_array_write_bytes_per_second(speeds->write);
  profile.set_array_read_bytes_per_second(speeds->read);
  return absl::OkStatus();
}

// The best of a few rounds (the least disturbed by other work).
template <typename Work>
double BestSeconds(int rounds, Work work) {
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const absl::Time start = absl::Now();
    work();
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
  }
  return std::max(best, 1e-9);
}

double MeasureMemcpy() {
  constexpr size_t kBytes = size_t{64} << 20;
  AlignedBuffer from(kBytes, 4096), to(kBytes, 4096);
  std::memset(from.data(), 1, kBytes);
  const double seconds =
      BestSeconds(3, [&] { std::memcpy(to.data(), from.data(), kBytes); });
  return static_cast<double>(kBytes) / seconds;
}

absl::StatusOr<double> MeasureOptimizer(const AdamUpdater& updater) {
  constexpr size_t kParameters = size_t{4} << 20;
  std::vector<float> weight(kParameters, 0.5f), m(kParameters), v(kParameters);
  std::vector<uint16_t> grad(kParameters, 0x3c00);  // bf16 1/128
  const AdamUpdater one = updater.OnCallingThread();
  AdamTensor tensor{.size = kParameters,
                    .weight = weight.data(),
                    .exp_avg = m.data(),
                    .exp_avg_sq = v.data()};
  absl::Status failed;
  const double seconds = BestSeconds(3, [&] {
    absl::StatusOr<StepStats> stats =
        one.Step(AdamOptions{}, tensor,
                 {.data = grad.data(), .dtype = DType::kBFloat16});
    if (!stats.ok()) failed = stats.status();
  });
  if (!failed.ok()) return failed;
  return static_cast<double>(kParameters) / seconds;
}

}  // namespace

std::string ProfileKey(const ProfileOptions& options) {
  return absl::StrCat(
      "ssds=", absl::StrJoin(options.ssd_paths, ","),
      ";block=", options.block_size, ";depth=", options.queue_depth,
      // The passes behind each figure (MeasurePasses): a profile measured
      // another way is measured again.
      ";probe=", options.probe_bytes, "x", kProbeRounds, "+warm", ";optimizer=",
      options.updater != nullptr ? options.updater->kernel_name() : "none", "/",
      options.updater != nullptr ? TuningName(options.updater->tuning()) : "",
      "x", options.optimizer_threads);
}

absl::StatusOr<v1::HostProfile> MeasureHost(const ProfileOptions& options) {
  v1::HostProfile profile;
  profile.set_key(ProfileKey(options));
  profile.set_probe_bytes(options.probe_bytes);
  profile.set_measured_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  profile.set_free_host_bytes(ReadHostMemory().available_bytes);
  if (options.probe_bytes > 0) {
    if (absl::Status ssds = MeasureSsds(options, profile); !ssds.ok()) {
      return ssds;
    }
  }
  profile.set_memcpy_bytes_per_second(MeasureMemcpy());
  if (options.updater != nullptr) {
    absl::StatusOr<double> optimizer = MeasureOptimizer(*options.updater);
    if (!optimizer.ok()) return optimizer.status();
    profile.set_optimizer_parameters_per_second_per_thread(*optimizer);
  }
  profile.set_optimizer_threads(options.optimizer_threads);
  return profile;
}

absl::StatusOr<v1::HostProfile> LoadOrMeasureHost(const std::string& state_dir,
                                                  const ProfileOptions& options,
                                                  bool remeasure,
                                                  bool* measured) {
  const std::string path = absl::StrCat(state_dir, "/", kCacheFile);
  *measured = false;
  // A probe a killed daemon left behind goes, measured again or not.
  for (const std::string& ssd : options.ssd_paths) {
    unlink(absl::StrCat(ssd, "/lohan.probe").c_str());
  }
  if (!remeasure) {
    std::ifstream in(path, std::ios::binary);
    v1::HostProfile cached;
    if (in && cached.ParseFromIstream(&in) &&
        cached.key() == ProfileKey(options)) {
      return cached;
    }
  }
  absl::StatusOr<v1::HostProfile> profile = MeasureHost(options);
  if (!profile.ok()) return profile;
  *measured = true;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out || !profile->SerializeToOstream(&out)) {
      spdlog::warn("machine profile not cached in {}: cannot write it", path);
      return profile;
    }
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    spdlog::warn("machine profile not cached in {}: {}", path,
                 std::strerror(errno));
  }
  return profile;
}

HostProfiler::HostProfiler(std::string state_dir, ProfileOptions options,
                           bool remeasure) {
  thread_ = std::thread([this, state_dir = std::move(state_dir),
                         options = std::move(options), remeasure] {
    bool measured = false;
    absl::StatusOr<v1::HostProfile> profile =
        LoadOrMeasureHost(state_dir, options, remeasure, &measured);
    if (!profile.ok()) {
      spdlog::warn("machine profile not measured: {}",
                   std::string(profile.status().message()));
    } else {
      spdlog::info(
          "machine profile ({}): {} SSDs, {:.2f} GB/s read, {:.2f} GB/s "
          "write together; memcpy {:.1f} GB/s; optimizer {:.0f} M "
          "parameters/s per thread x {}",
          measured ? "measured" : "as measured before", profile->ssds_size(),
          profile->array_read_bytes_per_second() / 1e9,
          profile->array_write_bytes_per_second() / 1e9,
          profile->memcpy_bytes_per_second() / 1e9,
          profile->optimizer_parameters_per_second_per_thread() / 1e6,
          profile->optimizer_threads());
    }
    absl::MutexLock lock(&mu_);
    if (profile.ok()) profile_ = *std::move(profile);
    done_ = true;
  });
}

HostProfiler::~HostProfiler() {
  if (thread_.joinable()) thread_.join();
}

std::optional<v1::HostProfile> HostProfiler::Get() const {
  absl::MutexLock lock(&mu_);
  return profile_;
}

void HostProfiler::Wait() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

}  // namespace lohan
