#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "layout/byte_size.h"
#include "plan/layout_bytes.h"

namespace lohan {
namespace {

// Bytes per parameter the optimizer reads and writes on the SSDs each
// iteration: fp32 master weights and Adam's two moments.
constexpr double kStateBytes = 12;

struct Derived {
  double parameters = 0;
  uint64_t host_room = 0;  // for activations
  bool weights_in_host = false;
  double ssd_read = 0, ssd_write = 0;  // whole array
  uint64_t ssd_room = 0;  // for activations; UINT64_MAX: not a limit
  uint64_t last_layer_parameters = 0;  // updated after backward ends
  // Parameters whose states the state tier holds (the first ones in
  // forward order, as lohand places them), and the commit interval.
  double resident_parameters = 0;
  double commit_interval = 1;
  // FLOPs a sublayer-at-a-time backward adds (recompute_unit kSublayer).
  double sublayer_recompute_flops = 0;
  // Weight bytes that cross the host-to-device link once more in backward
  // (param_unit kSublayer).
  double repeated_weight_bytes = 0;
};

// The optimizer states' SSD bytes for `parameters` of which `resident`
// are in the state tier: the spilled ones read and written each
// iteration, the resident ones written every commit_interval-th.
double StateReadBytes(double parameters, double resident) {
  return kStateBytes * (parameters - resident);
}
double StateWriteBytes(const Derived& d, double parameters, double resident) {
  return kStateBytes * (parameters - resident + resident / d.commit_interval);
}

// A step of the greedy search: one saved tensor of a block, or (per-block
// decisions) all of a block's but its input.
struct Entry {
  uint32_t block = 0;
  std::vector<size_t> tensors;  // indices into counts.block_tensors
  uint64_t bytes = 0;
  double recompute_flops = 0;
  double benefit() const {
    return bytes == 0 ? 0 : recompute_flops / static_cast<double>(bytes);
  }
};

// The iteration time with `offloaded` bytes of saved tensors sent off the
// device, `spilled` of them on to the SSDs, and `recompute` FLOPs redone.
Estimate Estimated(const Machine& m, const ModelCounts& c, const Derived& d,
                   uint64_t offloaded, uint64_t spilled, double recompute) {
  Estimate e;
  e.offloaded_bytes = offloaded;
  e.ssd_bytes = spilled;
  e.recompute_flops = recompute;
  const double a = static_cast<double>(offloaded);
  const double spill = static_cast<double>(e.ssd_bytes);
  const double p = d.parameters;
  // The 16-bit weights come from the SSDs unless resident in host memory
  // (both passes read them; the update writes the new ones).
  const double weights16_ssd = d.weights_in_host ? 0 : 2 * p;
  e.forward.compute = c.forward_flops / m.device_flops;
  e.forward.device_to_host = a / m.device_to_host;
  e.forward.host_to_device = 2 * p / m.host_to_device;
  e.forward.ssd = weights16_ssd / d.ssd_read + spill / d.ssd_write;
  e.backward.compute = (2 * c.forward_flops + c.loss_recompute_flops +
                        d.sublayer_recompute_flops + recompute) /
                       m.device_flops;
  e.backward.device_to_host = 2 * p / m.device_to_host;  // the gradients
  e.backward.host_to_device =
      (2 * p + d.repeated_weight_bytes + a) / m.host_to_device;
  const double r = d.resident_parameters;
  e.backward.ssd = (StateReadBytes(p, r) + weights16_ssd + spill) / d.ssd_read +
                   (StateWriteBytes(d, p, r) + weights16_ssd) / d.ssd_write;
  e.backward.optimizer = m.optimizer_params > 0 ? p / m.optimizer_params : 0;
  if (m.device_is_host) {
    e.backward.compute += e.backward.optimizer;
    e.backward.optimizer = 0;
  }
  const double last = static_cast<double>(d.last_layer_parameters);
  const double last16 = d.weights_in_host ? 0 : 2 * last;
  // The tier's first chunks are this layer's (forward order).
  const double last_resident = std::min(last, r);
  e.tail = (StateReadBytes(last, last_resident) + last16) / d.ssd_read +
           (StateWriteBytes(d, last, last_resident) + last16) / d.ssd_write +
           (m.optimizer_params > 0 ? last / m.optimizer_params : 0);
  return e;
}

// The parameters of the longest prefix of `chunks` (each one's parameters,
// forward order) whose states fit `tier_bytes`: what lohand's state tier
// holds, whole chunks from the first.
double ResidentParameters(const std::vector<uint64_t>& chunks,
                          uint64_t tier_bytes) {
  double resident = 0, bytes = 0;
  for (uint64_t chunk : chunks) {
    const double count = static_cast<double>(chunk);
    if (bytes + kStateBytes * count > static_cast<double>(tier_bytes)) break;
    bytes += kStateBytes * count;
    resident += count;
  }
  return resident;
}

// The optimizer states' place and SSD traffic, for the plan.
void CountStates(const Derived& d, Plan& plan) {
  plan.resident_state_bytes =
      static_cast<uint64_t>(kStateBytes * d.resident_parameters);
  plan.state_ssd_read_bytes =
      StateReadBytes(d.parameters, d.resident_parameters);
  plan.state_ssd_write_bytes =
      StateWriteBytes(d, d.parameters, d.resident_parameters);
}

absl::Status Short(const char* what, uint64_t needed, uint64_t have,
                   const std::string& hint) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " needs ", FormatByteSize(needed),
                   ", the machine has ", FormatByteSize(have), ": ", hint));
}

}  // namespace

