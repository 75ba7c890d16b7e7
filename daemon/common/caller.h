#ifndef LOHAN_DAEMON_COMMON_CALLER_H_
#define LOHAN_DAEMON_COMMON_CALLER_H_

#include <sys/types.h>

namespace lohan {

// Who is calling, as the kernel vouches for it (the socket's peer
// credentials), never as the caller describes itself.
struct Caller {
  uid_t uid = 0;
  pid_t pid = 0;

  bool is_root() const { return uid == 0; }
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_CALLER_H_
