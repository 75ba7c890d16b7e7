#include "client/ctl/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/control_client.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "layout/byte_size.h"
#include "layout/durability.h"
#include "plan/planner.h"

namespace lohan {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lohanctl plan: %s\n",
               std::string(status.message()).c_str());
  return 2;
}

absl::StatusOr<ModelShape> LoadShape(const std::string& model) {
  if (!absl::EndsWith(model, ".json")) return PresetShape(model);
  std::ifstream in(model);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", model, " (a config.json, or a preset: ",
                     absl::StrJoin(PresetNames(), ", "), ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const size_t slash = model.rfind('/');
  std::string name =
      slash == std::string::npos ? model : model.substr(slash + 1);
  if (name == "config.json" && slash != std::string::npos && slash > 0) {
    const size_t before = model.rfind('/', slash - 1);
    name = model.substr(before == std::string::npos ? 0 : before + 1,
                        slash - (before == std::string::npos ? 0 : before + 1));
  }
  return ShapeFromHfConfig(text.str(), name);
}

// The machine from `base` (this machine's measured parts, or nothing)
// with every flag given on top of it.
absl::StatusOr<Machine> Described(const PlanOptions& o, Machine m) {
  auto size = [&](const std::string& text, const char* flag,
                  uint64_t& out) -> absl::Status {
    if (text.empty()) return absl::OkStatus();
    absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", bytes.status().message()));
    }
    out = *bytes;
    return absl::OkStatus();
  };
  for (auto [text, flag, out] :
       {std::tuple{&o.device_memory, "--device-memory", &m.device_bytes},
        std::tuple{&o.host_memory, "--host-memory", &m.host_bytes},
        std::tuple{&o.ssd_capacity, "--ssd-capacity", &m.ssd_bytes}}) {
    if (absl::Status s = size(*text, flag, *out); !s.ok()) return s;
  }
  for (auto [value, scale, out] :
       {std::tuple{o.device_tflops, 1e12, &m.device_flops},
        std::tuple{o.h2d_gbps, 1e9, &m.host_to_device},
        std::tuple{o.d2h_gbps, 1e9, &m.device_to_host},
        std::tuple{o.ssd_read_gbps, 1e9, &m.ssd_read},
        std::tuple{o.ssd_write_gbps, 1e9, &m.ssd_write},
        std::tuple{o.optimizer_gparams, 1e9, &m.optimizer_params}}) {
    if (value > 0) *out = value * scale;
  }
  if (o.ssds > 0) m.ssds = o.ssds;
  m.device_is_host = o.device_is_host;
  if (o.state_tier == "split" || (o.state_tier.empty() && !o.this_machine)) {
    m.split_host_memory = true;
    m.state_tier_bytes = 0;
  } else if (absl::Status s =
                 size(o.state_tier, "--state-tier", m.state_tier_bytes);
             !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (or \"split\")"));
  }
  if (o.commit_interval) {
    if (*o.commit_interval < 1 ||
        *o.commit_interval > static_cast<int64_t>(kMaxCommitInterval)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--commit-interval must be from 1 (every iteration durable) to ",
          kMaxCommitInterval, ", got ", *o.commit_interval));
    }
    m.commit_interval = static_cast<uint32_t>(*o.commit_interval);
  }
  std::vector<std::string> missing;
  for (auto [value, flag] :
       {std::pair{static_cast<double>(m.device_bytes), "--device-memory"},
        std::pair{m.device_flops, "--device-tflops"},
        std::pair{m.host_to_device, "--h2d-gbps"},
        std::pair{m.device_to_host, "--d2h-gbps"},
        std::pair{static_cast<double>(m.host_bytes), "--host-memory"},
        std::pair{static_cast<double>(m.ssds), "--ssds"},
        std::pair{m.ssd_read, "--ssd-read-gbps"},
        std::pair{m.ssd_write, "--ssd-write-gbps"}}) {
    if (!(value > 0)) missing.push_back(flag);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "describe the machine: ", absl::StrJoin(missing, ", "),
        " (e.g. --device-memory 24GiB --device-tflops 165 --h2d-gbps 25 "
        "--d2h-gbps 25 --host-memory 256GiB --ssds 3 --ssd-read-gbps 6.5 "
        "--ssd-write-gbps 3.4; --this-machine takes the host memory, the "
        "SSDs and the optimizer from lohand)"));
  }
  if (absl::Status valid = ValidateMachine(m); !valid.ok()) return valid;
  return m;
}

