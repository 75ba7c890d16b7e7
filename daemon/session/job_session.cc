#include "daemon/session/job_session.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/common/test_point.h"
#include "daemon/common/thread_name.h"
#include "daemon/quota/daemon_memory.h"
#include "daemon/session/arena_layout.h"
#include "daemon/session/job_settings.h"
#include "daemon/session/model_layout_of.h"
#include "layout/job_space.h"
#include "spdlog/spdlog.h"
#include "spec/model_spec_checks.h"

namespace lohan {
namespace {

// How long a registration waits for SSD space that other users hold
// beyond their fair shares (their swapped activations, freed as their
// iterations end) before it is refused.
constexpr absl::Duration kSpaceWait = absl::Seconds(60);

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t bytes, uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

absl::StatusOr<std::pair<DType, RingDtype>> DTypes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return std::make_pair(DType::kFloat32, RingDtype::kFp32);
    case v1::DTYPE_BF16:
      return std::make_pair(DType::kBFloat16, RingDtype::kBf16);
    case v1::DTYPE_FP16:
      return std::make_pair(DType::kFloat16, RingDtype::kFp16);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("model dtype ", v1::DType_Name(dtype),
                       " is not supported; use DTYPE_FP32, DTYPE_BF16 or "
                       "DTYPE_FP16"));
  }
}

}  // namespace

JobSession::JobSession(std::unique_ptr<PooledArena> arena,
                       std::unique_ptr<SlotAllocator> slots, ArenaGrant grant,
                       uint32_t ring_entries)
    : arena_(std::move(arena)),
      slots_(std::move(slots)),
      grant_(grant),
      ring_entries_(ring_entries) {}

absl::StatusOr<std::unique_ptr<JobSession>> JobSession::Create(
    HostPool* pool, const std::string& job_id, uint64_t arena_bytes,
    uint32_t ring_entries) {
  const uint64_t ring_bytes = RingBytes(ring_entries, kRingEntryBytes);
  if (ring_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rings of ", ring_entries, " entries: a power of two from 2 to ",
        kRingMaxCapacity, " is needed"));
  }
  const uint64_t rings_bytes = 2 * RoundUp(ring_bytes, kPage);
  if (arena_bytes < rings_bytes + kPage) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id, " asked for a host pool of ", arena_bytes,
        " bytes; its data plane needs at least ", rings_bytes + kPage,
        " (create the job with a larger host_pool_bytes)"));
  }
  absl::StatusOr<std::unique_ptr<PooledArena>> arena =
      pool->CreateArena(job_id, RoundUp(arena_bytes, kPage));
  if (!arena.ok()) return arena.status();
  const SharedArena& memory = (*arena)->arena();
  auto slots = std::make_unique<SlotAllocator>(memory.size());

  ArenaGrant grant{.arena_bytes = memory.size()};
  for (int ring = 0; ring < 2; ++ring) {
    absl::StatusOr<Slot> slot = slots->Allocate(ring_bytes, SlotKind::kControl);
    if (!slot.ok()) return slot.status();
    if (absl::Status status =
            FormatRing(memory.base() + slot->offset, slot->length, ring_entries,
                       kRingEntryBytes);
        !status.ok()) {
      return status;
    }
    (ring == 0 ? grant.submission_offset : grant.completion_offset) =
        slot->offset;
    (ring == 0 ? grant.submission_bytes : grant.completion_bytes) =
        slot->length;
  }
  std::unique_ptr<JobSession> session(
      new JobSession(*std::move(arena), std::move(slots), grant, ring_entries));
  absl::StatusOr<RingConsumer> submissions =
      RingConsumer::Attach(session->base() + grant.submission_offset,
                           grant.submission_bytes, kRingEntryBytes);
  if (!submissions.ok()) return submissions.status();
  absl::StatusOr<RingProducer> completions =
      RingProducer::Attach(session->base() + grant.completion_offset,
                           grant.completion_bytes, kRingEntryBytes);
  if (!completions.ok()) return completions.status();
  session->submissions_.emplace(*std::move(submissions));
  {
    absl::MutexLock lock(&session->complete_mu_);
    session->completions_.emplace(*std::move(completions));
  }
  return session;
}

