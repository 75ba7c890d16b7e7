#ifndef LOHAN_PLUGINS_LIBTORCH_HANDLES_H_
#define LOHAN_PLUGINS_LIBTORCH_HANDLES_H_

#include <memory>

#include "lohan/lohan_client.h"
#include "lohan/lohan_steps.h"

namespace lohan::torch_plugin {

// Owners of the C ABI's handles: each destroys its handle with the
// matching lohan_*_destroy (or frees its string).
struct ClientDestroyer {
  void operator()(lohan_client* client) const { lohan_client_destroy(client); }
};
struct DataPlaneDestroyer {
  void operator()(lohan_data_plane* plane) const {
    lohan_data_plane_destroy(plane);
  }
};
struct ModelDestroyer {
  void operator()(lohan_model* model) const { lohan_model_destroy(model); }
};
struct StepsDestroyer {
  void operator()(lohan_steps* steps) const { lohan_steps_destroy(steps); }
};
struct JobListDestroyer {
  void operator()(lohan_job_list* list) const { lohan_job_list_destroy(list); }
};
struct StringFreer {
  void operator()(char* text) const { lohan_string_free(text); }
};

using ClientHandle = std::unique_ptr<lohan_client, ClientDestroyer>;
using DataPlaneHandle = std::unique_ptr<lohan_data_plane, DataPlaneDestroyer>;
using ModelHandle = std::unique_ptr<lohan_model, ModelDestroyer>;
using StepsHandle = std::unique_ptr<lohan_steps, StepsDestroyer>;
using JobListHandle = std::unique_ptr<lohan_job_list, JobListDestroyer>;
using OwnedString = std::unique_ptr<char, StringFreer>;

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_HANDLES_H_
