// The C ABI over ControlClient. Nothing here may throw or abort: every entry
// point catches bad input and reports it as a status plus lohan_last_error().
#include "client/include/lohan/lohan_client.h"

#include <google/protobuf/util/json_util.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/control_client.h"
#include "client/cuda_copy.h"
#include "client/data_plane.h"
#include "wire/ring_entry.h"
#include "wire/version.h"

struct lohan_client {
  std::unique_ptr<lohan::ControlClient> impl;
};

struct lohan_job_info {
  lohan::v1::Job job;
};

struct lohan_data_plane {
  std::unique_ptr<lohan::DataPlane> impl;
  bool cuda_registered = false;  // lohan_data_plane_cuda_register*
  // The device it was registered on (kUnspecifiedDevice: the thread's
  // current one); unregistered there too.
  int cuda_device = lohan::cuda::kUnspecifiedDevice;
  // CUDA copies whose stream callback has not finished: each still touches
  // the plane (and the copy the arena), so destroy waits for them. Plain
  // atomic, polled: the callback's decrement is its very last touch.
  std::atomic<int64_t> callbacks_pending{0};
};

struct lohan_model {
  lohan::DataPlane* plane;
  std::atomic<int64_t>* callbacks_pending;  // the plane's
  lohan::v1::RegisterModelResponse registration;
  std::vector<uint64_t> elements;
  uint64_t element_bytes = 0;
  lohan::RingDtype ring_dtype = lohan::RingDtype::kNone;
  uint64_t sequence = 0;  // the next ITER_BEGIN's number
  // An ITER_BEGIN succeeded and no ITER_END / ITER_ABORT went out since:
  // only then does ending one move `sequence` on (a refused end, with no
  // iteration begun, does not).
  bool in_iteration = false;
};

struct lohan_job_list {
  std::vector<lohan_job_info> jobs;
};

namespace {

thread_local std::string last_error;

int Report(const absl::Status& status) {
  if (status.ok()) {
    last_error.clear();
    return LOHAN_OK;
  }
  last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

int InvalidArgument(const char* what) {
  return Report(absl::InvalidArgumentError(what));
}

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

// A malloc'ed copy of `text` in *out (lohan_string_free frees it).
int CopyOut(const std::string& text, char** out) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  std::memcpy(copy, text.c_str(), text.size() + 1);
  *out = copy;
  return Report(absl::OkStatus());
}

// `json` (protobuf JSON: the proto's names, snake_case or lowerCamelCase)
// into `message`; INVALID_ARGUMENT with the parser's words, naming `what`.
absl::Status FromJson(const char* json, absl::string_view what,
                      google::protobuf::Message* message) {
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(json, message);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is not a ", message->GetDescriptor()->name(), ": ",
      absl::string_view(parsed.message().data(), parsed.message().size())));
}

// `message` as protobuf JSON with every field, named lowerCamelCase or,
// with `proto_names`, as the proto spells them.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool proto_names) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = proto_names;
  print.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, print)
           .ok()) {
    return absl::InternalError(absl::StrCat(
        "cannot render a ", message.GetDescriptor()->name(), " as JSON"));
  }
  return json;
}

}  // namespace

