// The C ABI over ControlClient, DataPlane, ArenaPinning, ModelChannel and
// the move between planes (share_move.h), translating only: NULL checks, C
// structs and JSON into protos, statuses into codes plus lohan_last_error(),
// out parameters. Nothing here may throw or abort: every entry point catches
// bad input and reports it as a status plus lohan_last_error().
#include "client/include/lohan/lohan_client.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/arena_pinning.h"
#include "client/c_abi_handles.h"
#include "client/control_client.h"
#include "client/cuda_copy.h"
#include "client/data_plane.h"
#include "client/job_lifecycle.h"
#include "client/model_channel.h"
#include "client/model_spec_from_c.h"
#include "client/plane_gone.h"
#include "client/proto_json.h"
#include "client/share_move.h"
#include "spec/model_spec_checks.h"
#include "wire/ring_entry.h"
#include "wire/version.h"

namespace {

using lohan::c_abi::CopyOut;
using lohan::c_abi::InvalidArgument;
using lohan::c_abi::NullModel;
using lohan::c_abi::Report;
using lohan::c_abi::ReturnTicket;

int ReturnJob(const absl::StatusOr<lohan::v1::Job>& job, lohan_job_info** out) {
  if (!job.ok()) return Report(job.status());
  if (out != nullptr) {
    *out = new (std::nothrow) lohan_job_info{*job};
    if (*out == nullptr) {
      return Report(absl::ResourceExhaustedError("out of memory"));
    }
  }
  return Report(absl::OkStatus());
}

// A data plane out of an open into a new handle in *out.
int ReturnPlane(absl::StatusOr<std::unique_ptr<lohan::DataPlane>> plane,
                lohan_data_plane** out) {
  if (!plane.ok()) return Report(plane.status());
  *out = new (std::nothrow) lohan_data_plane(*std::move(plane));
  if (*out == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  return Report(absl::OkStatus());
}

// READ_STATE / INIT_STATE: `call` with LOHAN_STATE_* `part` as the ring's.
template <typename Call>
int StateCall(lohan_model* model, int part, Call call) {
  if (model == nullptr) return NullModel();
  switch (part) {
    case LOHAN_STATE_EXP_AVG:
      return Report(call(lohan::RingStatePart::kExpAvg));
    case LOHAN_STATE_EXP_AVG_SQ:
      return Report(call(lohan::RingStatePart::kExpAvgSq));
    case LOHAN_STATE_MAX_EXP_AVG_SQ:
      return Report(call(lohan::RingStatePart::kMaxExpAvgSq));
  }
  return Report(absl::InvalidArgumentError(absl::StrCat(
      "part ", part,
      " is not LOHAN_STATE_EXP_AVG (1), LOHAN_STATE_EXP_AVG_SQ (2) or "
      "LOHAN_STATE_MAX_EXP_AVG_SQ (3)")));
}

// lohan_model_iter_end(_global)'s body: the outputs given (NULL allowed).
int IterEnd(lohan_model* model, std::optional<double> global_sum_squares,
            double* global_norm, int* clipped, int* skipped) {
  if (model == nullptr) return NullModel();
  absl::StatusOr<lohan::ModelChannel::IterEndResult> ended =
      model->channel->IterEnd(global_sum_squares);
  if (!ended.ok()) return Report(ended.status());
  if (global_norm != nullptr) *global_norm = ended->global_norm;
  if (clipped != nullptr) *clipped = ended->clipped ? 1 : 0;
  if (skipped != nullptr) *skipped = ended->skipped ? 1 : 0;
  return Report(absl::OkStatus());
}

}  // namespace

extern "C" {

const char* lohan_version(void) { return lohan::kLohanVersion; }

const char* lohan_last_error(void) { return lohan::c_abi::LastError().c_str(); }

const char* lohan_last_error_field(void) {
  return lohan::c_abi::LastErrorField().c_str();
}

const char* lohan_status_name(int status) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (status < 0 || status >= static_cast<int>(std::size(kNames))) {
    return "UNKNOWN";
  }
  return kNames[status];
}

int lohan_client_connect(const char* socket_path, lohan_client** out) {
  if (out == nullptr)
    return InvalidArgument("lohan_client_connect: out is NULL");
  lohan::ControlClient::Options options;
  if (socket_path != nullptr) options.socket_path = socket_path;
  auto client = lohan::ControlClient::Connect(std::move(options));
  if (!client.ok()) return Report(client.status());
  *out = new (std::nothrow) lohan_client{*std::move(client)};
  if (*out == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  return Report(absl::OkStatus());
}

void lohan_client_destroy(lohan_client* client) { delete client; }

const char* lohan_client_daemon_version(const lohan_client* client) {
  if (client == nullptr) return "";
  return client->impl->hello().daemon_version().c_str();
}

void lohan_client_protocol(const lohan_client* client, uint32_t* major,
                           uint32_t* minor) {
  if (client == nullptr) return;
  if (major != nullptr)
    *major = client->impl->hello().daemon_protocol().major();
  if (minor != nullptr)
    *minor = client->impl->hello().daemon_protocol().minor();
}

uint32_t lohan_client_caller_uid(const lohan_client* client) {
  return client == nullptr ? 0 : client->impl->hello().caller_uid();
}

int lohan_client_has_capability(const lohan_client* client,
                                const char* capability) {
  if (client == nullptr || capability == nullptr) return 0;
  for (const std::string& have : client->impl->hello().capabilities()) {
    if (have == capability) return 1;
  }
  return 0;
}

int lohan_job_create(lohan_client* client, const char* name,
                     uint64_t host_pool_bytes, uint64_t ssd_bytes,
                     lohan_job_info** out) {
  if (client == nullptr || name == nullptr) {
    return InvalidArgument("lohan_job_create: client and name are required");
  }
  lohan::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_host_pool_bytes(host_pool_bytes);
  spec.set_ssd_bytes(ssd_bytes);
  return ReturnJob(client->impl->CreateJob(spec), out);
}

int lohan_job_create_json(lohan_client* client, const char* request_json,
                          char** response_json_out) {
  if (client == nullptr || request_json == nullptr ||
      response_json_out == nullptr) {
    return InvalidArgument(
        "lohan_job_create_json: client, request_json and response_json_out "
        "are required");
  }
  lohan::v1::CreateJobRequest request;
  if (absl::Status parsed = lohan::FromJson(
          request_json, "lohan_job_create_json: request_json", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  absl::StatusOr<lohan::v1::CreateJobResponse> response =
      client->impl->CreateJobReply(request.spec());
  if (!response.ok()) return Report(response.status());
  absl::StatusOr<std::string> json =
      lohan::ToJson(*response, /*proto_names=*/true);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, response_json_out);
}

int lohan_job_attach(lohan_client* client, const char* job_id,
                     lohan_job_info** out) {
  if (client == nullptr || job_id == nullptr) {
    return InvalidArgument("lohan_job_attach: client and job_id are required");
  }
  return ReturnJob(client->impl->AttachJob(job_id), out);
}

int lohan_job_detach(lohan_client* client, const char* job_id,
                     lohan_job_info** out) {
  if (client == nullptr || job_id == nullptr) {
    return InvalidArgument("lohan_job_detach: client and job_id are required");
  }
  return ReturnJob(client->impl->DetachJob(job_id), out);
}

int lohan_job_delete(lohan_client* client, const char* job_id) {
  if (client == nullptr || job_id == nullptr) {
    return InvalidArgument("lohan_job_delete: client and job_id are required");
  }
  return Report(client->impl->DeleteJob(job_id));
}

int lohan_jobs_list(lohan_client* client, lohan_job_list** out) {
  if (client == nullptr || out == nullptr) {
    return InvalidArgument("lohan_jobs_list: client and out are required");
  }
  auto jobs = client->impl->ListJobs();
  if (!jobs.ok()) return Report(jobs.status());
  auto* list = new (std::nothrow) lohan_job_list;
  if (list == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  for (lohan::v1::Job& job : *jobs) list->jobs.push_back({std::move(job)});
  *out = list;
  return Report(absl::OkStatus());
}

size_t lohan_job_list_size(const lohan_job_list* list) {
  return list == nullptr ? 0 : list->jobs.size();
}

const lohan_job_info* lohan_job_list_get(const lohan_job_list* list, size_t i) {
  if (list == nullptr || i >= list->jobs.size()) return nullptr;
  return &list->jobs[i];
}

void lohan_job_list_destroy(lohan_job_list* list) { delete list; }

const char* lohan_job_info_id(const lohan_job_info* job) {
  return job == nullptr ? "" : job->job.id().c_str();
}

const char* lohan_job_info_name(const lohan_job_info* job) {
  return job == nullptr ? "" : job->job.spec().name().c_str();
}

uint32_t lohan_job_info_owner_uid(const lohan_job_info* job) {
  return job == nullptr ? 0 : job->job.owner_uid();
}

int lohan_job_info_state(const lohan_job_info* job) {
  return job == nullptr ? 0 : static_cast<int>(job->job.state());
}

int32_t lohan_job_info_attached_pid(const lohan_job_info* job) {
  return job == nullptr ? 0 : job->job.attached_pid();
}

void lohan_job_info_destroy(lohan_job_info* job) { delete job; }

int lohan_data_plane_open(lohan_client* client, const char* job_id,
                          lohan_data_plane** out) {
  if (client == nullptr || job_id == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_data_plane_open: client, job_id and out are required");
  }
  const std::string& path = client->impl->hello().data_socket_path();
  if (path.empty()) {
    return Report(
        absl::UnimplementedError("this lohand has no data plane; upgrade it"));
  }
  return ReturnPlane(lohan::DataPlane::Open(path, job_id), out);
}

int lohan_job_open(lohan_client* client, const char* request_json,
                   lohan_data_plane** plane_out, lohan_job_info** job_out,
                   char** response_json_out) {
  if (client == nullptr || request_json == nullptr || plane_out == nullptr) {
    return InvalidArgument(
        "lohan_job_open: client, request_json and plane_out are required");
  }
  lohan::v1::OpenJobRequest request;
  if (absl::Status parsed = lohan::FromJson(
          request_json, "lohan_job_open: request_json", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  absl::StatusOr<lohan::OpenedJob> opened =
      lohan::OpenJob(*client->impl, request);
  if (!opened.ok()) return Report(opened.status());
  std::string json;
  if (response_json_out != nullptr) {
    absl::StatusOr<std::string> text =
        lohan::ToJson(opened->response, /*proto_names=*/true);
    if (!text.ok()) return Report(text.status());
    json = *std::move(text);
  }
  std::unique_ptr<lohan_job_info> job(
      job_out == nullptr ? nullptr
                         : new (std::nothrow)
                               lohan_job_info{opened->response.job()});
  lohan_data_plane* plane = nullptr;
  if ((job_out != nullptr && job == nullptr) ||
      ReturnPlane(std::move(opened->plane), &plane) != LOHAN_OK) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  if (response_json_out != nullptr) {
    if (int copied = CopyOut(json, response_json_out); copied != LOHAN_OK) {
      lohan_data_plane_destroy(plane);
      return copied;
    }
  }
  if (job_out != nullptr) *job_out = job.release();
  *plane_out = plane;
  return Report(absl::OkStatus());
}

int lohan_job_reopen_data_plane(lohan_client* client, const char* job_id,
                                lohan_data_plane** out) {
  if (client == nullptr || job_id == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_job_reopen_data_plane: client, job_id and out are required");
  }
  return ReturnPlane(lohan::ReopenDataPlane(*client->impl, job_id), out);
}

int lohan_job_close(lohan_client* client, const char* job_id, int delete_job) {
  if (client == nullptr || job_id == nullptr) {
    return InvalidArgument("lohan_job_close: client and job_id are required");
  }
  return Report(lohan::CloseJob(*client->impl, job_id, delete_job != 0));
}

void* lohan_data_plane_arena(const lohan_data_plane* plane) {
  return plane == nullptr || plane->impl == nullptr ? nullptr
                                                    : plane->impl->arena();
}

uint64_t lohan_data_plane_arena_size(const lohan_data_plane* plane) {
  return plane == nullptr || plane->impl == nullptr
             ? 0
             : plane->impl->arena_bytes();
}

void lohan_data_plane_destroy(lohan_data_plane* plane) {
  if (plane == nullptr) return;
  // A callback still to run would use the plane after it is freed (and its
  // copy would DMA into unpinned or unmapped pages): wait for them. One
  // that never runs (a CUDA context torn down under it) leaves the plane
  // mapped rather than freed under it.
  if (!plane->cuda.AwaitCallbacks(absl::Seconds(60))) {
    std::fprintf(stderr,
                 "liblohan_client: %lld CUDA copies to or from the arena "
                 "never completed; the data plane is left mapped\n",
                 static_cast<long long>(plane->cuda.callbacks_left()));
    return;
  }
  delete plane;
}

namespace {

// Registers `spec` (whatever the caller described it in) and makes the
// model handle.
int RegisterSpec(lohan_client* client, lohan_data_plane* plane,
                 const char* job_id, const lohan::v1::ModelSpec& spec,
                 lohan_model** out) {
  if (plane->impl == nullptr) {
    return Report(lohan::PlaneGoneError("registering the model"));
  }
  absl::StatusOr<std::unique_ptr<lohan::ModelChannel>> channel =
      lohan::ModelChannel::Register(*client->impl, *plane->impl,
                                    plane->cuda.callbacks_pending(), job_id,
                                    spec);
  if (!channel.ok()) return Report(channel.status());
  auto model = std::make_unique<lohan_model>();
  model->channel = *std::move(channel);
  *out = model.release();
  return Report(absl::OkStatus());
}

}  // namespace

int lohan_model_register(lohan_client* client, lohan_data_plane* plane,
                         const char* job_id, const lohan_model_spec* spec,
                         lohan_model** out) {
  if (client == nullptr || plane == nullptr || job_id == nullptr ||
      spec == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_model_register: client, plane, job_id, spec and out are "
        "required");
  }
  lohan::v1::ModelSpec model_spec;
  if (absl::Status translated = lohan::SpecFromC(*spec, &model_spec);
      !translated.ok()) {
    return Report(translated);
  }
  return RegisterSpec(client, plane, job_id, model_spec, out);
}

int lohan_model_spec_json(const lohan_model_spec* spec, char** json_out) {
  if (spec == nullptr || json_out == nullptr) {
    return InvalidArgument(
        "lohan_model_spec_json: spec and json_out are "
        "required");
  }
  lohan::v1::ModelSpec model_spec;
  if (absl::Status translated = lohan::SpecFromC(*spec, &model_spec);
      !translated.ok()) {
    return Report(translated);
  }
  if (absl::Status checked = lohan::CheckModelSpec(model_spec); !checked.ok()) {
    return Report(checked);
  }
  absl::StatusOr<std::string> json =
      lohan::ToJson(model_spec, /*proto_names=*/true);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, json_out);
}

int lohan_model_spec_check_settings(const lohan_model_spec* spec) {
  if (spec == nullptr) {
    return InvalidArgument("lohan_model_spec_check_settings: spec is NULL");
  }
  lohan::v1::ModelSpec settings;
  if (absl::Status translated = lohan::SettingsFromC(*spec, &settings);
      !translated.ok()) {
    return Report(translated);
  }
  return Report(lohan::CheckSpecSettings(settings));
}

int lohan_model_spec_check_settings_json(const char* spec_json) {
  if (spec_json == nullptr) {
    return InvalidArgument(
        "lohan_model_spec_check_settings_json: spec_json is NULL");
  }
  lohan::v1::ModelSpec settings;
  if (absl::Status parsed = lohan::FromJson(
          spec_json, "lohan_model_spec_check_settings_json: spec_json",
          &settings);
      !parsed.ok()) {
    return Report(parsed);
  }
  return Report(lohan::CheckSpecSettings(settings));
}

int lohan_model_register_json(lohan_client* client, lohan_data_plane* plane,
                              const char* job_id, const char* spec_json,
                              lohan_model** out) {
  if (client == nullptr || plane == nullptr || job_id == nullptr ||
      spec_json == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_model_register_json: client, plane, job_id, spec_json and out "
        "are required");
  }
  lohan::v1::ModelSpec spec;
  if (absl::Status parsed = lohan::FromJson(
          spec_json, "lohan_model_register_json: spec_json", &spec);
      !parsed.ok()) {
    return Report(parsed);
  }
  return RegisterSpec(client, plane, job_id, spec, out);
}

void lohan_model_destroy(lohan_model* model) {
  std::unique_ptr<lohan_model> owned(model);
}

// ---- Following lohand's share of the host pool

int lohan_model_arena_asked(const lohan_model* model, uint64_t* bytes) {
  if (model == nullptr || bytes == nullptr) {
    return InvalidArgument(
        "lohan_model_arena_asked: model and bytes are required");
  }
  *bytes = model->channel->arena_asked();
  return Report(absl::OkStatus());
}

int lohan_job_follow_share(lohan_client* client, const char* job_id,
                           lohan_data_plane* plane, lohan_model* model,
                           int* moved) {
  if (client == nullptr || job_id == nullptr || plane == nullptr ||
      model == nullptr || moved == nullptr) {
    return InvalidArgument(
        "lohan_job_follow_share: client, job_id, plane, model and moved are "
        "required");
  }
  const bool had_plane = plane->impl != nullptr;
  absl::StatusOr<bool> followed = lohan::FollowShare(
      *client->impl, job_id, plane->impl, plane->cuda, *model->channel);
  // A failed move that closed the old plane moved the job off it.
  *moved = followed.ok() ? (*followed ? 1 : 0)
                         : (had_plane && plane->impl == nullptr ? 1 : 0);
  return Report(followed.status());
}

// ---- The registration's layout

uint32_t lohan_model_grad_slots(const lohan_model* model) {
  return model == nullptr ? 0 : model->channel->grad_slots();
}

uint32_t lohan_model_weight_slots(const lohan_model* model) {
  return model == nullptr ? 0 : model->channel->weight_slots();
}

uint64_t lohan_model_iteration(const lohan_model* model) {
  return model == nullptr ? 0 : model->channel->iteration();
}

int lohan_model_layer_initialized(const lohan_model* model, uint32_t layer) {
  return model != nullptr && model->channel->layer_initialized(layer) ? 1 : 0;
}

int lohan_model_previous_commit_kept(const lohan_model* model) {
  return model != nullptr && model->channel->previous_commit_kept() ? 1 : 0;
}

void* lohan_model_grad_buffer(const lohan_model* model, uint32_t layer) {
  if (model == nullptr) return nullptr;
  absl::StatusOr<uint8_t*> buffer = model->channel->GradBuffer(layer);
  return buffer.ok() ? *buffer : nullptr;
}

void* lohan_model_weight_buffer(const lohan_model* model, uint32_t layer) {
  if (model == nullptr) return nullptr;
  absl::StatusOr<uint8_t*> buffer = model->channel->WeightBuffer(layer);
  return buffer.ok() ? *buffer : nullptr;
}

uint64_t lohan_model_layer_bytes(const lohan_model* model, uint32_t layer) {
  if (model == nullptr) return 0;
  absl::StatusOr<uint64_t> bytes = model->channel->LayerBytes(layer);
  return bytes.ok() ? *bytes : 0;
}

float* lohan_model_staging(const lohan_model* model) {
  return model == nullptr ? nullptr : model->channel->staging();
}

uint64_t lohan_model_staging_bytes(const lohan_model* model) {
  return model == nullptr ? 0 : model->channel->staging_bytes();
}

void* lohan_model_activation_buffer(const lohan_model* model, uint64_t* bytes) {
  uint8_t* area =
      model == nullptr ? nullptr : model->channel->activation_area();
  if (bytes != nullptr) {
    *bytes = area == nullptr ? 0 : model->channel->activation_bytes();
  }
  return area;
}

// ---- The staging buffer

int lohan_model_init_weights(lohan_model* model, uint32_t layer) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->InitWeights(layer));
}

int lohan_model_read_weights(lohan_model* model, uint32_t layer) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->ReadWeights(layer));
}

