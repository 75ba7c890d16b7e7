#ifndef LOHAN_DAEMON_QUOTA_DAEMON_MEMORY_H_
#define LOHAN_DAEMON_QUOTA_DAEMON_MEMORY_H_

// What lohand holds in its own memory for a user ([quotas] daemon_memory):
// its jobs' store tensors (each an entry in the store and its catalog,
// and in a registered model's pipeline), and the plans kept with its
// sessions. A user's requests that would hold more are refused before
// anything is made, so no user can grow the daemon.

#include <sys/types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lohan {

// The daemon memory one store tensor of a job costs, counted with a
// margin: a registered model of 65536 one-element layers (131073 tensors
// with its streamed 16-bit copies) took lohand's RSS up by 145 MiB, 1.1 KiB
// a tensor.
inline constexpr uint64_t kDaemonBytesPerTensor = 1536;

// A kept plan's bytes (its serialized size) from what a PlanJob asks for,
// before it is made: a decision of a few bytes per saved tensor, a mode per
// block, and the figures.
constexpr uint64_t PlanBytesEstimate(uint64_t blocks, uint64_t block_tensors) {
  return blocks * (block_tensors * 12 + 12) + 4096;
}

// The limit for a machine of `physical_bytes` when the config leaves it 0:
// a sixteenth of the memory, at least 256 MiB.
uint64_t DefaultDaemonMemoryLimit(uint64_t physical_bytes);

// OK when `needed` bytes more fit beside the `held` bytes of `uid` under
// `limit`; else RESOURCE_EXHAUSTED naming `what`, the numbers and
// [quotas] daemon_memory.
absl::Status FitsDaemonMemory(uid_t uid, uint64_t needed, uint64_t held,
                              uint64_t limit, absl::string_view what);

}  // namespace lohan

#endif  // LOHAN_DAEMON_QUOTA_DAEMON_MEMORY_H_
