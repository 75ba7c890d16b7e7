/*
 * lohan_client.h: the C ABI of liblohan_client, lohan's client library.
 *
 * Conventions
 * - Every function that can fail returns an int status: LOHAN_OK (0) or one
 *   of the lohan_status codes below (the canonical gRPC/Abseil codes). After a
 *   failure, lohan_last_error() gives a message a person can act on; it is
 *   per thread and valid until this thread's next lohan_ call.
 * - Handles are opaque. Every lohan_*_create/connect/get that hands out a
 *   handle has a matching lohan_*_destroy; destroy accepts NULL.
 * - Out parameters are written only on success. Strings returned as
 *   `const char*` belong to the handle they came from and live as long as it.
 * - No function throws, aborts or exits on bad input; NULL where a handle or
 *   string is required is LOHAN_INVALID_ARGUMENT.
 * - A data plane lohand closes makes every request failing because of it
 *   (in flight, or made after) return one status with lohand's reason:
 *   LOHAN_ABORTED when lohand closed it on purpose while the daemon goes
 *   on: given way to another user's job within that user's share of the
 *   host pool or the SSD array ("lohand closed this job's data plane to
 *   give uid N's job J its share ..."), or `lohanctl drain` / `kill` by the
 *   job's owner or root; LOHAN_UNAVAILABLE when lohand is stopping ("lohand
 *   is stopping ...") or was lost without a word (it exited, crashed or
 *   restarted). The message says which iteration the job keeps when lohand
 *   knows it, and what to do: open the job again (its committed iterations
 *   are kept). A request lohand answered before it closed the plane (an
 *   ITER_END that committed) keeps its answer.
 * - A lohan_client may be used from several threads at once.
 * - Link with -llohan_client; nothing else is needed at run time.
 */
#ifndef LOHAN_CLIENT_H_
#define LOHAN_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOHAN_CLIENT_API __attribute__((visibility("default")))

typedef enum lohan_status {
  LOHAN_OK = 0,
  LOHAN_CANCELLED = 1,
  LOHAN_UNKNOWN = 2,
  LOHAN_INVALID_ARGUMENT = 3,
  LOHAN_DEADLINE_EXCEEDED = 4,
  LOHAN_NOT_FOUND = 5,
  LOHAN_ALREADY_EXISTS = 6,
  LOHAN_PERMISSION_DENIED = 7,
  LOHAN_RESOURCE_EXHAUSTED = 8,
  LOHAN_FAILED_PRECONDITION = 9,
  LOHAN_ABORTED = 10,
  LOHAN_OUT_OF_RANGE = 11,
  LOHAN_UNIMPLEMENTED = 12,
  LOHAN_INTERNAL = 13,
  LOHAN_UNAVAILABLE = 14,
  LOHAN_DATA_LOSS = 15,
  LOHAN_UNAUTHENTICATED = 16
} lohan_status;

typedef enum lohan_job_state {
  LOHAN_JOB_DETACHED = 1,
  LOHAN_JOB_ATTACHED = 2
} lohan_job_state;

/* A connection to lohand. */
typedef struct lohan_client lohan_client;
/* A snapshot of one job, as the daemon last reported it. */
typedef struct lohan_job_info lohan_job_info;
/* A snapshot of the jobs the caller may see. */
typedef struct lohan_job_list lohan_job_list;

/* The library's version, e.g. "0.1.0". */
LOHAN_CLIENT_API const char* lohan_version(void);
/* The message of this thread's last failed call ("" if none). */
LOHAN_CLIENT_API const char* lohan_last_error(void);
/* When this thread's last failed call refused a value of a model spec
 * (LOHAN_INVALID_ARGUMENT from the checks every spec passes before it leaves
 * the process, and lohand runs again): the ModelSpec field it names, as
 * protobuf JSON writes its path ("adam.eps", "commit_interval",
 * "layer_places[3].unit"), so a binding can name its own option for it.
 * "" otherwise. */
LOHAN_CLIENT_API const char* lohan_last_error_field(void);
/* "OK", "NOT_FOUND", ...; "UNKNOWN" for a code not listed above. */
LOHAN_CLIENT_API const char* lohan_status_name(int status);

/* Connects to the daemon at `socket_path` (NULL: $LOHAN_SOCKET, else
 * /run/lohan/lohand.sock) and says hello. LOHAN_UNAVAILABLE when no daemon
 * answers there. */
LOHAN_CLIENT_API int lohan_client_connect(const char* socket_path,
                                          lohan_client** out);
LOHAN_CLIENT_API void lohan_client_destroy(lohan_client* client);

/* What the daemon said at connect. */
LOHAN_CLIENT_API const char* lohan_client_daemon_version(
    const lohan_client* client);
LOHAN_CLIENT_API void lohan_client_protocol(const lohan_client* client,
                                            uint32_t* major, uint32_t* minor);
/* The uid and pid the daemon sees for this process. */
LOHAN_CLIENT_API uint32_t lohan_client_caller_uid(const lohan_client* client);
/* 1 if the daemon reports `capability` (e.g. "jobs"), else 0. */
LOHAN_CLIENT_API int lohan_client_has_capability(const lohan_client* client,
                                                 const char* capability);

/* Creates a job owned by the calling uid. `name`: 1-64 of [A-Za-z0-9._-],
 * unique among the caller's jobs (LOHAN_ALREADY_EXISTS otherwise). */
LOHAN_CLIENT_API int lohan_job_create(lohan_client* client, const char* name,
                                      uint64_t host_pool_bytes,
                                      uint64_t ssd_bytes, lohan_job_info** out);
