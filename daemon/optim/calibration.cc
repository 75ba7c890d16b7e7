#include "daemon/optim/calibration.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/optim/adam.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kMinWorkingSet = 256 * kMiB;
constexpr std::size_t kMaxWorkingSet = 2048 * kMiB;

// An anonymous private mapping, touched so its pages exist before timing.
class Mapping {
 public:
  static absl::StatusOr<Mapping> Create(std::size_t bytes, bool huge_pages) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "optimizer calibration: cannot map ", bytes / kMiB,
          " MiB of buffers (", std::strerror(errno),
          "); set lohand's [optimizer] tuning to skip the timing"));
    }
    if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
    return Mapping(static_cast<char*>(p), bytes);
  }
  Mapping(Mapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  Mapping& operator=(Mapping&&) = delete;
  Mapping(const Mapping&) = delete;
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  char* data() const { return data_; }

 private:
  Mapping(char* data, std::size_t bytes) : data_(data), bytes_(bytes) {}
  char* data_;
  std::size_t bytes_;
};

// One tensor's buffers inside a mapping: fp32 weight, moments and
// gradient, a bf16 gradient and a bf16 copy (20 bytes per parameter).
struct TensorSet {
  AdamTensor tensor;
  float* grad32;
  uint16_t* grad16;
  uint16_t* copy16;
};

constexpr std::size_t kBytesPerParameter = 20;

TensorSet CarveSet(char* base, std::size_t n) {
  auto* w = reinterpret_cast<float*>(base);
  auto* m = w + n;
  auto* v = m + n;
  auto* g32 = v + n;
  auto* g16 = reinterpret_cast<uint16_t*>(g32 + n);
  auto* out = g16 + n;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = 0.5f;
    g32[i] = 1e-3f;
    g16[i] = 0x3a83;  // bf16 ~1e-3
  }
  TensorSet set;
  set.tensor.size = n;
  set.tensor.weight = w;
  set.tensor.exp_avg = m;
  set.tensor.exp_avg_sq = v;
  set.grad32 = g32;
  set.grad16 = g16;
  set.copy16 = out;
  return set;
}

absl::Status CheckOptions(const CalibrationOptions& options) {
  if (options.tensor_parameters < 1024 ||
      options.tensor_parameters > (std::size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer calibration: tensor_parameters must be in "
                     "[1024, 2^30], got ",
                     options.tensor_parameters));
  }
  if (options.rounds < 1 || options.rounds > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer calibration: rounds must be in [1, 100], got ",
                     options.rounds));
  }
  for (const KernelTuning& t : options.candidates) {
    if (t.chunks_per_task < 1 || t.prefetch_elements > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer calibration: bad candidate ", TuningName(t),
                       " (chunks >= 1, prefetch <= 2^20 elements)"));
    }
  }
  return absl::OkStatus();
}

std::size_t WorkingSetBytes(const CalibrationOptions& options) {
  if (options.working_set_bytes != 0) return options.working_set_bytes;
  const std::size_t llc = LastLevelCacheBytes();
  if (llc == 0) return kMinWorkingSet;
  return std::clamp(2 * llc, kMinWorkingSet, kMaxWorkingSet);
}

// The sets in turn, so every step finds its tensor out of the cache.
class Rotation {
 public:
  explicit Rotation(std::vector<TensorSet> sets) : sets_(std::move(sets)) {}

  // Seconds of one step of the next set: fp32 gradient (no copy), or bf16
  // gradient with the bf16 copy.
  absl::StatusOr<double> TimeStep(const AdamUpdater& updater, bool bf16) {
    TensorSet& set = sets_[next_];
    next_ = (next_ + 1) % sets_.size();
    AdamOptions options;
    options.weight_decay = 0.01;
    const GradientView grad =
        bf16 ? GradientView{set.grad16, DType::kBFloat16, 1.0f}
             : GradientView{set.grad32, DType::kFloat32, 1.0f};
    const HalfOutput copy =
        bf16 ? HalfOutput{set.copy16, DType::kBFloat16} : HalfOutput{};
    const auto start = Clock::now();
    absl::StatusOr<StepStats> stats =
        updater.Step(options, set.tensor, grad, copy);
    if (!stats.ok()) return stats.status();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  std::vector<TensorSet> sets_;
  std::size_t next_ = 0;
};

// Step times per candidate and case. A candidate's figure is its fastest
// step: on a shared machine, interference only ever slows a step down.
class Samples {
 public:
  static constexpr std::size_t kFinalists = 3;  // besides the default

  explicit Samples(std::size_t candidates)
      : fp32_(candidates), bf16_(candidates) {}

  // `rounds` rounds, each one step per case of every candidate in `which`,
  // in an order rotated every round.
  absl::Status Time(Rotation& rotation,
                    const std::vector<AdamUpdater>& updaters,
                    const std::vector<std::size_t>& which, int rounds) {
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t j = 0; j < which.size(); ++j) {
        const std::size_t c =
            which[(j + static_cast<std::size_t>(round)) % which.size()];
        for (bool bf16 : {false, true}) {
          absl::StatusOr<double> s = rotation.TimeStep(updaters[c], bf16);
          if (!s.ok()) return s.status();
          (bf16 ? bf16_ : fp32_)[c].push_back(*s);
        }
      }
    }
    return absl::OkStatus();
  }

  double Best(std::size_t c, bool bf16) const {
    const std::vector<double>& v = (bf16 ? bf16_ : fp32_)[c];
    return *std::min_element(v.begin(), v.end());
  }

  // Candidate 0 (the default) and the kFinalists fastest others.
  std::vector<std::size_t> Finalists() const {
    std::vector<std::size_t> order;
    for (std::size_t c = 1; c < fp32_.size(); ++c) order.push_back(c);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return Best(a, false) + Best(a, true) < Best(b, false) + Best(b, true);
    });
    order.resize(std::min(order.size(), kFinalists));
    order.insert(order.begin(), 0);
    return order;
  }

 private:
  std::vector<std::vector<double>> fp32_, bf16_;
};

}  // namespace