extern "C" {

const char* lohan_version(void) { return lohan::kLohanVersion; }

const char* lohan_last_error(void) { return last_error.c_str(); }

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
  if (absl::Status parsed = FromJson(
          request_json, "lohan_job_create_json: request_json", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  absl::StatusOr<lohan::v1::CreateJobResponse> response =
      client->impl->CreateJobReply(request.spec());
  if (!response.ok()) return Report(response.status());
  absl::StatusOr<std::string> json = ToJson(*response, /*proto_names=*/true);
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
  auto plane = lohan::DataPlane::Open(path, job_id);
  if (!plane.ok()) return Report(plane.status());
  *out = new (std::nothrow) lohan_data_plane{*std::move(plane)};
  if (*out == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  return Report(absl::OkStatus());
}

void* lohan_data_plane_arena(const lohan_data_plane* plane) {
  return plane == nullptr ? nullptr : plane->impl->arena();
}

uint64_t lohan_data_plane_arena_size(const lohan_data_plane* plane) {
  return plane == nullptr ? 0 : plane->impl->arena_bytes();
}

void lohan_data_plane_destroy(lohan_data_plane* plane) {
  if (plane == nullptr) return;
  // A callback still to run would use the plane after it is freed (and its
  // copy would DMA into unpinned or unmapped pages): wait for them. One
  // that never runs (a CUDA context torn down under it) leaves the plane
  // mapped rather than freed under it.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (plane->callbacks_pending.load(std::memory_order_acquire) > 0) {
    if (absl::Now() >= deadline) {
      std::fprintf(stderr,
                   "liblohan_client: %lld CUDA copies to or from the arena "
                   "never completed; the data plane is left mapped\n",
                   static_cast<long long>(plane->callbacks_pending.load()));
      return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (plane->cuda_registered) {
    (void)lohan::cuda::UnregisterHost(plane->impl->arena(), plane->cuda_device);
  }
  delete plane;
}

namespace {

// An ITER_END waits for every layer's update; generous, not infinite.
constexpr absl::Duration kRingCallTimeout = absl::Hours(24);

int Finish(lohan_model* model, const lohan::SubmissionEntry& entry,
           lohan::CompletionEntry* completion_out) {
  absl::StatusOr<lohan::CompletionEntry> completion =
      model->plane->Call(entry, kRingCallTimeout);
  if (!completion.ok()) return Report(completion.status());
  if (completion_out != nullptr) *completion_out = *completion;
  return Report(absl::OkStatus());
}

int SubmitEntry(lohan_model* model, const lohan::SubmissionEntry& entry,
                uint64_t* ticket) {
  absl::StatusOr<lohan::DataPlane::Ticket> submitted =
      model->plane->Submit(entry, kRingCallTimeout);
  if (!submitted.ok()) return Report(submitted.status());
  *ticket = *submitted;
  return Report(absl::OkStatus());
}

// `ticket` NULL: submit and wait; else submit and hand out the ticket.
int ActivationCall(lohan_model* model, lohan::RingOp op, uint64_t id,
                   uint64_t offset, uint64_t length,
                   uint64_t* ticket = nullptr) {
  if (model == nullptr) return InvalidArgument("model is NULL");
  const uint64_t area = model->registration.activation_bytes();
  if (op != lohan::RingOp::kActFree &&
      (offset > area || length > area - offset || length == 0)) {
    return InvalidArgument(
        "activation range outside the model's activation area");
  }
  lohan::SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(op);
  entry.activation_id = id;
  if (op != lohan::RingOp::kActFree) {
    entry.slot_offset = model->registration.activation_offset() + offset;
    entry.length = length;
  }
  if (ticket != nullptr) return SubmitEntry(model, entry, ticket);
  return Finish(model, entry, nullptr);
}

// Fills `entry` for `op` on `layer`; LOHAN_OK or a reported error.
int BuildEntry(const lohan_model* model, lohan::RingOp op, uint32_t layer,
               lohan::SubmissionEntry& entry, float grad_scale = 0.0f,
               double lr = LOHAN_LR_REGISTERED) {
  if (model == nullptr) return InvalidArgument("model is NULL");
  entry = lohan::SubmissionEntry{};
  entry.op = static_cast<uint16_t>(op);
  switch (op) {
    case lohan::RingOp::kInitWeights:
    case lohan::RingOp::kReadWeights:
    case lohan::RingOp::kReadState:
    case lohan::RingOp::kInitState:
      if (layer >= model->elements.size()) {
        return InvalidArgument("layer out of range");
      }
      entry.layer = layer;
      entry.slot_offset = model->registration.staging_offset();
      entry.length = model->elements[layer] * 4;
      break;
    case lohan::RingOp::kFetchParams:
    case lohan::RingOp::kGradReady: {
      if (layer >= model->elements.size()) {
        return InvalidArgument("layer out of range");
      }
      const auto& slots = model->registration.layers(layer);
      entry.layer = layer;
      entry.length = slots.bytes();
      if (op == lohan::RingOp::kGradReady) {
        entry.slot_offset = slots.grad_offset();
        entry.dtype = static_cast<uint16_t>(model->ring_dtype);
      } else {
        entry.slot_offset = slots.weight_offset();
      }
      break;
    }
    case lohan::RingOp::kIterBegin:
      entry.grad_scale = grad_scale;
      if (lr >= 0.0) {
        entry.lr = lr;
        entry.iter_flags = lohan::kIterBeginLrGiven;
      }
      entry.iteration = model->sequence;
      break;
    case lohan::RingOp::kIterEnd:
    case lohan::RingOp::kIterAbort:
      entry.iteration = model->sequence;
      break;
    default:
      return InvalidArgument("unsupported ring op");
  }
  return LOHAN_OK;
}

// A FETCH_PARAMS refills the layer's weight buffer: it takes the buffer
// once no request uses it any more (a copy to a GPU still reading it, a
// shared buffer's earlier fetch) and is submitted under that ticket, so no
// other request can take the buffer in between.
absl::StatusOr<lohan::DataPlane::Ticket> SubmitRefill(
    lohan_model* model, const lohan::SubmissionEntry& entry) {
  absl::StatusOr<lohan::DataPlane::Ticket> reserved =
      model->plane->Reserve(entry.slot_offset, entry.length, kRingCallTimeout);
  if (!reserved.ok()) return reserved.status();
  if (absl::Status submitted =
          model->plane->SubmitReserved(*reserved, entry, kRingCallTimeout);
      !submitted.ok()) {
    model->plane->Abandon(*reserved);  // its result is this failure
    return submitted;
  }
  return *reserved;
}

bool IsRefill(const lohan::SubmissionEntry& entry) {
  return static_cast<lohan::RingOp>(entry.op) == lohan::RingOp::kFetchParams;
}

int RingCall(lohan_model* model, lohan::RingOp op, uint32_t layer,
             lohan::CompletionEntry* completion_out = nullptr,
             float grad_scale = 0.0f, double lr = LOHAN_LR_REGISTERED) {
  lohan::SubmissionEntry entry;
  if (int built = BuildEntry(model, op, layer, entry, grad_scale, lr);
      built != LOHAN_OK) {
    return built;
  }
  if (!IsRefill(entry)) return Finish(model, entry, completion_out);
  absl::StatusOr<lohan::DataPlane::Ticket> ticket = SubmitRefill(model, entry);
  if (!ticket.ok()) return Report(ticket.status());
  absl::StatusOr<lohan::CompletionEntry> completion =
      model->plane->Wait(*ticket, kRingCallTimeout);
  if (absl::IsDeadlineExceeded(completion.status())) {
    model->plane->Abandon(*ticket);
  }
  if (!completion.ok()) return Report(completion.status());
  if (completion_out != nullptr) *completion_out = *completion;
  return Report(absl::OkStatus());
}

int SubmitRing(lohan_model* model, lohan::RingOp op, uint32_t layer,
               uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  lohan::SubmissionEntry entry;
  if (int built = BuildEntry(model, op, layer, entry); built != LOHAN_OK) {
    return built;
  }
  if (!IsRefill(entry)) return SubmitEntry(model, entry, ticket);
  absl::StatusOr<lohan::DataPlane::Ticket> submitted =
      SubmitRefill(model, entry);
  if (!submitted.ok()) return Report(submitted.status());
  *ticket = *submitted;
  return Report(absl::OkStatus());
}

// The entry that hands over (kGradReady) or fills (kFetchParams) `layer`'s
// buffer, after checking that `bytes` is the layer's size.
int LayerEntry(const lohan_model* model, lohan::RingOp op, uint32_t layer,
               uint64_t bytes, lohan::SubmissionEntry& entry) {
  if (int built = BuildEntry(model, op, layer, entry); built != LOHAN_OK) {
    return built;
  }
  if (bytes != entry.length) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " has ", entry.length, " bytes of ",
                     op == lohan::RingOp::kGradReady ? "gradient" : "weights",
                     ", not ", bytes)));
  }
  return LOHAN_OK;
}

// (layer, begin, end) triples into `ranges`; INVALID_ARGUMENT for a layer
// that cannot be one (the daemon checks the rest).
absl::Status CopyRanges(
    const uint64_t* triples, uint32_t count, absl::string_view what,
    uint32_t layers,
    google::protobuf::RepeatedPtrField<lohan::v1::ElementRange>* ranges) {
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t* triple = triples + 3 * size_t{i};
    if (triple[0] > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("lohan_model_register: ", what, " range ", i, " (layer ",
                       triple[0], ", [", triple[1], ", ", triple[2],
                       ")): the model has ", layers, " layers"));
    }
    lohan::v1::ElementRange* range = ranges->Add();
    range->set_layer(static_cast<uint32_t>(triple[0]));
    range->set_begin(triple[1]);
    range->set_end(triple[2]);
  }
  return absl::OkStatus();
}