// What lohand knows of this machine: its pool (or the caller's host-pool
// quota, if smaller), its SSDs as measured and their capacity left, its
// optimizer. UNAVAILABLE while it is still measuring.
absl::StatusOr<Machine> ThisMachine(const std::string& socket) {
  absl::StatusOr<std::unique_ptr<ControlClient>> client =
      ControlClient::Connect({.socket_path = socket});
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::GetStatusResponse> status = (*client)->GetStatus();
  if (!status.ok()) return status.status();
  if (!status->has_profile()) {
    return absl::UnavailableError(absl::StrCat(
        "lohand on ", socket,
        " has no machine profile yet: it measures its SSDs when it starts "
        "(see its log); try again in a few seconds"));
  }
  const v1::HostProfile& profile = status->profile();
  Machine m;
  m.host_bytes = status->pool().capacity_bytes();
  const uint64_t quota = status->quota().host_pool_limit_bytes();
  if (quota > 0) m.host_bytes = std::min(m.host_bytes, quota);
  m.state_tier_bytes = status->pool().state_tier_bytes();
  const uint64_t tier_quota = status->quota().state_tier_limit_bytes();
  if (tier_quota > 0)
    m.state_tier_bytes = std::min(m.state_tier_bytes, tier_quota);
  // Durable by time (lohand's default, commit_interval 0): a durable write
  // now and then, not each iteration's, as lohand plans its jobs.
  m.commit_interval = status->pool().commit_interval() == 0
                          ? kMaxCommitInterval
                          : status->pool().commit_interval();
  m.ssds = static_cast<uint32_t>(profile.ssds_size());
  if (m.ssds > 0) {
    m.ssd_read = profile.array_read_bytes_per_second() / m.ssds;
    m.ssd_write = profile.array_write_bytes_per_second() / m.ssds;
  }
  for (const v1::SsdStatus& ssd : status->store().ssds()) {
    m.ssd_bytes +=
        ssd.capacity_bytes() - std::min(ssd.capacity_bytes(), ssd.used_bytes());
  }
  m.optimizer_params = profile.optimizer_parameters_per_second_per_thread() *
                       profile.optimizer_threads();
  if (status->store().block_size() > 0) {
    m.ssd_block_bytes = status->store().block_size();
  }
  return m;
}

std::string Gb(uint64_t bytes) {
  return absl::StrFormat("%.1f GB", static_cast<double>(bytes) / 1e9);
}

std::string Split(const StageTime& stage) {
  const Resource binding = stage.binding();
  auto part = [&](Resource r, double seconds) {
    return absl::StrFormat("%s %.2f%s", ResourceName(r), seconds,
                           r == binding ? " <- binds" : "");
  };
  std::vector<std::string> parts = {
      part(Resource::kCompute, stage.compute),
      part(Resource::kDeviceToHost, stage.device_to_host),
      part(Resource::kHostToDevice, stage.host_to_device),
      part(Resource::kSsd, stage.ssd)};
  if (stage.optimizer > 0) {
    parts.push_back(part(Resource::kOptimizer, stage.optimizer));
  }
  return absl::StrJoin(parts, ", ");
}

// How the machine's host memory holds optimizer states, for the header.
std::string TierText(const Machine& m) {
  const std::string interval =
      m.commit_interval >= kMaxCommitInterval
          ? std::string(", durable by time")
          : absl::StrCat(", commit interval ", m.commit_interval);
  if (m.split_host_memory) {
    return absl::StrCat(
        " (divided between lohand's pool and its state "
        "tier as the plan finds fastest",
        interval, ")");
  }
  if (m.state_tier_bytes == 0) return " (no state tier: states on the SSDs)";
  return absl::StrCat(" + a state tier of ", FormatByteSize(m.state_tier_bytes),
                      interval);
}