/* Creates a job from a CreateJobRequest in protobuf JSON (the proto's
 * names, snake_case or lowerCamelCase; parse errors are
 * LOHAN_INVALID_ARGUMENT with the parser's words). With spec.model (a
 * ModelSpec) and no host_pool_bytes, the daemon sizes the arena for the
 * model (ModelSpec.arena_fit: ARENA_FIT_MOST takes one buffer per layer if
 * the pool holds it, else the most shared buffers up to grad_slots that
 * fit; LOHAN_RESOURCE_EXHAUSTED saying how large the pool must be if none
 * do). `*response_json_out`: the CreateJobResponse (the job and
 * `arena`, the sizing) in protobuf JSON with the proto's names; free it
 * with lohan_string_free. */
LOHAN_CLIENT_API int lohan_job_create_json(lohan_client* client,
                                           const char* request_json,
                                           char** response_json_out);
/* Binds the job to this process until lohan_job_detach or process exit.
 * LOHAN_NOT_FOUND for a missing or another user's job (the daemon answers
 * both alike); LOHAN_FAILED_PRECONDITION
 * while another live process holds it. `out` may be NULL. */
LOHAN_CLIENT_API int lohan_job_attach(lohan_client* client, const char* job_id,
                                      lohan_job_info** out);
LOHAN_CLIENT_API int lohan_job_detach(lohan_client* client, const char* job_id,
                                      lohan_job_info** out);
/* Deletes a detached job and everything it holds. */
LOHAN_CLIENT_API int lohan_job_delete(lohan_client* client, const char* job_id);

LOHAN_CLIENT_API int lohan_jobs_list(lohan_client* client,
                                     lohan_job_list** out);
LOHAN_CLIENT_API size_t lohan_job_list_size(const lohan_job_list* list);
/* The i-th job, owned by the list; NULL when i is out of range. */
LOHAN_CLIENT_API const lohan_job_info* lohan_job_list_get(
    const lohan_job_list* list, size_t i);
LOHAN_CLIENT_API void lohan_job_list_destroy(lohan_job_list* list);

LOHAN_CLIENT_API const char* lohan_job_info_id(const lohan_job_info* job);
LOHAN_CLIENT_API const char* lohan_job_info_name(const lohan_job_info* job);
LOHAN_CLIENT_API uint32_t lohan_job_info_owner_uid(const lohan_job_info* job);
LOHAN_CLIENT_API int lohan_job_info_state(const lohan_job_info* job);
/* The attached process, 0 when detached. */
LOHAN_CLIENT_API int32_t lohan_job_info_attached_pid(const lohan_job_info* job);
LOHAN_CLIENT_API void lohan_job_info_destroy(lohan_job_info* job);

/* A job's data plane: its shared-memory arena (the job's host_pool_bytes),
 * mapped into this process and locked in RAM by the daemon. */
typedef struct lohan_data_plane lohan_data_plane;

/* Opens the data plane of a job this process has attached
 * (lohan_job_attach). LOHAN_NOT_FOUND for another user's job,
 * LOHAN_FAILED_PRECONDITION when this process is not the one attached or the
 * job's data plane is already open, LOHAN_RESOURCE_EXHAUSTED when the host
 * pool cannot hold the arena. The arena stays mapped until
 * lohan_data_plane_destroy; closing it (or this process exiting) gives the
 * memory back to the daemon. */
LOHAN_CLIENT_API int lohan_data_plane_open(lohan_client* client,
                                           const char* job_id,
                                           lohan_data_plane** out);
/* NULL and 0 when a failed lohan_job_follow_share left it without a plane. */
LOHAN_CLIENT_API void* lohan_data_plane_arena(const lohan_data_plane* plane);
LOHAN_CLIENT_API uint64_t
lohan_data_plane_arena_size(const lohan_data_plane* plane);
LOHAN_CLIENT_API void lohan_data_plane_destroy(lohan_data_plane* plane);

/* ---- A training process's job: open and close ----
 * lohan_job_open gets the job ready in one call: it finds the caller's job
 * of that name (resume) or creates it, its arena sized for the model, then
 * attaches it and opens its data plane (waiting, up to 30 s, while the
 * daemon takes back the arena of a plane just closed). request_json: an
 * OpenJobRequest (proto/job_open.proto) in protobuf JSON. Out: the plane;
 * the job (job_out, may be NULL); its OpenJobResponse in protobuf JSON
 * (response_json_out, may be NULL; lohan_string_free): the job, whether
 * this call created it, the arena's sizing. A job created here is deleted
 * again when a later part fails. NOT_FOUND (resume, no such job) and
 * ALREADY_EXISTS (a new job whose name is taken) say so. */
LOHAN_CLIENT_API int lohan_job_open(lohan_client* client,
                                    const char* request_json,
                                    lohan_data_plane** plane_out,
                                    lohan_job_info** job_out,
                                    char** response_json_out);
/* The job's data plane again after this process destroyed its last one:
   waits until the daemon has taken that one's arena back (until it sees
   the close it counts the plane as open), then opens. */
LOHAN_CLIENT_API int lohan_job_reopen_data_plane(lohan_client* client,
                                                 const char* job_id,
                                                 lohan_data_plane** out);
/* After the job's data plane was destroyed: waits (up to 30 s) until the
   daemon has taken its arena back, detaches the job and, with delete_job,
   deletes it. Returns the first error (a daemon that is gone: UNAVAILABLE);
   every step is tried. */
LOHAN_CLIENT_API int lohan_job_close(lohan_client* client, const char* job_id,
                                     int delete_job);

