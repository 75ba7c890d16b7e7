#include "daemon/quota/fair_share.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "layout/byte_size.h"

namespace lohan {
namespace {

double WeightOf(uid_t uid, const std::map<uid_t, ShareHolder>& holders) {
  auto found = holders.find(uid);
  return found == holders.end() ? 1.0 : found->second.weight;
}

}  // namespace

uint64_t ShareOf(uint64_t capacity, uid_t uid,
                 const std::map<uid_t, ShareHolder>& holders) {
  double total = WeightOf(uid, holders);
  for (const auto& [other, holder] : holders) {
    if (other != uid && holder.present) total += holder.weight;
  }
  const double share =
      static_cast<double>(capacity) * WeightOf(uid, holders) / total;
  return static_cast<uint64_t>(std::floor(share));
}

namespace {

// What the other training users' shares still have free, `training`
// counting the asker `uid` as present; `others` gets how many they are.
uint64_t KeptForOthers(uint64_t capacity, uid_t uid,
                       const std::map<uid_t, ShareHolder>& training,
                       int& others) {
  uint64_t kept_for_others = 0;
  others = 0;
  for (const auto& [other, holder] : training) {
    if (other == uid || !holder.present) continue;
    ++others;
    const uint64_t share = ShareOf(capacity, other, training);
    kept_for_others += share > holder.held ? share - holder.held : 0;
  }
  return kept_for_others;
}

// `holders` with the asker `uid` training: once it has what it asks for,
// the other users' shares count it (as its own share does).
std::map<uid_t, ShareHolder> Training(
    uid_t uid, const std::map<uid_t, ShareHolder>& holders) {
  std::map<uid_t, ShareHolder> training = holders;
  training[uid].present = true;
  return training;
}

}  // namespace

uint64_t FairShareRoom(uint64_t capacity, uint64_t held_by_all, uid_t uid,
                       const std::map<uid_t, ShareHolder>& holders) {
  const std::map<uid_t, ShareHolder> training = Training(uid, holders);
  int others = 0;
  const uint64_t kept_for_others =
      KeptForOthers(capacity, uid, training, others);
  const uint64_t free = capacity > held_by_all ? capacity - held_by_all : 0;
  if (others == 0) return free;
  // What is free beyond the others' shares, or what is free up to its own
  // share, whichever is more (FitsFairShare's two ways to fit).
  const uint64_t beyond = free > kept_for_others ? free - kept_for_others : 0;
  const uint64_t held = training.at(uid).held;
  const uint64_t share = ShareOf(capacity, uid, training);
  const uint64_t within = std::min(free, share > held ? share - held : 0);
  return std::max(beyond, within);
}

absl::Status FitsFairShare(uint64_t capacity, uint64_t held_by_all, uid_t uid,
                           uint64_t bytes,
                           const std::map<uid_t, ShareHolder>& holders,
                           absl::string_view what, absl::string_view resource) {
  const std::map<uid_t, ShareHolder> training = Training(uid, holders);
  int others = 0;
  const uint64_t kept_for_others =
      KeptForOthers(capacity, uid, training, others);
  const uint64_t free = capacity > held_by_all ? capacity - held_by_all : 0;
  if (bytes <= free && kept_for_others <= free - bytes) {
    return absl::OkStatus();
  }
  const uint64_t held = training.at(uid).held;
  const uint64_t share = ShareOf(capacity, uid, training);
  if (others == 0 || held + bytes <= share) {
    // Within its share (or nobody else is training): only what is free.
    if (bytes <= free) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatByteSize(bytes), " but the ", resource,
        " is full (", FormatByteSize(held_by_all), " of ",
        FormatByteSize(capacity), " held, ", FormatByteSize(held),
        " of it by uid ", uid, ", whose share is ", FormatByteSize(share),
        others == 0 ? "); space comes back as jobs end or free what they "
                      "swapped"
                    : "); it is within that share: other users hold beyond "
                      "theirs, which comes back as their jobs end or free "
                      "what they swapped"));
  }
  const uint64_t free_for_uid =
      free > kept_for_others ? free - kept_for_others : 0;
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", FormatByteSize(bytes), " beyond uid ", uid,
      "'s share of the ", resource, ": it holds ", FormatByteSize(held),
      " and its share is ", FormatByteSize(share), " while ", others,
      " other user", others == 1 ? " is" : "s are",
      " training (by [quotas] weight); of the ", FormatByteSize(free),
      " free, the rest of their shares keeps ", FormatByteSize(kept_for_others),
      " for them and ", FormatByteSize(free_for_uid), " is free for uid ", uid,
      ". Use less (for activations: lohan keeps them in host memory "
      "instead), or wait for them to finish"));
}

}  // namespace lohan