// Where the optimizer states are and what they cost the SSDs per
// iteration.
void PrintStates(const Plan& plan) {
  const double p = static_cast<double>(plan.counts.parameters);
  std::printf(
      "  states: %s of %s in RAM (pool %s, state tier %s); on the SSDs per "
      "iteration %.2f B/param read, %.2f written\n",
      Gb(plan.resident_state_bytes).c_str(),
      Gb(static_cast<uint64_t>(12 * p)).c_str(),
      FormatByteSize(plan.pool_bytes).c_str(),
      FormatByteSize(plan.state_tier_bytes).c_str(),
      plan.state_ssd_read_bytes / p, plan.state_ssd_write_bytes / p);
}

// What the training process holds in host memory besides lohand
// (plan/trainer_host.h).
void PrintTrainer(const Plan& plan) {
  const TrainerHostBytes& t = plan.trainer_host;
  const std::string device =
      t.device > 0
          ? absl::StrCat(", the device's memory (the CPU's) ", Gb(t.device))
          : "";
  std::printf(
      "  trainer: %s host at its peak besides lohand (activations offloaded "
      "to host %s, one read back from the SSDs %s, a checkpoint load %s "
      "(ranged reads into the arena), save_pretrained's largest parameter "
      "%s%s; no frozen weights; lohan's arena %s mapped in, counted above; "
      "torch and CUDA's own baseline not counted)\n",
      Gb(t.total()).c_str(), Gb(t.activations).c_str(),
      Gb(t.activation_read).c_str(), Gb(t.checkpoint_load).c_str(),
      Gb(t.checkpoint_save).c_str(), device.c_str(),
      FormatByteSize(t.arena_mapped).c_str());
}

// What the device's working set holds, how the loss is computed and the
// units a recomputed block's backward runs in and its weights stream at.
void PrintWorkingSet(const Plan& plan) {
  const ModelCounts& c = plan.counts;
  const std::string loss =
      c.loss_chunk_tokens > 0
          ? absl::StrCat("chunks of ", c.loss_chunk_tokens, " tokens (",
                         Gb(c.logits_bytes),
                         " with the head's fp32 "
                         "gradient accumulator)")
          : absl::StrCat("the full logits (", Gb(c.logits_bytes), ")");
  const bool unit_weights = plan.param_unit == ParamUnit::kSublayer;
  const DeviceWorkingSet set =
      WorkingSetOf(c, plan.recompute_unit, plan.param_unit);
  std::printf(
      "  device working set %s: two %s weights and the head's weights "
      "and gradients %s, then the larger of a block's backward %s and the "
      "loss %s; the loss in %s\n",
      Gb(set.bytes()).c_str(), unit_weights ? "sublayers'" : "blocks'",
      Gb(set.always).c_str(), Gb(set.block_backward).c_str(),
      Gb(set.loss).c_str(), loss.c_str());
  const bool sublayer = plan.recompute_unit == RecomputeUnit::kSublayer;
  std::printf(
      "  unit: %s%s\n",
      sublayer ? "a sublayer (lohan.init(recompute_unit=\"sublayer\")): a "
                 "recomputed block's backward one attention or MLP at a "
                 "time, each made once more"
               : "the block (recompute_unit=\"block\", the default)",
      plan.block_unit_working_bytes > plan.device_working_bytes && !unit_weights
          ? absl::StrCat("; whole blocks would need ",
                         Gb(plan.block_unit_working_bytes))
                .c_str()
          : "");
  if (unit_weights) {
    std::printf(
        "  weights: a sublayer at a time (lohan.init(param_unit="
        "\"sublayer\")): each sublayer's on the device only while it runs, "
        "the last of a block's twice a step, the others three times (%s "
        "more over the link in backward), its gradients handed over after "
        "its backward; whole blocks' weights would need %s\n",
        Gb(2 * c.layers * ParametersCrossingAgain(c)).c_str(),
        Gb(plan.block_weights_working_bytes).c_str());
  }
}