/* ---- Training through the data plane ----
 * After lohan_data_plane_open, a process registers its model: the daemon
 * creates (or, for a re-attached job, reopens) the model's optimizer states
 * on its SSDs and lays out per-layer gradient and weight buffers in the
 * arena. Each training step is then:
 *   lohan_model_iter_begin
 *   lohan_model_fetch_params(layer)   for each layer, before it runs forward
 *   lohan_model_grad_ready(layer)     for each layer, as backward produces
 *                                     its gradient in lohan_model_grad_buffer
 *   lohan_model_iter_end              waits for every layer's update;
 *                                     exact global-norm clipping and
 *                                     inf/nan skipping happen here
 *                                     (lohan_model_iter_end_global: on
 *                                     every rank's sum of squares, for
 *                                     jobs holding shards of the layers)
 * Each of these is one request to the daemon and waits for its answer. The
 * same requests can be made without waiting (see "Asynchronous requests"
 * below): a GPU training loop hands each layer's gradient over straight from
 * the device as backward produces it and only waits before iter_end:
 *   lohan_data_plane_cuda_register_on_device(plane, dev)  once: pins the
 *                                     arena
 *   lohan_model_iter_begin
 *   lohan_model_fetch_params + lohan_model_weights_to_device_on_device(
 *       layer, dev, weights, stream)  for each layer, before its forward
 *   lohan_model_grad_ready_from_device_on_device(layer, dev, grad, stream,
 *       &ticket[layer])
 *                                     for each layer, in backward: copies on
 *                                     the stream; once it is done a stream
 *                                     callback hands GRAD_READY to the data
 *                                     plane's submitter thread, which
 *                                     submits it; nothing waits
 *   lohan_model_wait(ticket[layer])   for each layer (any order)
 *   lohan_model_iter_end
 * Without CUDA, lohan_model_grad_ready_from_host / lohan_model_weights_to_host
 * do the same with memcpy.
 * Threads: lohan_model_iter_begin, lohan_model_iter_end(_global),
 * init/read_weights, init/read_state, register and destroy from one thread
 * at a time; everything else (the synchronous and asynchronous requests,
 * waits, polls and copies) from any number of threads at once. */
typedef struct lohan_model lohan_model;

enum { LOHAN_DTYPE_FP32 = 1, LOHAN_DTYPE_BF16 = 2, LOHAN_DTYPE_FP16 = 3 };

typedef struct lohan_model_spec {
  uint32_t struct_size; /* sizeof(lohan_model_spec): lets the ABI grow */
  uint32_t dtype;       /* LOHAN_DTYPE_*: weights and gradients */
  const uint64_t* layer_elements; /* parameters per layer */
  uint32_t num_layers;
  double lr, beta1, beta2, eps, weight_decay;
  int32_t adamw; /* 1: AdamW (decoupled decay); 0: Adam (L2) */
  int32_t amsgrad;
  int32_t bf16_moments;      /* moments stored in bf16 (less SSD traffic) */
  double max_grad_norm;      /* > 0: clip the global norm; 0: off */
  int32_t skip_nonfinite;    /* skip an iteration with inf/nan gradients */
  uint64_t chunk_elements;   /* 0: the daemon's default */
  uint64_t activation_bytes; /* arena area for swapped activations; 0: none */
  /* Gradient / 16-bit weight buffers in the arena (a spec whose
   * struct_size ends before these fields means 0, 0). 0 (or >= num_layers):
   * one per layer ("resident": the arena holds 2 x the model in 16 bits).
   * K in 1..num_layers-1: "streamed": K buffers, each as large as the
   * largest layer, shared by all layers; layer i's is buffer i % K. The
   * daemon copies a gradient into its SSD store before GRAD_READY
   * completes, so the completion frees the buffer for layer i + K (wait for
   * it first when requests are asynchronous); FETCH_PARAMS reads the
   * layer's committed weights from the store into the buffer. Arena use does
   * not grow with the model; the SSDs carry the gradients (written
   * once, read once per update pass) and the 16-bit weights. */
  uint32_t grad_slots;
  uint32_t weight_slots;
  /* Added after weight_slots (a spec whose struct_size ends before it
   * means 0). For a job that has no states yet (a new one): the iteration
   * it starts at, as if it had committed that many, so its first update is
   * Adam step initial_iteration + 1 and lohan_model_iteration reports it.
   * With lohan_model_init_weights and lohan_model_init_state this restores
   * a checkpoint taken at that step into a new job. A job with states
   * resumes at its stored iteration: a nonzero value other than that is
   * LOHAN_FAILED_PRECONDITION; 0 means whatever is stored. */
  uint64_t initial_iteration;
  /* Added after initial_iteration (a spec whose struct_size ends before
   * num_no_weight_decay means none). Elements updated without weight decay
   * (biases and norm weights, as torch's param group with weight_decay 0;
   * sent as the first of ModelSpec.param_groups, named "no_weight_decay"):
   * num_no_weight_decay triples (layer, begin, end), the elements
   * [begin, end) of that layer, which get weight_decay 0 (neither AdamW's
   * decay nor Adam's L2 term; lr, betas, eps, clipping as the rest). Any
   * order; layer < num_layers, begin < end <= the layer's elements, and a
   * layer's ranges must not overlap (LOHAN_INVALID_ARGUMENT naming the
   * range otherwise, as for NULL with a nonzero count). The daemon copies
   * them: the array need not outlive the call. */
  const uint64_t* no_weight_decay; /* triples: layer, begin, end */
  uint32_t num_no_weight_decay;
  /* Added after num_no_weight_decay (a spec whose struct_size ends before
   * num_param_groups means none). Elements trained with their own learning
   * rate and weight decay, as torch's param groups: see lohan_param_group.
   * No element may be in two groups, nor in a group and in
   * no_weight_decay. Copied by the daemon, like no_weight_decay. */
  const struct lohan_param_group* param_groups;
  uint32_t num_param_groups;
  /* Added after num_param_groups (a spec whose struct_size ends before it
   * means 0). 1: the caller fetches each layer (lohan_model_fetch_params or
   * its submit form, also with resident weight buffers, where it only
   * waits) before it uses the layer's new weights; lohan_model_iter_end
   * then returns as soon as the global norm has decided the iteration, and
   * its last updates (exact clipping's deferred ones, the first layers'
   * tail) run in forward order during the next forward, each fetch waiting
   * for its own layer only. A failure in them fails the next call with
   * LOHAN_ABORTED; the job stays at the iteration before. 0: iter_end
   * returns once every update is committed. */
  int32_t overlap_updates;
  /* Added after overlap_updates (a spec whose struct_size ends before it
   * means LOHAN_CLIP_DEFERRED). How an iteration that clips or skips is
   * updated; the results are the same bits. LOHAN_CLIP_DEFERRED: a layer
   * updates as it arrives while the global norm may still stay under
   * max_grad_norm; once clipping is certain the rest wait for the norm and
   * only those updated before are redone (one pass over the states).
   * LOHAN_CLIP_REDO_ALL: every layer updates at once and a clipped
   * iteration redoes them all (two passes), for comparison. Any other
   * value: LOHAN_INVALID_ARGUMENT. */
  uint32_t clip_schedule;
  /* Added after clip_schedule (absent means 0). 0: requests the device
   * waits for (fetch_params, act_get) are served beside, not behind, the
   * SSD writes of streamed gradients and act_put; 1: every request in
   * arrival order on one thread (the service before, for comparison). The
   * same results either way. */
  int32_t in_order_service;
  /* Added after in_order_service (absent means 0). Iterations between
   * durable commits (ModelSpec.commit_interval); 0: the daemon's default. */
  uint32_t commit_interval;
  /* 1: at job creation (lohan_job_open), one buffer per layer if the pool
   * holds the arena, else the most shared buffers up to grad_slots that it
   * holds (ARENA_FIT_MOST); 0: the slots as given. */
  int32_t arena_fit_most;
  /* Added after arena_fit_most (absent means 0). Durability by time
   * instead of commit_interval (ModelSpec.durable_every_seconds): durable
   * once this many seconds passed since the last durable commit; 0: see
   * commit_interval. Both nonzero: LOHAN_INVALID_ARGUMENT. */
  double durable_every_seconds;
  /* Added after durable_every_seconds (absent means 0). 1: Adam without
   * its bias correction (AdamSpec.no_bias_correction; DeepSpeed's
   * bias_correction=False); 0: torch's Adam and AdamW. */
  int32_t no_bias_correction;
} lohan_model_spec;