namespace {

// ValidateMachine; `host_memory` false: machine.host_bytes is not used
// (a job's layout stands in for it).
absl::Status CheckMachine(const Machine& m, bool host_memory) {
  std::map<const char*, double> rates = {
      {"device memory", static_cast<double>(m.device_bytes)},
      {"device FLOP/s", m.device_flops},
      {"host-to-device bandwidth", m.host_to_device},
      {"device-to-host bandwidth", m.device_to_host},
      {"SSD count", static_cast<double>(m.ssds)},
      {"SSD read bandwidth", m.ssd_read},
      {"SSD write bandwidth", m.ssd_write}};
  if (host_memory) {
    rates.emplace("host memory", static_cast<double>(m.host_bytes));
  }
  for (const auto& [name, value] : rates) {
    if (!(value > 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("machine: ", name, " must be a positive number"));
    }
  }
  if (m.optimizer_params < 0 || !std::isfinite(m.optimizer_params)) {
    return absl::InvalidArgumentError(
        "machine: optimizer parameters per second must be 0 (no limit) or "
        "positive");
  }
  if (m.commit_interval < 1) {
    return absl::InvalidArgumentError(
        "machine: the commit interval must be at least 1 (1: every "
        "iteration durable)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMachine(const Machine& m) { return CheckMachine(m, true); }

namespace {

// FLOP counts past this are no model's (1e40 at 1e18 FLOP/s is 3e14 years);
// below it every sum the search makes stays finite.
constexpr double kMaxFlops = 1e40;

absl::Status CheckFlops(const std::string& field, double flops) {
  if (!std::isfinite(flops) || flops < 0 || flops > kMaxFlops) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be a finite number from 0 to 1e40, got ", flops));
  }
  return absl::OkStatus();
}

// a x b + c, false when it leaves 64 bits.
bool MulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t& out) {
  uint64_t product;
  return !__builtin_mul_overflow(a, b, &product) &&
         !__builtin_add_overflow(product, c, &out);
}

}  // namespace

absl::Status ValidateCounts(const ModelCounts& c) {
  if (c.layers == 0 || c.layers > kMaxPlanLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers (blocks) must be from 1 to ", kMaxPlanLayers,
                     ", got ", c.layers));
  }
  if (c.block_tensors.size() > kMaxBlockTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_tensors has ", c.block_tensors.size(), " entries, at most ",
        kMaxBlockTensors, " are planned per block"));
  }
  if (c.layers * c.block_tensors.size() > kMaxPlanTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.layers, " blocks of ", c.block_tensors.size(),
                     " saved tensors are ", c.layers * c.block_tensors.size(),
                     ", at most ", kMaxPlanTensors, " are planned"));
  }
  for (const auto& [field, flops] :
       {std::pair<const char*, double>{"forward_flops", c.forward_flops},
        {"block_forward_flops", c.block_forward_flops},
        {"loss_recompute_flops", c.loss_recompute_flops}}) {
    if (absl::Status valid = CheckFlops(field, flops); !valid.ok()) {
      return valid;
    }
  }
  uint64_t block_bytes = 0;
  for (size_t t = 0; t < c.block_tensors.size(); ++t) {
    const SavedTensor& tensor = c.block_tensors[t];
    if (absl::Status valid =
            CheckFlops(absl::StrCat("block_tensors[", t, "].recompute_flops"),
                       tensor.recompute_flops);
        !valid.ok()) {
      return valid;
    }
    if (__builtin_add_overflow(block_bytes, tensor.bytes, &block_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_tensors' bytes add up past 64 bits at "
                       "block_tensors[",
                       t, "]"));
    }
  }
  if (c.sublayer_parameters.size() > kMaxBlockSublayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("sublayer_parameters has ", c.sublayer_parameters.size(),
                     " entries, at most ", kMaxBlockSublayers));
  }
  uint64_t in_sublayers = 0;
  for (const uint64_t parameters : c.sublayer_parameters) {
    if (parameters == 0 ||
        __builtin_add_overflow(in_sublayers, parameters, &in_sublayers) ||
        in_sublayers > c.block_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sublayer_parameters must each be > 0 and add up to at most "
          "block_parameters (",
          c.block_parameters, ")"));
    }
  }
  for (const auto& [field, value] :
       {std::pair<const char*, uint64_t>{"block_parameters",
                                         c.block_parameters},
        {"largest_layer_parameters", c.largest_layer_parameters},
        {"largest_parameter", c.largest_parameter},
        {"head_parameters", c.head_parameters},
        {"first_layer_parameters", c.first_layer_parameters}}) {
    if (value > c.parameters) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters (", c.parameters, ") must be at least ",
                       field, " (", value, ")"));
    }
  }
  // The sums the plan makes: every block's saved tensors, the device's
  // working set, the states on the SSDs (twice the fp32 states and 16-bit
  // copies; LayoutBytes bounds its own).
  uint64_t all_blocks, working, head, states;
  if (!MulAdd(c.layers, block_bytes, 0, all_blocks)) {
    return absl::InvalidArgumentError(
        "every block's saved tensors add up past 64 bits");
  }
  uint64_t between;  // the hidden states twice, or one and a saved tensor
  if (!MulAdd(2, std::max(c.hidden_bytes, block_bytes), 0, between) ||
      !MulAdd(6, c.block_parameters, block_bytes, working) ||
      !MulAdd(4, c.head_parameters, c.logits_bytes, head) ||
      __builtin_add_overflow(working, head, &working) ||
      __builtin_add_overflow(working, between, &working)) {
    return absl::InvalidArgumentError(
        "the device's working set (block_parameters, a block's saved "
        "tensors, head_parameters, logits_bytes, hidden_bytes) adds up past "
        "64 bits");
  }
  if (!MulAdd(28, c.parameters, 0, states)) {
    return absl::InvalidArgumentError(
        "parameters too large (the states' bytes pass 64 bits)");
  }
  if (!c.layer_elements.empty()) {
    if (c.layer_elements.size() > kMaxPlanLayers + 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_elements has ", c.layer_elements.size(),
                       " layers, at most ", kMaxPlanLayers + 2));
    }
    uint64_t sum = 0;
    for (size_t l = 0; l < c.layer_elements.size(); ++l) {
      if (c.layer_elements[l] == 0 ||
          __builtin_add_overflow(sum, c.layer_elements[l], &sum)) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer_elements[", l,
                         "] must be at least 1 and the layers must "
                         "add up within 64 bits"));
      }
    }
    if (sum != c.parameters) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_elements add up to ", sum, ", not parameters (",
                       c.parameters, ")"));
    }
  }
  return absl::OkStatus();
}

