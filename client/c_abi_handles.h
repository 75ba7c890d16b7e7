#ifndef LOHAN_CLIENT_C_ABI_HANDLES_H_
#define LOHAN_CLIENT_C_ABI_HANDLES_H_

// The C ABI's opaque handles and how its calls report: shared by the files
// that implement lohan_client.h (lohan_client.cc, lohan_client_cuda.cc),
// never exported.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/arena_pinning.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "client/include/lohan/lohan_client.h"
#include "client/model_channel.h"

struct lohan_client {
  std::unique_ptr<lohan::ControlClient> impl;
};

struct lohan_job_info {
  lohan::v1::Job job;
};

// A move to another arena (lohan_job_follow_share, share_move.h) replaces
// what both handles hold of the plane in place: `impl` is the new plane, or
// null when the move closed the old one and failed (every call that needs
// it then fails with FAILED_PRECONDITION saying so); `cuda` and `channel`
// stay the same objects, detached from the old plane.
struct lohan_data_plane {
  explicit lohan_data_plane(std::unique_ptr<lohan::DataPlane> plane)
      : impl(std::move(plane)), cuda(*impl) {}
  std::unique_ptr<lohan::DataPlane> impl;
  lohan::ArenaPinning cuda;  // destroyed first: unpins before the unmap
};

struct lohan_model {
  std::unique_ptr<lohan::ModelChannel> channel;  // never null
};

struct lohan_job_list {
  std::vector<lohan_job_info> jobs;
};

namespace lohan::c_abi {

// The calling thread's last error text (lohan_last_error) and the spec
// field it refused (lohan_last_error_field, RefusedField): empty after a
// call that succeeded.
const std::string& LastError();
const std::string& LastErrorField();

// The status as a lohan_status code, its message kept as the thread's last
// error.
int Report(const absl::Status& status);
int InvalidArgument(const char* what);
// A malloc'ed copy of `text` in *out (lohan_string_free frees it).
int CopyOut(const std::string& text, char** out);
// The model handle's null check, as every lohan_model_* call without a
// name of its own reports it.
int NullModel();
// A ticket out of a Submit* call into *ticket.
int ReturnTicket(const absl::StatusOr<ModelChannel::Ticket>& submitted,
                 uint64_t* ticket);

}  // namespace lohan::c_abi

#endif  // LOHAN_CLIENT_C_ABI_HANDLES_H_