void JobSession::StopServing() {
  if (serving_stopped_) return;
  serving_stopped_ = true;
  stopping_.store(true);
  TestPoint("job_session.stopping");
  if (server_.joinable()) server_.join();
  lanes_ready_.store(nullptr);
  pipeline_ready_.store(nullptr);
  lanes_.reset();  // drops what has not begun, waits for what runs
}

JobSession::~JobSession() {
  StopServing();
  if (served_ != nullptr && !keep_activations_) DropActivations();
  // The pipeline (inside model_) rolls back an unfinished iteration as it
  // goes; then the arena returns to the pool.
  absl::MutexLock lock(&mu_);
  model_.reset();
  if (ledger_ != nullptr) {
    ledger_->ClearSetAside(job_id(), reinterpret_cast<uintptr_t>(this));
  }
}

absl::Status JobSession::TakeSlots(const v1::ModelSpec& spec,
                                   absl::string_view smaller_arena,
                                   Model& model, std::vector<uint64_t>& taken) {
  const ModelLayout& layout = model.layout;
  // Slots: gradient and weight buffers (one per layer, or K shared ones),
  // one fp32 staging area, the error text and the activation area, as
  // arena_layout.h counts them.
  uint64_t largest = 0;
  for (uint64_t elements : layout.layer_elements) {
    largest = std::max(largest, elements);
  }
  const size_t num_layers = layout.layer_elements.size();
  ArenaLimit limit{.bytes = grant_.arena_bytes,
                   .what = absl::StrCat("job ", job_id(), "'s arena"),
                   .remedy =
                       "create the job with a larger host_pool_bytes, "
                       "or from its model (JobSpec.model) so the "
                       "daemon sizes it"};
  // A plane below its job's arena gets no larger one by asking: it says
  // why it is smaller, and that lohand asks the job to grow.
  constexpr absl::string_view kGrowsLater =
      "lohand asks the job to grow when the pool has room for more of it";
  if (!smaller_arena.empty()) {
    limit.what = absl::StrCat("job ", job_id(), "'s data plane (less than ",
                              smaller_arena, ")");
    limit.remedy = std::string(kGrowsLater);
  }
  absl::StatusOr<ArenaChoice> arena = ChooseArena(spec, limit);
  if (!arena.ok()) return arena.status();
  // K >= layers would only waste room: that is the resident layout.
  const uint32_t grad_buffers = arena->grad_buffers;
  const uint32_t weight_buffers = arena->weight_buffers;
  model.streamed_grads = grad_buffers != 0;
  model.streamed_weights = weight_buffers != 0;
  auto allocate = [&](uint64_t bytes, SlotKind kind) -> absl::StatusOr<Slot> {
    absl::StatusOr<Slot> slot = slots_->Allocate(bytes, kind);
    if (slot.ok()) taken.push_back(slot->offset);
    if (!slot.ok() && !smaller_arena.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", job_id(), "'s data plane holds ", grant_.arena_bytes,
          " bytes of host pool, less than ", smaller_arena,
          "; the model's buffers as registered do not fit in it (",
          slot.status().message(),
          "): register the model laid out within the arena this plane "
          "holds (ModelSpec.arena_fit ARENA_FIT_MOST, or fewer grad_slots / "
          "weight_slots); ",
          kGrowsLater));
    }
    if (!slot.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", job_id(), "'s arena (", grant_.arena_bytes,
          " bytes) cannot hold the model's buffers: ", slot.status().message(),
          "; create the job with a larger host_pool_bytes",
          model.streamed_grads && model.streamed_weights
              ? ""
              : ", or stream gradients and weights through the SSDs "
                "(ModelSpec grad_slots / weight_slots, e.g. 2)"));
    }
    return slot;
  };
  // Resident: layer i's own buffer. Streamed: K buffers for the largest.
  auto lay_out = [&](bool streamed, uint32_t k, SlotKind kind,
                     std::vector<Slot>& out) -> absl::Status {
    const size_t count = streamed ? k : num_layers;
    for (size_t i = 0; i < count; ++i) {
      const uint64_t elements = streamed ? largest : layout.layer_elements[i];
      absl::StatusOr<Slot> slot =
          allocate(elements * model.element_bytes, kind);
      if (!slot.ok()) return slot.status();
      out.push_back(*slot);
    }
    return absl::OkStatus();
  };
  if (absl::Status laid = lay_out(model.streamed_grads, grad_buffers,
                                  SlotKind::kGradient, model.grad_slots);
      !laid.ok()) {
    return laid;
  }
  if (absl::Status laid = lay_out(model.streamed_weights, weight_buffers,
                                  SlotKind::kWeight, model.weight_slots);
      !laid.ok()) {
    return laid;
  }
  absl::StatusOr<Slot> staging = allocate(largest * 4, SlotKind::kControl);
  if (!staging.ok()) return staging.status();
  model.staging = *staging;
  absl::StatusOr<Slot> error_text =
      allocate(kErrorTextBytes, SlotKind::kControl);
  if (!error_text.ok()) return error_text.status();
  model.error_text = *error_text;
  if (spec.activation_bytes() > 0) {
    absl::StatusOr<Slot> activations =
        allocate(spec.activation_bytes(), SlotKind::kActivation);
    if (!activations.ok()) return activations.status();
    model.activations = *activations;
  }
  return absl::OkStatus();
}