const char* DecisionName(Decision decision) {
  switch (decision) {
    case Decision::kDevice:
      return "device";
    case Decision::kHost:
      return "host";
    case Decision::kSsd:
      return "ssd";
    case Decision::kRecompute:
      return "recompute";
  }
  return "?";
}

const char* ResourceName(Resource resource) {
  switch (resource) {
    case Resource::kCompute:
      return "device compute";
    case Resource::kDeviceToHost:
      return "device-to-host link";
    case Resource::kHostToDevice:
      return "host-to-device link";
    case Resource::kSsd:
      return "SSDs";
    case Resource::kOptimizer:
      return "CPU optimizer";
  }
  return "?";
}

double StageTime::work() const {
  return compute + device_to_host + host_to_device + ssd + optimizer;
}

double Estimate::work() const {
  return forward.work() + backward.work() + tail;
}

double StageTime::seconds() const {
  return std::max({compute, device_to_host, host_to_device, ssd, optimizer});
}

Resource StageTime::binding() const {
  const std::pair<double, Resource> all[] = {
      {compute, Resource::kCompute},
      {device_to_host, Resource::kDeviceToHost},
      {host_to_device, Resource::kHostToDevice},
      {ssd, Resource::kSsd},
      {optimizer, Resource::kOptimizer}};
  return std::max_element(
             std::begin(all), std::end(all),
             [](const auto& a, const auto& b) { return a.first < b.first; })
      ->second;
}

