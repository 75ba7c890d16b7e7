#ifndef LOHAN_PLUGINS_LIBTORCH_OPTIONS_H_
#define LOHAN_PLUGINS_LIBTORCH_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lohan::torch_plugin {

// A torch-style param group (torch::optim::OptimizerParamGroup): these
// parameters are trained with this lr and weight decay, every other one
// with Options::lr and weight_decay. As the Python plugin's
// lohan.init(param_groups=[{"params": [...], "lr": x, "weight_decay": y}]).
struct ParamGroup {
  // Names as model->named_parameters() gives them (any of a tied
  // parameter's names); each trained parameter in at most one group.
  std::vector<std::string> params;
  // Unset: Options::lr / Options::weight_decay. The daemon runs the
  // group's lr as the fixed multiple lr / Options::lr of the job's lr, so
  // lr_schedule and set_lr scale every group alike (as torch's
  // schedulers scale every group's initial lr).
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

// How an Engine trains, as the Python plugin's lohan.init options of the
// same names (plugins/pytorch/lohan/options.py).
struct Options {
  // lohand's socket; "" means $LOHAN_SOCKET, else /run/lohan/lohand.sock.
  std::string socket_path;
  // The job on the daemon: 1-64 of [A-Za-z0-9._-], unique among the
  // caller's jobs.
  std::string job_name = "libtorch";
  // AdamW (decoupled weight decay), as torch::optim::AdamW.
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // false: Adam without its bias correction (AdamSpec.no_bias_correction;
  // the Python plugin's bias_correction; DeepSpeed's bias_correction).
  bool bias_correction = true;
  // Adam's two moments kept in bf16 on the daemon (AdamSpec.bf16_moments;
  // the Python plugin's bf16_moments): half their SSD traffic and space,
  // less exact than torch's fp32 moments.
  bool bf16_moments = false;
  // true: parameters with fewer than 2 dimensions (biases, norm weights)
  // get weight decay 0 (the Python plugin's no_weight_decay="1d").
  bool no_weight_decay_1d = false;
  // These parameters (names from model->named_parameters(), any of a
  // tied one's names) get weight decay 0 (the Python plugin's
  // no_weight_decay=[names]). Not together with no_weight_decay_1d. The
  // exemptions skip parameters of param_groups, whose own weight_decay
  // holds.
  std::vector<std::string> no_weight_decay_names;
  // Groups with their own lr and weight decay; see ParamGroup.
  std::vector<ParamGroup> param_groups;
  // > 0: the global gradient norm is clipped to it, as
  // torch::nn::utils::clip_grad_norm_; 0: no clipping.
  double max_grad_norm = 0.0;
  // true: a step whose gradients hold inf or NaN is skipped
  // (StepResult::skipped: weights, moments and the step count as before);
  // false: it is applied as it is (ModelSpec.skip_nonfinite; the Python
  // plugin's skip_nonfinite).
  bool skip_nonfinite = true;
  // How a step that clips (or skips) is updated (ModelSpec.clip_schedule;
  // the Python plugin's clip_schedule): "deferred", one pass over the
  // states, or "redo-all", every layer updated as it arrives and all of
  // them again when the step clips, for comparison. The same results.
  std::string clip_schedule = "deferred";
  // Parameters per stored chunk of the daemon's states
  // (ModelSpec.chunk_elements; the Python plugin's chunk_elements); 0:
  // lohand's default.
  uint64_t chunk_elements = 0;
  // "lanes": lohand serves what the model waits for (a layer's weights)
  // beside, not behind, the SSD writes of streamed gradients; "in-order":
  // every request in arrival order on one thread, for comparison
  // (ModelSpec.in_order_service; the Python plugin's service). The same
  // results.
  std::string service = "lanes";
  // Every how many steps the states lohand holds in its memory (its state
  // tier) are committed durably (ModelSpec.commit_interval; the Python
  // plugin's commit_interval): a lohand crash resumes at the last durable
  // step. 0: lohand's [pool] commit_interval; 1: every step; at most
  // kMaxCommitInterval (layout/durability.h, checked by liblohan_client).
  uint32_t commit_interval = 0;
  // Or by time (ModelSpec.durable_every_seconds): durable once this many
  // seconds passed since the last durable step; 0: see commit_interval.
  // Not with a commit_interval; at most kMaxDurableEverySeconds (7 days).
  double durable_every_seconds = 0.0;
  // "fp32", or "bf16": the module's parameters are cast to bf16 and the
  // daemon keeps fp32 masters (from the parameters' values at
  // construction).
  std::string dtype = "fp32";
  // "resident": one gradient and one weight buffer per layer in the arena;
  // "streamed": stream_buffers (at most layers - 1) shared ones, the
  // gradients and weights streamed through the daemon's SSDs; "auto":
  // resident if the daemon's host pool holds it, else streamed with as
  // many shared buffers (up to stream_buffers) as it holds.
  std::string buffers = "auto";
  uint32_t stream_buffers = 4;
  // A checkpoint directory (Engine::save's, or the Python plugin's
  // engine.save's) to start the new job from: its fp32 masters, and with
  // its optimizer state its Adam moments and step (else fresh moments at
  // step 0), as lohan.init(..., resume=<directory>). "": the module's
  // weights at step 0.
  std::string resume_from;
  // true: continue this user's existing job named job_name on the daemon
  // (the Python plugin's resume=True): the job keeps its arena, masters,
  // moments and committed step; the module's weights are replaced by the
  // job's committed ones. A job of that name must exist (LohanError
  // LOHAN_NOT_FOUND otherwise). Not together with resume_from.
  bool resume_job = false;
  // k >= 1 backward passes per step(): each layer's gradients are summed
  // over the k passes (as torch accumulates .grad) and handed over after
  // the k-th; divide each micro-batch's loss by k for the mean.
  int grad_accumulation_steps = 1;
  // The learning rate of each step, from the step's number (1 for the
  // first update, iteration() + 1): replaces lr and set_lr() when set.
  std::function<double(int64_t step)> lr_schedule;
  // "keep": backward uses what forward saved; "recompute": blocks called
  // through Engine::block(i) save only their input and backward runs them
  // again (less memory, one more forward per block).
  std::string activations = "keep";
};

// Throws std::invalid_argument naming the first option that is wrong:
// the plugin's own choices (names, strings, groups) here, the values of
// the job's settings by liblohan_client's check (the rules lohand runs,
// lohan_model_spec_check_settings), named by this struct's field.
void ValidateOptions(const Options& options);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_OPTIONS_H_