enum { LOHAN_CLIP_DEFERRED = 0, LOHAN_CLIP_REDO_ALL = 1 };

/* One param group: its num_ranges triples (layer, begin, end), ranges as
 * no_weight_decay's, are updated with the iteration's lr x lr_scale and
 * this weight_decay in place of the spec's (AdamW's decay or Adam's L2
 * term); betas, eps, the step and clipping as the rest. torch's group
 * {"lr": g, "weight_decay": w} in a job whose lr is l: lr_scale g / l.
 * lr_scale and weight_decay finite and >= 0 (LOHAN_INVALID_ARGUMENT
 * otherwise, naming "param_groups[i]"). */
typedef struct lohan_param_group {
  double lr_scale;
  double weight_decay;
  const uint64_t* ranges; /* triples: layer, begin, end */
  uint32_t num_ranges;
} lohan_param_group;

/* The spec as lohand's ModelSpec (proto/lohan.proto) in protobuf JSON, the
 * proto's field names (lohan_string_free): what lohan_job_open's request
 * and lohan_model_register_json take. Refusals as lohan_model_register's. */
LOHAN_CLIENT_API int lohan_model_spec_json(const lohan_model_spec* spec,
                                           char** json_out);
/* The settings of a spec (all but its layers, their places and groups:
 * dtype, Adam's hyperparameters, clipping, the clip schedule, durability,
 * initial iteration, activation area, arena fit) checked by the rules
 * lohan_model_register and lohand apply, before there is a model: how a
 * binding checks its options when it is given them. num_layers and the
 * arrays are not read. LOHAN_INVALID_ARGUMENT naming the ModelSpec field
 * (lohan_last_error_field) for a value out of range. The _json form takes
 * a ModelSpec in protobuf JSON (its layers, if any, ignored). */
LOHAN_CLIENT_API int lohan_model_spec_check_settings(
    const lohan_model_spec* spec);
LOHAN_CLIENT_API int lohan_model_spec_check_settings_json(
    const char* spec_json);
/* `plane` must stay open while the model is used. */
LOHAN_CLIENT_API int lohan_model_register(lohan_client* client,
                                          lohan_data_plane* plane,
                                          const char* job_id,
                                          const lohan_model_spec* spec,
                                          lohan_model** out);
/* As lohan_model_register, with the model described by a ModelSpec in
 * protobuf JSON (proto/lohan.proto; what lohan_model_spec translates to),
 * e.g. with ModelSpec.arena_fit ARENA_FIT_MOST: the daemon takes as many
 * shared buffers as the job's arena holds (lohan_model_grad_slots says
 * how many). Parse errors are LOHAN_INVALID_ARGUMENT with the parser's
 * words. */
LOHAN_CLIENT_API int lohan_model_register_json(lohan_client* client,
                                               lohan_data_plane* plane,
                                               const char* job_id,
                                               const char* spec_json,
                                               lohan_model** out);
