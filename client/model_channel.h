#ifndef LOHAN_CLIENT_MODEL_CHANNEL_H_
#define LOHAN_CLIENT_MODEL_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "proto/lohan.pb.h"
#include "wire/ring_entry.h"

namespace lohan {

// A registered model's requests over its job's data plane: turns "fetch
// layer 3", "iteration over", "copy this gradient in" into ring entries at
// the offsets the registration gave (RegisterModelResponse), numbers the
// iterations, and holds an arena buffer while a copy into or out of it is
// under way. The C ABI (lohan_client.cc) is a translation of this class.
//
// Layers: `layer` is an index below the registered model's layer count;
// any other is INVALID_ARGUMENT "layer out of range", with nothing
// submitted. Streamed layouts (fewer buffers K than layers) need nothing
// here: the registration already gives layer i buffer i % K's offsets, and
// a request filling or reading a shared buffer waits until no request in
// flight uses it (DataPlane ranges).
//
// Iterations: ITER_BEGIN carries the next iteration number, starting from
// the registration's `iteration`; ITER_END / ITER_ABORT carry the one
// begun. Ending an iteration that was begun moves the number on whatever
// the daemon answers (it rolled the iteration back on an error); an end
// with no iteration begun (e.g. after a refused ITER_BEGIN) does not.
//
// Synchronous calls (FetchParams, IterEnd, ...) wait up to kCallTimeout;
// Submit* forms return a ticket for Wait / Poll instead. Errors are the
// daemon's (code and text) or the data plane's.
//
// A move to another arena (share_move.h) keeps the channel (so a
// TrainingSteps over it goes on) and replaces what it holds of the plane:
// DetachPlane, then AttachPlane with the new plane and registration.
// Without a plane every call that needs it fails with FAILED_PRECONDITION
// saying so, and the arena's areas are absent (nullptr, 0 bytes).
//
// Thread-compatible for the iteration calls (IterBegin / IterEnd /
// IterAbort: one thread at a time) and for DetachPlane / AttachPlane (no
// other call at all meanwhile); the others may be called from any number
// of threads at once (the DataPlane is thread-safe).
class ModelChannel {
 public:
  using Ticket = DataPlane::Ticket;
  // How long a synchronous call waits: an ITER_END waits for every layer's
  // update; generous, not infinite.
  static constexpr absl::Duration kCallTimeout = absl::Hours(24);

  // What an ITER_END's completion says.
  struct IterEndResult {
    double global_norm = 0;  // the gradients' global norm
    bool clipped = false;    // scaled down to max_grad_norm
    bool skipped = false;    // not applied (a non-finite gradient)
    // Not zero: lohand asks the job to move to a data plane whose arena it
    // grants as this many bytes (CompletionEntry::arena_asked).
    uint64_t arena_asked = 0;
  };

  // Registers `spec` for `job_id` with the daemon (RegisterModelRequest)
  // and makes the channel over `plane`, the job's data plane. The daemon's
  // refusal comes back as its status. `callbacks_pending` counts CUDA copy
  // callbacks still to run (the plane's owner waits for it to reach zero
  // before destroying the plane). Both must outlive the channel.
  static absl::StatusOr<std::unique_ptr<ModelChannel>> Register(
      ControlClient& control, DataPlane& plane,
      std::atomic<int64_t>& callbacks_pending, const std::string& job_id,
      const v1::ModelSpec& spec);

  // The channel of a model already registered as `spec`, the daemon's
  // answer being `registration` (one LayerSlots per layer of `spec`). Points
  // the plane's error texts at the registration's. Register uses it; so do
  // tests that play the daemon. `spec` is kept (spec()).
  ModelChannel(DataPlane& plane, std::atomic<int64_t>& callbacks_pending,
               v1::RegisterModelResponse registration,
               const v1::ModelSpec& spec);

  ModelChannel(const ModelChannel&) = delete;
  ModelChannel& operator=(const ModelChannel&) = delete;

  // ---- The registration's layout (pointers into the plane's arena)

  uint32_t layers() const { return static_cast<uint32_t>(elements_.size()); }
  // What the model was registered as.
  const v1::ModelSpec& spec() const { return spec_; }
  absl::StatusOr<uint8_t*> GradBuffer(uint32_t layer) const;
  absl::StatusOr<uint8_t*> WeightBuffer(uint32_t layer) const;
  // A layer's gradient (= weight) buffer size in bytes.
  absl::StatusOr<uint64_t> LayerBytes(uint32_t layer) const;
  // The fp32 staging buffer (InitWeights, ReadWeights, ReadState,
  // InitState).
  float* staging() const;
  uint64_t staging_bytes() const {
    return plane_ == nullptr ? 0 : registration_.staging_bytes();
  }
  // The activation area: nullptr (and 0 bytes) when the model has none.
  uint8_t* activation_area() const;
  uint64_t activation_bytes() const {
    return plane_ == nullptr ? 0 : registration_.activation_bytes();
  }
  uint32_t grad_slots() const { return registration_.grad_slots(); }
  uint32_t weight_slots() const { return registration_.weight_slots(); }
  // Committed iterations when the model was registered.
  uint64_t iteration() const { return registration_.iteration(); }
  // Whether the layer had states at registration (false out of range).
  bool layer_initialized(uint32_t layer) const;
  // Whether the job kept the commit before its last one at registration
  // (RegisterModelResponse.previous_commit_kept).
  bool previous_commit_kept() const {
    return registration_.previous_commit_kept();
  }

