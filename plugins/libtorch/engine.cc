#include "plugins/libtorch/engine.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"
#include "plugins/libtorch/recompute.h"

namespace lohan::torch_plugin {
namespace {

Options Validated(Options options) {
  ValidateOptions(options);
  return options;
}

torch::ScalarType TrainingDtype(const Options& options) {
  return options.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
}

// Every trainable parameter is of a dtype the engine trains.
void CheckParameters(const std::vector<Layer>& layers,
                     torch::ScalarType dtype) {
  for (const Layer& layer : layers) {
    for (size_t i = 0; i < layer.params.size(); ++i) {
      const torch::Tensor& param = layer.params[i];
      const auto found = param.scalar_type();
      if (found != torch::kFloat32 && found != dtype) {
        throw std::invalid_argument("lohan Engine: parameter " +
                                    layer.names[i] + " is " +
                                    std::string(c10::toString(found)) +
                                    "; pass fp32 parameters (or dtype's own)");
      }
    }
  }
}

std::unique_ptr<CheckpointReader> OpenCheckpoint(const Options& options) {
  if (options.resume_from.empty()) return nullptr;
  return std::make_unique<CheckpointReader>(options.resume_from);
}

std::optional<CudaTransfer> CudaFor(const torch::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  return CudaTransfer(device);
}

// The model's ModelSpec in protobuf JSON.
std::string SpecJson(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks,
    const Options& options, const std::vector<Layer>& layers,
    const CheckpointReader* checkpoint) {
  ModelSpecBuilder builder;
  lohan_model_spec& spec = builder.spec();
  // Without moments a checkpoint's weights start afresh at step 0.
  if (checkpoint != nullptr && !checkpoint->moments().empty()) {
    spec.initial_iteration = checkpoint->iteration();
  }
  std::vector<uint64_t> elements;
  for (const Layer& layer : layers) elements.push_back(layer.numel);
  builder.set_layer_elements(std::move(elements));
  SetSpecSettings(options, spec);
  const uint32_t count = static_cast<uint32_t>(layers.size());
  const uint32_t streamed =
      count > 1 ? std::min(options.stream_buffers, count - 1) : 0;
  const uint32_t slots = options.buffers == "resident" ? 0 : streamed;
  spec.grad_slots = slots;
  spec.weight_slots = slots;
  spec.arena_fit_most = options.buffers == "auto" && slots > 0;
  // The groups as ranges of the layers, by liblohan_client.
  return PlanModel(model, blocks, &options, builder.Json()).spec_json;
}

// The layer as a checkpoint stores it: its parameters' names, shapes and
// places in the flat vector.
CheckpointLayer StoredLayer(const Layer& layer) {
  CheckpointLayer stored;
  stored.names = layer.names;
  stored.offsets = layer.offsets;
  stored.elements = static_cast<uint64_t>(layer.numel);
  for (const torch::Tensor& param : layer.params) {
    stored.shapes.emplace_back(param.sizes().begin(), param.sizes().end());
  }
  return stored;
}

torch::Tensor ArenaView(void* buffer, int64_t numel, torch::ScalarType dtype) {
  return torch::from_blob(buffer, {numel}, torch::TensorOptions(dtype));
}

std::string Mib(uint64_t bytes) {
  constexpr uint64_t kMib = uint64_t{1} << 20;
  if (bytes % kMib == 0) return std::to_string(bytes / kMib) + " MiB";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB",
                static_cast<double>(bytes) / kMib);
  return text;
}

// How the arena holds gradients and weights after a move.
std::string Layout(uint32_t slots, bool streamed) {
  if (!streamed) {
    return "gradients and weights now resident, a buffer per layer";
  }
  return "gradients and weights now streamed through " + std::to_string(slots) +
         (slots > 1 ? " shared buffers of each" : " shared buffer of each");
}

// The line a move leaves on stderr.
std::string MoveLine(const std::string& job_name,
                     const JobSession::ShareMove& move, uint32_t slots,
                     bool streamed) {
  if (move.to_bytes < move.from_bytes) {
    return "lohan: lohand moved job \"" + job_name + "\" to a " +
           Mib(move.to_bytes) + " arena (was " + Mib(move.from_bytes) + "; " +
           Layout(slots, streamed) +
           "): another user's job needs its share of the host pool";
  }
  return "lohan: lohand grew job \"" + job_name + "\" back to a " +
         Mib(move.to_bytes) + " arena (was " + Mib(move.from_bytes) + "; " +
         Layout(slots, streamed) + "): the host pool has room again";
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model,
               std::vector<std::shared_ptr<torch::nn::Module>> blocks,
               Options options)
    : module_(std::move(model)),
      blocks_(std::move(blocks)),
      options_(Validated(std::move(options))),
      checkpoint_(OpenCheckpoint(options_)),
      layers_(PlanLayers(module_, blocks_)),
      dtype_(TrainingDtype(options_)),
      device_(TrainingDevice(layers_)),
      cuda_(CudaFor(device_)),
      session_(options_.socket_path) {
  CheckParameters(layers_, dtype_);
  const std::string spec =
      SpecJson(module_, blocks_, options_, layers_, checkpoint_.get());
  try {
    session_.Open(options_.job_name, spec, options_.resume_job);
    // Pinned once, before any copy, on the module's device.
    if (cuda_) cuda_->PinArena(session_.plane());
    remote_ = session_.Register(spec);
    steps_ = session_.StartSteps(
        "{\"lr\":" + JsonNumber(options_.lr) +
        ",\"loss_scaling\":{\"dynamic\":false,\"scale\":1}}");
    MapBuffers();
    InitializeWeights();
    checkpoint_.reset();
  } catch (...) {
    // A job created here goes again; a resumed one stays as it was.
    session_.Close(/*delete_job=*/!options_.resume_job);
    throw;
  }
  arrived_.resize(layers_.size());
  arrivals_.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    arrived_[i].resize(layers_[i].params.size());
    arrivals_[i].assign(layers_[i].params.size(), 0);
  }
  arrived_count_.assign(layers_.size(), 0);
  handed_over_.assign(layers_.size(), false);
  RegisterHooks();
}