LOHAN_CLIENT_API void lohan_model_destroy(lohan_model* model);
/* Gradient (weight) buffers in the arena: the number of layers when there
 * is one per layer, K when K are shared (layer i uses buffer i % K). */
LOHAN_CLIENT_API uint32_t lohan_model_grad_slots(const lohan_model* model);
LOHAN_CLIENT_API uint32_t lohan_model_weight_slots(const lohan_model* model);
/* Committed iterations (Adam steps) when the model was registered. */
LOHAN_CLIENT_API uint64_t lohan_model_iteration(const lohan_model* model);
/* 1 if the layer has stored states already (a re-attached job). */
LOHAN_CLIENT_API int lohan_model_layer_initialized(const lohan_model* model,
                                                   uint32_t layer);
/* 1 if the job kept the commit before its last one when the model was
 * registered (a data-parallel rank's job between its commit and its next
 * iteration): registering again with ModelSpec.revert_last_commit
 * (lohan_model_register_json) resumes it at lohan_model_iteration - 1. */
LOHAN_CLIENT_API int lohan_model_previous_commit_kept(const lohan_model* model);
/* Buffers in the arena; NULL for a layer out of range. Sizes in bytes.
 * Streamed (lohan_model_spec.grad_slots / weight_slots = K): buffer
 * layer % K, shared with every layer of the same residue, as large as the
 * largest layer (lohan_model_layer_bytes is still the layer's own size). */
LOHAN_CLIENT_API void* lohan_model_grad_buffer(const lohan_model* model,
                                               uint32_t layer);
LOHAN_CLIENT_API void* lohan_model_weight_buffer(const lohan_model* model,
                                                 uint32_t layer);
LOHAN_CLIENT_API uint64_t lohan_model_layer_bytes(const lohan_model* model,
                                                  uint32_t layer);
/* fp32 staging, as large as the largest layer. */
LOHAN_CLIENT_API float* lohan_model_staging(const lohan_model* model);
LOHAN_CLIENT_API uint64_t lohan_model_staging_bytes(const lohan_model* model);
/* Stores the layer's initial fp32 weights from the staging buffer (a new
 * job, outside iterations); fills its weight buffer too. */
LOHAN_CLIENT_API int lohan_model_init_weights(lohan_model* model,
                                              uint32_t layer);
/* Copies the layer's committed fp32 master weights into staging. */
LOHAN_CLIENT_API int lohan_model_read_weights(lohan_model* model,
                                              uint32_t layer);
/* The Adam moments of a layer (torch's optimizer state names), for
 * portable checkpoints: `part` of lohan_model_read_state /
 * lohan_model_init_state. LOHAN_STATE_MAX_EXP_AVG_SQ exists only with
 * amsgrad (LOHAN_INVALID_ARGUMENT otherwise). */
enum {
  LOHAN_STATE_EXP_AVG = 1,
  LOHAN_STATE_EXP_AVG_SQ = 2,
  LOHAN_STATE_MAX_EXP_AVG_SQ = 3
};
/* Copies the layer's committed moment `part` into staging as fp32
 * (widened from bf16 with bf16_moments). Outside iterations
 * (LOHAN_FAILED_PRECONDITION inside, or before the layer has states). */
LOHAN_CLIENT_API int lohan_model_read_state(lohan_model* model, uint32_t layer,
                                            int part);
/* Replaces the layer's committed moment `part` with the fp32 values in
 * staging (rounded to nearest even with bf16_moments), committed at once
 * for the whole layer; its weights and other moments stay. Outside
 * iterations, after lohan_model_init_weights (LOHAN_FAILED_PRECONDITION
 * otherwise). */
LOHAN_CLIENT_API int lohan_model_init_state(lohan_model* model, uint32_t layer,
                                            int part);
LOHAN_CLIENT_API int lohan_model_iter_begin(lohan_model* model);
/* As lohan_model_iter_begin, with every gradient of the iteration multiplied
 * by `grad_scale` (> 0; 1/loss_scale for fp16 loss scaling) and, when
 * `lr` >= 0, that learning rate for this iteration (a schedule's value; 0
 * too, the first step of a warmup); a negative `lr`
 * (LOHAN_LR_REGISTERED) keeps the registered one. */
#define LOHAN_LR_REGISTERED (-1.0)
LOHAN_CLIENT_API int lohan_model_iter_begin_with(lohan_model* model,
                                                 float grad_scale, double lr);
LOHAN_CLIENT_API int lohan_model_fetch_params(lohan_model* model,
                                              uint32_t layer);
LOHAN_CLIENT_API int lohan_model_grad_ready(lohan_model* model, uint32_t layer);
/* Activation swapping through the daemon: the activation area of the
 * arena (lohan_model_spec.activation_bytes) holds activations the process
 * hands over (put: the daemon keeps a copy on its SSDs and the area may be
 * reused), brings back (get: into the area, same length) and forgets
 * (free). Offsets are relative to the area. Ids are the caller's. */
LOHAN_CLIENT_API void* lohan_model_activation_buffer(const lohan_model* model,
                                                     uint64_t* bytes);
LOHAN_CLIENT_API int lohan_model_act_put(lohan_model* model, uint64_t id,
                                         uint64_t offset, uint64_t length);
LOHAN_CLIENT_API int lohan_model_act_get(lohan_model* model, uint64_t id,
                                         uint64_t offset, uint64_t length);
LOHAN_CLIENT_API int lohan_model_act_free(lohan_model* model, uint64_t id);

