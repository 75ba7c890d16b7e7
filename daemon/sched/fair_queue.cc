#include "daemon/sched/fair_queue.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "daemon/common/check.h"

namespace lohan {

FairQueue::Grant& FairQueue::Grant::operator=(Grant&& other) noexcept {
  if (this != &other) {
    if (queue_ != nullptr) queue_->Release(start_, flow_);
    queue_ = other.queue_;
    start_ = other.start_;
    flow_ = std::move(other.flow_);
    other.queue_ = nullptr;
  }
  return *this;
}

FairQueue::Grant::~Grant() {
  if (queue_ != nullptr) queue_->Release(start_, flow_);
}

FairQueue::FairQueue(size_t slots, absl::Duration anticipation, int catch_up)
    : slots_(slots),
      anticipation_(anticipation),
      catch_up_(catch_up),
      free_(slots) {
  LOHAN_CHECK(slots >= 1 && catch_up >= 0);
}

FairQueue::Grant FairQueue::Acquire(absl::string_view flow, double weight,
                                    uint64_t cost, bool urgent,
                                    absl::string_view group) {
  const absl::Time asked = absl::Now();
  absl::MutexLock lock(&mu_);
  if (group.empty()) group = flow;
  auto found = flows_.find(flow);
  if (found == flows_.end()) {
    found = flows_.emplace(std::string(flow), Flow{std::string(group)}).first;
    ++groups_[std::string(group)].flows;
  }
  Flow& state = found->second;
  // A flow keeps the group it first asked in (a job's owner is fixed).
  auto in_group = groups_.find(state.group);
  Group& shared = in_group->second;
  Waiter waiter;
  const double normalized =
      static_cast<double>(cost) / (weight > 0 ? weight : 1.0);
  shared.last_lag = catch_up_ * normalized;
  waiter.start = StartTagLocked(shared, shared.last_lag);
  waiter.sequence = next_sequence_++;
  waiter.flow = &found->first;
  waiter.group = &in_group->first;
  waiter.urgent = urgent;
  shared.finish = waiter.start + normalized;
  BecomesActive(state, asked);
  ++state.waiting;
  ++shared.waiting;
  if (urgent) state.urgent.insert(&waiter);
  waiting_.insert(&waiter);
  DispatchLocked();
  while (!waiter.granted) {
    if (held_for_.empty()) {
      // Woken when granted, or when a slot starts being held (then the
      // wait must end by the hold's deadline).
      const uint64_t holds = holds_;
      auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return waiter.granted || holds_ != holds;
      };
      mu_.Await(absl::Condition(&woken));
    } else if (!mu_.AwaitWithDeadline(absl::Condition(&waiter.granted),
                                      held_until_) &&
               !held_for_.empty() && absl::Now() >= held_until_) {
      held_for_.clear();  // its flow did not come back in time
      DispatchLocked();
    }
  }
  // The flow may have been forgotten meanwhile: count into it afresh,
  // this grant in service.
  auto counted_at = flows_.find(flow);
  if (counted_at == flows_.end()) {
    counted_at =
        flows_.emplace(std::string(flow), Flow{std::string(group)}).first;
    ++groups_[std::string(group)].flows;
    BecomesActive(counted_at->second, asked);
    ++counted_at->second.in_service;
  }
  Flow& counted = counted_at->second;
  ++counted.stats.grants;
  counted.stats.cost += cost;
  counted.stats.waited_seconds += absl::ToDoubleSeconds(absl::Now() - asked);
  return Grant(this, waiter.start, std::string(flow));
}

void FairQueue::DispatchLocked() {
  while (free_ > 0 && !waiting_.empty()) {
    Waiter* next = *waiting_.begin();
    if (!held_for_.empty()) {
      // Held: only the group it is held for, or a request that would have
      // gone before it anyway.
      if (*next->group != held_for_ && next->start >= held_tag_ &&
          absl::Now() < held_until_) {
        return;
      }
      held_for_.clear();
    }
    // The flow's turn; its most urgent request takes it.
    Flow& flow = flows_[*next->flow];
    if (!next->urgent && !flow.urgent.empty()) next = *flow.urgent.begin();
    waiting_.erase(next);
    if (next->urgent) flow.urgent.erase(next);
    --flow.waiting;
    ++flow.in_service;
    --groups_.find(*next->group)->second.waiting;
    in_service_.insert(next->start);
    virtual_time_ = std::max(virtual_time_, *in_service_.begin());
    next->granted = true;
    --free_;
  }
}

void FairQueue::Release(double start, const std::string& flow) {
  absl::MutexLock lock(&mu_);
  in_service_.erase(in_service_.find(start));
  if (!in_service_.empty()) {
    virtual_time_ = std::max(virtual_time_, *in_service_.begin());
  }
  ++free_;
  auto found = flows_.find(flow);
  if (found != flows_.end() && found->second.in_service > 0) {
    --found->second.in_service;
    MayBecomeIdle(found->second, absl::Now());
  }
  auto group =
      found == flows_.end() ? groups_.end() : groups_.find(found->second.group);
  if (anticipation_ > absl::ZeroDuration() && held_for_.empty() &&
      !waiting_.empty() && group != groups_.end() &&
      group->second.waiting == 0) {
    const double next_start =
        StartTagLocked(group->second, group->second.last_lag);
    if (next_start < (*waiting_.begin())->start) {
      held_for_ = group->first;
      held_tag_ = next_start;
      held_until_ = absl::Now() + anticipation_;
      ++holds_;
    }
  }
  DispatchLocked();
}

void FairQueue::Forget(absl::string_view flow) {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  // A flow with requests waiting keeps its entry (they point at its key),
  // and a group its entry while it has flows.
  if (found != flows_.end() && found->second.waiting == 0) {
    auto group = groups_.find(found->second.group);
    if (--group->second.flows == 0 && group->second.waiting == 0) {
      groups_.erase(group);
    }
    flows_.erase(found);
  }
}

std::map<std::string, FairQueue::FlowStats> FairQueue::Stats() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, FlowStats> stats;
  const absl::Time now = absl::Now();
  for (const auto& [name, flow] : flows_) {
    FlowStats& counted = stats[name] = flow.stats;
    counted.waiting = flow.waiting;
    if (flow.waiting + flow.in_service > 0) {
      counted.active_seconds += absl::ToDoubleSeconds(now - flow.active_since);
    }
  }
  return stats;
}

double FairQueue::StartTagLocked(const Group& group, double lag) const {
  return std::max(virtual_time_ - lag, group.finish);
}

void FairQueue::BecomesActive(Flow& flow, absl::Time now) {
  if (flow.waiting + flow.in_service == 0) flow.active_since = now;
}

void FairQueue::MayBecomeIdle(Flow& flow, absl::Time now) {
  if (flow.waiting + flow.in_service == 0) {
    flow.stats.active_seconds += absl::ToDoubleSeconds(now - flow.active_since);
  }
}

}  // namespace lohan
