#include "plugins/libtorch/job_session.h"

#include <cstdint>
#include <string>

#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {

JobSession::JobSession(const std::string& socket_path) {
  lohan_client* client = nullptr;
  ThrowIfFailed(lohan_client_connect(
      socket_path.empty() ? nullptr : socket_path.c_str(), &client));
  client_.reset(client);
}

JobSession::~JobSession() { Close(false); }

void JobSession::Open(const std::string& name,
                      const std::string& model_spec_json, bool resume) {
  const std::string request = OpenJobRequestJson(name, model_spec_json, resume);
  lohan_data_plane* plane = nullptr;
  lohan_job_info* job = nullptr;
  const int status =
      lohan_job_open(client_.get(), request.c_str(), &plane, &job, nullptr);
  if (status == LOHAN_NOT_FOUND && resume) {
    throw LohanError(status, "resume_job=true but you have no job named \"" +
                                 name +
                                 "\" on this daemon; start it without "
                                 "resume_job first (lohanctl jobs lists your "
                                 "jobs)");
  }
  if (status == LOHAN_ALREADY_EXISTS) {
    throw LohanError(status, std::string(lohan_last_error()) +
                                 " (a job named \"" + name +
                                 "\" exists: set resume_job to continue it, "
                                 "choose another job_name, or delete it "
                                 "with lohanctl)");
  }
  ThrowIfFailed(status);
  plane_.reset(plane);
  job_id_ = lohan_job_info_id(job);
  lohan_job_info_destroy(job);
  created_ = !resume;
}

lohan_model* JobSession::Register(const std::string& model_spec_json) {
  lohan_model* model = nullptr;
  ThrowIfFailed(lohan_model_register_json(client_.get(), plane_.get(),
                                          job_id_.c_str(),
                                          model_spec_json.c_str(), &model));
  model_.reset(model);
  registered_ = true;
  return model;
}

uint64_t JobSession::ArenaAsked() const {
  uint64_t asked = 0;
  if (model_ != nullptr) {
    ThrowIfFailed(lohan_model_arena_asked(model_.get(), &asked));
  }
  return asked;
}

JobSession::ShareMove JobSession::FollowShare() {
  ShareMove move;
  move.from_bytes = lohan_data_plane_arena_size(plane_.get());
  int moved = 0;
  const int status = lohan_job_follow_share(client_.get(), job_id_.c_str(),
                                            plane_.get(), model_.get(), &moved);
  move.moved = moved != 0;
  if (status != LOHAN_OK) {
    // Refused with nothing done (moved 0), or the old plane closed and no
    // new one (moved 1): the job has no data plane then.
    throw ShareMoveError(status, lohan_last_error(), move.moved);
  }
  move.to_bytes = lohan_data_plane_arena_size(plane_.get());
  return move;
}

lohan_steps* JobSession::StartSteps(const std::string& options_json) {
  lohan_steps* steps = nullptr;
  ThrowIfFailed(lohan_steps_create(model_.get(), options_json.c_str(), &steps));
  steps_.reset(steps);
  return steps;
}

void JobSession::Close(bool delete_job) {
  steps_.reset();
  model_.reset();
  plane_.reset();
  if (client_ == nullptr) return;
  // A job created here whose model never registered holds nothing worth
  // keeping.
  if (!job_id_.empty()) {
    lohan_job_close(client_.get(), job_id_.c_str(),
                    delete_job || (created_ && !registered_));
  }
  client_.reset();
}

}  // namespace lohan::torch_plugin
