#ifndef LOHAN_DAEMON_PROFILE_OPTIMIZER_KERNEL_H_
#define LOHAN_DAEMON_PROFILE_OPTIMIZER_KERNEL_H_

// Which optimizer kernel lohand runs, and how it moves memory: from its
// config, or timed on its own optimizer threads at its first start
// (daemon/optim/calibration.h) and cached in the state directory.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/optim/calibration.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/tuning.h"
#include "daemon/optim/worker_pool.h"
#include "proto/lohan.pb.h"

namespace lohan {

struct KernelChoiceOptions {
  std::string state_dir;
  // [optimizer] tuning: "auto", "default" or a tuning form.
  std::string tuning = "auto";
  // The ISA [optimizer] isa or $LOHAN_OPTIM_ISA forces (see ForcedIsa);
  // nullopt: any vector path the CPU has.
  std::optional<Isa> forced_isa;
  // Time the candidates again even when a calibration is cached.
  bool recalibrate = false;
  // What and how long to time (tests shrink it).
  CalibrationOptions calibration;
};

struct KernelChoice {
  Isa isa = Isa::kScalar;
  KernelTuning tuning;
  // As OptimizerStatus.source: "calibrated", "calibrated earlier",
  // "configured" or "default".
  std::string source;
  std::optional<v1::OptimizerCalibration> calibration;
};

// What a cached calibration must have been timed for: this CPU (model and
// vector paths), the pool's thread count, the forced ISA and the candidate
// set.
std::string CalibrationKey(int threads, std::optional<Isa> forced_isa);

// The kernel to run on `pool` (null: the calling thread). "default" and a
// tuning form run on the forced ISA or the best one; "auto" loads
// <state_dir>/optimizer_calibration.pb when its key matches, else times the
// candidates and caches the result (a failure to cache is logged). A
// calibration that fails (no memory for its buffers...) is logged and
// leaves the default: the daemon starts either way. InvalidArgument for a
// tuning that does not parse. REQUIRES: nothing else uses `pool`.
absl::StatusOr<KernelChoice> ChooseOptimizerKernel(
    WorkerPool* pool, const KernelChoiceOptions& options);

}  // namespace lohan

#endif  // LOHAN_DAEMON_PROFILE_OPTIMIZER_KERNEL_H_
