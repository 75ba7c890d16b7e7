#ifndef LOHAN_PLUGINS_LIBTORCH_ENGINE_H_
#define LOHAN_PLUGINS_LIBTORCH_ENGINE_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lohan/lohan_client.h"
#include "plugins/libtorch/checkpoint.h"
#include "plugins/libtorch/device_transfer.h"
#include "plugins/libtorch/job_session.h"
#include "plugins/libtorch/layer_plan.h"
#include "plugins/libtorch/options.h"

namespace lohan::torch_plugin {

// What the daemon decided at the end of a step.
struct StepResult {
  double global_norm = 0.0;  // before clipping
  bool clipped = false;
  bool skipped = false;  // inf/nan gradients: no update
};

// A block's forward, as Engine::run_block calls it.
using BlockForward = std::function<torch::Tensor(const torch::Tensor&)>;

// Trains a torch::nn::Module through lohand: AdamW runs in the daemon, on
// fp32 masters it keeps, with its optimizer states on the daemon's host
// memory and SSDs. The module's trained parameters are all on the CPU or
// all on one CUDA device (see TrainingDevice); on CUDA the gradients and
// weights cross between the device and the daemon's pinned arena on
// torch's current stream for that device (the one backward and step()
// run on: use the same stream for both), the gradients of a layer summed
// into one flat tensor on the device first. Construction creates a new job
// named options.job_name for the model's layers (see PlanLayers), attaches it,
// registers the model and stores the module's current weights as the
// initial masters (or, with options.resume_from, the checkpoint's masters,
// moments and step); with options.resume_job it attaches this user's
// existing job of that name instead and copies its committed weights into
// the module, iteration() continuing from its committed step. Each step is
//   loss.backward();  // each layer's gradient goes to the daemon as soon
//                     // as backward has produced all of it
//   engine.step();    // ends the step: global norm, clipping, the update;
//                     // the new weights are copied into the module; and
//                     // if lohand asked, the job's data plane moves to
//                     // the arena it grants (a line on stderr says so)
// (k = options.grad_accumulation_steps backward passes before each
// step(): a layer's gradients are summed over the k passes and handed
// over after the k-th). On CUDA, autograd runs the hooks (and so the
// hand-overs) on its device thread while the calling thread waits in
// backward(): the engine is used by one thread at a time. Not thread-safe;
// the module's parameters must stay where they are (same tensors) while
// the engine lives.
// Errors: LohanError (a std::runtime_error whose what() is the C ABI's
// lohan_last_error()) for everything the daemon or the client library
// refuses; std::invalid_argument for bad options or blocks;
// std::logic_error for calls out of order.
class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> model,
         std::vector<std::shared_ptr<torch::nn::Module>> blocks,
         Options options);
  // close(false).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Ends the step whose gradients backward handed over: hands over what
  // is left (parameters backward gave no gradient get zeros), waits for
  // the daemon's update and copies every layer's new weights into the
  // module's parameters; their .grad are reset (undefined).
  // std::logic_error, the step left as it is, after fewer than
  // options.grad_accumulation_steps backward passes.
  StepResult step();

  // The learning rate of the steps that begin from now on (without
  // options.lr_schedule, which overrides it).
  void set_lr(double lr);

  // Writes a checkpoint of the committed state into `directory` in the
  // Python plugin's format (checkpoint.h): the fp32 masters, with
  // `with_optimizer` the Adam moments too, replacing the directory's
  // previous checkpoint as a whole. Resume from it with
  // Options::resume_from, or in Python with lohan.init(model, ...,
  // resume=directory). Between steps only (std::logic_error inside one).
  void save(const std::string& directory, bool with_optimizer = true);

  // Runs block `index` (of the blocks given at construction) on `input`
  // through `forward` (typically [&](auto& x) { return block->forward(x);
  // }) under options.activations: "keep" calls it; "recompute" calls it
  // without saving its intermediates and runs it again in backward. The
  // block's parameter gradients reach the engine either way. `forward`
  // must compute the same values when run again (no dropout).
  torch::Tensor run_block(size_t index, const BlockForward& forward,
                          const torch::Tensor& input);

  // Committed steps (skipped ones do not count).
  uint64_t iteration() const;
  const std::vector<Layer>& layers() const { return layers_; }
  const std::string& job_id() const { return session_.job_id(); }
  // "resident" (one gradient and one weight buffer per layer) or
  // "streamed" (shared buffers, through the daemon's SSDs): the layout of
  // the arena the job has now.
  std::string buffers() const;
  // The job's arena now, in bytes (0 after close()), and how many times
  // lohand moved it (issue #47: a job over its owner's share of the host
  // pool shrinks when another user needs that share, and grows back when
  // the pool has room again).
  uint64_t arena_bytes() const;
  int arena_moves() const { return arena_moves_; }

  // Throws a step in progress away, removes the gradient hooks, detaches
  // the job (deleting it with `delete_job`) and gives the arena back. The
  // module keeps its last weights. A second call does nothing.
  void close(bool delete_job = false);

 private:
  void InitializeWeights();
  // The layer's masters and (when present) moments from the checkpoint.
  void RestoreLayer(const Layer& layer);
  void RegisterHooks();
  void OnGradient(uint32_t layer, size_t param, const torch::Tensor& grad);
  // The most backward passes any parameter has had a gradient from in
  // the step in progress.
  int BackwardPassesSeen() const;
  // Begins the step at options_.lr_schedule's rate, if set.
  void BeginIfIdle();
  // Copies the layer's gradients into its buffer (zeros for parameters
  // without one) and hands it over: on the CPU through the arena's
  // buffer once the step may refill it; on CUDA into a flat tensor on the
  // device, copied over on the current stream.
  void HandOver(uint32_t layer);
  // The layer's gradients back to back in `flat` (zeros for parameters
  // backward gave none), forgotten after.
  void FillGradient(uint32_t layer, torch::Tensor& flat);
  void FlushLayers();
  // The layer's committed weights (in the training dtype), as the daemon
  // writes them into its weight buffer, into the module's parameters.
  void FetchIntoModule(uint32_t layer);
  // Forgets the step's bookkeeping and the parameters' .grad.
  void ResetStep();
  // The registered layout's buffers as tensors, and its slot count.
  void MapBuffers();
  // After a step: if lohand asked at its ITER_END, moves the data plane
  // (JobSession::FollowShare) and maps the new arena's buffers, with a
  // line on stderr. A failed move leaves the engine closed (the job has
  // no data plane) and is rethrown saying how to go on.
  void FollowShare();
  // Waits for the copies between the device and the arena on torch's
  // current stream (a move unmaps the arena).
  void SynchronizeDevice() const;

  std::shared_ptr<torch::nn::Module> module_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  Options options_;
  // options_.resume_from's, until the initial states are written.
  std::unique_ptr<CheckpointReader> checkpoint_;
  std::vector<Layer> layers_;
  torch::ScalarType dtype_;
  // Where the trained parameters are; cuda_ is set for a CUDA device.
  torch::Device device_;
  std::optional<CudaTransfer> cuda_;
  JobSession session_;
  lohan_model* remote_ = nullptr;  // owned by session_
  // The committed count, lr, the step in progress and its hand-overs;
  // owned by session_.
  lohan_steps* steps_ = nullptr;
  uint64_t iteration_at_close_ = 0;  // iteration() once steps_ is gone
  uint32_t grad_slots_ = 0;
  std::vector<torch::Tensor> grad_views_;    // the arena's, per layer
  std::vector<torch::Tensor> weight_views_;  // the arena's, per layer
  int arena_moves_ = 0;
  // (parameter, hook handle) to remove at close.
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;
  bool closed_ = false;

  // The step in progress. Gradients backward produced, per layer and
  // parameter (undefined until then; summed over the passes), kept until
  // the layer is complete: layers that share a gradient buffer may be
  // produced interleaved, so a layer's buffer is written only when it is
  // handed over.
  std::vector<std::vector<torch::Tensor>> arrived_;
  // Per layer and parameter: the backward passes whose gradient is in
  // arrived_ (their sum); per layer: the parameters at
  // grad_accumulation_steps of them.
  std::vector<std::vector<int>> arrivals_;
  std::vector<size_t> arrived_count_;
  std::vector<bool> handed_over_;
};

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_ENGINE_H_
