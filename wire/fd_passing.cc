#include "wire/fd_passing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

constexpr size_t kHeaderBytes = 4;
constexpr size_t kControlBytes = CMSG_SPACE(sizeof(int) * kMaxPassedFds);

absl::Status IoError(int error, const char* what) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": timed out (SO_RCVTIMEO/SO_SNDTIMEO)"));
  }
  return ErrnoToStatus(error, what);
}

// Takes ownership of every SCM_RIGHTS fd in `msg` (so none can leak).
void CollectFds(msghdr* msg, std::vector<UniqueFd>* fds) {
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) {
      continue;
    }
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(cmsg);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
      fds->emplace_back(fd);
    }
  }
}

// Reads exactly `size` bytes into `buffer`, collecting fds from every
// recvmsg (they arrive with the first byte; collecting from all of them
// means none can slip past).
// Waits until `socket_fd` is readable or `deadline` (none when infinite).
absl::Status WaitReadable(int socket_fd, absl::Time deadline, size_t done,
                          size_t size) {
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    }
    pollfd fd{.fd = socket_fd, .events = POLLIN};
    const int ready = poll(&fd, 1, timeout_ms);
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return IoError(errno, "poll");
    return absl::DeadlineExceededError(
        absl::StrCat("fd message: ", done, " of ", size,
                     " bytes arrived in time, the rest did not"));
  }
}

absl::Status ReadExactly(int socket_fd, uint8_t* buffer, size_t size,
                         std::vector<UniqueFd>* fds, absl::Time deadline) {
  size_t done = 0;
  while (done < size) {
    iovec iov{buffer + done, size - done};
    alignas(cmsghdr) unsigned char control[kControlBytes];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      // On a blocking socket EAGAIN is its SO_RCVTIMEO running out.
      if ((errno == EAGAIN || errno == EWOULDBLOCK) &&
          (fcntl(socket_fd, F_GETFL) & O_NONBLOCK) != 0) {
        absl::Status waited = WaitReadable(socket_fd, deadline, done, size);
        if (!waited.ok()) return waited;
        continue;
      }
      return IoError(errno, "recvmsg");
    }
    CollectFds(&msg, fds);
    if (msg.msg_flags & MSG_CTRUNC) {
      return absl::InvalidArgumentError(
          "fd message: control data truncated (more fds than allowed)");
    }
    if (n == 0) {
      return absl::UnavailableError(
          done == 0 ? "fd message: peer closed the connection"
                    : "fd message: peer closed mid-frame");
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendWithFds(int socket_fd, absl::Span<const uint8_t> payload,
                         absl::Span<const int> fds) {
  if (fds.size() > kMaxPassedFds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot pass ", fds.size(), " fds (at most ", kMaxPassedFds, ")"));
  }
  if (payload.size() > kMaxFdMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd message payload of ", payload.size(), " bytes is too large"));
  }
  const uint32_t length = static_cast<uint32_t>(payload.size());
  const uint8_t header[kHeaderBytes] = {
      static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
      static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};

  iovec iov[2] = {{const_cast<uint8_t*>(header), kHeaderBytes},
                  {const_cast<uint8_t*>(payload.data()), payload.size()}};
  size_t total = kHeaderBytes + payload.size();
  size_t sent = 0;
  bool fds_sent = fds.empty();
  alignas(cmsghdr) unsigned char control[kControlBytes] = {};
  while (sent < total) {
    // Build the iovec for what is left.
    iovec rest[2];
    int count = 0;
    size_t skip = sent;
    for (const iovec& part : iov) {
      if (skip >= part.iov_len) {
        skip -= part.iov_len;
        continue;
      }
      rest[count++] = {static_cast<uint8_t*>(part.iov_base) + skip,
                       part.iov_len - skip};
      skip = 0;
    }
    msghdr msg{};
    msg.msg_iov = rest;
    msg.msg_iovlen = count;
    if (!fds_sent) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "sendmsg");
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<FdMessage> ReceiveWithFds(int socket_fd,
                                         size_t max_payload_bytes,
                                         size_t expected_fds, int timeout_ms) {
  const absl::Time deadline =
      timeout_ms < 0 ? absl::InfiniteFuture()
                     : absl::Now() + absl::Milliseconds(timeout_ms);
  FdMessage message;
  uint8_t header[kHeaderBytes];
  absl::Status status =
      ReadExactly(socket_fd, header, kHeaderBytes, &message.fds, deadline);
  if (!status.ok()) return status;  // message.fds closes whatever came
  const uint32_t length = uint32_t{header[0]} | uint32_t{header[1]} << 8 |
                          uint32_t{header[2]} << 16 | uint32_t{header[3]} << 24;
  if (length > max_payload_bytes || length > kMaxFdMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd message: payload of ", length, " bytes exceeds the limit of ",
        std::min(max_payload_bytes, kMaxFdMessageBytes)));
  }
  message.payload.resize(length);
  status = ReadExactly(socket_fd, message.payload.data(), length, &message.fds,
                       deadline);
  if (!status.ok()) return status;
  if (message.fds.size() != expected_fds) {
    return absl::InvalidArgumentError(absl::StrCat("fd message: expected ",
                                                   expected_fds, " fds, got ",
                                                   message.fds.size()));
  }
  return message;
}

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int socket_fd) {
  ucred credentials{};
  socklen_t size = sizeof(credentials);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) !=
      0) {
    return ErrnoToStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  if (size != sizeof(credentials)) {
    return absl::InternalError("SO_PEERCRED: short answer");
  }
  return PeerCredentials{credentials.pid, credentials.uid, credentials.gid};
}

}  // namespace lohan
