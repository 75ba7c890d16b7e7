#ifndef LOHAN_DAEMON_SCHED_FAIR_GATES_H_
#define LOHAN_DAEMON_SCHED_FAIR_GATES_H_

#include <functional>
#include <memory>
#include <string>

#include "daemon/sched/fair_queue.h"
#include "daemon/store/io_gate.h"

namespace lohan {

// The store's IoGate over two FairQueues, the array's reads and its
// writes: each job is a flow in its owner's group, weighed by the owner's
// weight from the config (`share_of(job)`), each transfer's cost its bytes:
// users share the array by their weights, however many jobs each runs. A job's
// update pipeline keeps one read and one write in flight, so with one slot per
// direction every job that wants more waits at each turn and the weights
// decide every turn, while a read and a write still share the SSDs (two
// slots let each job's pipeline in without waiting: 2:1 weights came out
// 1.1:1). The store passes a large transfer in parts (store.gate_unit), so
// a light job is served within a part of asking. A transfer made under an
// IoGate::UrgentScope goes before the same job's others.
class FairSsdGate : public IoGate {
 public:
  struct Share {
    double weight = 1.0;
    std::string group;  // the job's owner; empty: the job alone
  };
  using ShareOf = std::function<Share(absl::string_view job)>;
  // REQUIRES: both queues outlive the gate.
  FairSsdGate(FairQueue* reads, FairQueue* writes, ShareOf share_of)
      : reads_(reads), writes_(writes), share_of_(std::move(share_of)) {}

  std::unique_ptr<Pass> Enter(absl::string_view job, uint64_t bytes,
                              Direction direction) override;

 private:
  FairQueue* const reads_;
  FairQueue* const writes_;
  const ShareOf share_of_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_FAIR_GATES_H_