std::vector<std::string> Plan::block_modes() const {
  std::vector<bool> recomputed(counts.layers), swapped(counts.layers);
  for (const TensorPlan& tensor : tensors) {
    if (tensor.inter_block) continue;
    if (tensor.decision == Decision::kRecompute)
      recomputed[tensor.block] = true;
    if (tensor.decision == Decision::kHost ||
        tensor.decision == Decision::kSsd) {
      swapped[tensor.block] = true;
    }
  }
  std::vector<std::string> modes;
  for (uint64_t b = 0; b < counts.layers; ++b) {
    // A block partly recomputed is recomputed whole by the plugin (the
    // memory-safe reading of a per-tensor plan).
    modes.push_back(recomputed[b] ? "offload" : swapped[b] ? "swap" : "keep");
  }
  return modes;
}

double Plan::model_flops_per_second() const {
  const double seconds = estimate.seconds();
  return seconds > 0 ? 3 * counts.forward_flops / seconds : 0;
}

namespace {

// Sizes what the plan needs besides the activations in each memory and
// what is left there for them (`layout`'s rooms where given; else lohan's
// layout as lohan.init sets it up, with an activation area of
// `activation_area` bytes in the arena, and no SSD room for activations
// unless `spill`); FAILED_PRECONDITION when one is short.
absl::Status SizeMemories(const Machine& m, const PlanLayout* layout,
                          uint64_t activation_area, bool spill, Plan& plan,
                          Derived& d) {
  const ModelCounts& c = plan.counts;
  absl::StatusOr<Units> units = ChooseUnits(c, m.device_bytes);
  if (!units.ok()) return units.status();
  plan.recompute_unit = units->recompute;
  plan.param_unit = units->params;
  plan.block_unit_working_bytes =
      WorkingSetOf(c, RecomputeUnit::kBlock).bytes();
  plan.block_weights_working_bytes =
      WorkingSetOf(c, plan.recompute_unit, ParamUnit::kBlock).bytes();
  if (plan.param_unit == ParamUnit::kSublayer) {
    // Sublayers' weights crossing the link a third time in backward.
    d.repeated_weight_bytes = 2.0 * static_cast<double>(c.layers) *
                              static_cast<double>(ParametersCrossingAgain(c));
  }
  if (plan.recompute_unit == RecomputeUnit::kSublayer) {
    // Each sublayer's saved tensors made once more in its backward.
    for (const SavedTensor& tensor : c.block_tensors) {
      if (tensor.sublayer > 0) {
        d.sublayer_recompute_flops += tensor.recompute_flops;
      }
    }
    d.sublayer_recompute_flops *= static_cast<double>(c.layers);
  }
  const DeviceWorkingSet working =
      WorkingSetOf(c, plan.recompute_unit, plan.param_unit);
  plan.device_working_bytes = working.bytes();
  if (plan.device_working_bytes > m.device_bytes) {
    return Short(
        plan.param_unit == ParamUnit::kSublayer
            ? "The device's working set (two sublayers' weights, the "
              "head's weights and gradients, then the larger of a block's "
              "backward: a sublayer's gradients, saved tensors and the "
              "gradients backward makes, and the loss: its logits and the "
              "head's input and gradient)"
            : "The device's working set (two blocks' weights, the head's "
              "weights and gradients, then the larger of a block's "
              "backward: its gradients, saved tensors and the gradients "
              "backward makes, and the loss: its logits and the head's "
              "input and gradient)",
        plan.device_working_bytes, m.device_bytes,
        working.loss > working.block_backward && c.loss_chunk_tokens == 0
            ? "chunk the loss, or use a smaller batch or sequence"
            : "use a smaller batch or sequence");
  }
  d.parameters = static_cast<double>(c.parameters);
  d.last_layer_parameters = c.first_layer_parameters;
  d.commit_interval = m.commit_interval;
  plan.pool_bytes = m.host_bytes;
  plan.state_tier_bytes = m.state_tier_bytes;
  d.ssd_read = m.ssds * m.ssd_read;
  d.ssd_write = m.ssds * m.ssd_write;
  if (layout != nullptr) {
    // A running job: its arena and weight buffers are laid out, its states
    // are on the SSDs; what is left for activations is the layout's.
    d.weights_in_host = layout->weights_in_host;
    plan.weights_in_host = d.weights_in_host;
    plan.layout_bytes.arena_bytes = layout->host_fixed_bytes;
    plan.host_fixed_bytes = layout->host_fixed_bytes;
    d.host_room = layout->activation_host_bytes;
    d.ssd_room = layout->activation_ssd_bytes;
    // Its chunks are not known here: the tier's bytes of its states.
    d.resident_parameters = std::min(
        d.parameters, static_cast<double>(m.state_tier_bytes) / kStateBytes);
    return absl::OkStatus();
  }
  // The daemon's layers as the plugin cuts the model.
  if (c.layer_elements.empty()) {
    uint64_t counted;
    if (!MulAdd(c.layers, c.block_parameters, c.first_layer_parameters,
                counted) ||
        counted > c.parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers x block_parameters + first_layer_parameters pass "
          "parameters (",
          c.parameters, "): lohan's layout for them cannot be sized"));
    }
  }
  const std::vector<uint64_t> layers = LayerElements(c);
  // The host: lohan's arena and the daemon's chunk buffers, a gradient and
  // a weight buffer per layer (the 16-bit weights resident) when they fit,
  // as lohan.init's buffers="auto" takes them, else streamed through
  // shared ones; activations get the rest (the paper's order).
  absl::StatusOr<JobLayoutBytes> resident = LayoutBytes(
      layers, /*streamed=*/false, activation_area, m.ssd_block_bytes);
  if (!resident.ok()) return resident.status();
  absl::StatusOr<JobLayoutBytes> streamed = LayoutBytes(
      layers, /*streamed=*/true, activation_area, m.ssd_block_bytes);
  if (!streamed.ok()) return streamed.status();
  const JobLayoutBytes& bytes =
      resident->host_bytes() <= m.host_bytes ? *resident : *streamed;
  if (bytes.host_bytes() > m.host_bytes) {
    return Short(
        "lohan's host memory for the job (its arena: gradients and "
        "weights streamed in turn, staging, the activation area; the "
        "optimizer's chunk buffers)",
        bytes.host_bytes(), m.host_bytes, "give lohand a larger host pool");
  }
  plan.layout_bytes = bytes;
  // The whole chunks the tier holds, from the first.
  d.resident_parameters =
      ResidentParameters(bytes.chunk_elements, m.state_tier_bytes);
  plan.activation_area_bytes = activation_area;
  d.weights_in_host = bytes.stream_buffers == 0;
  plan.weights_in_host = d.weights_in_host;
  plan.host_fixed_bytes = bytes.host_bytes();
  d.host_room = m.host_bytes - plan.host_fixed_bytes;
  // The SSDs: what registering the model sets aside (the states and the
  // 16-bit copies when streamed, room for their new versions), and the
  // streamed gradients.
  plan.ssd_fixed_bytes = bytes.ssd_bytes();
  d.ssd_room = spill ? UINT64_MAX : 0;
  if (m.ssd_bytes > 0) {
    if (plan.ssd_fixed_bytes > m.ssd_bytes) {
      return Short(
          "The model's states on the SSDs (fp32 weights and Adam's "
          "moments, 16-bit copies, room for the new versions, streamed "
          "gradients)",
          plan.ssd_fixed_bytes, m.ssd_bytes,
          "add SSDs or pick a smaller model");
    }
    if (spill) d.ssd_room = m.ssd_bytes - plan.ssd_fixed_bytes;
  }
  return absl::OkStatus();
}