// A copy between the GPU and the arena, holding the arena bytes it touches
// (a reserved ticket) until it is done. Its callback runs on a CUDA thread
// and must not lock or wait (CUDA forbids waiting in host functions: it
// would hold up the stream), so it only delivers the hand-off, made up
// front, to the data plane's submitter: for a gradient that submits its
// GRAD_READY (or fails the ticket with the copy's error); for weights it
// releases the bytes. No CUDA calls in there either.
struct PendingCopy {
  lohan::DataPlane* plane;
  std::unique_ptr<lohan::DataPlane::HandOff> handoff;
  std::atomic<int64_t>* callbacks_pending;
};

void DeliverWhenCopied(void* argument, absl::Status copied) {
  std::unique_ptr<PendingCopy> pending(static_cast<PendingCopy*>(argument));
  std::atomic<int64_t>* counter = pending->callbacks_pending;
  pending->plane->Deliver(std::move(pending->handoff), std::move(copied));
  pending.reset();
  // The callback's last touch of anything the plane owns.
  counter->fetch_sub(1, std::memory_order_release);
}

// Reserves the entry's arena bytes (its slot), then enqueues on `stream` the
// copy between them and `device` (to the host: a gradient, GRAD_READY
// submitted once it is done; else weights, the bytes released once read),
// on CUDA device `device_index` (kUnspecifiedDevice: the pointer's).
// The reservation's ticket, or the error, with nothing left in flight.
absl::StatusOr<lohan::DataPlane::Ticket> CopyHoldingBuffer(
    const lohan_model* model, const lohan::SubmissionEntry& entry, bool to_host,
    void* device, int device_index, void* stream) {
  lohan::DataPlane* plane = model->plane;
  absl::StatusOr<lohan::DataPlane::Ticket> reserved =
      plane->Reserve(entry.slot_offset, entry.length, kRingCallTimeout);
  if (!reserved.ok()) return reserved.status();
  auto handoff = std::unique_ptr<lohan::DataPlane::HandOff>(
      new (std::nothrow) lohan::DataPlane::HandOff);
  auto pending = std::unique_ptr<PendingCopy>(
      handoff == nullptr ? nullptr
                         : new (std::nothrow) PendingCopy{
                               plane, nullptr, model->callbacks_pending});
  if (pending == nullptr) {
    plane->Cancel(*reserved);
    return absl::ResourceExhaustedError("out of memory");
  }
  handoff->ticket = *reserved;
  handoff->submit = to_host;  // a gradient's GRAD_READY; weights: release
  handoff->entry = entry;
  pending->handoff = std::move(handoff);
  uint8_t* buffer = plane->arena() + entry.slot_offset;
  model->callbacks_pending->fetch_add(1, std::memory_order_relaxed);
  absl::Status copied =
      to_host ? lohan::cuda::CopyToHostThen(buffer, device, entry.length,
                                            device_index, stream,
                                            &DeliverWhenCopied, pending.get())
              : lohan::cuda::CopyToDeviceThen(
                    device, buffer, entry.length, device_index, stream,
                    &DeliverWhenCopied, pending.get());
  if (!copied.ok()) {
    plane->Cancel(*reserved);  // nothing is in flight: the bytes are free
    model->callbacks_pending->fetch_sub(1, std::memory_order_relaxed);
    return copied;
  }
  (void)pending.release();  // the callback owns it now
  return *reserved;
}

}  // namespace

