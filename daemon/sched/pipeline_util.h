#ifndef LOHAN_DAEMON_SCHED_PIPELINE_UTIL_H_
#define LOHAN_DAEMON_SCHED_PIPELINE_UTIL_H_

// Internal to daemon/sched: small helpers the JobPipeline files share.

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "layout/job_space.h"

namespace lohan::sched_internal {

// O_DIRECT-friendly alignment for chunk buffers (the store copies through
// bounce buffers otherwise).
inline constexpr size_t kBufferAlignment = kChunkBufferAlignment;

inline double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline size_t RoundUp(size_t n, size_t unit) {
  return (n + unit - 1) / unit * unit;
}

// `s` with `context` before its message (OK stays OK).
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// The store tag (TensorStore::Commit's) of the versions committed at
// `iteration` (the job's meta then reads it): every commit of a job's
// tensors carries the iteration its meta is at, so tensors committed apart
// can be checked to belong together when a job reopens. 0 is "no tag".
inline uint64_t CommitTag(uint64_t iteration) { return iteration + 1; }

// The store's answer when a tensor has no pending version.
inline bool IsNoPending(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace lohan::sched_internal

#endif  // LOHAN_DAEMON_SCHED_PIPELINE_UTIL_H_