void JobSession::MakeValidator(const Model& model, RingDtype dtype) {
  // The validator checks entries against the layout just checked
  // (CheckModelSpec, ValidateLayout): every layer's bytes a positive
  // multiple of the dtype's.
  JobLayout job_layout{.dtype = dtype};
  for (uint64_t elements : model.layout.layer_elements) {
    job_layout.layer_bytes.push_back(elements * model.element_bytes);
  }
  EntryValidator::Options checks{.next_iteration = model.pipeline->iteration()};
  // Streamed: an entry must name one of the K slots exactly.
  for (const Slot& slot : model.grad_slots) {
    if (model.streamed_grads) checks.grad_slots.push_back(slot.offset);
  }
  for (const Slot& slot : model.weight_slots) {
    if (model.streamed_weights) checks.weight_slots.push_back(slot.offset);
  }
  validator_.emplace(slots_.get(), std::move(job_layout), std::move(checks));
}

v1::RegisterModelResponse JobSession::ResponseFor(const Model& model) {
  v1::RegisterModelResponse response;
  for (size_t layer = 0; layer < model.layout.layer_elements.size(); ++layer) {
    v1::LayerSlots* slots = response.add_layers();
    // Streamed: slot layer % K, so a client that simply uses "its" buffer
    // works unchanged.
    slots->set_grad_offset(
        model.grad_slots[layer % model.grad_slots.size()].offset);
    slots->set_weight_offset(
        model.weight_slots[layer % model.weight_slots.size()].offset);
    slots->set_bytes(model.layout.layer_elements[layer] * model.element_bytes);
    response.add_layer_initialized(model.pipeline->layer_initialized(layer));
  }
  response.set_staging_offset(model.staging.offset);
  response.set_staging_bytes(model.staging.length);
  response.set_iteration(model.pipeline->iteration());
  response.set_previous_commit_kept(model.pipeline->KeepsPreviousCommit());
  response.set_error_text_offset(model.error_text.offset);
  response.set_error_text_bytes(model.error_text.length);
  if (model.activations.has_value()) {
    response.set_activation_offset(model.activations->offset);
    response.set_activation_bytes(model.activations->length);
  }
  response.set_grad_slots(static_cast<uint32_t>(model.grad_slots.size()));
  response.set_weight_slots(static_cast<uint32_t>(model.weight_slots.size()));

  return response;
}