namespace {

// The C spec as the proto the daemon takes; INVALID_ARGUMENT for what the
// struct cannot mean (a size it does not know, NULL arrays with counts).
absl::Status SpecFromC(const lohan_model_spec* spec,
                       lohan::v1::ModelSpec* model_spec) {
  // A caller built against an older header passes the smaller struct it
  // knows (without grad_slots / weight_slots): read only what it has.
  constexpr size_t kSpecBytesV1 = offsetof(lohan_model_spec, grad_slots);
  if (spec->struct_size < kSpecBytesV1) {
    return absl::InvalidArgumentError(
        "lohan_model_register: spec->struct_size is smaller than any "
        "lohan_model_spec; set it to sizeof(lohan_model_spec)");
  }
  const bool has_slots =
      spec->struct_size >=
      offsetof(lohan_model_spec, weight_slots) + sizeof(spec->weight_slots);
  const bool has_initial_iteration =
      spec->struct_size >= offsetof(lohan_model_spec, initial_iteration) +
                               sizeof(spec->initial_iteration);
  const bool has_no_weight_decay =
      spec->struct_size >= offsetof(lohan_model_spec, num_no_weight_decay) +
                               sizeof(spec->num_no_weight_decay);
  const uint32_t num_no_weight_decay =
      has_no_weight_decay ? spec->num_no_weight_decay : 0;
  const bool has_param_groups =
      spec->struct_size >= offsetof(lohan_model_spec, num_param_groups) +
                               sizeof(spec->num_param_groups);
  const uint32_t num_param_groups =
      has_param_groups ? spec->num_param_groups : 0;
  const bool has_overlap =
      spec->struct_size >= offsetof(lohan_model_spec, overlap_updates) +
                               sizeof(spec->overlap_updates);
  const bool has_clip_schedule =
      spec->struct_size >=
      offsetof(lohan_model_spec, clip_schedule) + sizeof(spec->clip_schedule);
  const bool has_in_order =
      spec->struct_size >= offsetof(lohan_model_spec, in_order_service) +
                               sizeof(spec->in_order_service);
  if (spec->num_layers == 0 || spec->layer_elements == nullptr) {
    return absl::InvalidArgumentError(
        "lohan_model_register: a model needs layers");
  }
  if (num_no_weight_decay != 0 && spec->no_weight_decay == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("lohan_model_register: spec->no_weight_decay is NULL but "
                     "num_no_weight_decay is ",
                     num_no_weight_decay));
  }
  if (num_param_groups != 0 && spec->param_groups == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("lohan_model_register: spec->param_groups is NULL but "
                     "num_param_groups is ",
                     num_param_groups));
  }
  for (uint32_t g = 0; g < num_param_groups; ++g) {
    if (spec->param_groups[g].num_ranges != 0 &&
        spec->param_groups[g].ranges == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("lohan_model_register: param_groups[", g,
                       "].ranges is NULL but num_ranges is ",
                       spec->param_groups[g].num_ranges));
    }
  }
  for (uint32_t i = 0; i < spec->num_layers; ++i) {
    model_spec->add_layer_elements(spec->layer_elements[i]);
  }
  model_spec->set_dtype(static_cast<lohan::v1::DType>(spec->dtype));
  lohan::v1::AdamSpec* adam = model_spec->mutable_adam();
  adam->set_lr(spec->lr);
  adam->set_beta1(spec->beta1);
  adam->set_beta2(spec->beta2);
  adam->set_eps(spec->eps);
  adam->set_weight_decay(spec->weight_decay);
  adam->set_decoupled_weight_decay(spec->adamw != 0);
  adam->set_amsgrad(spec->amsgrad != 0);
  adam->set_bf16_moments(spec->bf16_moments != 0);
  model_spec->set_max_grad_norm(spec->max_grad_norm);
  model_spec->set_skip_nonfinite(spec->skip_nonfinite != 0);
  model_spec->set_chunk_elements(spec->chunk_elements);
  model_spec->set_activation_bytes(spec->activation_bytes);
  model_spec->set_grad_slots(has_slots ? spec->grad_slots : 0);
  model_spec->set_weight_slots(has_slots ? spec->weight_slots : 0);
  model_spec->set_initial_iteration(
      has_initial_iteration ? spec->initial_iteration : 0);
  model_spec->set_overlap_updates(has_overlap && spec->overlap_updates != 0);
  // The daemon refuses values it does not know, naming them.
  model_spec->set_clip_schedule(static_cast<lohan::v1::ClipSchedule>(
      has_clip_schedule ? spec->clip_schedule
                        : static_cast<uint32_t>(LOHAN_CLIP_DEFERRED)));
  model_spec->set_in_order_service(has_in_order && spec->in_order_service != 0);
  // The exempt elements are a group of their own, named as the caller
  // knows them, as are the others.
  if (num_no_weight_decay != 0) {
    lohan::v1::ParamGroup* exempt = model_spec->add_param_groups();
    exempt->set_name("no_weight_decay");
    exempt->set_lr_scale(1.0);
    if (absl::Status copied = CopyRanges(
            spec->no_weight_decay, num_no_weight_decay, "no_weight_decay",
            spec->num_layers, exempt->mutable_ranges());
        !copied.ok()) {
      return copied;
    }
  }
  for (uint32_t g = 0; g < num_param_groups; ++g) {
    const lohan_param_group& from = spec->param_groups[g];
    lohan::v1::ParamGroup* group = model_spec->add_param_groups();
    group->set_name(absl::StrCat("param_groups[", g, "]"));
    group->set_lr_scale(from.lr_scale);
    group->set_weight_decay(from.weight_decay);
    if (absl::Status copied = CopyRanges(
            from.ranges, from.num_ranges, absl::StrCat("param_groups[", g, "]"),
            spec->num_layers, group->mutable_ranges());
        !copied.ok()) {
      return copied;
    }
  }
  return absl::OkStatus();
}