void PrintDetail(const Plan& plan, bool whole_blocks, bool every_block) {
  std::printf("\nbatch %llu: %.2f s per iteration, %.1f TFLOPS (case %d)\n",
              static_cast<unsigned long long>(plan.batch),
              plan.estimate.seconds(), plan.model_flops_per_second() / 1e12,
              plan.search_case);
  std::printf("  forward  %.2f s: %s\n", plan.estimate.forward.seconds(),
              Split(plan.estimate.forward).c_str());
  std::printf("  backward %.2f s: %s\n", plan.estimate.backward.seconds(),
              Split(plan.estimate.backward).c_str());
  std::printf(
      "  after    %.2f s: the embedding's update, which nothing "
      "hides\n",
      plan.estimate.tail);
  const JobLayoutBytes& layout = plan.layout_bytes;
  std::printf(
      "  memory: device %s working + %s kept; host %s lohan's (arena %s, "
      "%s; chunk buffers %s) + %s activations; SSDs %s lohan's (states %s, "
      "set aside %s) + %s activations\n",
      Gb(plan.device_working_bytes).c_str(), Gb(plan.device_bytes).c_str(),
      Gb(plan.host_fixed_bytes).c_str(),
      FormatByteSize(layout.arena_bytes).c_str(),
      plan.weights_in_host
          ? "buffers per layer, 16-bit weights resident"
          : absl::StrCat(layout.stream_buffers,
                         " shared buffers, weights streamed from the SSDs")
                .c_str(),
      FormatByteSize(layout.update_buffer_bytes).c_str(),
      Gb(plan.host_bytes).c_str(), Gb(plan.ssd_fixed_bytes).c_str(),
      FormatByteSize(layout.ssd_state_bytes).c_str(),
      FormatByteSize(layout.ssd_set_aside_bytes).c_str(),
      Gb(plan.ssd_bytes).c_str());
  PrintTrainer(plan);
  PrintStates(plan);
  PrintWorkingSet(plan);
  // Per tensor class: how many blocks put it where.
  std::map<std::string, std::map<Decision, uint32_t>> where;
  std::map<std::string, std::pair<uint64_t, double>> size;
  std::vector<std::string> classes;
  for (const TensorPlan& tensor : plan.tensors) {
    if (!where.count(tensor.name)) classes.push_back(tensor.name);
    ++where[tensor.name][tensor.decision];
    size[tensor.name] = {tensor.bytes, tensor.benefit};
  }
  std::printf("  %-10s %12s %14s %7s %7s %7s %10s   (blocks)\n", "saved",
              "per block", "FLOP per byte", "device", "host", "SSD",
              "recompute");
  for (const std::string& name : classes) {
    auto& count = where[name];
    std::printf("  %-10s %12s %14.0f %7u %7u %7u %10u\n", name.c_str(),
                FormatByteSize(size[name].first).c_str(), size[name].second,
                count[Decision::kDevice], count[Decision::kHost],
                count[Decision::kSsd], count[Decision::kRecompute]);
  }
  // The plan as lohan.init(activations=...) takes it, in runs.
  std::vector<std::string> runs;
  const std::vector<std::string> modes = plan.block_modes();
  for (size_t b = 0; b < modes.size();) {
    size_t end = b;
    while (end < modes.size() && modes[end] == modes[b]) ++end;
    runs.push_back(absl::StrCat("[\"", modes[b], "\"] * ", end - b));
    b = end;
  }
  std::printf(
      "  plugin: activations=\"auto\" plans per saved tensor from its own "
      "profile; by block: activations=%s%s\n",
      absl::StrJoin(runs, " + ").c_str(),
      whole_blocks ? ""
                   : " (a block with any tensor recomputed is recomputed "
                     "whole there; --per-block plans for that)");
  if (!every_block) return;
  std::printf("  per block (d device, h host, s SSD, r recompute):\n");
  for (uint32_t b = 0; b < plan.shape.layers; ++b) {
    std::string row;
    for (const TensorPlan& tensor : plan.tensors) {
      if (tensor.block == b) row += "dhsr"[static_cast<int>(tensor.decision)];
    }
    std::printf("    block %3u  %s\n", b, row.c_str());
  }
}

google::protobuf::Value Number(double value) {
  google::protobuf::Value v;
  v.set_number_value(value);
  return v;
}

google::protobuf::Value Text(const std::string& value) {
  google::protobuf::Value v;
  v.set_string_value(value);
  return v;
}

