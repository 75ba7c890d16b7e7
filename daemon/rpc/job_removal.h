#ifndef LOHAN_DAEMON_RPC_JOB_REMOVAL_H_
#define LOHAN_DAEMON_RPC_JOB_REMOVAL_H_

#include <cstdint>
#include <functional>
#include <string>

#include "daemon/quota/space_ledger.h"
#include "daemon/store/tensor_store.h"

namespace lohan {

// What deleting a job frees beyond its registry entry, whoever deleted it
// (DeleteJob, or lohand itself: ended_job_sweeper.h): its tensors on the
// SSDs (states, copies, swapped activations: the space is the scarce thing
// on a shared server), its account in `ledger`, and whatever `forget` is
// told (the fair queues' flows; may be empty). Returns the SSD bytes its
// tensors held; a failure to free them is logged, and the next start frees
// them (lohand.cc).
// REQUIRES: the registry has deleted the job.
uint64_t FreeDeletedJob(TensorStore* store, SpaceLedger* ledger,
                        const std::function<void(const std::string&)>& forget,
                        const std::string& job_id);

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_JOB_REMOVAL_H_
