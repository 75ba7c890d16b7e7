#include "client/c_abi_handles.h"

#include <cstdlib>
#include <cstring>

#include "spec/model_spec_checks.h"

namespace lohan::c_abi {
namespace {

thread_local std::string last_error;
thread_local std::string last_error_field;

}  // namespace

const std::string& LastError() { return last_error; }
const std::string& LastErrorField() { return last_error_field; }

int Report(const absl::Status& status) {
  if (status.ok()) {
    last_error.clear();
    last_error_field.clear();
    return LOHAN_OK;
  }
  last_error = std::string(status.message());
  last_error_field = RefusedField(status);
  return static_cast<int>(status.code());
}

int InvalidArgument(const char* what) {
  return Report(absl::InvalidArgumentError(what));
}

int CopyOut(const std::string& text, char** out) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  std::memcpy(copy, text.c_str(), text.size() + 1);
  *out = copy;
  return Report(absl::OkStatus());
}

int NullModel() { return InvalidArgument("model is NULL"); }

int ReturnTicket(const absl::StatusOr<ModelChannel::Ticket>& submitted,
                 uint64_t* ticket) {
  if (!submitted.ok()) return Report(submitted.status());
  *ticket = *submitted;
  return Report(absl::OkStatus());
}

}  // namespace lohan::c_abi