absl::StatusOr<v1::RegisterModelResponse> JobSession::RegisterModel(
    const v1::ModelSpec& spec, const UpdateParts& parts) {
  TensorStore* const store = parts.store;
  SpaceLedger* const ledger = parts.ledger;
  absl::MutexLock lock(&mu_);
  if (model_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(),
                     " has registered its model on this data plane "
                     "already"));
  }
  // Nothing is allocated for a spec before it is checked whole.
  if (absl::Status checked = CheckModelSpec(spec); !checked.ok()) {
    return checked;
  }
  absl::StatusOr<JobSettings> settings =
      ResolveJobSettings(spec, parts.defaults, parts.job);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<std::pair<DType, RingDtype>> dtypes = DTypes(spec.dtype());
  if (!dtypes.ok()) return dtypes.status();
  Model model;
  model.dtype = spec.dtype();
  model.element_bytes = DTypeSize(dtypes->first);
  absl::StatusOr<ModelLayout> laid_out = ModelLayoutOf(spec);
  if (!laid_out.ok()) return laid_out.status();
  model.layout = *std::move(laid_out);
  const ModelLayout& layout = model.layout;
  model.clip = ClipOptions{.max_grad_norm = spec.max_grad_norm(),
                           .skip_nonfinite = spec.skip_nonfinite()};
  *model.layers.mutable_layer_elements() = spec.layer_elements();
  *model.layers.mutable_layer_places() = spec.layer_places();

  // A refused registration gives back every slot it took.
  std::vector<uint64_t> taken;
  bool registered = false;
  absl::Cleanup give_back = [&] {
    if (registered) return;
    for (uint64_t offset : taken) (void)slots_->Free(offset);
  };
  if (absl::Status took = TakeSlots(spec, parts.smaller_arena, model, taken);
      !took.ok()) {
    return took;
  }
  model.store = store;
  model.activation_swap = std::make_unique<ActivationSwap>(store, job_id());
  const size_t layers = layout.layer_elements.size();

  const PipelineOptions options =
      PipelineOptionsFor(*settings,
                         {.streamed_grads = model.streamed_grads,
                          .streamed_weights = model.streamed_weights,
                          .fp32 = model.dtype == v1::DTYPE_FP32},
                         parts.optimizer_queue);
  read_ahead_shares_.store(settings->read_ahead_shares);
  // The daemon memory its tensors take (the meta, a state per chunk and,
  // streamed, a 16-bit copy per chunk), before any is made.
  const uint64_t chunks = StateLayout(layout).total_chunks();
  const uint64_t tensors = 1 + chunks * (options.stream_weight16 ? 2 : 1);
  if (absl::Status fits = FitsDaemonMemory(
          parts.owner, tensors * kDaemonBytesPerTensor,
          parts.daemon_memory_held, parts.daemon_memory_limit,
          absl::StrCat("job ", job_id(), "'s model (", layers, " layers, ",
                       tensors, " store tensors)"));
      !fits.ok()) {
    return fits;
  }
  // The SSD space the updates need is claimed before anything is made in
  // the store: a model that does not fit is refused with nothing left
  // behind.
  if (ledger != nullptr) {
    if (absl::Status set_aside =
            ledger->SetAside(job_id(), UpdateSpace(*store, layout, options),
                             reinterpret_cast<uintptr_t>(this), kSpaceWait);
        !set_aside.ok()) {
      return set_aside;
    }
    ledger_ = ledger;
  }
  absl::StatusOr<std::unique_ptr<JobPipeline>> pipeline =
      JobPipeline::Open(store, *parts.updater, job_id(), layout, options);
  if (!pipeline.ok()) {
    if (ledger_ != nullptr) {
      ledger_->ClearSetAside(job_id(), reinterpret_cast<uintptr_t>(this));
      ledger_ = nullptr;
    }
    return pipeline.status();
  }
  model.pipeline = *std::move(pipeline);
  if (ledger != nullptr) {
    absl::MutexLock stats_lock(&stats_mu_);
    stats_.set_ssd_set_aside_bytes(ledger->UsageOf(job_id()).set_aside);
  }

  MakeValidator(model, dtypes->second);

  const v1::RegisterModelResponse response = ResponseFor(model);

  model_.emplace(std::move(model));
  served_ = &*model_;
  registered = true;
  if (parts.adopt_activations) {
    // Those the job's last plane kept when it closed to move.
    for (const ActivationSwap::Held& held :
         served_->activation_swap->ListHeld()) {
      {
        absl::MutexLock validator_lock(&validator_mu_);
        validator_->AdoptActivation(held.id, held.bytes);
      }
      CountSwapped(1, static_cast<int64_t>(held.bytes));
    }
  } else {
    DropActivations();  // left by a session that died
  }
  // A reopened job's weights go straight into its weight slots (resident;
  // streamed ones are fetched from the store).
  for (size_t layer = 0; layer < layers && !served_->streamed_weights;
       ++layer) {
    if (served_->pipeline->layer_initialized(layer)) {
      if (absl::Status published =
              served_->pipeline->ReadWeightCopy(layer, ResidentWeights(layer));
          !published.ok()) {
        return published;
      }
    }
  }
  {
    absl::MutexLock stats_lock(&stats_mu_);
    stats_.set_layers(static_cast<uint32_t>(layers));
    uint64_t parameters = 0;
    for (uint64_t elements : served_->layout.layer_elements) {
      parameters += elements;
    }
    stats_.set_parameters(parameters);
    stats_.set_iteration(response.iteration());
    stats_.set_grad_slots(response.grad_slots());
    stats_.set_weight_slots(response.weight_slots());
    stats_.set_update_buffer_bytes(served_->pipeline->chunk_pool_bytes() +
                                   served_->pipeline->handoff_bytes());
  }
  lanes_ = std::make_unique<ServeLanes>(spec.in_order_service());
  lanes_ready_.store(lanes_.get());
  pipeline_ready_.store(served_->pipeline.get());
  server_ = std::thread([this] {
    NameThisThread("lohan-session");
    Serve();
  });
  registered_.store(true);
  spdlog::info(
      "job {}: model of {} layers registered ({} gradient and {} weight "
      "buffers), resuming at iteration {}",
      job_id(), layers, response.grad_slots(), response.weight_slots(),
      response.iteration());
  return response;
}

