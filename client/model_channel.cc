#include "client/model_channel.h"

#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cuda_copy.h"
#include "client/plane_gone.h"

namespace lohan {
namespace {

RingDtype RingDtypeOf(v1::DType dtype) {
  return dtype == v1::DTYPE_FP32   ? RingDtype::kFp32
         : dtype == v1::DTYPE_BF16 ? RingDtype::kBf16
                                   : RingDtype::kFp16;
}

bool IsRefill(const SubmissionEntry& entry) {
  return static_cast<RingOp>(entry.op) == RingOp::kFetchParams;
}

// A copy between the GPU and the arena, holding the arena bytes it touches
// (a reserved ticket) until it is done. Its callback runs on a CUDA thread
// and must not lock or wait (CUDA forbids waiting in host functions: it
// would hold up the stream), so it only delivers the hand-off, made up
// front, to the data plane's submitter: for a gradient that submits its
// GRAD_READY (or fails the ticket with the copy's error); for weights it
// releases the bytes. No CUDA calls in there either.
struct PendingCopy {
  DataPlane* plane;
  std::unique_ptr<DataPlane::HandOff> handoff;
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

}  // namespace

absl::StatusOr<std::unique_ptr<ModelChannel>> ModelChannel::Register(
    ControlClient& control, DataPlane& plane,
    std::atomic<int64_t>& callbacks_pending, const std::string& job_id,
    const v1::ModelSpec& spec) {
  v1::RegisterModelRequest request;
  request.set_job_id(job_id);
  *request.mutable_model() = spec;
  absl::StatusOr<v1::RegisterModelResponse> registration =
      control.RegisterModel(request);
  if (!registration.ok()) return registration.status();
  return std::make_unique<ModelChannel>(plane, callbacks_pending,
                                        *std::move(registration), spec);
}

ModelChannel::ModelChannel(DataPlane& plane,
                           std::atomic<int64_t>& callbacks_pending,
                           v1::RegisterModelResponse registration,
                           const v1::ModelSpec& spec)
    : plane_(&plane),
      callbacks_pending_(callbacks_pending),
      registration_(std::move(registration)),
      spec_(spec),
      elements_(spec.layer_elements().begin(), spec.layer_elements().end()),
      ring_dtype_(RingDtypeOf(spec.dtype())),
      sequence_(registration_.iteration()) {
  plane_->SetErrorText(registration_.error_text_offset(),
                       registration_.error_text_bytes());
}

// ---- Layout

absl::Status ModelChannel::CheckPlane() const {
  if (plane_ == nullptr) return PlaneGoneError("this model");
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> ModelChannel::GradBuffer(uint32_t layer) const {
  if (layer >= elements_.size()) {
    return absl::InvalidArgumentError("layer out of range");
  }
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  return plane_->arena() + registration_.layers(layer).grad_offset();
}

absl::StatusOr<uint8_t*> ModelChannel::WeightBuffer(uint32_t layer) const {
  if (layer >= elements_.size()) {
    return absl::InvalidArgumentError("layer out of range");
  }
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  return plane_->arena() + registration_.layers(layer).weight_offset();
}

absl::StatusOr<uint64_t> ModelChannel::LayerBytes(uint32_t layer) const {
  if (layer >= elements_.size()) {
    return absl::InvalidArgumentError("layer out of range");
  }
  return registration_.layers(layer).bytes();
}

float* ModelChannel::staging() const {
  if (plane_ == nullptr) return nullptr;
  return reinterpret_cast<float*>(plane_->arena() +
                                  registration_.staging_offset());
}

uint8_t* ModelChannel::activation_area() const {
  if (plane_ == nullptr || registration_.activation_bytes() == 0) {
    return nullptr;
  }
  return plane_->arena() + registration_.activation_offset();
}

bool ModelChannel::layer_initialized(uint32_t layer) const {
  return layer <
             static_cast<uint32_t>(registration_.layer_initialized_size()) &&
         registration_.layer_initialized(layer);
}

// ---- Entries

// Every request's entry is built here or in ActivationEntry, which check
// that there is a plane to submit it on.
absl::StatusOr<SubmissionEntry> ModelChannel::BuildEntry(
    RingOp op, uint32_t layer, float grad_scale,
    std::optional<double> lr) const {
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(op);
  switch (op) {
    case RingOp::kInitWeights:
    case RingOp::kReadWeights:
    case RingOp::kReadState:
    case RingOp::kInitState:
      if (layer >= elements_.size()) {
        return absl::InvalidArgumentError("layer out of range");
      }
      entry.layer = layer;
      entry.slot_offset = registration_.staging_offset();
      entry.length = elements_[layer] * 4;
      break;
    case RingOp::kFetchParams:
    case RingOp::kGradReady: {
      if (layer >= elements_.size()) {
        return absl::InvalidArgumentError("layer out of range");
      }
      const v1::LayerSlots& slots = registration_.layers(layer);
      entry.layer = layer;
      entry.length = slots.bytes();
      if (op == RingOp::kGradReady) {
        entry.slot_offset = slots.grad_offset();
        entry.dtype = static_cast<uint16_t>(ring_dtype_);
      } else {
        entry.slot_offset = slots.weight_offset();
      }
      break;
    }
    case RingOp::kIterBegin:
      entry.grad_scale = grad_scale;
      if (lr.has_value()) {
        entry.lr = *lr;
        entry.iter_flags = kIterBeginLrGiven;
      }
      entry.iteration = sequence_;
      break;
    case RingOp::kIterEnd:
    case RingOp::kIterAbort:
      entry.iteration = sequence_;
      break;
    case RingOp::kIterCommitted:
      break;
    default:
      return absl::InvalidArgumentError("unsupported ring op");
  }
  return entry;
}

absl::StatusOr<SubmissionEntry> ModelChannel::LayerEntry(RingOp op,
                                                         uint32_t layer,
                                                         uint64_t bytes) const {
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(op, layer);
  if (!entry.ok()) return entry.status();
  if (bytes != entry->length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", layer, " has ", entry->length, " bytes of ",
        op == RingOp::kGradReady ? "gradient" : "weights", ", not ", bytes));
  }
  return entry;
}

absl::StatusOr<SubmissionEntry> ModelChannel::ActivationEntry(
    RingOp op, uint64_t id, uint64_t offset, uint64_t length) const {
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  const uint64_t area = registration_.activation_bytes();
  if (op != RingOp::kActFree &&
      (offset > area || length > area - offset || length == 0)) {
    return absl::InvalidArgumentError(
        "activation range outside the model's activation area");
  }
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(op);
  entry.activation_id = id;
  if (op != RingOp::kActFree) {
    entry.slot_offset = registration_.activation_offset() + offset;
    entry.length = length;
  }
  return entry;
}

absl::StatusOr<SubmissionEntry> ModelChannel::StateEntry(
    RingOp op, uint32_t layer, RingStatePart part) const {
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(op, layer);
  if (!entry.ok()) return entry.status();
  entry->activation_id = static_cast<uint64_t>(part);
  return entry;
}

// ---- Submitting

// A FETCH_PARAMS refills the layer's weight buffer: it takes the buffer
// once no request uses it any more (a copy to a GPU still reading it, a
// shared buffer's earlier fetch) and is submitted under that ticket, so no
// other request can take the buffer in between.
absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitRefill(
    const SubmissionEntry& entry) {
  absl::StatusOr<Ticket> reserved =
      plane_->Reserve(entry.slot_offset, entry.length, kCallTimeout);
  if (!reserved.ok()) return reserved.status();
  if (absl::Status submitted =
          plane_->SubmitReserved(*reserved, entry, kCallTimeout);
      !submitted.ok()) {
    plane_->Abandon(*reserved);  // its result is this failure
    return submitted;
  }
  return *reserved;
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitEntry(
    const SubmissionEntry& entry) {
  if (IsRefill(entry)) return SubmitRefill(entry);
  return plane_->Submit(entry, kCallTimeout);
}

absl::StatusOr<CompletionEntry> ModelChannel::CallEntry(
    const SubmissionEntry& entry) {
  if (!IsRefill(entry)) return plane_->Call(entry, kCallTimeout);
  absl::StatusOr<Ticket> ticket = SubmitRefill(entry);
  if (!ticket.ok()) return ticket.status();
  absl::StatusOr<CompletionEntry> completion =
      plane_->Wait(*ticket, kCallTimeout);
  if (absl::IsDeadlineExceeded(completion.status())) plane_->Abandon(*ticket);
  return completion;
}

// ---- Iterations

absl::Status ModelChannel::IterBegin(float grad_scale,
                                     std::optional<double> lr) {
  absl::StatusOr<SubmissionEntry> entry =
      BuildEntry(RingOp::kIterBegin, 0, grad_scale, lr);
  if (!entry.ok()) return entry.status();
  absl::Status status = CallEntry(*entry).status();
  if (status.ok()) in_iteration_ = true;
  return status;
}

// Gradients still being copied from a GPU go first: their GRAD_READY is
// submitted from the submitter, and the end must not overtake them. An
// iteration begun is over afterwards whatever the answer.
absl::StatusOr<CompletionEntry> ModelChannel::EndIteration(
    RingOp op, std::optional<double> global_sum_squares) {
  // The daemon refuses it without ending the iteration; refused here, the
  // iteration numbers stay in step with the daemon's. (NaN's sign bit
  // means nothing: inf - inf in an all-reduce sets it.)
  if (global_sum_squares.has_value() && std::signbit(*global_sum_squares) &&
      !std::isnan(*global_sum_squares)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ITER_END: the global sum of squares ",
                     *global_sum_squares, " is negative"));
  }
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(op, 0);
  if (!entry.ok()) return entry.status();
  if (absl::Status pending = plane_->WaitForReserved(kCallTimeout);
      !pending.ok()) {
    return pending;
  }
  if (global_sum_squares.has_value()) {
    entry->iter_flags = kIterEndSumSquaresGiven;
    entry->global_sum_squares = *global_sum_squares;
  }
  absl::StatusOr<CompletionEntry> completion = CallEntry(*entry);
  if (in_iteration_) {
    ++sequence_;
    in_iteration_ = false;
  }
  return completion;
}

