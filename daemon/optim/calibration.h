#ifndef LOHAN_DAEMON_OPTIM_CALIBRATION_H_
#define LOHAN_DAEMON_OPTIM_CALIBRATION_H_

// Chooses the Adam kernels for this machine, their SIMD path and how they
// move memory (KernelTuning), by timing the candidates, not by guessing from
// the CPU's name: a wider path, software prefetch distance, streaming stores
// and per-thread run length help one microarchitecture and cost on another. The
// timed steps run on buffers rotated so that together they exceed the
// last-level cache (the regime of an optimizer streaming states from host
// memory and SSDs), candidates interleaved round by round so drift and
// neighbours fall on all alike.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/tuning.h"
#include "daemon/optim/worker_pool.h"

namespace lohan {

struct CalibrationOptions {
  // Parameters per timed tensor (fp32 weight and moments, a gradient and a
  // bf16 copy).
  std::size_t tensor_parameters = std::size_t{4} << 20;
  // Bytes all rotated tensors span together; 0: twice the last-level cache,
  // within [256 MiB, 2 GiB] (256 MiB when the cache size is unknown).
  std::size_t working_set_bytes = 0;
  // Rounds over every candidate, each timing one step per case on the next
  // tensor of the rotation; then twice as many over the default and the
  // three fastest.
  int rounds = 5;
  // madvise(MADV_HUGEPAGE) on the buffers, as lohand advises its state
  // buffers (daemon/store/aligned_buffer.h): the page size changes which
  // prefetch distance is best.
  bool huge_pages = true;
  // Empty: CandidateTunings(threads) for every ISA given.
  std::vector<KernelTuning> candidates;
};

struct TuningTime {
  Isa isa = Isa::kScalar;
  KernelTuning tuning;
  // The fastest step over the rounds in each case (interference only slows
  // a step down): fp32 gradient with no copy, and bf16 gradient with a
  // bf16 weight copy (lohan's own).
  double fp32_seconds = 0;
  double bf16_seconds = 0;
  double seconds() const { return fp32_seconds + bf16_seconds; }
};

struct Calibration {
  // The fastest candidate over both cases.
  Isa isa = Isa::kScalar;
  KernelTuning tuning;
  std::vector<TuningTime> measured;  // one per candidate, in their order
  std::size_t parameters_per_step = 0;
  // Time of the first ISA with KernelTuning{} (what runs uncalibrated,
  // always measured) over that of the chosen one.
  double speedup_over_default = 1.0;
};

// The candidates timed by default on a pool of `threads`: prefetch
// distances (none to far) with and without streaming stores and, with more
// than one thread, short or long per-thread runs. Includes KernelTuning{}.
std::vector<KernelTuning> CandidateTunings(int threads);

// The paths worth timing on this CPU, best first: the vector paths it
// supports (scalar only where it has none), or just `forced`.
std::vector<Isa> CalibrationIsas(std::optional<Isa> forced);

// Times Adam steps on `pool` (null: the calling thread) for every ISA in
// `isas` (best first; each must be supported) under each candidate tuning
// and returns the fastest. InvalidArgument for bad options or ISAs;
// ResourceExhausted when the buffers cannot be mapped. Call it while
// nothing else uses the pool.
absl::StatusOr<Calibration> CalibrateAdam(WorkerPool* pool,
                                          const std::vector<Isa>& isas,
                                          const CalibrationOptions& options);

// The last-level cache in bytes as the OS reports it, 0 if unknown.
std::size_t LastLevelCacheBytes();

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_CALIBRATION_H_