uint64_t JobSession::UpdateSpace(const TensorStore& store,
                                 const ModelLayout& layout,
                                 const PipelineOptions& options) {
  // The tensors the pipeline keeps, as its Open makes them, and its
  // streamed gradients (job_space.h).
  return SetAsideBytes(StateLayout(layout), layout.grad_dtype,
                       options.stream_gradients, options.stream_weight16,
                       store.block_size(), options.buffers);
}

uint8_t* JobSession::ResidentWeights(size_t layer) const {
  const Model& model = *served_;
  if (model.streamed_weights) return nullptr;
  return base() + model.weight_slots[layer].offset;
}

absl::Status JobSession::CheckStaging(const SubmissionEntry& entry) const {
  const Model& model = *served_;
  if (absl::Status format = CheckStagingEntry(entry); !format.ok()) {
    return format;
  }
  const RingOp op = static_cast<RingOp>(entry.op);
  const bool state = op == RingOp::kReadState || op == RingOp::kInitState;
  const char* name = op == RingOp::kInitWeights   ? "INIT_WEIGHTS"
                     : op == RingOp::kReadWeights ? "READ_WEIGHTS"
                     : op == RingOp::kReadState   ? "READ_STATE"
                                                  : "INIT_STATE";
  if (entry.layer >= model.layout.layer_elements.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": layer ", entry.layer, " of ",
                     model.layout.layer_elements.size()));
  }
  const uint64_t bytes = model.layout.layer_elements[entry.layer] * 4;
  if (entry.slot_offset != model.staging.offset || entry.length != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", state ? "optimizer states" : "weights",
        " go through the staging slot at offset ", model.staging.offset,
        " with length ", bytes, " for layer ", entry.layer, "; got offset ",
        entry.slot_offset, " length ", entry.length));
  }
  bool in_iteration;
  {
    absl::MutexLock lock(&validator_mu_);
    in_iteration = validator_->in_iteration();
  }
  if (in_iteration) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": ", state ? "optimizer states" : "weights",
                     " are staged only between iterations"));
  }
  return absl::OkStatus();
}

absl::Status JobSession::AdmitOrdered(const SubmissionEntry& entry) {
  const Model& model = *served_;
  const RingOp op = static_cast<RingOp>(entry.op);
  if (op == RingOp::kInitWeights || op == RingOp::kReadWeights ||
      op == RingOp::kReadState || op == RingOp::kInitState) {
    return CheckStaging(entry);
  }
  if (op == RingOp::kIterBegin) {
    // The validator's state must not advance for an iteration the pipeline
    // then refuses, so check the pipeline's precondition first (every
    // INIT_WEIGHTS before has run: see Dispatch).
    for (size_t layer = 0; layer < model.layout.layer_elements.size();
         ++layer) {
      if (!model.pipeline->layer_initialized(layer)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ITER_BEGIN: layer ", layer,
            " has no weights yet; send its initial weights (INIT_WEIGHTS) "
            "first"));
      }
    }
  }
  return AcceptEntry(entry);
}