absl::StatusOr<ModelChannel::IterEndResult> ModelChannel::IterEnd(
    std::optional<double> global_sum_squares) {
  absl::StatusOr<CompletionEntry> completion =
      EndIteration(RingOp::kIterEnd, global_sum_squares);
  arena_asked_ = completion.ok() ? completion->arena_asked : 0;
  if (!completion.ok()) return completion.status();
  IterEndResult result;
  std::memcpy(&result.global_norm, &completion->detail,
              sizeof(result.global_norm));
  result.clipped = (completion->flags & kIterEndClipped) != 0;
  result.skipped = (completion->flags & kIterEndSkipped) != 0;
  result.arena_asked = completion->arena_asked;
  return result;
}

absl::Status ModelChannel::IterAbort() {
  return EndIteration(RingOp::kIterAbort).status();
}

absl::StatusOr<uint64_t> ModelChannel::AwaitCommitted() {
  return CallIterCommitted(0);
}

absl::Status ModelChannel::ReleasePreviousCommit() {
  return CallIterCommitted(kIterCommittedRelease).status();
}

absl::StatusOr<uint64_t> ModelChannel::CallIterCommitted(uint8_t flags) {
  if (in_iteration_) {
    return absl::FailedPreconditionError(
        "ITER_COMMITTED: an iteration is in progress; it waits for the last "
        "commit between iterations");
  }
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(RingOp::kIterCommitted, 0);
  if (!entry.ok()) return entry.status();
  entry->iter_flags = flags;
  absl::StatusOr<CompletionEntry> completion = CallEntry(*entry);
  if (!completion.ok()) return completion.status();
  return completion->detail;
}