  // ---- Iterations

  // An ITER_BEGIN succeeded and no ITER_END / ITER_ABORT went out since.
  bool in_iteration() const { return in_iteration_; }
  // What the last ITER_END since registration asked
  // (IterEndResult::arena_asked; 0 after a failed end): 0 nothing.
  uint64_t arena_asked() const { return arena_asked_; }

  // ITER_BEGIN. `grad_scale`: the loss scale the gradients carry (0: none);
  // `lr`: this iteration's rate (even 0), or the registered one.
  absl::Status IterBegin(float grad_scale = 0.0f,
                         std::optional<double> lr = std::nullopt);
  // ITER_END, after every gradient still being copied from a GPU has been
  // handed over (their GRAD_READY must not be overtaken).
  // `global_sum_squares` (sharded data-parallel jobs, each holding one
  // rank's shard of every layer): the sum of squares of every rank's
  // gradients (times grad_scale), the same on every rank; the daemon
  // decides clipping and skipping on it and reports its square root as
  // the global norm (ring_entry.h, kIterEndSumSquaresGiven). inf/NaN mean
  // a non-finite gradient somewhere. Negative (-0.0 too): INVALID_ARGUMENT
  // without sending anything, the iteration still in progress.
  absl::StatusOr<IterEndResult> IterEnd(
      std::optional<double> global_sum_squares = std::nullopt);
  // ITER_ABORT, likewise after pending gradient copies.
  absl::Status IterAbort();
  // ITER_COMMITTED (between iterations): waits until the last iteration
  // has committed and returns the job's committed iterations.
  absl::StatusOr<uint64_t> AwaitCommitted();
  // ITER_COMMITTED with kIterCommittedRelease: once every rank has
  // committed the last iteration, frees the states that commit kept.
  absl::Status ReleasePreviousCommit();

  // ---- Layers' weights and gradients in their arena buffers

  absl::Status FetchParams(uint32_t layer);
  absl::Status GradReady(uint32_t layer);
  absl::StatusOr<Ticket> SubmitFetchParams(uint32_t layer);
  absl::StatusOr<Ticket> SubmitGradReady(uint32_t layer);

  // Copies `bytes` (the layer's size, else INVALID_ARGUMENT) from `source`
  // into the layer's gradient buffer, once no request in flight uses it,
  // and submits GRAD_READY; the ticket is that request's.
  absl::StatusOr<Ticket> GradReadyFromHost(uint32_t layer, const void* source,
                                           uint64_t bytes);
  // Copies the layer's weight buffer (`bytes`, its size) to `destination`
  // once no request still fills it (a FETCH_PARAMS).
  absl::Status WeightsToHost(uint32_t layer, void* destination,
                             uint64_t bytes) const;

  // The same with GPU memory, on `cuda_stream` (a CUstream / cudaStream_t)
  // on CUDA device `device` (cuda::kUnspecifiedDevice: the pointer's). The
  // buffer is held until the copy is done; a gradient's GRAD_READY is then
  // submitted under the returned ticket (the copy's error fails it). The
  // weights copy returns once enqueued. UNIMPLEMENTED / FAILED_PRECONDITION
  // where CUDA cannot be used (cuda::Available).
  absl::StatusOr<Ticket> GradReadyFromDevice(uint32_t layer, int device,
                                             const void* device_source,
                                             uint64_t bytes, void* cuda_stream);
  absl::Status WeightsToDevice(uint32_t layer, int device,
                               void* device_destination, uint64_t bytes,
                               void* cuda_stream) const;

  // ---- The staging buffer (outside iterations)

  absl::Status InitWeights(uint32_t layer);
  absl::Status ReadWeights(uint32_t layer);
  absl::Status ReadState(uint32_t layer, RingStatePart part);
  absl::Status InitState(uint32_t layer, RingStatePart part);

  // ---- Activations: [offset, offset + length) of the activation area
  // (INVALID_ARGUMENT outside it or empty)