// Algorithm 1's step test: a shorter iteration, or as short (within
// rounding) with less work. The paper stops at the first step that is not
// shorter; where the binding resource hides the step's saving (a backward
// bound by the SSDs hides recompute), less work is the better point:
// overlap is never perfect (on a machine without a GPU the device, the
// optimizer and the I/O share cores). Still convex: along the greedy
// order the work is a sum of convex terms.
bool Better(const Estimate& next, const Estimate& best) {
  const double tolerance = 1e-9 * best.seconds();
  if (next.seconds() < best.seconds() - tolerance) return true;
  return next.seconds() <= best.seconds() + tolerance &&
         next.work() < best.work();
}

// Fills plan.curve, plan.chosen and plan.search_case; returns the saved
// tensors in the greedy order (plan.chosen of them offloaded).
std::vector<Entry> Search(const Machine& m, const Derived& d,
                          Granularity granularity, Plan& plan) {
  const ModelCounts& c = plan.counts;
  // Algorithm 1 over every block's saved tensors (or whole blocks),
  // highest offloading benefit first, from the block inputs alone (always
  // offloaded); among equals, the last blocks first (the first backward
  // needs).
  std::vector<Entry> order;
  uint64_t offloaded = 0;
  double recompute = 0;
  for (uint32_t b = 0; b < c.layers; ++b) {
    Entry whole{.block = b};
    for (size_t t = 0; t < c.block_tensors.size(); ++t) {
      const SavedTensor& tensor = c.block_tensors[t];
      if (tensor.inter_block) {
        offloaded += tensor.bytes;
        continue;
      }
      recompute += tensor.recompute_flops;
      Entry& entry = granularity == Granularity::kBlock
                         ? whole
                         : order.emplace_back(Entry{.block = b});
      entry.tensors.push_back(t);
      entry.bytes += tensor.bytes;
      entry.recompute_flops += tensor.recompute_flops;
    }
    if (granularity == Granularity::kBlock) order.push_back(whole);
  }
  std::stable_sort(
      order.begin(), order.end(), [](const Entry& x, const Entry& y) {
        return x.benefit() != y.benefit() ? x.benefit() > y.benefit()
                                          : x.block > y.block;
      });
  // What the device's spare memory holds of the tensors not recomputed
  // stays there (Place keeps it): only the rest crosses the link, and of
  // that what the host's room does not take goes on to the SSDs.
  const uint64_t spare = m.device_bytes - plan.device_working_bytes;
  auto estimate = [&](uint64_t kept, double recomputed) {
    const uint64_t moved = kept > spare ? kept - spare : 0;
    const uint64_t spilled = moved > d.host_room ? moved - d.host_room : 0;
    Estimate e = Estimated(m, c, d, moved, spilled, recomputed);
    e.saved_bytes = kept;
    return std::make_pair(e, spilled);
  };
  plan.curve.push_back(estimate(offloaded, recompute).first);
  // The whole curve (for the plot and the tests), as far as the SSDs can
  // take the spill; Algorithm 1 stops at its first step that does not
  // improve (convexity makes that the minimum).
  bool stopped = false;
  for (const Entry& entry : order) {
    offloaded += entry.bytes;
    recompute -= entry.recompute_flops;
    const auto [next, spilled] = estimate(offloaded, recompute);
    if (spilled > d.ssd_room) break;  // the SSDs cannot take more
    plan.curve.push_back(next);
    if (!stopped && !Better(plan.curve.back(), plan.curve[plan.chosen])) {
      stopped = true;
    }
    if (!stopped) plan.chosen = plan.curve.size() - 1;
  }
  plan.search_case = !stopped ? 2 : plan.chosen == 0 ? 1 : 3;
  return order;
}