google::protobuf::Value StageJson(const StageTime& stage) {
  google::protobuf::Value v;
  auto& f = *v.mutable_struct_value()->mutable_fields();
  f["seconds"] = Number(stage.seconds());
  f["compute"] = Number(stage.compute);
  f["device_to_host"] = Number(stage.device_to_host);
  f["host_to_device"] = Number(stage.host_to_device);
  f["ssd"] = Number(stage.ssd);
  f["optimizer"] = Number(stage.optimizer);
  f["binding"] = Text(ResourceName(stage.binding()));
  return v;
}

google::protobuf::Value PlanJson(const Plan& plan) {
  google::protobuf::Value v;
  auto& f = *v.mutable_struct_value()->mutable_fields();
  f["batch"] = Number(plan.batch);
  f["seq"] = Number(plan.seq);
  f["case"] = Number(plan.search_case);
  f["iteration_seconds"] = Number(plan.estimate.seconds());
  f["tflops"] = Number(plan.model_flops_per_second() / 1e12);
  f["forward_flops"] = Number(plan.counts.forward_flops);
  f["forward"] = StageJson(plan.estimate.forward);
  f["backward"] = StageJson(plan.estimate.backward);
  f["tail_seconds"] = Number(plan.estimate.tail);
  f["device_working_bytes"] = Number(plan.device_working_bytes);
  f["loss_chunk_tokens"] = Number(plan.counts.loss_chunk_tokens);
  const DeviceWorkingSet set =
      WorkingSetOf(plan.counts, plan.recompute_unit, plan.param_unit);
  f["recompute_unit"] = Text(RecomputeUnitName(plan.recompute_unit));
  f["block_unit_working_bytes"] = Number(plan.block_unit_working_bytes);
  f["param_unit"] = Text(ParamUnitName(plan.param_unit));
  f["block_weights_working_bytes"] = Number(plan.block_weights_working_bytes);
  auto& parts =
      *f["device_working_set"].mutable_struct_value()->mutable_fields();
  parts["always"] = Number(set.always);
  parts["block_backward"] = Number(set.block_backward);
  parts["loss"] = Number(set.loss);
  f["device_kept_bytes"] = Number(plan.device_bytes);
  f["host_fixed_bytes"] = Number(plan.host_fixed_bytes);
  f["arena_bytes"] = Number(plan.layout_bytes.arena_bytes);
  f["update_buffer_bytes"] = Number(plan.layout_bytes.update_buffer_bytes);
  f["stream_buffers"] = Number(plan.layout_bytes.stream_buffers);
  f["activation_area_bytes"] = Number(plan.activation_area_bytes);
  f["host_activation_bytes"] = Number(plan.host_bytes);
  const TrainerHostBytes& trainer = plan.trainer_host;
  f["trainer_host_bytes"] = Number(trainer.total());
  auto& held = *f["trainer_host"].mutable_struct_value()->mutable_fields();
  held["activations"] = Number(trainer.activations);
  held["activation_read"] = Number(trainer.activation_read);
  held["frozen_weights"] = Number(trainer.frozen_weights);
  held["checkpoint_load"] = Number(trainer.checkpoint_load);
  held["checkpoint_save"] = Number(trainer.checkpoint_save);
  held["device"] = Number(trainer.device);
  held["arena_mapped"] = Number(trainer.arena_mapped);
  f["ssd_fixed_bytes"] = Number(plan.ssd_fixed_bytes);
  f["ssd_state_bytes"] = Number(plan.layout_bytes.ssd_state_bytes);
  f["ssd_state_tensor_bytes"] =
      Number(plan.layout_bytes.ssd_state_tensor_bytes);
  f["ssd_scratch_bytes"] = Number(plan.layout_bytes.ssd_scratch_bytes);
  f["ssd_set_aside_bytes"] = Number(plan.layout_bytes.ssd_set_aside_bytes);
  f["ssd_activation_bytes"] = Number(plan.ssd_bytes);
  f["recomputed_bytes"] = Number(plan.recomputed_bytes);
  f["weights_in_host"] = Number(plan.weights_in_host ? 1 : 0);
  f["pool_bytes"] = Number(plan.pool_bytes);
  f["state_tier_bytes"] = Number(plan.state_tier_bytes);
  f["resident_state_bytes"] = Number(plan.resident_state_bytes);
  f["state_ssd_read_bytes"] = Number(plan.state_ssd_read_bytes);
  f["state_ssd_write_bytes"] = Number(plan.state_ssd_write_bytes);
  auto* tensors = f["tensors"].mutable_list_value();
  for (const TensorPlan& tensor : plan.tensors) {
    google::protobuf::Value t;
    auto& tf = *t.mutable_struct_value()->mutable_fields();
    tf["block"] = Number(tensor.block);
    tf["name"] = Text(tensor.name);
    tf["bytes"] = Number(tensor.bytes);
    tf["decision"] = Text(DecisionName(tensor.decision));
    *tensors->add_values() = t;
  }
  auto* curve = f["curve"].mutable_list_value();
  for (const Estimate& e : plan.curve) {
    google::protobuf::Value point;
    auto& pf = *point.mutable_struct_value()->mutable_fields();
    pf["saved_bytes"] = Number(e.saved_bytes);
    pf["offloaded_bytes"] = Number(e.offloaded_bytes);
    pf["iteration_seconds"] = Number(e.seconds());
    *curve->add_values() = point;
  }
  f["chosen"] = Number(plan.chosen);
  auto* modes = f["block_modes"].mutable_list_value();
  for (const std::string& mode : plan.block_modes()) {
    *modes->add_values() = Text(mode);
  }
  return v;
}