// ---- Layers

absl::Status ModelChannel::FetchParams(uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry =
      BuildEntry(RingOp::kFetchParams, layer);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::GradReady(uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(RingOp::kGradReady, layer);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitFetchParams(
    uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry =
      BuildEntry(RingOp::kFetchParams, layer);
  if (!entry.ok()) return entry.status();
  return SubmitEntry(*entry);
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitGradReady(
    uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry = BuildEntry(RingOp::kGradReady, layer);
  if (!entry.ok()) return entry.status();
  return SubmitEntry(*entry);
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::GradReadyFromHost(
    uint32_t layer, const void* source, uint64_t bytes) {
  absl::StatusOr<SubmissionEntry> entry =
      LayerEntry(RingOp::kGradReady, layer, bytes);
  if (!entry.ok()) return entry.status();
  // The buffer may be shared with other layers (a streamed layout): wait
  // until no request in flight uses it, and hold it, before copying in.
  absl::StatusOr<Ticket> reserved =
      plane_->Reserve(entry->slot_offset, entry->length, kCallTimeout);
  if (!reserved.ok()) return reserved.status();
  std::memcpy(plane_->arena() + entry->slot_offset, source, bytes);
  if (absl::Status submitted =
          plane_->SubmitReserved(*reserved, *entry, kCallTimeout);
      !submitted.ok()) {
    plane_->Abandon(*reserved);
    return submitted;
  }
  return *reserved;
}

absl::Status ModelChannel::WeightsToHost(uint32_t layer, void* destination,
                                         uint64_t bytes) const {
  absl::StatusOr<SubmissionEntry> entry =
      LayerEntry(RingOp::kFetchParams, layer, bytes);
  if (!entry.ok()) return entry.status();
  // A FETCH_PARAMS (or anything else) still filling the buffer goes first.
  if (absl::Status idle =
          plane_->WaitForRange(entry->slot_offset, entry->length, kCallTimeout);
      !idle.ok()) {
    return idle;
  }
  std::memcpy(destination, plane_->arena() + entry->slot_offset, bytes);
  return absl::OkStatus();
}

// ---- CUDA

absl::StatusOr<ModelChannel::Ticket> ModelChannel::GradReadyFromDevice(
    uint32_t layer, int device, const void* device_source, uint64_t bytes,
    void* cuda_stream) {
  absl::StatusOr<SubmissionEntry> entry =
      LayerEntry(RingOp::kGradReady, layer, bytes);
  if (!entry.ok()) return entry.status();
  if (absl::Status available = cuda::Available(); !available.ok()) {
    return available;
  }
  // The ticket exists before the copy is enqueued, so the caller can wait
  // for it while the callback has not run yet; it holds the gradient
  // buffer (which may be shared with other layers: then this waits until
  // the last request using it has completed).
  return CopyHoldingBuffer(*entry, /*to_host=*/true,
                           const_cast<void*>(device_source), device,
                           cuda_stream);
}

absl::Status ModelChannel::WeightsToDevice(uint32_t layer, int device,
                                           void* device_destination,
                                           uint64_t bytes,
                                           void* cuda_stream) const {
  absl::StatusOr<SubmissionEntry> entry =
      LayerEntry(RingOp::kFetchParams, layer, bytes);
  if (!entry.ok()) return entry.status();
  if (absl::Status available = cuda::Available(); !available.ok()) {
    return available;
  }
  // Held until the copy has read the buffer, so a FETCH_PARAMS that would
  // refill it (a weight buffer shared by several layers) waits for that.
  return CopyHoldingBuffer(*entry, /*to_host=*/false, device_destination,
                           device, cuda_stream)
      .status();
}

// The reservation's ticket, or the error with nothing left in flight. The
// hand-off and its wrapper are allocated with std::nothrow and owned by the
// callback once the copy is enqueued (it frees them).
absl::StatusOr<ModelChannel::Ticket> ModelChannel::CopyHoldingBuffer(
    const SubmissionEntry& entry, bool to_host, void* device_memory, int device,
    void* stream) const {
  absl::StatusOr<Ticket> reserved =
      plane_->Reserve(entry.slot_offset, entry.length, kCallTimeout);
  if (!reserved.ok()) return reserved.status();
  auto handoff = std::unique_ptr<DataPlane::HandOff>(new (std::nothrow)
                                                         DataPlane::HandOff);
  auto pending = std::unique_ptr<PendingCopy>(
      handoff == nullptr ? nullptr
                         : new (std::nothrow) PendingCopy{plane_, nullptr,
                                                          &callbacks_pending_});
  if (pending == nullptr) {
    plane_->Cancel(*reserved);
    return absl::ResourceExhaustedError("out of memory");
  }
  handoff->ticket = *reserved;
  handoff->submit = to_host;  // a gradient's GRAD_READY; weights: release
  handoff->entry = entry;
  pending->handoff = std::move(handoff);
  uint8_t* buffer = plane_->arena() + entry.slot_offset;
  callbacks_pending_.fetch_add(1, std::memory_order_relaxed);
  absl::Status copied =
      to_host
          ? cuda::CopyToHostThen(buffer, device_memory, entry.length, device,
                                 stream, &DeliverWhenCopied, pending.get())
          : cuda::CopyToDeviceThen(device_memory, buffer, entry.length, device,
                                   stream, &DeliverWhenCopied, pending.get());
  if (!copied.ok()) {
    plane_->Cancel(*reserved);  // nothing is in flight: the bytes are free
    callbacks_pending_.fetch_sub(1, std::memory_order_relaxed);
    return copied;
  }
  (void)pending.release();  // the callback owns it now
  return *reserved;
}

// ---- Staging

absl::Status ModelChannel::InitWeights(uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry =
      BuildEntry(RingOp::kInitWeights, layer);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::ReadWeights(uint32_t layer) {
  absl::StatusOr<SubmissionEntry> entry =
      BuildEntry(RingOp::kReadWeights, layer);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::ReadState(uint32_t layer, RingStatePart part) {
  absl::StatusOr<SubmissionEntry> entry =
      StateEntry(RingOp::kReadState, layer, part);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::InitState(uint32_t layer, RingStatePart part) {
  absl::StatusOr<SubmissionEntry> entry =
      StateEntry(RingOp::kInitState, layer, part);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

// ---- Activations

absl::Status ModelChannel::ActPut(uint64_t id, uint64_t offset,
                                  uint64_t length) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActPut, id, offset, length);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::ActGet(uint64_t id, uint64_t offset,
                                  uint64_t length) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActGet, id, offset, length);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::Status ModelChannel::ActFree(uint64_t id) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActFree, id, 0, 0);
  if (!entry.ok()) return entry.status();
  return CallEntry(*entry).status();
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitActPut(
    uint64_t id, uint64_t offset, uint64_t length) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActPut, id, offset, length);
  if (!entry.ok()) return entry.status();
  return SubmitEntry(*entry);
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitActGet(
    uint64_t id, uint64_t offset, uint64_t length) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActGet, id, offset, length);
  if (!entry.ok()) return entry.status();
  return SubmitEntry(*entry);
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitActFree(uint64_t id) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActFree, id, 0, 0);
  if (!entry.ok()) return entry.status();
  return SubmitEntry(*entry);
}

absl::StatusOr<ModelChannel::Ticket> ModelChannel::SubmitActPutFromDevice(
    uint64_t id, uint64_t offset, uint64_t length, int device,
    const void* device_source, void* cuda_stream) {
  absl::StatusOr<SubmissionEntry> entry =
      ActivationEntry(RingOp::kActPut, id, offset, length);
  if (!entry.ok()) return entry.status();
  if (absl::Status available = cuda::Available(); !available.ok()) {
    return available;
  }
  return CopyHoldingBuffer(*entry, /*to_host=*/true,
                           const_cast<void*>(device_source), device,
                           cuda_stream);
}

// ---- Tickets

absl::Status ModelChannel::Wait(Ticket ticket, absl::Duration timeout) {
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  return plane_->Wait(ticket, timeout).status();
}

absl::StatusOr<bool> ModelChannel::Poll(Ticket ticket) {
  if (absl::Status there = CheckPlane(); !there.ok()) return there;
  return plane_->Poll(ticket);
}

// ---- The data plane under the channel

void ModelChannel::DetachPlane() { plane_ = nullptr; }

absl::Status ModelChannel::AttachPlane(DataPlane& plane,
                                       v1::RegisterModelResponse registration) {
  if (plane_ != nullptr) {
    return absl::FailedPreconditionError(
        "the model is registered over a data plane already");
  }
  if (static_cast<size_t>(registration.layers_size()) != elements_.size()) {
    return absl::InternalError(absl::StrCat(
        "lohand's registration lays out ", registration.layers_size(),
        " layers, not the model's ", elements_.size()));
  }
  plane_ = &plane;
  registration_ = std::move(registration);
  sequence_ = registration_.iteration();
  in_iteration_ = false;
  arena_asked_ = 0;
  plane_->SetErrorText(registration_.error_text_offset(),
                       registration_.error_text_bytes());
  return absl::OkStatus();
}

}  // namespace lohan
