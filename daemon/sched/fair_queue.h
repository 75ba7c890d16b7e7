#ifndef LOHAN_DAEMON_SCHED_FAIR_QUEUE_H_
#define LOHAN_DAEMON_SCHED_FAIR_QUEUE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lohan {

// Weighted fair sharing of one resource (the SSD array, the optimizer's
// threads) among flows (jobs), by start-time fair queueing: `slots`
// requests hold the resource at once; each waiting request of flow f gets
// the start tag S = max(V, F_f) and moves F_f to S + cost / weight; a free
// slot goes to the waiting request with the smallest S. V, the virtual
// time, is the smallest S among the requests holding a slot (the last one
// granted when none does; it never goes back). So while flows are
// backlogged each gets cost in proportion to its weight, whatever its rate
// of asking. Costs are bytes (SSD) or parameters (optimizer).
//
// Catch-up: a flow's start tag is S = max(V - lag, F_f), lag = `catch_up`
// x the request's cost / weight. Plain SFQ (catch_up 0) restarts a flow
// that was not waiting at V, so every turn it missed, however briefly, is
// lost for good; a job's pipeline misses turns all the time (it asks for
// its next transfer only once the last is done, and its thread is not
// always scheduled at once), and two such jobs weighted 2:1 got about
// 1.45:1. With catch-up a flow keeps its place while it is at most
// `catch_up` of its own requests behind V, and wins the next turns until it
// is level: a flow back from a long idle spell goes ahead of the others by
// that much at most, then shares as usual.
//
// Flows may be put in groups (a user's jobs): the tags are then the
// group's, so the group shares the resource with other groups by its
// weight, however many flows it has (a user's ten jobs get what one would),
// and its flows are served in their order of asking among themselves.
// With no group, a flow is a group of its own.
//
// A job's pipeline has one transfer of each kind in flight and asks for the
// next only once that one is done, so at the moment a slot frees its flow
// has nothing waiting and a plain work-conserving queue would hand the slot
// to the other flow every time: round robin, whatever the weights. So when
// a flow gives back a slot that its next request would win (its finish tag
// is below every waiting start tag), the slot is held for it for up to
// `anticipation` (a pipeline turns around in microseconds); a request of
// another flow with an earlier tag still goes first, and once the wait runs
// out the slot goes to the waiting requests as usual. Zero: no holding.
// Thread-safe; Acquire blocks.
class FairQueue {
 public:
  // Holds one slot until destroyed.
  class Grant {
   public:
    Grant() = default;
    Grant(Grant&& other) noexcept
        : queue_(other.queue_),
          start_(other.start_),
          flow_(std::move(other.flow_)) {
      other.queue_ = nullptr;
    }
    Grant& operator=(Grant&& other) noexcept;
    Grant(const Grant&) = delete;
    Grant& operator=(const Grant&) = delete;
    ~Grant();

   private:
    friend class FairQueue;
    Grant(FairQueue* queue, double start, std::string flow)
        : queue_(queue), start_(start), flow_(std::move(flow)) {}
    FairQueue* queue_ = nullptr;
    double start_ = 0;
    std::string flow_;
  };

  struct FlowStats {
    uint64_t grants = 0;
    uint64_t cost = 0;  // granted
    double waited_seconds = 0;
    // Time with at least one request of the flow waiting or holding a
    // slot: the flow's demand. A share of a window is only owed to a flow
    // while it is active.
    double active_seconds = 0;
    size_t waiting = 0;  // its requests waiting for a slot now
  };

  // REQUIRES: slots >= 1, catch_up >= 0.
  explicit FairQueue(size_t slots,
                     absl::Duration anticipation = absl::ZeroDuration(),
                     int catch_up = 0);
  FairQueue(const FairQueue&) = delete;
  FairQueue& operator=(const FairQueue&) = delete;

  // Waits for `flow`'s turn (weight > 0, its group's: a non-positive
  // weight counts as 1) and returns its slot. An `urgent` request takes its
  // flow's turn ahead of the flow's other waiting requests (deadline order
  // inside a flow; between flows the tags still decide, so marking
  // requests urgent wins a flow nothing against the others). `group`
  // empty: the flow alone.
  Grant Acquire(absl::string_view flow, double weight, uint64_t cost,
                bool urgent = false, absl::string_view group = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a flow's tag and counts (a job that ended).
  void Forget(absl::string_view flow) ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, FlowStats> Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t slots() const { return slots_; }

 private:
  struct Waiter {
    double start = 0;
    uint64_t sequence = 0;
    bool granted = false;
    bool urgent = false;
    const std::string* flow = nullptr;   // the key in flows_
    const std::string* group = nullptr;  // the key in groups_
    bool operator<(const Waiter& other) const {
      return start != other.start ? start < other.start
                                  : sequence < other.sequence;
    }
  };
  struct ByStart {
    bool operator()(const Waiter* a, const Waiter* b) const { return *a < *b; }
  };
  struct Flow {
    std::string group;
    size_t waiting = 0;                 // its requests in waiting_
    size_t in_service = 0;              // its grants not yet released
    absl::Time active_since;            // when waiting + in_service left 0
    std::set<Waiter*, ByStart> urgent;  // those of them marked urgent
    FlowStats stats;
  };
  struct Group {
    double finish = 0;
    double last_lag = 0;  // catch_up x the last request's cost / weight
    size_t waiting = 0;   // its flows' requests in waiting_
    size_t flows = 0;     // in flows_
  };

  void Release(double start, const std::string& flow) ABSL_LOCKS_EXCLUDED(mu_);
  void DispatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double StartTagLocked(const Group& group, double lag) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bookkeeping of a flow's active time around a change of its counts.
  static void BecomesActive(Flow& flow, absl::Time now);
  static void MayBecomeIdle(Flow& flow, absl::Time now);

  const size_t slots_;
  const absl::Duration anticipation_;
  const int catch_up_;
  mutable absl::Mutex mu_;
  size_t free_ ABSL_GUARDED_BY(mu_);
  double virtual_time_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<Waiter*, ByStart> waiting_ ABSL_GUARDED_BY(mu_);
  std::multiset<double> in_service_ ABSL_GUARDED_BY(mu_);
  // A slot held for the group `held_for_` (empty: none) until
  // `held_until_`, for its next request, whose start tag will be
  // `held_tag_`.
  std::string held_for_ ABSL_GUARDED_BY(mu_);
  absl::Time held_until_ ABSL_GUARDED_BY(mu_);
  double held_tag_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t holds_ ABSL_GUARDED_BY(mu_) = 0;  // holds begun, to wake waiters
  std::map<std::string, Flow, std::less<>> flows_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Group, std::less<>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SCHED_FAIR_QUEUE_H_
