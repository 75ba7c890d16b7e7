#ifndef LOHAN_CLIENT_DATA_PLANE_H_
#define LOHAN_CLIENT_DATA_PLANE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/common/unique_fd.h"
#include "daemon/ipc/arena_grant.h"

namespace lohan {

// The client's end of a job's data plane: the job's shared-memory arena,
// mapped into this process, and the connection whose life bounds it (the
// daemon frees the arena when the connection closes).
// Thread-compatible: one owner.
class DataPlane {
 public:
  // Connects to `data_socket_path` (HelloResponse.data_socket_path) and asks
  // for `job_id`'s arena. The daemon's refusal comes back as its status
  // (e.g. PERMISSION_DENIED for another user's job, FAILED_PRECONDITION when
  // this process has not attached the job); UNAVAILABLE when no daemon
  // answers there.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Open(
      const std::string& data_socket_path, const std::string& job_id);

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;
  // Unmaps the arena and closes the connection.
  ~DataPlane();

  uint8_t* arena() const { return base_; }
  uint64_t arena_bytes() const { return grant_.arena_bytes; }
  const ArenaGrant& grant() const { return grant_; }

 private:
  DataPlane(UniqueFd connection, uint8_t* base, ArenaGrant grant)
      : connection_(std::move(connection)), base_(base), grant_(grant) {}

  UniqueFd connection_;
  uint8_t* base_;
  const ArenaGrant grant_;
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_DATA_PLANE_H_
