#include "client/c_abi_handles.h"

namespace lohan::c_abi {
namespace {

thread_local std::string last_error;

}  // namespace

const std::string& LastError() { return last_error; }

int Report(const absl::Status& status) {
  if (status.ok()) {
    last_error.clear();
    return LOHAN_OK;
  }
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

int InvalidArgument(const char* what) {
  return Report(absl::InvalidArgumentError(what));
}

int NullModel() { return InvalidArgument("model is NULL"); }

int ReturnTicket(const absl::StatusOr<ModelChannel::Ticket>& submitted,
                 uint64_t* ticket) {
  if (!submitted.ok()) return Report(submitted.status());
  *ticket = *submitted;
  return Report(absl::OkStatus());
}

}  // namespace lohan::c_abi
