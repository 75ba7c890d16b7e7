#ifndef LOHAN_DAEMON_SCHED_FAIR_GATES_H_
#define LOHAN_DAEMON_SCHED_FAIR_GATES_H_

#include <functional>
#include <memory>

#include "daemon/sched/fair_queue.h"
#include "daemon/store/io_gate.h"

namespace lohan {

// The store's IoGate over two FairQueues, the array's reads and its
// writes: each job is a flow, weighed by `weight_of(job)` (its owner's
// weight from the config), each transfer's cost its bytes. A job's update
// pipeline keeps one read and one write in flight, so with one slot per
// direction every job that wants more waits at each turn and the weights
// decide every turn, while a read and a write still share the SSDs. A
// light job is served within a transfer of asking. A transfer made under
// an IoGate::UrgentScope goes before the same job's others.
class FairSsdGate : public IoGate {
 public:
  using WeightOf = std::function<double(absl::string_view job)>;
  // REQUIRES: both queues outlive the gate.
  FairSsdGate(FairQueue* reads, FairQueue* writes, WeightOf weight_of)
      : reads_(reads), writes_(writes), weight_of_(std::move(weight_of)) {}

  std::unique_ptr<Pass> Enter(absl::string_view job, uint64_t bytes,
                              Direction direction) override;

 private:
  FairQueue* const reads_;
  FairQueue* const writes_;
  const WeightOf weight_of_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_FAIR_GATES_H_