Engine::~Engine() {
  try {
    close(false);
  } catch (...) {
    // Destructors do not throw; close() itself ignores the daemon's
    // refusals past the data plane.
  }
}

std::string Engine::buffers() const {
  return grad_slots_ < layers_.size() ? "streamed" : "resident";
}

uint64_t Engine::arena_bytes() const {
  return session_.plane() == nullptr
             ? 0
             : lohan_data_plane_arena_size(session_.plane());
}

void Engine::MapBuffers() {
  grad_slots_ = lohan_model_grad_slots(remote_);
  grad_views_.clear();
  weight_views_.clear();
  for (const Layer& layer : layers_) {
    grad_views_.push_back(ArenaView(
        lohan_model_grad_buffer(remote_, layer.index), layer.numel, dtype_));
    weight_views_.push_back(ArenaView(
        lohan_model_weight_buffer(remote_, layer.index), layer.numel, dtype_));
  }
}

void Engine::SynchronizeDevice() const {
  if (!cuda_) return;
  const c10::impl::DeviceGuardImplInterface* cuda =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  cuda->synchronizeStream(cuda->getStream(device_));
}

void Engine::FollowShare() {
  if (session_.ArenaAsked() == 0) return;
  // FetchIntoModule's copies out of the weight buffers may still run.
  SynchronizeDevice();
  grad_views_.clear();
  weight_views_.clear();
  JobSession::ShareMove move;
  try {
    move = session_.FollowShare();
  } catch (const ShareMoveError& error) {
    if (!error.lost_plane()) {
      MapBuffers();  // nothing was done: the old arena's
      throw;
    }
    const uint64_t committed = iteration();
    close(false);
    throw LohanError(
        error.status(),
        "lohan Engine: job \"" + options_.job_name +
            "\" could not move to the arena lohand asked for (" + error.what() +
            "); it has no data plane now: make the Engine again with "
            "Options::resume_job to continue it from step " +
            std::to_string(committed));
  }
  MapBuffers();
  if (!move.moved) return;
  ++arena_moves_;
  std::cerr << MoveLine(options_.job_name, move, grad_slots_,
                        buffers() == "streamed")
            << std::endl;
}