/* `global_norm`, `clipped`, `skipped` may be NULL. */
LOHAN_CLIENT_API int lohan_model_iter_end(lohan_model* model,
                                          double* global_norm, int* clipped,
                                          int* skipped);
/* lohan_model_iter_end for sharded data-parallel jobs: each rank's job
 * holds only that rank's shard of every layer, so no daemon sees the whole
 * gradient. `global_sum_squares` is the sum over every rank's gradients of
 * (g * grad_scale)^2 (all-reduce each rank's sum of its shards' squares),
 * the same value on every rank: the daemon clips and skips on it, as one
 * job of the whole model would on its own gradients, and `global_norm`
 * receives its square root, so every rank decides alike. inf or NaN means
 * a non-finite gradient somewhere (a skip when the model skips them).
 * Negative (-0.0 too): LOHAN_INVALID_ARGUMENT, nothing sent, the iteration
 * still in progress. `global_norm`, `clipped`, `skipped` may be NULL. */
LOHAN_CLIENT_API int lohan_model_iter_end_global(lohan_model* model,
                                                 double global_sum_squares,
                                                 double* global_norm,
                                                 int* clipped, int* skipped);
/* Ends the iteration begun with nothing committed: the updates it ran are
 * rolled back, the step does not advance, the weight buffers hold the
 * committed weights again (e.g. after the caller's backward failed
 * half-way). Gradients still being copied from a GPU are waited for
 * first. */
LOHAN_CLIENT_API int lohan_model_iter_abort(lohan_model* model);
/* Between iterations: waits until the last iteration has committed (its
 * last updates may run after lohan_model_iter_end returned) and sets
 * `*iteration` (may be NULL) to the job's committed iterations;
 * LOHAN_ABORTED if those updates failed. A data-parallel rank's job
 * (lohan_job_spec run) keeps the states its last commit replaced until its
 * next lohan_model_iter_begin, which frees them: call this on every rank
 * and agree that every rank committed before that begin, so that ranks
 * whose peers stopped short can go back (ModelSpec.revert_last_commit,
 * lohan_model_previous_commit_kept). */
LOHAN_CLIENT_API int lohan_model_await_committed(lohan_model* model,
                                                 uint64_t* iteration);
/* As lohan_model_await_committed, once every rank has committed (the
 * caller's agreement): frees the states the last commit kept now rather
 * than at the next lohan_model_iter_begin (a run closing: an idle job then
 * holds one version of its states). OK when nothing is kept. */
LOHAN_CLIENT_API int lohan_model_release_previous_commit(lohan_model* model);

/* ---- Following the job's share of the host pool ----
 * lohand may ask a job to move its data plane to an arena of another size
 * between iterations: fewer bytes when the job holds more of the shared
 * host pool than its owner's share and another user's job needs it (the
 * model then streams through fewer shared buffers), more when the pool has
 * room again. It asks at the end of an iteration (lohan_model_iter_end);
 * lohan_job_follow_share moves. A shrink not followed soon enough ends
 * with lohand closing the plane for the other user's share (LOHAN_ABORTED,
 * see the conventions above); a grow not followed costs nothing. */
/* What lohand asked of the job's arena at the end of the last iteration
 * (lohan_model_iter_end's answer; 0 after a failed one): 0 nothing; else
 * the arena bytes its next data plane gets (fewer than now: give way to
 * another user's share of the host pool; more: the pool has room again).
 * lohan_job_follow_share moves it. */
LOHAN_CLIENT_API int lohan_model_arena_asked(const lohan_model* model,
                                             uint64_t* bytes);
/* Between iterations (every request answered: every ticket waited for),
 * when lohand asked: waits for the last iteration's commit, closes the
 * job's data plane, opens it again (lohand grants the arena it asked),
 * registers the model again as it was registered (the same spec at the
 * job's committed iteration; the layout chosen anew in that arena: shared
 * buffers when smaller, as the spec's arena_fit allows) and pins the new
 * arena for CUDA on the same device if the old one was pinned. `plane`
 * and `model` then hold the new ones (the same handles; a lohan_steps over
 * the model goes on): every pointer taken from them before (arena,
 * buffers, staging, activation area) is invalid: take them again.
 * *moved: 1 when it moved, 0 when nothing was asked (nothing done).
 * Refused with nothing done (*moved 0): an iteration in progress or a
 * ticket not waited for (LOHAN_FAILED_PRECONDITION), a model registered
 * over another plane (LOHAN_INVALID_ARGUMENT), the last commit's failure.
 * Unlike other out parameters, *moved is set on failure too: 1 if the old
 * plane was closed: the job then has no data plane, and plane and model
 * calls fail with LOHAN_FAILED_PRECONDITION saying so (the job keeps its
 * committed iterations: open it again with resume); the status says which
 * step failed. */
LOHAN_CLIENT_API int lohan_job_follow_share(lohan_client* client,
                                            const char* job_id,
                                            lohan_data_plane* plane,
                                            lohan_model* model, int* moved);

/* The daemon's status (GetStatus) as JSON, field names as in
 * proto/lohan.proto (snake_case); free it with lohan_string_free. */
LOHAN_CLIENT_API int lohan_client_status_json(lohan_client* client,
                                              char** json_out);