int lohan_model_read_state(lohan_model* model, uint32_t layer, int part) {
  return StateCall(model, part, [&](lohan::RingStatePart ring_part) {
    return model->channel->ReadState(layer, ring_part);
  });
}

int lohan_model_init_state(lohan_model* model, uint32_t layer, int part) {
  return StateCall(model, part, [&](lohan::RingStatePart ring_part) {
    return model->channel->InitState(layer, ring_part);
  });
}

// ---- Iterations

int lohan_model_iter_begin(lohan_model* model) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->IterBegin());
}

int lohan_model_iter_begin_with(lohan_model* model, float grad_scale,
                                double lr) {
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return InvalidArgument("grad_scale must be finite and > 0");
  }
  if (!std::isfinite(lr)) {
    return InvalidArgument(
        "lr must be finite: >= 0, or LOHAN_LR_REGISTERED (< 0) for the "
        "registered one");
  }
  if (model == nullptr) return NullModel();
  return Report(model->channel->IterBegin(
      grad_scale, lr >= 0.0 ? std::optional<double>(lr) : std::nullopt));
}

int lohan_model_iter_end(lohan_model* model, double* global_norm, int* clipped,
                         int* skipped) {
  return IterEnd(model, std::nullopt, global_norm, clipped, skipped);
}

