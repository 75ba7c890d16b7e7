#include "daemon/sched/fair_gates.h"

namespace lohan {
namespace {

class GrantPass : public IoGate::Pass {
 public:
  explicit GrantPass(FairQueue::Grant grant) : grant_(std::move(grant)) {}

 private:
  FairQueue::Grant grant_;
};

}  // namespace

std::unique_ptr<IoGate::Pass> FairSsdGate::Enter(absl::string_view job,
                                                 uint64_t bytes,
                                                 Direction direction) {
  FairQueue* queue = direction == Direction::kRead ? reads_ : writes_;
  const Share share = share_of_(job);
  return std::make_unique<GrantPass>(
      queue->Acquire(job, share.weight, bytes,
                     /*urgent=*/UrgentScope::Active(), share.group));
}

}  // namespace lohan
