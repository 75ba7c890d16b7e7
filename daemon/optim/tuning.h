#ifndef LOHAN_DAEMON_OPTIM_TUNING_H_
#define LOHAN_DAEMON_OPTIM_TUNING_H_

// How the optimizer kernels move memory, apart from what they compute: the
// choices that help one microarchitecture and cost on another. Every
// tuning gives bit-identical results; only speed differs. Chosen per
// machine by calibration (calibration.h), or forced by lohand's config.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

struct KernelTuning {
  // How far ahead, in elements, the main loop prefetches each stream in
  // software (0: none, the hardware prefetchers alone). Ignored by the
  // scalar path.
  std::size_t prefetch_elements = 1024;
  // Store the 16-bit weight copy with non-temporal (streaming) stores,
  // skipping the read of its lines, where the ISA has them.
  bool stream_half_copy = true;
  // Consecutive chunks (of optim_internal::kChunkElements) one worker takes
  // at a time: more keeps each thread's streams long and its prefetches
  // inside its own work; fewer balances the threads finer. >= 1.
  std::size_t chunks_per_task = 1;
};

inline bool operator==(const KernelTuning& a, const KernelTuning& b) {
  return a.prefetch_elements == b.prefetch_elements &&
         a.stream_half_copy == b.stream_half_copy &&
         a.chunks_per_task == b.chunks_per_task;
}

// "prefetch=1024,stream=on,chunks=1": the form `ParseTuning` reads (for a
// config or command line override) and status reports print.
std::string TuningName(const KernelTuning& tuning);
// InvalidArgument naming the bad field; fields may come in any order and
// missing ones keep KernelTuning{}'s value.
absl::StatusOr<KernelTuning> ParseTuning(absl::string_view text);

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_TUNING_H_