void Engine::InitializeWeights() {
  torch::NoGradGuard no_grad;
  torch::Tensor staging = torch::from_blob(
      lohan_model_staging(remote_),
      {static_cast<int64_t>(lohan_model_staging_bytes(remote_) / 4)},
      torch::TensorOptions(torch::kFloat32));
  const uint64_t iteration = lohan_model_iteration(remote_);
  for (Layer& layer : layers_) {
    // A layer the job stores already (a resumed job's) keeps its committed
    // weights: they replace the module's below.
    const bool stored = lohan_model_layer_initialized(remote_, layer.index);
    if (checkpoint_ != nullptr) {
      RestoreLayer(layer);
    } else if (!stored) {
      if (iteration > 0) {
        throw LohanError(
            LOHAN_DATA_LOSS,
            "job \"" + options_.job_name + "\" is at iteration " +
                std::to_string(iteration) + " but has no weights for layer " +
                std::to_string(layer.index) + "; it cannot be resumed");
      }
      for (size_t i = 0; i < layer.params.size(); ++i) {
        const torch::Tensor& param = layer.params[i];
        staging.narrow(0, layer.offsets[i], param.numel())
            .copy_(param.reshape(-1));
      }
      ThrowIfFailed(lohan_model_init_weights(remote_, layer.index));
    }
    // The module trains in the training dtype; its weights are the
    // daemon's (the masters rounded, as every later step's).
    for (torch::Tensor& param : layer.params) {
      if (param.scalar_type() != dtype_) param.set_data(param.to(dtype_));
    }
    FetchIntoModule(layer.index);
  }
}

void Engine::RestoreLayer(const Layer& layer) {
  const CheckpointLayer stored = StoredLayer(layer);
  checkpoint_->Restore(remote_, stored, layer.index, {"weights"});
  // The moments it holds (AMSGrad's are not this engine's).
  if (!checkpoint_->moments().empty()) {
    checkpoint_->Restore(remote_, stored, layer.index, checkpoint_->moments());
  }
}

void Engine::save(const std::string& directory, bool with_optimizer) {
  if (closed_) throw std::logic_error("lohan Engine: save() after close()");
  if (lohan_steps_active(steps_)) {
    throw std::logic_error(
        "lohan Engine: save() in the middle of a step; call step() first");
  }
  std::vector<CheckpointLayer> stored;
  for (const Layer& layer : layers_) stored.push_back(StoredLayer(layer));
  std::vector<std::string> parts = {"weights"};
  if (with_optimizer) {
    parts.push_back("exp_avg");
    parts.push_back("exp_avg_sq");
  }
  char* scaling = nullptr;
  ThrowIfFailed(lohan_steps_loss_scaling_json(steps_, &scaling));
  const OwnedString loss_scaling(scaling);
  // The engine's own fields of lohan.json (the library adds the job, its
  // step and the layers from what it writes).
  const std::string meta =
      "{\"job_id\":" + JsonQuoted(session_.job_id()) +
      ",\"dtype\":" + JsonQuoted(options_.dtype) +
      ",\"adam\":{\"lr\":" + JsonNumber(lohan_steps_lr(steps_)) +
      ",\"amsgrad\":false},\"loss_scaling\":" + loss_scaling.get() + "}";
  WriteCheckpoint(directory, remote_, stored, parts, options_.job_name,
                  iteration(), meta);
}