// Registers `spec` (whatever the caller described it in) and makes the
// model handle.
int RegisterSpec(lohan_client* client, lohan_data_plane* plane,
                 const char* job_id, const lohan::v1::ModelSpec& spec,
                 lohan_model** out) {
  lohan::v1::RegisterModelRequest request;
  request.set_job_id(job_id);
  *request.mutable_model() = spec;
  auto registration = client->impl->RegisterModel(request);
  if (!registration.ok()) return Report(registration.status());
  auto model = std::make_unique<lohan_model>();
  model->plane = plane->impl.get();
  model->callbacks_pending = &plane->callbacks_pending;
  model->registration = *std::move(registration);
  model->elements.assign(spec.layer_elements().begin(),
                         spec.layer_elements().end());
  model->element_bytes = spec.dtype() == lohan::v1::DTYPE_FP32 ? 4 : 2;
  model->ring_dtype =
      spec.dtype() == lohan::v1::DTYPE_FP32   ? lohan::RingDtype::kFp32
      : spec.dtype() == lohan::v1::DTYPE_BF16 ? lohan::RingDtype::kBf16
                                              : lohan::RingDtype::kFp16;
  model->sequence = model->registration.iteration();
  model->plane->SetErrorText(model->registration.error_text_offset(),
                             model->registration.error_text_bytes());
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
  if (absl::Status translated = SpecFromC(spec, &model_spec);
      !translated.ok()) {
    return Report(translated);
  }
  return RegisterSpec(client, plane, job_id, model_spec, out);
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
  if (absl::Status parsed =
          FromJson(spec_json, "lohan_model_register_json: spec_json", &spec);
      !parsed.ok()) {
    return Report(parsed);
  }
  return RegisterSpec(client, plane, job_id, spec, out);
}

void lohan_model_destroy(lohan_model* model) {
  std::unique_ptr<lohan_model> owned(model);
}

uint32_t lohan_model_grad_slots(const lohan_model* model) {
  return model == nullptr ? 0 : model->registration.grad_slots();
}

uint32_t lohan_model_weight_slots(const lohan_model* model) {
  return model == nullptr ? 0 : model->registration.weight_slots();
}

uint64_t lohan_model_iteration(const lohan_model* model) {
  return model == nullptr ? 0 : model->registration.iteration();
}

int lohan_model_layer_initialized(const lohan_model* model, uint32_t layer) {
  if (model == nullptr ||
      layer >=
          static_cast<uint32_t>(model->registration.layer_initialized_size())) {
    return 0;
  }
  return model->registration.layer_initialized(layer) ? 1 : 0;
}

// Streamed layouts: the daemon already answers buffer layer % K for layer.
void* lohan_model_grad_buffer(const lohan_model* model, uint32_t layer) {
  if (model == nullptr || layer >= model->elements.size()) return nullptr;
  return model->plane->arena() +
         model->registration.layers(layer).grad_offset();
}

void* lohan_model_weight_buffer(const lohan_model* model, uint32_t layer) {
  if (model == nullptr || layer >= model->elements.size()) return nullptr;
  return model->plane->arena() +
         model->registration.layers(layer).weight_offset();
}

uint64_t lohan_model_layer_bytes(const lohan_model* model, uint32_t layer) {
  if (model == nullptr || layer >= model->elements.size()) return 0;
  return model->registration.layers(layer).bytes();
}