// Each saved tensor's decision and the bytes per tier; the estimate at
// them. A tensor that fits neither the host's room nor the SSDs' (whole
// tensors leave gaps the search's byte counts do not) is recomputed;
// FAILED_PRECONDITION when it is one that never is.
absl::Status Place(const Machine& m, const Derived& d,
                   const std::vector<Entry>& order, Plan& plan) {
  const ModelCounts& c = plan.counts;
  // Entries of `order` offloaded at the chosen point.
  const size_t taken = plan.chosen;
  // Decisions: the block inputs and the taken entries are offloaded; the
  // device keeps what its spare memory holds of them, last blocks first
  // (the first backward needs); the rest goes to host memory in forward
  // order until its room is used, then to the SSDs.
  std::vector<std::vector<Decision>> decided(
      c.layers,
      std::vector<Decision>(c.block_tensors.size(), Decision::kRecompute));
  for (uint32_t b = 0; b < c.layers; ++b) {
    for (size_t t = 0; t < c.block_tensors.size(); ++t) {
      if (c.block_tensors[t].inter_block) decided[b][t] = Decision::kHost;
    }
  }
  for (size_t i = 0; i < taken; ++i) {
    for (size_t t : order[i].tensors) {
      decided[order[i].block][t] = Decision::kHost;
    }
  }
  uint64_t spare = m.device_bytes - plan.device_working_bytes;
  for (uint32_t b = c.layers; b-- > 0;) {
    for (size_t t = 0; t < c.block_tensors.size(); ++t) {
      const uint64_t bytes = c.block_tensors[t].bytes;
      if (decided[b][t] == Decision::kHost && bytes <= spare) {
        decided[b][t] = Decision::kDevice;
        spare -= bytes;
      }
    }
  }
  uint64_t host_left = d.host_room;
  uint64_t ssd_left = d.ssd_room;
  double recompute = plan.curve[plan.chosen].recompute_flops;
  for (uint32_t b = 0; b < c.layers; ++b) {
    for (size_t t = 0; t < c.block_tensors.size(); ++t) {
      const SavedTensor& tensor = c.block_tensors[t];
      Decision& decision = decided[b][t];
      if (decision == Decision::kHost) {
        if (tensor.bytes <= host_left) {
          host_left -= tensor.bytes;
        } else if (tensor.bytes <= ssd_left) {
          ssd_left -= tensor.bytes;
          decision = Decision::kSsd;
        } else if (!tensor.inter_block) {
          decision = Decision::kRecompute;
          recompute += tensor.recompute_flops;
        } else {
          return absl::FailedPreconditionError(absl::StrCat(
              "The saved tensors that are never recomputed (block inputs "
              "and the like) do not fit: block ",
              b, "'s tensor ", t, " (", FormatByteSize(tensor.bytes),
              ") finds no room in host memory (", FormatByteSize(d.host_room),
              " for activations) nor on the SSDs (", FormatByteSize(d.ssd_room),
              "); give the job more host memory or SSD space for "
              "activations, or use a smaller batch or sequence"));
        }
      }
      switch (decision) {
        case Decision::kDevice:
          plan.device_bytes += tensor.bytes;
          break;
        case Decision::kHost:
          plan.host_bytes += tensor.bytes;
          break;
        case Decision::kSsd:
          plan.ssd_bytes += tensor.bytes;
          break;
        case Decision::kRecompute:
          plan.recomputed_bytes += tensor.bytes;
          break;
      }
      plan.tensors.push_back({tensor.name, b, tensor.bytes, tensor.benefit(),
                              decision, tensor.inter_block});
    }
  }
  // Whole tensors: what spills is what did not fit whole.
  plan.estimate = Estimated(m, c, d, plan.host_bytes + plan.ssd_bytes,
                            plan.ssd_bytes, recompute);
  plan.estimate.saved_bytes =
      plan.device_bytes + plan.host_bytes + plan.ssd_bytes;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const ModelShape& shape, uint64_t batch,
                              uint64_t seq, const Machine& m,
                              Attention attention, Granularity granularity,
                              LossChunks loss, RecomputeUnit unit,
                              ParamUnit params) {
  if (absl::Status valid = ValidateShape(shape); !valid.ok()) return valid;
  if (absl::Status valid = ValidateMachine(m); !valid.ok()) return valid;
  if (batch == 0 || seq == 0 || batch > (1u << 20) || seq > (1u << 20)) {
    return absl::InvalidArgumentError(
        "batch and sequence length must be from 1 to 2^20");
  }
  // The largest count the plan makes: a block's attention scores (eager),
  // b x heads x s^2 two-byte elements. Past 2^60 bytes nothing fits any
  // machine, and counts would leave 64 bits.
  if (static_cast<double>(batch) * static_cast<double>(seq) *
          static_cast<double>(seq) * static_cast<double>(shape.heads) * 2 >
      std::ldexp(1.0, 60)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", batch, " x sequence ", seq, " is too large to plan for ",
        shape.heads, " heads (a block's attention alone passes 2^60 bytes)"));
  }
  ModelCounts counts = CountModel(shape, batch, seq, attention, loss);
  counts.recompute_unit = unit;
  counts.param_unit = params;
  absl::StatusOr<Plan> plan =
      PlanFromCounts(counts, batch, seq, m, nullptr, granularity);
  if (plan.ok()) plan->shape = shape;
  return plan;
}