torch::Tensor Engine::run_block(size_t index, const BlockForward& forward,
                                const torch::Tensor& input) {
  if (index >= blocks_.size()) {
    throw std::invalid_argument("lohan Engine: run_block(" +
                                std::to_string(index) + "): there are " +
                                std::to_string(blocks_.size()) + " blocks");
  }
  if (options_.activations != "recompute") return forward(input);
  std::vector<torch::Tensor> params;
  for (const Layer& layer : layers_) {
    if (layer.block.get() == blocks_[index].get()) params = layer.params;
  }
  return RunRecomputed(forward, input, params);
}

void Engine::RegisterHooks() {
  for (const Layer& layer : layers_) {
    for (size_t i = 0; i < layer.params.size(); ++i) {
      torch::Tensor param = layer.params[i];
      const uint32_t index = layer.index;
      const unsigned handle =
          param.register_hook([this, index, i](const torch::Tensor& grad) {
            OnGradient(index, i, grad);
          });
      hooks_.emplace_back(std::move(param), handle);
    }
  }
}

void Engine::OnGradient(uint32_t layer, size_t param,
                        const torch::Tensor& grad) {
  // No gradient (a node that gives none, as RunRecomputed's for the
  // parameters whose gradients its own backward accumulated).
  if (!grad.defined()) return;
  const int steps = options_.grad_accumulation_steps;
  if (handed_over_[layer] || arrivals_[layer][param] == steps) {
    throw std::logic_error(
        "lohan Engine: layer " + std::to_string(layer) +
        " got a gradient again after " + std::to_string(steps) +
        " backward passes in this step (grad_accumulation_steps=" +
        std::to_string(steps) + "): call step() after every " +
        std::to_string(steps) +
        " backward passes, or raise Options::grad_accumulation_steps");
  }
  BeginIfIdle();
  torch::Tensor& sum = arrived_[layer][param];
  // As torch accumulates .grad: the earlier passes' sum plus this one.
  sum = sum.defined() ? sum + grad : grad;
  if (++arrivals_[layer][param] == steps &&
      ++arrived_count_[layer] == layers_[layer].params.size()) {
    HandOver(layer);
  }
}

int Engine::BackwardPassesSeen() const {
  int seen = 0;
  for (const std::vector<int>& layer : arrivals_) {
    for (const int count : layer) seen = std::max(seen, count);
  }
  return seen;
}

uint64_t Engine::iteration() const {
  return steps_ == nullptr ? iteration_at_close_
                           : lohan_steps_committed(steps_);
}

void Engine::BeginIfIdle() {
  if (lohan_steps_active(steps_)) return;
  const int64_t next = static_cast<int64_t>(iteration()) + 1;
  std::optional<double> lr;
  if (options_.lr_schedule) lr = options_.lr_schedule(next);
  const int status = lohan_steps_begin(steps_, lr ? &*lr : nullptr);
  if (status == LOHAN_INVALID_ARGUMENT && lr) {
    throw std::invalid_argument("lohan Engine: lr_schedule(" +
                                std::to_string(next) +
                                "): " + lohan_last_error());
  }
  ThrowIfFailed(status);
}

void Engine::FillGradient(uint32_t layer, torch::Tensor& flat) {
  const Layer& owner = layers_[layer];
  for (size_t i = 0; i < owner.params.size(); ++i) {
    torch::Tensor slice =
        flat.narrow(0, owner.offsets[i], owner.params[i].numel());
    torch::Tensor& grad = arrived_[layer][i];
    if (grad.defined()) {
      slice.copy_(grad.reshape(-1));
    } else {
      slice.zero_();
    }
    grad = torch::Tensor();
  }
}

void Engine::HandOver(uint32_t layer) {
  if (cuda_) {
    // Built on the device on the current stream (backward's), then
    // copied from there straight into the pinned gradient buffer (the
    // data plane starts the copy once no request uses a shared buffer:
    // backward does not wait for it).
    torch::Tensor flat = torch::empty(
        {layers_[layer].numel}, torch::TensorOptions(dtype_).device(device_));
    FillGradient(layer, flat);
    cuda_->SubmitGradient(steps_, layer, flat);
  } else {
    ThrowIfFailed(lohan_steps_claim_grad_buffer(steps_, layer));
    FillGradient(layer, grad_views_[layer]);
    ThrowIfFailed(lohan_steps_grad_ready(steps_, layer));
  }
  handed_over_[layer] = true;
}

