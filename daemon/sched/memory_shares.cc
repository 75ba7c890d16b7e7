#include "daemon/sched/memory_shares.h"

#include <algorithm>

#include "daemon/common/check.h"

namespace lohan {

void MemoryShares::Join(absl::string_view flow, absl::string_view group,
                        double weight, uint64_t group_limit) {
  absl::MutexLock lock(&mu_);
  if (flows_.count(flow) > 0) return;
  if (group.empty()) group = flow;
  Group& shared = groups_[std::string(group)];
  if (shared.flows++ == 0) {
    shared.weight = weight > 0 ? weight : 1.0;
    shared.limit = group_limit;
    total_weight_ += shared.weight;
  }
  flows_.emplace(std::string(flow), Flow{std::string(group)});
}

void MemoryShares::Leave(absl::string_view flow) {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  if (found == flows_.end()) return;
  held_ -= found->second.held;
  auto group = groups_.find(found->second.group);
  if (--group->second.flows == 0) {
    total_weight_ -= group->second.weight;
    groups_.erase(group);
  }
  flows_.erase(found);
  if (flows_.empty()) total_weight_ = 0;  // no rounding left behind
}

std::map<std::string, double, std::less<>> MemoryShares::GroupSharesLocked()
    const {
  std::map<std::string, double, std::less<>> shares;
  double left = static_cast<double>(capacity_);
  double weight = total_weight_;
  // Groups whose limit is below their weighted part of what is left get
  // their limit; the rest is split again among the others, until none is.
  for (bool capped = true; capped;) {
    capped = false;
    for (const auto& [name, group] : groups_) {
      if (shares.count(name) > 0 || group.limit == 0) continue;
      if (static_cast<double>(group.limit) < left * group.weight / weight) {
        shares[name] = static_cast<double>(group.limit);
        left -= static_cast<double>(group.limit);
        weight -= group.weight;
        capped = true;
      }
    }
  }
  for (const auto& [name, group] : groups_) {
    if (shares.count(name) == 0) shares[name] = left * group.weight / weight;
  }
  return shares;
}

uint64_t MemoryShares::ShareLocked(const Flow& flow) const {
  const Group& group = groups_.find(flow.group)->second;
  const double share = GroupSharesLocked().find(flow.group)->second /
                       static_cast<double>(group.flows);
  return static_cast<uint64_t>(share);
}

bool MemoryShares::TryTake(absl::string_view flow, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  if (found == flows_.end()) return false;
  Flow& taker = found->second;
  if (held_ + bytes > capacity_ || taker.held + bytes > ShareLocked(taker)) {
    return false;
  }
  taker.held += bytes;
  held_ += bytes;
  return true;
}

void MemoryShares::Give(absl::string_view flow, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  LOHAN_CHECK(found != flows_.end() && found->second.held >= bytes);
  found->second.held -= bytes;
  held_ -= bytes;
}

uint64_t MemoryShares::Excess(absl::string_view flow) const {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  if (found == flows_.end()) return 0;
  const uint64_t share = ShareLocked(found->second);
  return found->second.held > share ? found->second.held - share : 0;
}

uint64_t MemoryShares::ShareOf(absl::string_view flow) const {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  return found == flows_.end() ? 0 : ShareLocked(found->second);
}

uint64_t MemoryShares::Held(absl::string_view flow) const {
  absl::MutexLock lock(&mu_);
  auto found = flows_.find(flow);
  return found == flows_.end() ? 0 : found->second.held;
}

}  // namespace lohan