int lohan_model_iter_end_global(lohan_model* model, double global_sum_squares,
                                double* global_norm, int* clipped,
                                int* skipped) {
  return IterEnd(model, global_sum_squares, global_norm, clipped, skipped);
}

int lohan_model_iter_abort(lohan_model* model) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->IterAbort());
}

int lohan_model_release_previous_commit(lohan_model* model) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->ReleasePreviousCommit());
}

int lohan_model_await_committed(lohan_model* model, uint64_t* iteration) {
  if (model == nullptr) return NullModel();
  absl::StatusOr<uint64_t> committed = model->channel->AwaitCommitted();
  if (committed.ok() && iteration != nullptr) *iteration = *committed;
  return Report(committed.status());
}

// ---- Layers and activations, synchronous

int lohan_model_fetch_params(lohan_model* model, uint32_t layer) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->FetchParams(layer));
}

int lohan_model_grad_ready(lohan_model* model, uint32_t layer) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->GradReady(layer));
}

int lohan_model_act_put(lohan_model* model, uint64_t id, uint64_t offset,
                        uint64_t length) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->ActPut(id, offset, length));
}

int lohan_model_act_get(lohan_model* model, uint64_t id, uint64_t offset,
                        uint64_t length) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->ActGet(id, offset, length));
}