std::string Escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else {
      out += c;
    }
  }
  return out;
}

// Predicted iteration time against the saved tensors' bytes not
// recomputed (kept on the device while its spare memory lasts, then
// offloaded), one line per batch, the chosen point circled.
absl::Status WritePlot(const std::string& path, const std::vector<Plan>& plans,
                       const std::string& title) {
  constexpr double kWidth = 720, kHeight = 440, kLeft = 70, kBottom = 50,
                   kTop = 40, kRight = 150;
  double max_x = 0, max_y = 0;
  for (const Plan& plan : plans) {
    for (const Estimate& e : plan.curve) {
      max_x = std::max(max_x, static_cast<double>(e.saved_bytes) / 1e9);
      max_y = std::max(max_y, e.seconds());
    }
  }
  if (max_x <= 0 || max_y <= 0) {
    return absl::FailedPreconditionError("nothing to plot");
  }
  auto x = [&](double gb) {
    return kLeft + gb / max_x * (kWidth - kLeft - kRight);
  };
  auto y = [&](double s) {
    return kHeight - kBottom - s / (1.1 * max_y) * (kHeight - kBottom - kTop);
  };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                  "#9467bd", "#ff7f0e", "#8c564b"};
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n"
      "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" "
      "stroke=\"black\"/>\n<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" "
      "y2=\"%.0f\" stroke=\"black\"/>\n"
      "<text x=\"%.0f\" y=\"%.0f\">activations not recomputed (GB): kept on "
      "the device, then offloaded</text>\n"
      "<text x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\">"
      "predicted iteration time (s)</text>\n",
      kWidth, kHeight, kLeft, Escaped(title), kLeft, kHeight - kBottom,
      kWidth - kRight, kHeight - kBottom, kLeft, kHeight - kBottom, kLeft, kTop,
      kLeft + 20, kHeight - 12, kHeight / 2, kHeight / 2);
  for (int tick = 0; tick <= 4; ++tick) {
    const double gb = max_x * tick / 4, s = 1.1 * max_y * tick / 4;
    svg += absl::StrFormat(
        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n"
        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.1f</text>\n",
        x(gb), kHeight - kBottom + 16, gb, kLeft - 6, y(s) + 4, s);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& plan = plans[i];
    const char* color = kColors[i % 6];
    std::string points;
    for (const Estimate& e : plan.curve) {
      absl::StrAppendFormat(&points, "%.1f,%.1f ",
                            x(static_cast<double>(e.saved_bytes) / 1e9),
                            y(e.seconds()));
    }
    const Estimate& chosen = plan.curve[plan.chosen];
    svg += absl::StrFormat(
        "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
        "points=\"%s\"/>\n<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" "
        "fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n"
        "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">batch %llu</text>\n",
        color, points, x(static_cast<double>(chosen.saved_bytes) / 1e9),
        y(chosen.seconds()), color, kWidth - kRight + 12, kTop + 18 * (i + 1),
        color, static_cast<unsigned long long>(plan.batch));
  }
  svg += "</svg>\n";
  std::ofstream out(path);
  out << svg;
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// A --recompute-unit or --param-unit value: "auto", "block" or
// "sublayer"; INVALID_ARGUMENT naming the flag otherwise.
template <typename Unit>
absl::StatusOr<Unit> ParseUnit(const char* flag, const std::string& value,
                               Unit automatic, Unit block, Unit sublayer) {
  if (value == "auto") return automatic;
  if (value == "block") return block;
  if (value == "sublayer") return sublayer;
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " ", value,
      ": use auto (the default: the block when it fits the device, else "
      "a sublayer), block or sublayer"));
}

