#ifndef LOHAN_DAEMON_SCHED_JOB_META_H_
#define LOHAN_DAEMON_SCHED_JOB_META_H_

// The small per-job record stored next to a job's chunk states and committed
// in the same batch, so the step counter moves with the states.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

struct JobMeta {
  uint64_t layout_fingerprint = 0;  // LayoutFingerprint of the job's layout.
  // Iterations committed so far: also every chunk's Adam step counter.
  uint64_t iteration = 0;

  // Fixed kBytes: magic "LOHANJOB", format version, fields, zero padding.
  static constexpr size_t kBytes = 64;
  std::string Encode() const;
  // DATA_LOSS if `bytes` is not an encoded JobMeta.
  static absl::StatusOr<JobMeta> Decode(absl::string_view bytes);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_JOB_META_H_
