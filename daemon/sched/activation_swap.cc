#include "daemon/sched/activation_swap.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/store/io_gate.h"

namespace lohan {
namespace {

constexpr absl::string_view kPrefix = "act.";

}  // namespace

std::string ActivationSwap::NameOf(uint64_t id) {
  return absl::StrCat(kPrefix, id);
}

absl::Status ActivationSwap::Put(uint64_t id, absl::Span<const uint8_t> bytes) {
  const std::string name = NameOf(id);
  absl::Status stored = store_->Create(job_, name, bytes.size());
  if (!stored.ok()) return stored;
  stored = store_->Write(job_, name, bytes).status();
  if (!stored.ok()) (void)store_->Delete(job_, name);
  return stored;
}

absl::Status ActivationSwap::Get(uint64_t id, absl::Span<uint8_t> bytes) {
  // The device waits for it: ahead of this job's other transfers.
  IoGate::UrgentScope urgent;
  return store_->ReadPending(job_, NameOf(id), bytes).status();
}

absl::StatusOr<uint64_t> ActivationSwap::Free(uint64_t id) {
  const std::string name = NameOf(id);
  absl::StatusOr<TensorInfo> held = store_->Stat(job_, name);
  if (absl::Status deleted = store_->Delete(job_, name); !deleted.ok()) {
    return deleted;
  }
  return held.ok() ? held->bytes : 0;
}

std::vector<ActivationSwap::Held> ActivationSwap::ListHeld() const {
  std::vector<Held> held;
  for (const std::string& name : store_->List(job_)) {
    uint64_t id = 0;
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, kPrefix) || !absl::SimpleAtoi(rest, &id)) {
      continue;
    }
    absl::StatusOr<TensorInfo> info = store_->Stat(job_, name);
    if (info.ok()) held.push_back({id, info->bytes});
  }
  return held;
}

void ActivationSwap::FreeAll() {
  for (const std::string& name : store_->List(job_)) {
    if (absl::string_view(name).substr(0, kPrefix.size()) == kPrefix) {
      (void)store_->Delete(job_, name);
    }
  }
}

}  // namespace lohan