float* lohan_model_staging(const lohan_model* model) {
  if (model == nullptr) return nullptr;
  return reinterpret_cast<float*>(model->plane->arena() +
                                  model->registration.staging_offset());
}

uint64_t lohan_model_staging_bytes(const lohan_model* model) {
  return model == nullptr ? 0 : model->registration.staging_bytes();
}

int lohan_model_init_weights(lohan_model* model, uint32_t layer) {
  return RingCall(model, lohan::RingOp::kInitWeights, layer);
}

int lohan_model_read_weights(lohan_model* model, uint32_t layer) {
  return RingCall(model, lohan::RingOp::kReadWeights, layer);
}

namespace {

// READ_STATE / INIT_STATE of `part` through the staging slot.
int StateCall(lohan_model* model, lohan::RingOp op, uint32_t layer, int part) {
  if (model == nullptr) return InvalidArgument("model is NULL");
  if (part != LOHAN_STATE_EXP_AVG && part != LOHAN_STATE_EXP_AVG_SQ &&
      part != LOHAN_STATE_MAX_EXP_AVG_SQ) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "part ", part,
        " is not LOHAN_STATE_EXP_AVG (1), LOHAN_STATE_EXP_AVG_SQ (2) or "
        "LOHAN_STATE_MAX_EXP_AVG_SQ (3)")));
  }
  lohan::SubmissionEntry entry;
  if (int built = BuildEntry(model, op, layer, entry); built != LOHAN_OK) {
    return built;
  }
  entry.activation_id = static_cast<uint64_t>(part);
  return Finish(model, entry, nullptr);
}

}  // namespace

int lohan_model_read_state(lohan_model* model, uint32_t layer, int part) {
  return StateCall(model, lohan::RingOp::kReadState, layer, part);
}

int lohan_model_init_state(lohan_model* model, uint32_t layer, int part) {
  return StateCall(model, lohan::RingOp::kInitState, layer, part);
}

int lohan_model_iter_begin(lohan_model* model) {
  const int status = RingCall(model, lohan::RingOp::kIterBegin, 0);
  if (status == LOHAN_OK) model->in_iteration = true;
  return status;
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
  const int status =
      RingCall(model, lohan::RingOp::kIterBegin, 0, nullptr, grad_scale, lr);
  if (status == LOHAN_OK) model->in_iteration = true;
  return status;
}

int lohan_model_fetch_params(lohan_model* model, uint32_t layer) {
  return RingCall(model, lohan::RingOp::kFetchParams, layer);
}

int lohan_model_grad_ready(lohan_model* model, uint32_t layer) {
  return RingCall(model, lohan::RingOp::kGradReady, layer);
}

void* lohan_model_activation_buffer(const lohan_model* model, uint64_t* bytes) {
  if (model == nullptr || model->registration.activation_bytes() == 0) {
    if (bytes != nullptr) *bytes = 0;
    return nullptr;
  }
  if (bytes != nullptr) *bytes = model->registration.activation_bytes();
  return model->plane->arena() + model->registration.activation_offset();
}

int lohan_model_act_put(lohan_model* model, uint64_t id, uint64_t offset,
                        uint64_t length) {
  return ActivationCall(model, lohan::RingOp::kActPut, id, offset, length);
}

int lohan_model_act_get(lohan_model* model, uint64_t id, uint64_t offset,
                        uint64_t length) {
  return ActivationCall(model, lohan::RingOp::kActGet, id, offset, length);
}

int lohan_model_act_free(lohan_model* model, uint64_t id) {
  return ActivationCall(model, lohan::RingOp::kActFree, id, 0, 0);
}

namespace {

// ITER_END or ITER_ABORT. Gradients still being copied from a GPU go
// first: their GRAD_READY is submitted from a CUDA host function, and the
// end must not overtake them. An iteration begun is over afterwards
// whatever the answer (the daemon rolled it back on an error).
int EndIteration(lohan_model* model, lohan::RingOp op,
                 lohan::CompletionEntry* completion) {
  if (model == nullptr) return InvalidArgument("model is NULL");
  if (absl::Status pending = model->plane->WaitForReserved(kRingCallTimeout);
      !pending.ok()) {
    return Report(pending);
  }
  const int status = RingCall(model, op, 0, completion);
  if (model->in_iteration) {
    ++model->sequence;
    model->in_iteration = false;
  }
  return status;
}

}  // namespace

int lohan_model_iter_end(lohan_model* model, double* global_norm, int* clipped,
                         int* skipped) {
  lohan::CompletionEntry completion{};
  const int status = EndIteration(model, lohan::RingOp::kIterEnd, &completion);
  if (status != LOHAN_OK) return status;
  double norm = 0;
  std::memcpy(&norm, &completion.detail, sizeof(norm));
  if (global_norm != nullptr) *global_norm = norm;
  if (clipped != nullptr) {
    *clipped = (completion.flags & lohan::kIterEndClipped) != 0;
  }
  if (skipped != nullptr) {
    *skipped = (completion.flags & lohan::kIterEndSkipped) != 0;
  }
  return LOHAN_OK;
}