std::vector<KernelTuning> CandidateTunings(int threads) {
  std::vector<KernelTuning> candidates = {KernelTuning{}};
  const std::vector<std::size_t> runs = threads > 1
                                            ? std::vector<std::size_t>{1, 16}
                                            : std::vector<std::size_t>{1};
  for (std::size_t prefetch : {0, 256, 1024, 4096}) {
    for (bool stream : {true, false}) {
      for (std::size_t chunks : runs) {
        const KernelTuning t{prefetch, stream, chunks};
        if (!(t == KernelTuning{})) candidates.push_back(t);
      }
    }
  }
  return candidates;
}

std::vector<Isa> CalibrationIsas(std::optional<Isa> forced) {
  if (forced.has_value()) return {*forced};
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (CpuSupportsIsa(isa)) isas.push_back(isa);
  }
  if (isas.empty()) isas.push_back(Isa::kScalar);
  return isas;
}

absl::StatusOr<Calibration> CalibrateAdam(WorkerPool* pool,
                                          const std::vector<Isa>& isas,
                                          const CalibrationOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (isas.empty()) {
    return absl::InvalidArgumentError("optimizer calibration: no ISA to time");
  }
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  const std::vector<KernelTuning> tunings = options.candidates.empty()
                                                ? CandidateTunings(threads)
                                                : options.candidates;
  // Candidate 0 is what runs uncalibrated: the first ISA, KernelTuning{}.
  std::vector<TuningTime> candidates;
  std::vector<AdamUpdater> updaters;
  for (Isa isa : isas) {
    absl::StatusOr<AdamUpdater> updater = AdamUpdater::Create(pool, isa);
    if (!updater.ok()) return updater.status();
    candidates.push_back(TuningTime{isa, KernelTuning{}});
    updaters.push_back(*updater);
    for (const KernelTuning& t : tunings) {
      if (t == KernelTuning{}) continue;
      candidates.push_back(TuningTime{isa, t});
      updaters.push_back(updater->WithTuning(t));
    }
  }
  const std::size_t n = options.tensor_parameters;
  const std::size_t set_bytes = n * kBytesPerParameter;
  const std::size_t num_sets = std::max<std::size_t>(
      2, (WorkingSetBytes(options) + set_bytes - 1) / set_bytes);
  absl::StatusOr<Mapping> mapping =
      Mapping::Create(num_sets * set_bytes, options.huge_pages);
  if (!mapping.ok()) return mapping.status();
  std::vector<TensorSet> sets;
  for (std::size_t s = 0; s < num_sets; ++s) {
    sets.push_back(CarveSet(mapping->data() + s * set_bytes, n));
  }
  Rotation rotation(std::move(sets));
  // A warm-up step each: frequency, the pool's threads awake.
  std::vector<std::size_t> all(candidates.size());
  for (std::size_t c = 0; c < all.size(); ++c) all[c] = c;
  Samples samples(candidates.size());
  if (absl::Status s = samples.Time(rotation, updaters, all, 1); !s.ok()) {
    return s;
  }
  samples = Samples(candidates.size());
  // Every candidate, then the few fastest and the default again: more
  // samples where the choice is made, where a neighbour's burst would
  // otherwise decide between near-equals.
  if (absl::Status s = samples.Time(rotation, updaters, all, options.rounds);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = samples.Time(rotation, updaters, samples.Finalists(),
                                    2 * options.rounds);
      !s.ok()) {
    return s;
  }
  Calibration result;
  result.parameters_per_step = n;
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    candidates[c].fp32_seconds = samples.Best(c, false);
    candidates[c].bf16_seconds = samples.Best(c, true);
  }
  result.measured = std::move(candidates);
  const auto fastest =
      std::min_element(result.measured.begin(), result.measured.end(),
                       [](const TuningTime& a, const TuningTime& b) {
                         return a.seconds() < b.seconds();
                       });
  result.isa = fastest->isa;
  result.tuning = fastest->tuning;
  result.speedup_over_default =
      result.measured.front().seconds() / fastest->seconds();
  return result;
}

std::size_t LastLevelCacheBytes() {
  // sysfs lists the caches cpu0 sees; the highest level is the last.
  std::size_t best_level = 0, best_bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir =
        absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/");
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    std::string level_text, size_text;
    if (!(level_file >> level_text) || !(size_file >> size_text)) break;
    std::size_t level = 0, multiplier = 1;
    absl::string_view size_digits = size_text;
    if (absl::ConsumeSuffix(&size_digits, "K"))
      multiplier = 1024;
    else if (absl::ConsumeSuffix(&size_digits, "M"))
      multiplier = kMiB;
    std::size_t value = 0;
    if (!absl::SimpleAtoi(level_text, &level) ||
        !absl::SimpleAtoi(size_digits, &value)) {
      continue;
    }
    if (level >= best_level) {
      best_level = level;
      best_bytes = value * multiplier;
    }
  }
  if (best_bytes != 0) return best_bytes;
  const long sysconf_bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return sysconf_bytes > 0 ? static_cast<std::size_t>(sysconf_bytes) : 0;
}

}  // namespace lohan
