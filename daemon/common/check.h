#ifndef LOHAN_DAEMON_COMMON_CHECK_H_
#define LOHAN_DAEMON_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

// For our own broken invariants only. Anything that comes from outside the
// process (a client message, the config, a disk completion) returns a Status.
#define LOHAN_CHECK(condition)                                          \
  do {                                                                  \
    if (!(condition)) {                                                 \
      std::fprintf(stderr, "%s:%d: LOHAN_CHECK failed: %s\n", __FILE__, \
                   __LINE__, #condition);                               \
      std::abort();                                                     \
    }                                                                   \
  } while (0)

#endif  // LOHAN_DAEMON_COMMON_CHECK_H_
