#include "daemon/rpc/job_removal.h"

#include "daemon/common/memory_release.h"
#include "spdlog/spdlog.h"

namespace lohan {

uint64_t FreeDeletedJob(TensorStore* store, SpaceLedger* ledger,
                        const std::function<void(const std::string&)>& forget,
                        const std::string& job_id) {
  const std::map<std::string, uint64_t> by_job = store->BytesByJob();
  auto held = by_job.find(job_id);
  const uint64_t bytes = held == by_job.end() ? 0 : held->second;
  absl::Status freed = store->DeleteJob(job_id);
  ReleaseFreedMemory();  // its tensors' entries
  ledger->Forget(job_id);
  if (forget) forget(job_id);
  if (!freed.ok()) {
    spdlog::warn(
        "job {} deleted, but freeing its SSD space failed (retried at the "
        "next start): {}",
        job_id, std::string(freed.message()));
  }
  return bytes;
}

}  // namespace lohan