/* Asks lohand for the activation plan of `job_id` (attached by this
 * process, its data plane open and its model registered): `request_json`
 * is a lohan.v1.PlanJobRequest in protobuf's JSON form (lowerCamelCase or
 * proto field names; its job_id, if any, is replaced by `job_id`), e.g.
 * {"profile": {"blocks": 4, "blockTensors": [...], ...},
 *  "activationHostBytes": "1048576", "perBlock": true}.
 * On success *plan_json_out is the lohan.v1.JobPlan in JSON with
 * lowerCamelCase names and every field present (64-bit integers as
 * strings, protobuf's rule); free it with lohan_string_free. The daemon
 * keeps the plan with the job's session (GetStatus: SessionStatus.plan).
 * LOHAN_INVALID_ARGUMENT for JSON that does not parse as a PlanJobRequest
 * (the parser's message) or a malformed profile (naming the field);
 * LOHAN_NOT_FOUND for another user's job; LOHAN_FAILED_PRECONDITION when
 * this process is not the one attached, the model is not registered or a
 * memory is too short for any plan (which one and by how much);
 * LOHAN_UNAVAILABLE while lohand is still measuring its machine (ask again
 * shortly). */
LOHAN_CLIENT_API int lohan_job_plan_json(lohan_client* client,
                                         const char* job_id,
                                         const char* request_json,
                                         char** plan_json_out);
/* The whole plan lohand keeps with `job_id`'s session (GetStatus carries
 * only its summary), as lohan_job_plan_json returns it; for the job's
 * owner or root. LOHAN_NOT_FOUND for a job the caller may not see;
 * LOHAN_FAILED_PRECONDITION when the job has no data plane open or no
 * plan. Free it with lohan_string_free. */
LOHAN_CLIENT_API int lohan_job_kept_plan_json(lohan_client* client,
                                              const char* job_id,
                                              char** plan_json_out);
LOHAN_CLIENT_API void lohan_string_free(char* text);

/* ---- Asynchronous requests ----
 * A lohan_model_submit_* call puts one request on the job's submission ring
 * and returns at once with a ticket; lohan_model_wait(ticket) returns that
 * request's status (the daemon's code, with its text in lohan_last_error)
 * and lohan_model_poll says whether it is done, without blocking. Many
 * requests may be in flight at once (as many as the rings hold, 1024 with
 * today's daemon; a submit beyond that waits for room); they complete in any
 * order, and a completed request's result is kept until its ticket is waited
 * for, once: waiting again is LOHAN_NOT_FOUND, a number never issued is
 * LOHAN_INVALID_ARGUMENT (both name the ticket). At most 65536 tickets may be
 * issued and not yet waited for (LOHAN_RESOURCE_EXHAUSTED beyond): wait for
 * every ticket, also when you do not need its answer. The daemon serves
 * requests in the order they were submitted. The synchronous calls above are
 * submit + wait and mix freely with these. If the daemon goes away, every
 * wait returns LOHAN_UNAVAILABLE within about 100 ms, never hangs.
 * `ticket` is required (LOHAN_INVALID_ARGUMENT when NULL) and written only on
 * success. */
LOHAN_CLIENT_API int lohan_model_submit_grad_ready(lohan_model* model,
                                                   uint32_t layer,
                                                   uint64_t* ticket);
LOHAN_CLIENT_API int lohan_model_submit_fetch_params(lohan_model* model,
                                                     uint32_t layer,
                                                     uint64_t* ticket);
LOHAN_CLIENT_API int lohan_model_submit_act_put(lohan_model* model, uint64_t id,
                                                uint64_t offset,
                                                uint64_t length,
                                                uint64_t* ticket);
/* An ACT_PUT whose `length` bytes are GPU memory at `device_source` on CUDA
 * device `device`: enqueues on `cuda_stream` (a cudaStream_t on that
 * device) their copy into the activation area at `offset`, and once the
 * copy is done a stream callback hands the ACT_PUT to the data plane's
 * submitter (as lohan_model_grad_ready_from_device does); returns the
 * ticket at once. The area's range is in use until the put completes; the
 * caller keeps `device_source` alive until the copy has read it (e.g.
 * torch's record_stream on `cuda_stream`). LOHAN_UNIMPLEMENTED /
 * LOHAN_FAILED_PRECONDITION where the library cannot use CUDA. */
LOHAN_CLIENT_API int lohan_model_submit_act_put_from_device(
    lohan_model* model, uint64_t id, uint64_t offset, uint64_t length,
    int device, const void* device_source, void* cuda_stream, uint64_t* ticket);
LOHAN_CLIENT_API int lohan_model_submit_act_get(lohan_model* model, uint64_t id,
                                                uint64_t offset,
                                                uint64_t length,
                                                uint64_t* ticket);
LOHAN_CLIENT_API int lohan_model_submit_act_free(lohan_model* model,
                                                 uint64_t id, uint64_t* ticket);
/* Waits up to `timeout_ms` (< 0: no limit) for `ticket`'s request and
 * returns its status, consuming the ticket. LOHAN_DEADLINE_EXCEEDED when it
 * is still in flight: the ticket stays valid, wait again. */
LOHAN_CLIENT_API int lohan_model_wait(lohan_model* model, uint64_t ticket,
                                      int64_t timeout_ms);
/* *done = 1 when `ticket`'s request has completed (lohan_model_wait then
 * returns at once), else 0. Does not consume the ticket. */
LOHAN_CLIENT_API int lohan_model_poll(lohan_model* model, uint64_t ticket,
                                      int* done);

/* ---- Moving tensors between the caller's memory and the arena ----
 * `bytes` must be the layer's (lohan_model_layer_bytes). Each copy first
 * waits until no request in flight uses the buffer it writes or reads: a
 * gradient copied into a buffer shared with other layers (grad_slots) waits
 * for the buffer's previous GRAD_READY; weights read right after
 * lohan_model_submit_fetch_params wait for that FETCH_PARAMS. (Requests
 * submitted after the copy started are not waited for.) The weight buffer
 * holds what the layer's last FETCH_PARAMS put there. */
