#include "plugins/libtorch/job_session.h"

#include <chrono>
#include <string>
#include <thread>

#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {
namespace {

// How long Close() waits for the daemon to take back the arena (it does
// so as soon as it sees the data plane's connection close).
constexpr std::chrono::seconds kArenaReturnTimeout(30);

// The id of the caller's job named `name`, "" when there is none.
std::string FindJobId(lohan_client* client, const std::string& name) {
  lohan_job_list* list = nullptr;
  ThrowIfFailed(lohan_jobs_list(client, &list));
  JobListHandle owned(list);
  const uint32_t uid = lohan_client_caller_uid(client);
  for (size_t i = 0; i < lohan_job_list_size(list); ++i) {
    const lohan_job_info* job = lohan_job_list_get(list, i);
    if (lohan_job_info_name(job) == name &&
        lohan_job_info_owner_uid(job) == uid) {
      return lohan_job_info_id(job);
    }
  }
  return "";
}

}  // namespace

bool StatusListsArena(const std::string& status_json,
                      const std::string& job_id) {
  const size_t key = status_json.find("\"arenas\"");
  if (key == std::string::npos) return false;
  const size_t open = status_json.find('[', key);
  if (open == std::string::npos) return false;
  // The array's extent: brackets outside strings.
  int depth = 0;
  bool in_string = false;
  size_t close = open;
  for (; close < status_json.size(); ++close) {
    const char c = status_json[close];
    if (in_string) {
      if (c == '\\') {
        ++close;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[') {
      ++depth;
    } else if (c == ']' && --depth == 0) {
      break;
    }
  }
  return status_json.substr(open, close - open).find("\"" + job_id + "\"") !=
         std::string::npos;
}

JobSession::JobSession(const std::string& socket_path) {
  lohan_client* client = nullptr;
  ThrowIfFailed(lohan_client_connect(
      socket_path.empty() ? nullptr : socket_path.c_str(), &client));
  client_.reset(client);
}

JobSession::~JobSession() { Close(false); }

void JobSession::CreateAndOpen(const std::string& name,
                               const std::string& model_spec_json) {
  const std::string request = CreateJobRequestJson(name, model_spec_json);
  char* response = nullptr;
  const int status =
      lohan_job_create_json(client_.get(), request.c_str(), &response);
  if (status == LOHAN_ALREADY_EXISTS) {
    throw LohanError(status, std::string(lohan_last_error()) +
                                 " (a job named \"" + name +
                                 "\" exists: set resume_job to continue it, "
                                 "choose another job_name, or delete it "
                                 "with lohanctl)");
  }
  ThrowIfFailed(status);
  OwnedString owned_response(response);
  job_id_ = FindJobId(client_.get(), name);
  if (job_id_.empty()) {
    throw LohanError(LOHAN_INTERNAL, "lohand created the job \"" + name +
                                         "\" but does not list it");
  }
  created_ = true;
  AttachAndOpen();
}

void JobSession::FindAndOpen(const std::string& name) {
  job_id_ = FindJobId(client_.get(), name);
  if (job_id_.empty()) {
    throw LohanError(LOHAN_NOT_FOUND,
                     "resume_job=true but you have no job named \"" + name +
                         "\" on this daemon; start it without resume_job "
                         "first (lohanctl jobs lists your jobs)");
  }
  AttachAndOpen();
}

void JobSession::AttachAndOpen() {
  ThrowIfFailed(lohan_job_attach(client_.get(), job_id_.c_str(), nullptr));
  attached_ = true;
  // The daemon frees a job's arena when it sees the previous data plane's
  // connection close; a quick reopen can race it.
  const auto deadline = std::chrono::steady_clock::now() + kArenaReturnTimeout;
  while (true) {
    lohan_data_plane* plane = nullptr;
    const int status =
        lohan_data_plane_open(client_.get(), job_id_.c_str(), &plane);
    if (status == LOHAN_OK) {
      plane_.reset(plane);
      return;
    }
    if (status != LOHAN_ALREADY_EXISTS ||
        std::chrono::steady_clock::now() > deadline) {
      ThrowIfFailed(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
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

void JobSession::Close(bool delete_job) {
  model_.reset();
  if (plane_ != nullptr) {
    plane_.reset();
    WaitForArenaReturn();
  }
  if (client_ == nullptr) return;
  if (!job_id_.empty() && attached_) {
    lohan_job_detach(client_.get(), job_id_.c_str(), nullptr);
  }
  // A job created here whose model never registered holds nothing worth
  // keeping.
  if (!job_id_.empty() && (delete_job || (created_ && !registered_))) {
    lohan_job_delete(client_.get(), job_id_.c_str());
  }
  client_.reset();
}

void JobSession::WaitForArenaReturn() {
  const auto deadline = std::chrono::steady_clock::now() + kArenaReturnTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    char* status = nullptr;
    if (lohan_client_status_json(client_.get(), &status) != LOHAN_OK) {
      return;  // the daemon is gone: nothing to wait for
    }
    OwnedString owned(status);
    if (!StatusListsArena(status, job_id_)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace lohan::torch_plugin
