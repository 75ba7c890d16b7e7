#ifndef LOHAN_DAEMON_RPC_CONTROL_PROBE_H_
#define LOHAN_DAEMON_RPC_CONTROL_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace lohan {

// Whether lohand's control plane answers as its clients find it: one
// GetStatus (what `lohanctl status` asks) on a fresh connection to the unix
// socket at `socket_path`, within `deadline`. An answer takes the socket
// file, the accept thread, the peer check, gRPC's threads and the service,
// which reads the job registry, the store, the sessions and the host pool,
// each under its lock: a stopped daemon, or one with any of those threads
// or locks stuck, does not answer. OK when answered; else the call's status
// (DEADLINE_EXCEEDED: no answer in time, UNAVAILABLE: no connection).
// Called by lohand on itself (its watchdog), whose own connections its
// control server admits beyond [quotas] control_connections.
absl::Status ProbeControlPlane(const std::string& socket_path,
                               absl::Duration deadline);

}  // namespace lohan

#endif  // LOHAN_DAEMON_RPC_CONTROL_PROBE_H_
