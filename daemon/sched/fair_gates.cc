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
  return std::make_unique<GrantPass>(queue->Acquire(
      job, weight_of_(job), bytes, /*urgent=*/UrgentScope::Active()));
}

}  // namespace lohan
