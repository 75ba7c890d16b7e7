#ifndef LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_
#define LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_

#include <string>

#include "lohan/lohan_client.h"
#include "plugins/libtorch/handles.h"

namespace lohan::torch_plugin {

// A job on lohand for one model: created with an arena the daemon sizes
// for the model (or an existing one found by name), attached by this process,
// its data plane open and the model registered on it. Close() (or the
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