// The largest preset (by parameters) that fits at `batch` x `seq`.
std::string LargestPreset(uint64_t batch, uint64_t seq, const Machine& m,
                          Attention attention, LossChunks loss,
                          RecomputeUnit unit, ParamUnit params) {
  std::string best = "none";
  uint64_t best_parameters = 0;
  for (const std::string& name : PresetNames()) {
    const ModelShape shape = *PresetShape(name);
    const uint64_t parameters = CountModel(shape, 1, 1).parameters;
    if (parameters > best_parameters &&
        MakePlan(shape, batch, seq, m, attention, Granularity::kTensor, loss,
                 unit, params)
            .ok()) {
      best = name;
      best_parameters = parameters;
    }
  }
  return best;
}

}  // namespace

int RunPlan(const PlanOptions& options) {
  absl::StatusOr<ModelShape> shape = LoadShape(options.model);
  if (!shape.ok()) return Fail(shape.status());
  Machine base;
  if (options.this_machine) {
    absl::StatusOr<Machine> here = ThisMachine(options.socket);
    if (!here.ok()) return Fail(here.status());
    base = *here;
  }
  absl::StatusOr<Machine> machine = Described(options, base);
  if (!machine.ok()) return Fail(machine.status());
  const Attention attention =
      options.eager_attention ? Attention::kEager : Attention::kFused;
  if (options.full_logits && options.loss_chunk_tokens > 0) {
    return Fail(absl::InvalidArgumentError(
        "--loss-chunk-tokens and --full-logits: give one (the loss in chunks "
        "of that many tokens, or over the full logits)"));
  }
  const LossChunks loss{!options.full_logits, options.loss_chunk_tokens};
  absl::StatusOr<RecomputeUnit> unit = ParseUnit(
      "--recompute-unit", options.recompute_unit, RecomputeUnit::kAuto,
      RecomputeUnit::kBlock, RecomputeUnit::kSublayer);
  if (!unit.ok()) return Fail(unit.status());
  absl::StatusOr<ParamUnit> params =
      ParseUnit("--param-unit", options.param_unit, ParamUnit::kAuto,
                ParamUnit::kBlock, ParamUnit::kSublayer);
  if (!params.ok()) return Fail(params.status());
  std::vector<Plan> plans;
  std::vector<std::pair<uint64_t, std::string>> refused;
  for (uint64_t batch : options.batches) {
    absl::StatusOr<Plan> plan =
        MakePlan(*shape, batch, options.seq, *machine, attention,
                 options.per_block ? Granularity::kBlock : Granularity::kTensor,
                 loss, *unit, *params);
    if (!plan.ok()) {
      if (!absl::IsFailedPrecondition(plan.status()))
        return Fail(plan.status());
      refused.push_back({batch, std::string(plan.status().message())});
      continue;
    }
    plans.push_back(*std::move(plan));
  }
  const uint64_t largest_batch = LargestBatch(
      *shape, options.seq, *machine, 4096, attention, loss, *unit, *params);
  const std::string largest_model =
      LargestPreset(options.batches.front(), options.seq, *machine, attention,
                    loss, *unit, *params);
  const ModelCounts counts = CountModel(*shape, 1, 1);
  if (options.json) {
    google::protobuf::Value out;
    auto& f = *out.mutable_struct_value()->mutable_fields();
    f["model"] = Text(shape->name);
    f["parameters"] = Number(counts.parameters);
    f["layers"] = Number(shape->layers);
    auto* layer_elements = f["layer_elements"].mutable_list_value();
    for (uint64_t elements : counts.layer_elements) {
      *layer_elements->add_values() = Number(elements);
    }
    f["largest_batch"] = Number(largest_batch);
    f["largest_preset"] = Text(largest_model);
    auto* list = f["plans"].mutable_list_value();
    for (const Plan& plan : plans) *list->add_values() = PlanJson(plan);
    auto* refusals = f["refused"].mutable_list_value();
    for (const auto& [batch, why] : refused) {
      google::protobuf::Value r;
      (*r.mutable_struct_value()->mutable_fields())["batch"] = Number(batch);
      (*r.mutable_struct_value()->mutable_fields())["why"] = Text(why);
      *refusals->add_values() = r;
    }
    std::string text;
    (void)google::protobuf::util::MessageToJsonString(out, &text);
    std::printf("%s\n", text.c_str());
  } else {
    const Machine& m = *machine;
    std::printf(
        "model %s: %.2f B parameters, %llu blocks x %llu wide, sequence "
        "%llu, %s attention\n"
        "machine: device %s at %.0f TFLOPS; host->device %.1f GB/s, "
        "device->host %.1f GB/s; host memory %s%s; %u SSDs x %.1f GB/s "
        "read, %.1f GB/s write\n\n",
        shape->name.c_str(), static_cast<double>(counts.parameters) / 1e9,
        static_cast<unsigned long long>(shape->layers),
        static_cast<unsigned long long>(shape->hidden),
        static_cast<unsigned long long>(options.seq),
        options.eager_attention ? "eager (scores saved)" : "fused",
        FormatByteSize(m.device_bytes).c_str(), m.device_flops / 1e12,
        m.host_to_device / 1e9, m.device_to_host / 1e9,
        FormatByteSize(m.host_bytes).c_str(), TierText(m).c_str(), m.ssds,
        m.ssd_read / 1e9, m.ssd_write / 1e9);
    std::printf("%6s %5s %12s %8s %-22s %-22s %10s %10s %10s %10s\n", "batch",
                "case", "iteration s", "TFLOPS", "forward binds",
                "backward binds", "on device", "host", "SSD", "recomputed");
    for (const Plan& plan : plans) {
      std::printf("%6llu %5d %12.2f %8.1f %-22s %-22s %10s %10s %10s %10s\n",
                  static_cast<unsigned long long>(plan.batch), plan.search_case,
                  plan.estimate.seconds(), plan.model_flops_per_second() / 1e12,
                  ResourceName(plan.estimate.forward.binding()),
                  ResourceName(plan.estimate.backward.binding()),
                  Gb(plan.device_bytes).c_str(), Gb(plan.host_bytes).c_str(),
                  Gb(plan.ssd_bytes).c_str(),
                  Gb(plan.recomputed_bytes).c_str());
    }
    for (const auto& [batch, why] : refused) {
      std::printf("%6llu  does not fit: %s\n",
                  static_cast<unsigned long long>(batch), why.c_str());
    }
    std::printf(
        "\nlargest batch that fits at sequence %llu: %llu; largest preset "
        "model that fits at batch %llu: %s\n",
        static_cast<unsigned long long>(options.seq),
        static_cast<unsigned long long>(largest_batch),
        static_cast<unsigned long long>(options.batches.front()),
        largest_model.c_str());
    for (const Plan& plan : plans) {
      PrintDetail(plan, options.per_block, options.tensors);
    }
  }
  if (!options.plot_path.empty() && !plans.empty()) {
    if (absl::Status written =
            WritePlot(options.plot_path, plans,
                      absl::StrCat(shape->name, ", sequence ", options.seq));
        !written.ok()) {
      return Fail(written);
    }
    if (!options.json) {
      std::printf("\nplot: %s\n", options.plot_path.c_str());
    }
  }
  return refused.empty() ? 0 : 1;
}

}  // namespace lohan