int lohan_model_act_free(lohan_model* model, uint64_t id) {
  if (model == nullptr) return NullModel();
  return Report(model->channel->ActFree(id));
}

int lohan_client_status_json(lohan_client* client, char** json_out) {
  if (client == nullptr || json_out == nullptr) {
    return InvalidArgument(
        "lohan_client_status_json: client and json_out are required");
  }
  auto status = client->impl->GetStatus();
  if (!status.ok()) return Report(status.status());
  absl::StatusOr<std::string> json =
      lohan::ToJson(*status, /*proto_names=*/true);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, json_out);
}

int lohan_job_plan_json(lohan_client* client, const char* job_id,
                        const char* request_json, char** plan_json_out) {
  if (client == nullptr || job_id == nullptr || request_json == nullptr ||
      plan_json_out == nullptr) {
    return InvalidArgument(
        "lohan_job_plan_json: client, job_id, request_json and "
        "plan_json_out are required");
  }
  lohan::v1::PlanJobRequest request;
  if (absl::Status parsed = lohan::FromJson(
          request_json, "lohan_job_plan_json: request_json", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  request.set_job_id(job_id);
  absl::StatusOr<lohan::v1::JobPlan> plan = client->impl->PlanJob(request);
  if (!plan.ok()) return Report(plan.status());
  absl::StatusOr<std::string> json =
      lohan::ToJson(*plan, /*proto_names=*/false);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, plan_json_out);
}

int lohan_job_kept_plan_json(lohan_client* client, const char* job_id,
                             char** plan_json_out) {
  if (client == nullptr || job_id == nullptr || plan_json_out == nullptr) {
    return InvalidArgument(
        "lohan_job_kept_plan_json: client, job_id and plan_json_out are "
        "required");
  }
  absl::StatusOr<lohan::v1::JobPlan> plan = client->impl->GetJobPlan(job_id);
  if (!plan.ok()) return Report(plan.status());
  absl::StatusOr<std::string> json =
      lohan::ToJson(*plan, /*proto_names=*/false);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, plan_json_out);
}