void Engine::FlushLayers() {
  for (const Layer& layer : layers_) {
    if (!handed_over_[layer.index]) HandOver(layer.index);
  }
}

StepResult Engine::step() {
  if (closed_) throw std::logic_error("lohan Engine: step() after close()");
  if (!lohan_steps_active(steps_)) {
    throw std::logic_error(
        "lohan Engine: step() without gradients: call loss.backward() "
        "first");
  }
  const int seen = BackwardPassesSeen();
  if (seen < options_.grad_accumulation_steps) {
    throw std::logic_error("lohan Engine: step() after " +
                           std::to_string(seen) + " of " +
                           std::to_string(options_.grad_accumulation_steps) +
                           " backward passes (grad_accumulation_steps=" +
                           std::to_string(options_.grad_accumulation_steps) +
                           "): run the rest first");
  }
  StepResult result;
  try {
    FlushLayers();
    int clipped = 0;
    int skipped = 0;
    // Ended either way (the daemon rolled a failed step back).
    ThrowIfFailed(lohan_steps_end(steps_, nullptr, &result.global_norm,
                                  &clipped, &skipped));
    result.clipped = clipped != 0;
    result.skipped = skipped != 0;
  } catch (...) {
    lohan_steps_discard(steps_);  // a step a hand-over cut short
    ResetStep();
    throw;
  }
  try {
    for (const Layer& layer : layers_) FetchIntoModule(layer.index);
  } catch (...) {
    ResetStep();
    throw;
  }
  ResetStep();
  FollowShare();
  return result;
}

void Engine::FetchIntoModule(uint32_t layer) {
  // A streamed weight buffer is shared by several layers: the daemon reads
  // the layer's weights into it from its SSDs.
  ThrowIfFailed(lohan_model_fetch_params(remote_, layer));
  torch::NoGradGuard no_grad;
  const Layer& owner = layers_[layer];
  // On CUDA the buffer goes up on the current stream and the parameters
  // take their slices on that same stream; the flat tensor may go as soon
  // as they are enqueued (torch's allocator reuses it in stream order).
  const torch::Tensor source =
      cuda_ ? cuda_->FetchWeights(remote_, layer, owner.numel, dtype_)
            : weight_views_[layer];
  for (size_t i = 0; i < owner.params.size(); ++i) {
    torch::Tensor param = owner.params[i];
    param.copy_(
        source.narrow(0, owner.offsets[i], param.numel()).view(param.sizes()));
  }
}

void Engine::ResetStep() {
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (torch::Tensor& grad : arrived_[i]) grad = torch::Tensor();
    std::fill(arrivals_[i].begin(), arrivals_[i].end(), 0);
    arrived_count_[i] = 0;
    handed_over_[i] = false;
    for (torch::Tensor& param : layers_[i].params) {
      param.mutable_grad() = torch::Tensor();
    }
  }
}

void Engine::set_lr(double lr) {
  if (closed_) throw std::logic_error("lohan Engine: set_lr() after close()");
  if (lohan_steps_set_lr(steps_, lr) != LOHAN_OK) {
    throw std::invalid_argument(std::string("lohan Engine: set_lr: ") +
                                lohan_last_error());
  }
}

void Engine::close(bool delete_job) {
  if (closed_) return;
  closed_ = true;
  for (auto& [param, handle] : hooks_) param.remove_hook(handle);
  hooks_.clear();
  lohan_steps_discard(steps_);  // a step in progress is rolled back
  ResetStep();
  grad_views_.clear();
  weight_views_.clear();
  remote_ = nullptr;
  iteration_at_close_ = iteration();
  steps_ = nullptr;
  session_.Close(delete_job);
}

}  // namespace lohan::torch_plugin
