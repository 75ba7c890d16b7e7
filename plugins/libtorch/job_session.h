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

  // Creates the job `name` for `model_spec_json` (a ModelSpec), attaches
  // it and opens its data plane. A job created here and not closed with
  // Close(false) after a successful Register is deleted again.
  void CreateAndOpen(const std::string& name,
                     const std::string& model_spec_json);
  // Finds this user's job named `name` (owner lohan_client_caller_uid),
  // attaches it and opens its data plane; its arena is the one it was
  // created with. LohanError LOHAN_NOT_FOUND naming the job when there is
  // none. Close() never deletes a job found here unless asked to.
  void FindAndOpen(const std::string& name);
  // Registers the model on the open data plane; the session owns it.
  lohan_model* Register(const std::string& model_spec_json);

  const std::string& job_id() const { return job_id_; }
  // The open data plane (null before CreateAndOpen / FindAndOpen and
  // after Close); the session owns it.
  lohan_data_plane* plane() const { return plane_.get(); }

  // Destroys the model, closes the data plane and waits until the daemon
  // has taken the arena back (so the job can be reopened at once), then
  // detaches the job (and deletes it with `delete_job`) and disconnects.
  // Errors past the data plane's close are ignored (the daemon may be
  // gone); a second call does nothing.
  void Close(bool delete_job);

 private:
  void AttachAndOpen();
  void WaitForArenaReturn();

  ClientHandle client_;
  DataPlaneHandle plane_;
  ModelHandle model_;
  std::string job_id_;
  bool attached_ = false;
  bool created_ = false;  // by CreateAndOpen
  bool registered_ = false;
};

// Whether GetStatus's JSON (`status_json`) lists an arena of `job_id` in
// pool.arenas.
bool StatusListsArena(const std::string& status_json,
                      const std::string& job_id);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_JOB_SESSION_H_
