#ifndef LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_
#define LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_

#include <cstdint>
#include <string>

#include "lohan/lohan_client.h"
#include "plugins/libtorch/handles.h"
#include "plugins/libtorch/lohan_error.h"

namespace lohan::torch_plugin {

// JobSession::FollowShare's failure: whether the old data plane was closed
// (the job then has none) or nothing was done.
class ShareMoveError : public LohanError {
 public:
  ShareMoveError(int status, const std::string& message, bool lost_plane)
      : LohanError(status, message), lost_plane_(lost_plane) {}
  bool lost_plane() const { return lost_plane_; }

 private:
  bool lost_plane_;
};

// A job on lohand for one model: created with an arena the daemon sizes
// for the model (or an existing one found by name), attached by this process,
// its data plane open and the model registered on it; FollowShare() moves
// the plane to the arena lohand asks for between steps. Close() (or the
// destructor) takes down whatever was opened and gives the arena back. Errors
// are LohanError.
class JobSession {
 public:
  // Connects to lohand at `socket_path` ("" : $LOHAN_SOCKET, else
  // /run/lohan/lohand.sock).
  explicit JobSession(const std::string& socket_path);
  ~JobSession();
  JobSession(const JobSession&) = delete;
  JobSession& operator=(const JobSession&) = delete;

  // Creates the job `name` for `model_spec_json` (a ModelSpec), or with
  // `resume` finds this user's job named `name` (LohanError
  // LOHAN_NOT_FOUND naming it when there is none), attaches it and opens
  // its data plane (lohan_job_open). A job created here and not closed
  // with Close(false) after a successful Register is deleted again.
  void Open(const std::string& name, const std::string& model_spec_json,
            bool resume);
  // Registers the model on the open data plane; the session owns it.
  lohan_model* Register(const std::string& model_spec_json);
  // The registered model's training steps (lohan_steps_create with
  // `options_json`, a TrainingStepsOptions); the session owns them.
  lohan_steps* StartSteps(const std::string& options_json);

  // What lohand asked at the end of the last step: the arena bytes of the
  // data plane it grants the job (0: nothing). Not zero, the plane moves
  // at FollowShare().
  uint64_t ArenaAsked() const;

  struct ShareMove {
    bool moved = false;
    uint64_t from_bytes = 0;  // the arena before
    uint64_t to_bytes = 0;    // the arena after
  };
  // Between steps, with nothing in flight (no copy reading or writing the
  // arena): moves the data plane to the arena lohand asked for
  // (lohan_job_follow_share: the model registered again as it was
  // registered, laid out anew for that arena, pinned again for CUDA). The
  // plane, the model and the steps stay the same handles, but every
  // pointer taken into the old arena (lohan_model_grad_buffer,
  // ..._weight_buffer, ..._staging) is invalid after it. ShareMoveError
  // when it failed: lost_plane() says whether the job has a data plane no
  // more.
  ShareMove FollowShare();

  const std::string& job_id() const { return job_id_; }
  // The open data plane (null before Open and after Close); the session
  // owns it.
  lohan_data_plane* plane() const { return plane_.get(); }

  // Destroys the steps and the model, closes the data plane, then
  // (lohan_job_close) waits until the daemon has taken the arena back (so the
  // job can be reopened at once), detaches the job (and deletes it with
  // `delete_job`) and disconnects. Errors past the data plane's close are
  // ignored (the daemon may be gone); a second call does nothing.
  void Close(bool delete_job);

 private:
  ClientHandle client_;
  DataPlaneHandle plane_;
  ModelHandle model_;
  StepsHandle steps_;  // destroyed before model_
  std::string job_id_;
  bool created_ = false;  // by Open
  bool registered_ = false;
};

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_
