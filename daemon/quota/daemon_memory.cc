#include "daemon/quota/daemon_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "layout/byte_size.h"

namespace lohan {

uint64_t DefaultDaemonMemoryLimit(uint64_t physical_bytes) {
  return std::max<uint64_t>(physical_bytes / 16, uint64_t{256} << 20);
}

absl::Status FitsDaemonMemory(uid_t uid, uint64_t needed, uint64_t held,
                              uint64_t limit, absl::string_view what) {
  if (held <= limit && needed <= limit - held) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", FormatByteSize(needed), " of lohand's memory; uid ", uid,
      "'s jobs and plans hold ", FormatByteSize(held),
      " of it and the "
      "quota is ",
      FormatByteSize(limit),
      " ([quotas] daemon_memory in lohand.toml: each store tensor of a job "
      "counts ",
      kDaemonBytesPerTensor,
      " bytes, each kept plan its size). Delete jobs you no longer need, "
      "or use fewer, larger layers"));
}

}  // namespace lohan