int lohan_model_iter_abort(lohan_model* model) {
  return EndIteration(model, lohan::RingOp::kIterAbort, nullptr);
}

int lohan_client_status_json(lohan_client* client, char** json_out) {
  if (client == nullptr || json_out == nullptr) {
    return InvalidArgument(
        "lohan_client_status_json: client and json_out are required");
  }
  auto status = client->impl->GetStatus();
  if (!status.ok()) return Report(status.status());
  absl::StatusOr<std::string> json = ToJson(*status, /*proto_names=*/true);
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
  if (absl::Status parsed =
          FromJson(request_json, "lohan_job_plan_json: request_json", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  request.set_job_id(job_id);
  absl::StatusOr<lohan::v1::JobPlan> plan = client->impl->PlanJob(request);
  if (!plan.ok()) return Report(plan.status());
  absl::StatusOr<std::string> json = ToJson(*plan, /*proto_names=*/false);
  if (!json.ok()) return Report(json.status());
  return CopyOut(*json, plan_json_out);
}

void lohan_string_free(char* text) { std::free(text); }

// ---- Asynchronous requests

int lohan_model_submit_grad_ready(lohan_model* model, uint32_t layer,
                                  uint64_t* ticket) {
  return SubmitRing(model, lohan::RingOp::kGradReady, layer, ticket);
}

int lohan_model_submit_fetch_params(lohan_model* model, uint32_t layer,
                                    uint64_t* ticket) {
  return SubmitRing(model, lohan::RingOp::kFetchParams, layer, ticket);
}

int lohan_model_submit_act_put(lohan_model* model, uint64_t id, uint64_t offset,
                               uint64_t length, uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  return ActivationCall(model, lohan::RingOp::kActPut, id, offset, length,
                        ticket);
}

int lohan_model_submit_act_get(lohan_model* model, uint64_t id, uint64_t offset,
                               uint64_t length, uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  return ActivationCall(model, lohan::RingOp::kActGet, id, offset, length,
                        ticket);
}

int lohan_model_submit_act_free(lohan_model* model, uint64_t id,
                                uint64_t* ticket) {
  if (ticket == nullptr) return InvalidArgument("ticket is NULL");
  return ActivationCall(model, lohan::RingOp::kActFree, id, 0, 0, ticket);
}

int lohan_model_wait(lohan_model* model, uint64_t ticket, int64_t timeout_ms) {
  if (model == nullptr) {
    return InvalidArgument("lohan_model_wait: model is NULL");
  }
  const absl::Duration timeout = timeout_ms < 0
                                     ? absl::InfiniteDuration()
                                     : absl::Milliseconds(timeout_ms);
  return Report(model->plane->Wait(ticket, timeout).status());
}

int lohan_model_poll(lohan_model* model, uint64_t ticket, int* done) {
  if (model == nullptr || done == nullptr) {
    return InvalidArgument("lohan_model_poll: model and done are required");
  }
  absl::StatusOr<bool> polled = model->plane->Poll(ticket);
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
  lohan::SubmissionEntry entry;
  if (int built =
          LayerEntry(model, lohan::RingOp::kGradReady, layer, bytes, entry);
      built != LOHAN_OK) {
    return built;
  }
  // The buffer may be shared with other layers (a streamed layout): wait
  // until no request in flight uses it, and hold it, before copying in.
  absl::StatusOr<lohan::DataPlane::Ticket> reserved =
      model->plane->Reserve(entry.slot_offset, entry.length, kRingCallTimeout);
  if (!reserved.ok()) return Report(reserved.status());
  std::memcpy(model->plane->arena() + entry.slot_offset, source, bytes);
  if (absl::Status submitted =
          model->plane->SubmitReserved(*reserved, entry, kRingCallTimeout);
      !submitted.ok()) {
    model->plane->Abandon(*reserved);
    return Report(submitted);
  }
  *ticket = *reserved;
  return Report(absl::OkStatus());
}

int lohan_model_weights_to_host(const lohan_model* model, uint32_t layer,
                                void* destination, uint64_t bytes) {
  if (model == nullptr || destination == nullptr) {
    return InvalidArgument(
        "lohan_model_weights_to_host: model and destination are required");
  }
  lohan::SubmissionEntry entry;
  if (int built =
          LayerEntry(model, lohan::RingOp::kFetchParams, layer, bytes, entry);
      built != LOHAN_OK) {
    return built;
  }
  // A FETCH_PARAMS (or anything else) still filling the buffer goes first.
  if (absl::Status idle = model->plane->WaitForRange(
          entry.slot_offset, entry.length, kRingCallTimeout);
      !idle.ok()) {
    return Report(idle);
  }
  std::memcpy(destination, model->plane->arena() + entry.slot_offset, bytes);
  return Report(absl::OkStatus());
}

// ---- CUDA

int lohan_cuda_built_with(void) { return lohan::cuda::BuiltWith() ? 1 : 0; }

int lohan_cuda_available(void) {
  const absl::Status available = lohan::cuda::Available();
  Report(available);
  return available.ok() ? 1 : 0;
}

namespace {

// A device index from the C ABI: >= 0, or kUnspecifiedDevice for the
// functions without one.
bool BadDevice(int device) { return device < 0; }

int CudaRegister(lohan_data_plane* plane, int device, const char* what) {
  if (plane == nullptr) {
    return Report(
        absl::InvalidArgumentError(absl::StrCat(what, ": plane is NULL")));
  }
  if (plane->cuda_registered) {
    if (device != lohan::cuda::kUnspecifiedDevice &&
        plane->cuda_device != lohan::cuda::kUnspecifiedDevice &&
        device != plane->cuda_device) {
      return Report(absl::InvalidArgumentError(absl::StrCat(
          what, ": the arena is already registered on CUDA device ",
          plane->cuda_device, ", not ", device)));
    }
    return Report(absl::OkStatus());
  }
  absl::Status registered = lohan::cuda::RegisterHost(
      plane->impl->arena(), plane->impl->arena_bytes(), device);
  if (registered.ok()) {
    plane->cuda_registered = true;
    plane->cuda_device = device;
  }
  return Report(registered);
}

int GradReadyFromDevice(lohan_model* model, uint32_t layer, int device,
                        const void* device_source, uint64_t bytes,
                        void* cuda_stream, uint64_t* ticket, const char* what) {
  if (model == nullptr || device_source == nullptr || ticket == nullptr) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat(what, ": model, device_source and ticket are required")));
  }
  lohan::SubmissionEntry entry;
  if (int built =
          LayerEntry(model, lohan::RingOp::kGradReady, layer, bytes, entry);
      built != LOHAN_OK) {
    return built;
  }
  if (absl::Status available = lohan::cuda::Available(); !available.ok()) {
    return Report(available);
  }
  // The ticket exists before the copy is enqueued, so the caller can wait
  // for it while the callback has not run yet; it holds the gradient
  // buffer (which may be shared with other layers: then this waits until
  // the last request using it has completed).
  absl::StatusOr<lohan::DataPlane::Ticket> reserved =
      CopyHoldingBuffer(model, entry, /*to_host=*/true,
                        const_cast<void*>(device_source), device, cuda_stream);
  if (!reserved.ok()) return Report(reserved.status());
  *ticket = *reserved;
  return Report(absl::OkStatus());
}

