#include "daemon/profile/optimizer_kernel.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace lohan {
namespace {

constexpr char kCacheFile[] = "optimizer_calibration.pb";

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view view = line;
    if (absl::ConsumePrefix(&view, "model name")) {
      const std::size_t colon = view.find(':');
      if (colon != absl::string_view::npos) {
        return std::string(absl::StripAsciiWhitespace(view.substr(colon + 1)));
      }
    }
  }
  return "unknown";
}

v1::OptimizerCalibration ToRecord(const Calibration& c, const std::string& key,
                                  double seconds_taken) {
  v1::OptimizerCalibration record;
  record.set_key(key);
  record.set_isa(std::string(IsaName(c.isa)));
  record.set_tuning(TuningName(c.tuning));
  record.set_speedup_over_default(c.speedup_over_default);
  record.set_parameters_per_step(c.parameters_per_step);
  record.set_measured_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  record.set_seconds_taken(seconds_taken);
  const double n = static_cast<double>(c.parameters_per_step);
  for (const TuningTime& t : c.measured) {
    v1::CalibrationCandidate* candidate = record.add_candidates();
    candidate->set_isa(std::string(IsaName(t.isa)));
    candidate->set_tuning(TuningName(t.tuning));
    candidate->set_fp32_parameters_per_second(n / t.fp32_seconds);
    candidate->set_bf16_parameters_per_second(n / t.bf16_seconds);
  }
  return record;
}

// The choice a record holds, if it is whole and this CPU can run it.
std::optional<KernelChoice> FromRecord(const v1::OptimizerCalibration& record,
                                       const char* source) {
  absl::StatusOr<Isa> isa = ParseIsa(record.isa());
  absl::StatusOr<KernelTuning> tuning = ParseTuning(record.tuning());
  if (!isa.ok() || !tuning.ok() || !CpuSupportsIsa(*isa)) return std::nullopt;
  return KernelChoice{*isa, *tuning, source, record};
}

std::optional<KernelChoice> LoadCached(const std::string& path,
                                       const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  v1::OptimizerCalibration cached;
  if (!in || !cached.ParseFromIstream(&in) || cached.key() != key) {
    return std::nullopt;
  }
  return FromRecord(cached, "calibrated earlier");
}

void Cache(const std::string& path, const v1::OptimizerCalibration& record) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out || !record.SerializeToOstream(&out)) {
      spdlog::warn(
          "optimizer calibration not cached in {}: cannot write it; it is "
          "timed again at the next start",
          path);
      return;
    }
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    spdlog::warn("optimizer calibration not cached in {}: {}", path,
                 std::strerror(errno));
  }
}

absl::StatusOr<KernelChoice> Calibrated(WorkerPool* pool,
                                        const KernelChoiceOptions& options,
                                        const KernelChoice& fallback) {
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  const std::string key = CalibrationKey(threads, options.forced_isa);
  const std::string path = absl::StrCat(options.state_dir, "/", kCacheFile);
  if (!options.recalibrate) {
    if (std::optional<KernelChoice> cached = LoadCached(path, key)) {
      return *cached;
    }
  }
  spdlog::info(
      "timing the optimizer kernels on {} thread{} to choose the fastest "
      "(once per machine, a few seconds; cached in {})",
      threads, threads == 1 ? "" : "s", path);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Calibration> calibration = CalibrateAdam(
      pool, CalibrationIsas(options.forced_isa), options.calibration);
  if (!calibration.ok()) {
    spdlog::warn(
        "optimizer calibration failed ({}); running the default tuning {} "
        "(set [optimizer] tuning to skip the calibration)",
        calibration.status().ToString(), TuningName(fallback.tuning));
    return fallback;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const v1::OptimizerCalibration record = ToRecord(*calibration, key, seconds);
  Cache(path, record);
  return KernelChoice{calibration->isa, calibration->tuning, "calibrated",
                      record};
}

}  // namespace

std::string CalibrationKey(int threads, std::optional<Isa> forced_isa) {
  std::vector<std::string> isas;
  for (Isa isa : CalibrationIsas(std::nullopt)) {
    isas.push_back(std::string(IsaName(isa)));
  }
  if (CpuSupportsAvx512Bf16()) isas.push_back("avx512_bf16");
  std::vector<std::string> candidates;
  for (const KernelTuning& t : CandidateTunings(threads)) {
    candidates.push_back(TuningName(t));
  }
  return absl::StrCat("cpu=", CpuModel(), ";isas=", absl::StrJoin(isas, ","),
                      ";threads=", threads, ";forced=",
                      forced_isa.has_value() ? IsaName(*forced_isa) : "none",
                      ";candidates=", absl::StrJoin(candidates, "|"));
}

absl::StatusOr<KernelChoice> ChooseOptimizerKernel(
    WorkerPool* pool, const KernelChoiceOptions& options) {
  const Isa isa = options.forced_isa.value_or(BestIsa());
  if (options.tuning == "default") {
    return KernelChoice{isa, KernelTuning{}, "default", std::nullopt};
  }
  if (options.tuning != "auto") {
    absl::StatusOr<KernelTuning> tuning = ParseTuning(options.tuning);
    if (!tuning.ok()) return tuning.status();
    return KernelChoice{isa, *tuning, "configured", std::nullopt};
  }
  return Calibrated(pool, options,
                    KernelChoice{isa, KernelTuning{}, "default", std::nullopt});
}

}  // namespace lohan