void lohan_string_free(char* text) { std::free(text); }

// ---- Asynchronous requests

int lohan_model_submit_grad_ready(lohan_model* model, uint32_t layer,
                                  uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  return ReturnTicket(model->channel->SubmitGradReady(layer), ticket);
}

int lohan_model_submit_fetch_params(lohan_model* model, uint32_t layer,
                                    uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  return ReturnTicket(model->channel->SubmitFetchParams(layer), ticket);
}

int lohan_model_submit_act_put(lohan_model* model, uint64_t id, uint64_t offset,
                               uint64_t length, uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  return ReturnTicket(model->channel->SubmitActPut(id, offset, length), ticket);
}

int lohan_model_submit_act_put_from_device(lohan_model* model, uint64_t id,
                                           uint64_t offset, uint64_t length,
                                           int device,
                                           const void* device_source,
                                           void* cuda_stream,
                                           uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  if (device < 0) {
    return InvalidArgument(
        "lohan_model_submit_act_put_from_device: device must be >= 0");
  }
  if (device_source == nullptr) {
    return InvalidArgument(
        "lohan_model_submit_act_put_from_device: device_source is NULL");
  }
  return ReturnTicket(
      model->channel->SubmitActPutFromDevice(id, offset, length, device,
                                             device_source, cuda_stream),
      ticket);
}

