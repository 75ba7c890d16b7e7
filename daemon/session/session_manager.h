#ifndef LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_
#define LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/caller.h"
#include "daemon/common/unique_fd.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/pool/host_pool.h"
#include "daemon/rpc/unix_listener.h"
#include "daemon/session/job_session.h"

namespace lohan {

// Serves the data-plane socket: each connection is one process asking for
// its job's arena (daemon/ipc/attach_protocol.h). The process must be the
// one attached to the job (JobRegistry::CheckAttachedBy, which also enforces
// the owner's uid); it then gets the arena fd and the ring layout, and its
// JobSession lives exactly as long as the connection: when the process
// closes it or dies, the arena goes back to the host pool.
//
// Each connection is served on a thread of its own, so a client that
// connects and says nothing holds up nobody (and is dropped after
// kHandshakeTimeout). Thread-safe.
class SessionManager {
 public:
  static constexpr int kHandshakeTimeoutMs = 5000;
  static constexpr size_t kMaxConnections = 1024;

  // REQUIRES: `jobs`, `pool`, `store` and `updater` (with its worker pool)
  // outlive the manager.
  static std::unique_ptr<SessionManager> Start(
      std::unique_ptr<UnixListener> listener, JobRegistry* jobs, HostPool* pool,
      TensorStore* store, const AdamUpdater* updater);

  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;
  ~SessionManager();

  // Stops accepting, closes every data-plane connection, frees every arena
  // and joins every thread. Idempotent.
  void Shutdown();

  size_t ActiveSessions() const;

  // Every open data plane's progress, by job id.
  std::vector<v1::SessionStatus> Status() const;

  // RegisterModel for the job's open data plane, called by the process
  // attached to the job. FAILED_PRECONDITION when the job has no data plane
  // open (open it first) or the caller is not the attached process.
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const Caller& caller, const v1::RegisterModelRequest& request);

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> finished{false};
  };

  SessionManager(std::unique_ptr<UnixListener> listener, JobRegistry* jobs,
                 HostPool* pool, TensorStore* store, const AdamUpdater* updater,
                 UniqueFd stop_event);
  void Accept(UniqueFd connection, const Caller& caller);
  void Serve(int connection, const Caller& caller);
  // The session for `caller`'s job, or the reason there is none.
  absl::StatusOr<std::unique_ptr<JobSession>> OpenSession(int connection,
                                                          const Caller& caller);
  // Waits until the peer hangs up (or sends anything: not allowed) or the
  // manager stops.
  void WaitForHangUp(int connection);
  void JoinFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  std::unique_ptr<UnixListener> listener_;
  JobRegistry* const jobs_;
  HostPool* const pool_;
  TensorStore* const store_;
  const AdamUpdater* const updater_;
  const UniqueFd stop_event_;  // eventfd: readable once Shutdown starts

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  // Sessions by job id. A session is removed (under mu_) before its
  // connection thread destroys it; RegisterModel holds mu_ while it uses one.
  std::map<std::string, JobSession*> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, pid_t> session_pids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_SESSION_MANAGER_H_