namespace {

// What the trainer's host memory depends on in a placed plan: the
// activations it put on the host and the largest it put on the SSDs, the
// model's largest parameter (a client's counts lack it: its largest
// layer's), the arena; the device's memory when the device is the host.
TrainerHostInputs TrainerInputs(const Machine& m, const Plan& plan) {
  TrainerHostInputs in;
  in.host_activation_bytes = plan.host_bytes;
  for (const TensorPlan& tensor : plan.tensors) {
    if (tensor.decision == Decision::kSsd) {
      in.largest_ssd_tensor_bytes =
          std::max(in.largest_ssd_tensor_bytes, tensor.bytes);
    }
  }
  in.largest_parameter = plan.counts.largest_parameter > 0
                             ? plan.counts.largest_parameter
                             : plan.counts.largest_layer_parameters;
  in.arena_bytes = plan.layout_bytes.arena_bytes;
  if (m.device_is_host) {
    in.device_in_host_bytes = plan.device_working_bytes + plan.device_bytes;
  }
  return in;
}

// The plan, memories sized as SizeMemories does with `activation_area`
// and `spill`. REQUIRES: counts, machine, batch and seq checked.
absl::StatusOr<Plan> PlanWith(const ModelCounts& counts, uint64_t batch,
                              uint64_t seq, const Machine& m,
                              const PlanLayout* layout, Granularity granularity,
                              uint64_t activation_area, bool spill) {
  Plan plan;
  plan.batch = batch;
  plan.seq = seq;
  plan.counts = counts;
  plan.counts.block_activation_bytes = 0;
  for (const SavedTensor& tensor : counts.block_tensors) {
    plan.counts.block_activation_bytes += tensor.bytes;  // checked
  }
  Derived d;
  if (absl::Status fits =
          SizeMemories(m, layout, activation_area, spill, plan, d);
      !fits.ok()) {
    return fits;
  }
  CountStates(d, plan);
  const std::vector<Entry> order = Search(m, d, granularity, plan);
  if (absl::Status placed = Place(m, d, order, plan); !placed.ok()) {
    return placed;
  }
  plan.trainer_host = TrainerHostOf(TrainerInputs(m, plan));
  return plan;
}

// The plan with the machine's memories as given. REQUIRES: counts,
// machine, batch and seq checked.
absl::StatusOr<Plan> PlanOnMachine(const ModelCounts& counts, uint64_t batch,
                                   uint64_t seq, const Machine& m,
                                   const PlanLayout* layout,
                                   Granularity granularity) {
  absl::StatusOr<Plan> plan =
      PlanWith(counts, batch, seq, m, layout, granularity, 0, true);
  if (layout != nullptr || !plan.ok() || plan->ssd_bytes == 0) return plan;
  // Activations go to the SSDs: the plugin swaps them through an
  // activation area in its arena, which leaves the host less room.
  absl::StatusOr<Plan> swapped =
      PlanWith(counts, batch, seq, m, layout, granularity,
               kPluginActivationAreaBytes, true);
  if (!absl::IsFailedPrecondition(swapped.status())) return swapped;
  // No room for the area: nothing goes to the SSDs, or, when that does
  // not fit either, the area's refusal.
  absl::StatusOr<Plan> kept =
      PlanWith(counts, batch, seq, m, layout, granularity, 0, false);
  return kept.ok() ? kept : swapped;
}

// Splits for the state tier tried: this many steps from none to all the
// states (or all the host memory, if less).
constexpr uint64_t kTierSteps = 16;

// The fastest plan over the splits of m.host_bytes between the pool and
// the state tier (ties: the larger tier, which moves fewer bytes through
// the SSDs); the refusal of the split with no tier when none fits.
absl::StatusOr<Plan> PlanSplittingHost(const ModelCounts& counts,
                                       uint64_t batch, uint64_t seq,
                                       const Machine& m,
                                       Granularity granularity) {
  const double states = kStateBytes * static_cast<double>(counts.parameters);
  const uint64_t most = static_cast<uint64_t>(
      std::min(states, static_cast<double>(m.host_bytes)));
  std::optional<Plan> best;
  absl::Status refusal;
  for (uint64_t step = kTierSteps + 1; step-- > 0;) {
    Machine split = m;
    split.split_host_memory = false;
    split.state_tier_bytes = static_cast<uint64_t>(
        static_cast<double>(most) * static_cast<double>(step) / kTierSteps);
    split.host_bytes = m.host_bytes - split.state_tier_bytes;
    if (split.host_bytes == 0) continue;
    absl::StatusOr<Plan> plan =
        PlanOnMachine(counts, batch, seq, split, nullptr, granularity);
    if (!plan.ok()) {
      if (!absl::IsFailedPrecondition(plan.status())) return plan.status();
      refusal = plan.status();
      continue;
    }
    if (!best || Better(plan->estimate, best->estimate)) {
      best = *std::move(plan);
    }
  }
  if (best) return *std::move(best);
  return refusal;
}

}  // namespace

