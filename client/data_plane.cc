#include "client/data_plane.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/common/errno_status.h"
#include "daemon/ipc/attach_protocol.h"
#include "daemon/ipc/fd_passing.h"

namespace lohan {

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Open(
    const std::string& data_socket_path, const std::string& job_id) {
  if (job_id.empty() || job_id.size() > kMaxAttachJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id must be 1 to ", kMaxAttachJobIdBytes, " characters"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (data_socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data socket path '", data_socket_path, "' is too long"));
  }
  std::memcpy(address.sun_path, data_socket_path.c_str(),
              data_socket_path.size() + 1);
  UniqueFd connection(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!connection) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (connect(connection.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no lohand data plane at ", data_socket_path, ": ",
                     ErrnoToStatus(errno, "connect").message()));
  }
  if (absl::Status sent =
          SendWithFds(connection.get(), EncodeAttachRequest(job_id), {});
      !sent.ok()) {
    return sent;
  }
  absl::StatusOr<FdMessage> reply =
      ReceiveWithFds(connection.get(), kMaxAttachReplyBytes, 0);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<AttachReply> decoded = DecodeAttachReply(reply->payload);
  if (!decoded.ok()) return decoded.status();
  if (!decoded->daemon_status.ok()) return decoded->daemon_status;

  absl::StatusOr<FdMessage> granted =
      ReceiveWithFds(connection.get(), kArenaGrantBytes, 1);
  if (!granted.ok()) return granted.status();
  absl::StatusOr<ArenaGrant> grant = DecodeArenaGrant(granted->payload);
  if (!grant.ok()) return grant.status();
  void* mapped = mmap(nullptr, grant->arena_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, granted->fds[0].get(), 0);
  if (mapped == MAP_FAILED) {
    return ErrnoToStatus(errno,
                         absl::StrCat("mapping the arena of job ", job_id));
  }
  return std::unique_ptr<DataPlane>(new DataPlane(
      std::move(connection), static_cast<uint8_t*>(mapped), *grant));
}

DataPlane::~DataPlane() {
  munmap(base_, grant_.arena_bytes);
  connection_.reset();
}

}  // namespace lohan