int WeightsToDevice(const lohan_model* model, uint32_t layer, int device,
                    void* device_destination, uint64_t bytes, void* cuda_stream,
                    const char* what) {
  if (model == nullptr || device_destination == nullptr) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat(what, ": model and device_destination are required")));
  }
  lohan::SubmissionEntry entry;
  if (int built =
          LayerEntry(model, lohan::RingOp::kFetchParams, layer, bytes, entry);
      built != LOHAN_OK) {
    return built;
  }
  if (absl::Status available = lohan::cuda::Available(); !available.ok()) {
    return Report(available);
  }
  // Held until the copy has read the buffer, so a FETCH_PARAMS that would
  // refill it (a weight buffer shared by several layers) waits for that.
  return Report(CopyHoldingBuffer(model, entry, /*to_host=*/false,
                                  device_destination, device, cuda_stream)
                    .status());
}

}  // namespace

int lohan_data_plane_cuda_register(lohan_data_plane* plane) {
  return CudaRegister(plane, lohan::cuda::kUnspecifiedDevice,
                      "lohan_data_plane_cuda_register");
}

int lohan_data_plane_cuda_register_on_device(lohan_data_plane* plane,
                                             int device) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_data_plane_cuda_register_on_device: device is negative");
  }
  return CudaRegister(plane, device,
                      "lohan_data_plane_cuda_register_on_device");
}

int lohan_model_grad_ready_from_device(lohan_model* model, uint32_t layer,
                                       const void* device_source,
                                       uint64_t bytes, void* cuda_stream,
                                       uint64_t* ticket) {
  return GradReadyFromDevice(model, layer, lohan::cuda::kUnspecifiedDevice,
                             device_source, bytes, cuda_stream, ticket,
                             "lohan_model_grad_ready_from_device");
}

int lohan_model_grad_ready_from_device_on_device(
    lohan_model* model, uint32_t layer, int device, const void* device_source,
    uint64_t bytes, void* cuda_stream, uint64_t* ticket) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_model_grad_ready_from_device_on_device: device is negative");
  }
  return GradReadyFromDevice(model, layer, device, device_source, bytes,
                             cuda_stream, ticket,
                             "lohan_model_grad_ready_from_device_on_device");
}

int lohan_model_weights_to_device(const lohan_model* model, uint32_t layer,
                                  void* device_destination, uint64_t bytes,
                                  void* cuda_stream) {
  return WeightsToDevice(model, layer, lohan::cuda::kUnspecifiedDevice,
                         device_destination, bytes, cuda_stream,
                         "lohan_model_weights_to_device");
}

int lohan_model_weights_to_device_on_device(const lohan_model* model,
                                            uint32_t layer, int device,
                                            void* device_destination,
                                            uint64_t bytes, void* cuda_stream) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_model_weights_to_device_on_device: device is negative");
  }
  return WeightsToDevice(model, layer, device, device_destination, bytes,
                         cuda_stream,
                         "lohan_model_weights_to_device_on_device");
}

}  // extern "C"