int lohan_model_submit_act_get(lohan_model* model, uint64_t id, uint64_t offset,
                               uint64_t length, uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  return ReturnTicket(model->channel->SubmitActGet(id, offset, length), ticket);
}

int lohan_model_submit_act_free(lohan_model* model, uint64_t id,
                                uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  if (model == nullptr) return NullModel();
  return ReturnTicket(model->channel->SubmitActFree(id), ticket);
}

int lohan_model_wait(lohan_model* model, uint64_t ticket, int64_t timeout_ms) {
  if (model == nullptr) {
    return InvalidArgument("lohan_model_wait: model is NULL");
  }
  const absl::Duration timeout = timeout_ms < 0
                                     ? absl::InfiniteDuration()
                                     : absl::Milliseconds(timeout_ms);
  return Report(model->channel->Wait(ticket, timeout));
}

int lohan_model_poll(lohan_model* model, uint64_t ticket, int* done) {
  if (model == nullptr || done == nullptr) {
    return InvalidArgument("lohan_model_poll: model and done are required");
  }
  absl::StatusOr<bool> polled = model->channel->Poll(ticket);
  if (!polled.ok()) return Report(polled.status());
  *done = *polled ? 1 : 0;
  return Report(absl::OkStatus());
}

// ---- Moving tensors between the caller's memory and the arena

int lohan_model_grad_ready_from_host(lohan_model* model, uint32_t layer,
                                     const void* source, uint64_t bytes,
                                     uint64_t* ticket) {
  if (model == nullptr || source == nullptr || ticket == nullptr) {
    return InvalidArgument(
        "lohan_model_grad_ready_from_host: model, source and ticket are "
        "required");
  }
  return ReturnTicket(model->channel->GradReadyFromHost(layer, source, bytes),
                      ticket);
}

int lohan_model_weights_to_host(const lohan_model* model, uint32_t layer,
                                void* destination, uint64_t bytes) {
  if (model == nullptr || destination == nullptr) {
    return InvalidArgument(
        "lohan_model_weights_to_host: model and destination are required");
  }
  return Report(model->channel->WeightsToHost(layer, destination, bytes));
}

}  // extern "C"