absl::StatusOr<Plan> PlanFromCounts(const ModelCounts& counts, uint64_t batch,
                                    uint64_t seq, const Machine& m,
                                    const PlanLayout* layout,
                                    Granularity granularity) {
  if (absl::Status valid = ValidateCounts(counts); !valid.ok()) return valid;
  if (absl::Status valid = CheckMachine(m, layout == nullptr); !valid.ok()) {
    return valid;
  }
  if (batch == 0 || seq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch and seq must be at least 1, got batch ", batch,
                     " and seq ", seq));
  }
  if (m.split_host_memory && layout == nullptr) {
    return PlanSplittingHost(counts, batch, seq, m, granularity);
  }
  return PlanOnMachine(counts, batch, seq, m, layout, granularity);
}

uint64_t LargestBatch(const ModelShape& shape, uint64_t seq,
                      const Machine& machine, uint64_t limit,
                      Attention attention, LossChunks loss, RecomputeUnit unit,
                      ParamUnit params) {
  auto fits = [&](uint64_t batch) {
    return MakePlan(shape, batch, seq, machine, attention, Granularity::kTensor,
                    loss, unit, params)
        .ok();
  };
  if (!fits(1)) return 0;
  uint64_t good = 1, bad = 0;
  while (bad == 0 && good < limit) {
    const uint64_t next = std::min(limit, 2 * good);
    if (fits(next)) {
      good = next;
    } else {
      bad = next;
    }
  }
  if (bad == 0) return good;
  while (bad - good > 1) {
    const uint64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace lohan