/* Copies the layer's gradient from host memory into its gradient buffer,
 * then submits GRAD_READY: wait for `ticket`. */
LOHAN_CLIENT_API int lohan_model_grad_ready_from_host(lohan_model* model,
                                                      uint32_t layer,
                                                      const void* source,
                                                      uint64_t bytes,
                                                      uint64_t* ticket);
/* Copies the layer's weights from its weight buffer to host memory. */
LOHAN_CLIENT_API int lohan_model_weights_to_host(const lohan_model* model,
                                                 uint32_t layer,
                                                 void* destination,
                                                 uint64_t bytes);

/* ---- CUDA ----
 * Where lohan was built with the CUDA toolkit, liblohan_client uses the CUDA
 * driver API, loading libcuda.so.1 at run time (any NVIDIA driver for CUDA
 * 12.0 or newer, R525+; nothing from the toolkit is needed at run time: no
 * libcudart.so, no clash with torch's) and copies between GPU memory and the
 * arena on the caller's stream. A stream is a cudaStream_t (a CUstream)
 * passed as void* (NULL: the legacy default stream); torch's
 * (torch.cuda.current_stream().cuda_stream) works as is: torch's runtime
 * and this library drive the same primary contexts. Without CUDA built in
 * these return LOHAN_UNIMPLEMENTED; without a usable GPU or driver (none, or
 * one older than CUDA 12.0), LOHAN_FAILED_PRECONDITION; lohan_last_error
 * says which and what to do.
 * Devices: the *_on_device functions take the job's CUDA device index (as
 * torch counts them: tensor.device.index) and make every CUDA call on it,
 * switching the calling thread's current device only if it differs and
 * switching back afterwards without creating a context anywhere else (a
 * thread that had no context is left without one), so torch's current
 * device never moves and a job on cuda:N puts nothing on GPU 0. Use them.
 * The functions without a device argument are kept for old callers:
 * registration runs on the thread's current device (which, if the thread
 * has none yet, is device 0, whose context it then creates), and the copies
 * find the pointer's device by cuPointerGetAttribute (which creates no
 * context). A negative device is LOHAN_INVALID_ARGUMENT.
 */
/* 1 if this library was built with CUDA, else 0. */
LOHAN_CLIENT_API int lohan_cuda_built_with(void);
/* 1 if CUDA can be used in this process, else 0 with the reason in
 * lohan_last_error (built without CUDA, no driver, a driver older than CUDA
 * 12.0, no device). */
LOHAN_CLIENT_API int lohan_cuda_available(void);
/* Pins the whole arena for DMA (cuMemHostRegister, portable: every context,
 * torch's included, sees it pinned), so the copies below run asynchronously
 * at full PCIe speed. Once per plane (again: OK, unless on another device:
 * LOHAN_INVALID_ARGUMENT); undone by lohan_data_plane_destroy, on the same
 * device. The call is made on `device`; the older form, on the thread's
 * current device. */
LOHAN_CLIENT_API int lohan_data_plane_cuda_register_on_device(
    lohan_data_plane* plane, int device);
LOHAN_CLIENT_API int lohan_data_plane_cuda_register(lohan_data_plane* plane);
/* Enqueues on `cuda_stream` a copy of the layer's gradient from
 * `device_source` into its gradient buffer, then a stream callback that,
 * once the copy is done, hands GRAD_READY to the data plane's submitter
 * thread (the callback never locks or waits, so the stream is never held
 * up; the submitter waits for room on the rings and submits); returns at
 * once with `ticket` (wait for it like any other; a failure to submit, or
 * the plane being destroyed first, becomes its result).
 * The buffer counts as in use from the call until the request completes (a
 * buffer shared by several layers is waited for first). If the stream hits
 * a CUDA error before the copy is done, the ticket completes with
 * LOHAN_INTERNAL saying so and no GRAD_READY is sent.
 * lohan_model_iter_end first waits until every such GRAD_READY is
 * submitted, so it never overtakes a gradient still on its way.
 * REQUIRES: the model and plane outlive the copy (wait for the ticket);
 * `device_source` and `cuda_stream` are on `device` (the older form finds
 * the device from the pointer). */
LOHAN_CLIENT_API int lohan_model_grad_ready_from_device_on_device(
    lohan_model* model, uint32_t layer, int device, const void* device_source,
    uint64_t bytes, void* cuda_stream, uint64_t* ticket);
LOHAN_CLIENT_API int lohan_model_grad_ready_from_device(
    lohan_model* model, uint32_t layer, const void* device_source,
    uint64_t bytes, void* cuda_stream, uint64_t* ticket);
/* Enqueues on `cuda_stream` a copy of the layer's weight buffer to
 * `device_destination`; work enqueued after it on the stream sees the
 * weights. The buffer counts as in use until the copy has read it: a
 * FETCH_PARAMS that would refill it (a buffer shared by several layers)
 * waits for that. Resident 16-bit weights are rewritten by the daemon's
 * update after the layer's GRAD_READY: enqueue that GRAD_READY's copy on the
 * same stream (or after a sync), as the loop above does.
 * `device_destination` and `cuda_stream` are on `device` (the older form
 * finds the device from the pointer). */
LOHAN_CLIENT_API int lohan_model_weights_to_device_on_device(
    const lohan_model* model, uint32_t layer, int device,
    void* device_destination, uint64_t bytes, void* cuda_stream);
LOHAN_CLIENT_API int lohan_model_weights_to_device(const lohan_model* model,
                                                   uint32_t layer,
                                                   void* device_destination,
                                                   uint64_t bytes,
                                                   void* cuda_stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOHAN_CLIENT_H_ */