absl::Status JobSession::Handle(const SubmissionEntry& entry, uint64_t& detail,
                                uint32_t& flags) {
  Model& model = *served_;
  const RingOp op = static_cast<RingOp>(entry.op);
  if (op == RingOp::kInitWeights || op == RingOp::kReadWeights) {
    float* staging = reinterpret_cast<float*>(base() + model.staging.offset);
    if (op == RingOp::kReadWeights) {
      return model.pipeline->ReadWeights(entry.layer, staging);
    }
    // Copy first: the client may rewrite the staging slot at any time.
    // Resident weights: the pipeline also writes them into the layer's
    // weight slot (streamed: stored with the states, read by FETCH_PARAMS).
    std::vector<float> weights(
        staging, staging + model.layout.layer_elements[entry.layer]);
    return model.pipeline->InitializeWeights(entry.layer, weights.data(),
                                             ResidentWeights(entry.layer));
  }
  if (op == RingOp::kReadState || op == RingOp::kInitState) {
    float* staging = reinterpret_cast<float*>(base() + model.staging.offset);
    const StatePart part = static_cast<StatePart>(entry.activation_id);
    if (op == RingOp::kReadState) {
      return model.pipeline->ReadState(entry.layer, part, staging);
    }
    // Copy first: the client may rewrite the staging slot at any time.
    // The weights (and so the arena's or the store's 16-bit copies) stay.
    std::vector<float> values(
        staging, staging + model.layout.layer_elements[entry.layer]);
    return model.pipeline->InitState(entry.layer, part, values.data());
  }
  switch (op) {
    case RingOp::kIterBegin:
      iteration_began_ = absl::Now();
      iterations_begun_.fetch_add(1);
      return model.pipeline->BeginIteration(
          entry.grad_scale == 0.0f ? 1.0f : entry.grad_scale,
          (entry.iter_flags & kIterBeginLrGiven) != 0 || entry.lr > 0.0
              ? std::optional<double>(entry.lr)
              : std::nullopt,
          model.clip);
    case RingOp::kIterEnd: {
      // On error the pipeline has put the committed weights back into
      // the weight slots it was given (JobPipeline::EndIteration).
      // A sharded data-parallel rank's: every rank's sum decides.
      absl::StatusOr<IterationReport> report = model.pipeline->EndIteration(
          (entry.iter_flags & kIterEndSumSquaresGiven) != 0
              ? std::optional<double>(entry.global_sum_squares)
              : std::nullopt);
      if (!report.ok()) return report.status();
      {
        absl::MutexLock stats_lock(&stats_mu_);
        stats_.set_iteration(report->iteration);
        const double seconds =
            absl::ToDoubleSeconds(absl::Now() - iteration_began_);
        stats_.set_last_iteration_seconds(seconds);
        const uint64_t iterations = stats_.session_iterations() + 1;
        stats_.set_mean_iteration_seconds(
            (stats_.mean_iteration_seconds() * (iterations - 1) + seconds) /
            iterations);
        stats_.set_session_iterations(iterations);
        if (stats_.has_plan() &&
            iterations_begun_.load() > begun_before_plan_) {
          const uint64_t planned = stats_.planned_iterations() + 1;
          stats_.set_planned_mean_iteration_seconds(
              (stats_.planned_mean_iteration_seconds() * (planned - 1) +
               seconds) /
              planned);
          stats_.set_planned_iterations(planned);
        }
        stats_.set_optimizer_seconds(stats_.optimizer_seconds() +
                                     report->busy.compute);
        stats_.set_ssd_read_bytes(stats_.ssd_read_bytes() +
                                  report->busy.bytes_read);
        stats_.set_ssd_written_bytes(stats_.ssd_written_bytes() +
                                     report->busy.bytes_written);
        stats_.set_host_update_bytes(stats_.host_update_bytes() +
                                     report->busy.bytes_updated);
        stats_.set_host_copied_bytes(stats_.host_copied_bytes() +
                                     report->busy.bytes_copied);
        stats_.set_last_end_wait_seconds(report->wait_seconds);
        stats_.set_last_global_norm(report->global_norm);
        if (report->clipped) {
          stats_.set_clipped_iterations(stats_.clipped_iterations() + 1);
        }
        if (report->skipped) {
          stats_.set_skipped_iterations(stats_.skipped_iterations() + 1);
        }
      }
      TestPoint("job_session.iteration_committed");
      std::memcpy(&detail, &report->global_norm, sizeof(detail));
      flags = (report->clipped ? kIterEndClipped : 0) |
              (report->skipped ? kIterEndSkipped : 0) |
              (report->nonfinite ? kIterEndNonfinite : 0);
      spdlog::debug("job {}: iteration {} norm {} clipped {} skipped {}",
                    job_id(), report->iteration, report->global_norm,
                    report->clipped, report->skipped);
      return absl::OkStatus();
    }
    case RingOp::kIterAbort:
      // The pipeline puts the committed weights back into the weight slots
      // its updates wrote (JobPipeline::AbortIteration).
      return model.pipeline->AbortIteration();
    case RingOp::kIterCommitted: {
      if ((entry.iter_flags & kIterCommittedRelease) != 0) {
        if (absl::Status released = model.pipeline->ReleasePreviousCommit();
            !released.ok()) {
          return released;
        }
      }
      absl::StatusOr<uint64_t> committed = model.pipeline->AwaitCommitted();
      if (!committed.ok()) return committed.status();
      detail = *committed;
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(
          absl::StrCat("op ", entry.op, " reached the ordered lane"));
  }
}

absl::Status JobSession::Execute(const SubmissionEntry& entry, uint64_t& detail,
                                 uint32_t& flags) {
  Model& model = *served_;
  switch (static_cast<RingOp>(entry.op)) {
    case RingOp::kGradReady:
      // Streamed gradients: this returns once the gradient is in the
      // store, so the completion frees the slot. Resident weights: the
      // update writes the new ones (16-bit, or the fp32 masters) into the
      // layer's weight slot; streamed: none in the arena.
      return model.pipeline->SubmitGradients(entry.layer,
                                             base() + entry.slot_offset,
                                             ResidentWeights(entry.layer));
    case RingOp::kFetchParams: {
      uint8_t* destination = base() + entry.slot_offset;
      if (model.streamed_weights) {
        // The current weights (the validator checked the slot and length),
        // in part from lohand's memory.
        uint64_t from_memory = 0;
        absl::Status read =
            model.dtype == v1::DTYPE_FP32
                ? model.pipeline->ReadWeights(
                      entry.layer, reinterpret_cast<float*>(destination),
                      &from_memory)
                : model.pipeline->ReadWeight16(entry.layer, destination,
                                               &from_memory);
        if (read.ok()) {
          CountSsd(entry.length - std::min<uint64_t>(from_memory, entry.length),
                   0);
        }
        return read;
      }
      // The layer's update may still run (ModelSpec.overlap_updates).
      if (absl::Status updated = model.pipeline->WaitLayer(entry.layer);
          !updated.ok()) {
        return updated;
      }
      const Slot& weights = model.weight_slots[entry.layer];
      if (entry.slot_offset != weights.offset) {
        std::memmove(destination, base() + weights.offset, entry.length);
      }
      return absl::OkStatus();
    }
    case RingOp::kActPut:
    case RingOp::kActGet:
    case RingOp::kActFree:
      return SwapActivation(entry);
    default:
      return absl::InternalError(
          absl::StrCat("op ", entry.op, " reached a lane"));
  }
}

bool JobSession::weights_resident() const { return !served_->streamed_weights; }

const v1::ModelSpec& JobSession::registered_layers() const {
  return served_->layers;
}

JobSession::TierUse JobSession::tier_use() const {
  const JobPipeline* pipeline = pipeline_ready_.load();
  if (pipeline == nullptr) return {};
  return {.share_bytes = pipeline->tier_stats().share_bytes,
          .commit_interval = pipeline->commit_interval(),
          .durable_every_seconds = pipeline->durable_every_seconds()};
}

namespace {

// What GetStatus carries of a plan: every figure, and the blocks per mode
// instead of the per-block lists, so a status stays small however large
// the plans its sessions keep.
v1::JobPlan Summary(const v1::JobPlan& plan) {
  v1::JobPlan summary = plan;
  summary.clear_blocks();
  summary.clear_block_modes();
  for (const std::string& mode : plan.block_modes()) {
    ++(*summary.mutable_block_mode_counts())[mode];
  }
  return summary;
}

}  // namespace

std::optional<v1::JobPlan> JobSession::Plan() const {
  absl::MutexLock lock(&stats_mu_);
  if (!plan_.has_value()) return std::nullopt;
  v1::JobPlan plan;
  if (!plan.ParseFromString(*plan_)) return std::nullopt;  // made by us
  return plan;
}

uint64_t JobSession::plan_bytes() const {
  absl::MutexLock lock(&stats_mu_);
  return plan_.has_value() ? plan_->size() : 0;
}

void JobSession::SetPlan(v1::JobPlan plan) {
  absl::MutexLock lock(&stats_mu_);
  *stats_.mutable_plan() = Summary(plan);
  plan_ = plan.SerializeAsString();
  stats_.set_planned_iterations(0);
  stats_.set_planned_mean_iteration_seconds(0);
  begun_before_plan_ = iterations_begun_.load();
}

absl::Status JobSession::AcceptEntry(const SubmissionEntry& entry) {
  absl::MutexLock lock(&validator_mu_);
  return validator_->Accept(entry);
}

v1::SessionStatus JobSession::Status() const {
  absl::MutexLock lock(&stats_mu_);
  v1::SessionStatus status = stats_;
  status.set_job_id(job_id());
  status.set_arena_bytes(grant_.arena_bytes);
  status.set_ring_entries(ring_entries_);
  status.set_draining(drain_requested_.load());
  if (const MemoryShares* shares = read_ahead_shares_.load()) {
    status.set_read_ahead_held_bytes(shares->Held(job_id()));
    status.set_read_ahead_share_bytes(shares->ShareOf(job_id()));
  }
  if (const JobPipeline* pipeline = pipeline_ready_.load()) {
    status.set_committed_iteration(pipeline->iteration());
    const StateTier::Stats tier = pipeline->tier_stats();
    status.set_state_bytes(tier.state_bytes);
    status.set_state_tier_bytes(tier.committed_bytes);
    status.set_state_tier_share_bytes(tier.share_bytes);
    status.set_state_tier_grad_bytes(pipeline->tier_grad_bytes());
    status.set_durable_iteration(pipeline->durable_iteration());
    status.set_seconds_since_durable(pipeline->seconds_since_durable());
    status.set_commit_interval(pipeline->durable_every_seconds() > 0.0
                                   ? 0
                                   : pipeline->commit_interval());
    status.set_durable_every_seconds(pipeline->durable_every_seconds());
  }
  if (const ServeLanes* lanes = lanes_ready_.load()) {
    status.set_urgent_queued(
        static_cast<uint32_t>(lanes->Queued(ServeLanes::Lane::kUrgent)));
    status.set_bulk_queued(
        static_cast<uint32_t>(lanes->Queued(ServeLanes::Lane::kBulk)));
  }
  return status;
}

absl::Status JobSession::SwapActivation(const SubmissionEntry& entry) {
  ActivationSwap& swap = *served_->activation_swap;
  const RingOp op = static_cast<RingOp>(entry.op);
  if (op == RingOp::kActFree) {
    absl::StatusOr<uint64_t> freed = swap.Free(entry.activation_id);
    if (freed.ok()) CountSwapped(-1, -static_cast<int64_t>(*freed));
    return freed.status();
  }
  absl::Span<uint8_t> bytes(base() + entry.slot_offset, entry.length);
  if (op == RingOp::kActGet) {
    absl::Status read = swap.Get(entry.activation_id, bytes);
    if (read.ok()) CountSsd(entry.length, 0);
    return read;
  }
  absl::Status stored = swap.Put(entry.activation_id, bytes);
  if (stored.ok()) {
    CountSwapped(1, static_cast<int64_t>(entry.length));
    CountSsd(0, entry.length);
  } else {
    // Not held after all: undo the validator's bookkeeping.
    absl::MutexLock lock(&validator_mu_);
    validator_->ForgetActivation(entry.activation_id);
  }
  return stored;
}

void JobSession::DropActivations() {
  served_->activation_swap->FreeAll();
  absl::MutexLock stats_lock(&stats_mu_);
  stats_.set_swapped_activations(0);
  stats_.set_swapped_activation_bytes(0);
}

void JobSession::CountSsd(uint64_t read, uint64_t written) {
  absl::MutexLock stats_lock(&stats_mu_);
  stats_.set_ssd_read_bytes(stats_.ssd_read_bytes() + read);
  stats_.set_ssd_written_bytes(stats_.ssd_written_bytes() + written);
}

void JobSession::CountSwapped(int64_t activations, int64_t bytes) {
  absl::MutexLock stats_lock(&stats_mu_);
  stats_.set_swapped_activations(stats_.swapped_activations() + activations);
  stats_.set_swapped_activation_bytes(stats_.swapped_activation_bytes() +
                                      bytes);
}

}  // namespace lohan
