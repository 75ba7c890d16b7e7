#ifndef LOHAN_DAEMON_COMMON_THREAD_NAME_H_
#define LOHAN_DAEMON_COMMON_THREAD_NAME_H_

namespace lohan {

// Names the calling thread as `top -H`, /proc/<pid>/task/*/comm and
// debuggers show it (at most 15 bytes are kept). A thread starts with the
// name of the one that made it: without this, the threads a job's session
// makes from a gRPC handler all read "grpcpp_sync_ser".
void NameThisThread(const char* name);

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_THREAD_NAME_H_