  absl::Status ActPut(uint64_t id, uint64_t offset, uint64_t length);
  absl::Status ActGet(uint64_t id, uint64_t offset, uint64_t length);
  absl::Status ActFree(uint64_t id);
  absl::StatusOr<Ticket> SubmitActPut(uint64_t id, uint64_t offset,
                                      uint64_t length);
  absl::StatusOr<Ticket> SubmitActGet(uint64_t id, uint64_t offset,
                                      uint64_t length);
  absl::StatusOr<Ticket> SubmitActFree(uint64_t id);
  // An ACT_PUT of `length` bytes at `device_source` (GPU memory on CUDA
  // device `device`): enqueues on `cuda_stream` their copy into the
  // activation area's [offset, offset + length), held until done, and
  // submits the put once the copy is done (the copy's error fails the
  // ticket). Returns the ticket at once; nothing waits. UNIMPLEMENTED /
  // FAILED_PRECONDITION where CUDA cannot be used.
  absl::StatusOr<Ticket> SubmitActPutFromDevice(uint64_t id, uint64_t offset,
                                                uint64_t length, int device,
                                                const void* device_source,
                                                void* cuda_stream);

  // ---- Tickets (DataPlane::Wait / Poll)

  absl::Status Wait(Ticket ticket, absl::Duration timeout);
  absl::StatusOr<bool> Poll(Ticket ticket);

  // ---- The data plane under the channel (a move: share_move.h)

  // The plane the model is registered over; nullptr between DetachPlane
  // and AttachPlane.
  const DataPlane* plane() const { return plane_; }
  // Lets go of the plane, which may then close. REQUIRES: no iteration in
  // progress, no request of the channel's in flight or waiting for its
  // ticket, no CUDA callback left (ArenaPinning::AwaitCallbacks).
  void DetachPlane();
  // Takes `plane` with the model registered there anew as `registration`
  // (for spec(), unchanged): its layout and iteration numbers from there;
  // arena_asked() is 0 again. FAILED_PRECONDITION when a plane is
  // attached; INTERNAL, nothing taken, when the registration does not lay
  // out spec()'s layers.
  absl::Status AttachPlane(DataPlane& plane,
                           v1::RegisterModelResponse registration);

 private:
  // The entry for `op` on `layer` (the iteration ops ignore `layer`).
  absl::StatusOr<SubmissionEntry> BuildEntry(
      RingOp op, uint32_t layer, float grad_scale = 0.0f,
      std::optional<double> lr = std::nullopt) const;
  // BuildEntry for GRAD_READY / FETCH_PARAMS, checking that `bytes` is the
  // layer's size.
  absl::StatusOr<SubmissionEntry> LayerEntry(RingOp op, uint32_t layer,
                                             uint64_t bytes) const;
  absl::StatusOr<SubmissionEntry> ActivationEntry(RingOp op, uint64_t id,
                                                  uint64_t offset,
                                                  uint64_t length) const;
  absl::StatusOr<SubmissionEntry> StateEntry(RingOp op, uint32_t layer,
                                             RingStatePart part) const;
  // Submits `entry` (a FETCH_PARAMS under a reservation of its buffer).
  absl::StatusOr<Ticket> SubmitEntry(const SubmissionEntry& entry);
  // SubmitEntry, then waits for the completion.
  // ITER_COMMITTED with `flags`; the committed iterations.
  absl::StatusOr<uint64_t> CallIterCommitted(uint8_t flags);
  absl::StatusOr<CompletionEntry> CallEntry(const SubmissionEntry& entry);
  absl::StatusOr<Ticket> SubmitRefill(const SubmissionEntry& entry);
  // ITER_END (with every rank's sum of squares, when given) / ITER_ABORT.
  absl::StatusOr<CompletionEntry> EndIteration(
      RingOp op, std::optional<double> global_sum_squares = std::nullopt);
  // Reserves the entry's buffer and enqueues the copy between it and
  // `device_memory` (to_host: a gradient, GRAD_READY submitted once done;
  // else weights, the buffer released once read).
  absl::StatusOr<Ticket> CopyHoldingBuffer(const SubmissionEntry& entry,
                                           bool to_host, void* device_memory,
                                           int device, void* stream) const;

  // Without a plane (a move's): FAILED_PRECONDITION saying so; else OK.
  absl::Status CheckPlane() const;

  DataPlane* plane_;  // null between DetachPlane and AttachPlane
  std::atomic<int64_t>& callbacks_pending_;
  v1::RegisterModelResponse registration_;  // the plane's
  const v1::ModelSpec spec_;
  const std::vector<uint64_t> elements_;  // per layer
  const RingDtype ring_dtype_;
  uint64_t sequence_;  // the next ITER_BEGIN's number
  // An ITER_BEGIN succeeded and no ITER_END / ITER_ABORT went out since.
  bool in_iteration_ = false;
  uint64_t arena_asked_ = 0;  // by the last ITER_END
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_MODEL_CHANNEL_H_
