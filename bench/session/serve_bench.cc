// The data plane's service order, measured: one lohand, two identical jobs
// with streamed gradients and weights (2 buffers of each), one served in
// arrival order on one thread (ModelSpec.in_order_service), one in lanes
// (what the device waits for beside the SSD writes), their iterations
// interleaved. Each iteration plays the plugin's activation offload and
// backward: in forward each layer's input goes out (ACT_PUT, waited); in
// backward, per layer from the last, FETCH_PARAMS and ACT_GET (the
// recompute needs the weights and the input; the client waits for both:
// their latencies are the figures), the gradient handed over without
// waiting (GRAD_READY, which writes it to the SSDs before it completes) and
// the input freed (ACT_FREE, waited, as the plugin's sweep does), then
// ITER_END.
//
//   bazel run //bench/session:serve_bench -- [--layers=16]
//       [--elements=4194304] [--iterations=4] [--activation_bytes=1048576]
// The daemon's state and its SSD file live in a fresh directory under /tmp.
//
// Prints FETCH_PARAMS, ACT_GET and ACT_FREE latency p50/p99 and the
// iteration time per mode, and the ratios lanes / in order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;
constexpr absl::Duration kTimeout = absl::Seconds(600);

struct Flags {
  uint32_t layers = 16;
  uint64_t elements = uint64_t{4} << 20;
  int iterations = 4;
  uint64_t activation_bytes = uint64_t{1} << 20;  // per layer
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "serve_bench: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::exit(1);
}

// One job's control and data plane, registered.
struct Job {
  std::string id;
  std::unique_ptr<DataPlane> plane;
  v1::RegisterModelResponse layout;
  uint64_t next_iteration = 0;
  std::vector<double> fetch_ms, get_ms, free_ms;
  std::vector<double> iteration_s;
};

Job OpenJob(ControlClient& client, const Flags& flags, const std::string& name,
            bool in_order) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_host_pool_bytes(6 * flags.elements * 2 + flags.activation_bytes +
                           (uint64_t{16} << 20));
  auto job = client.CreateJob(spec);
  if (!job.ok()) Die("create", job.status());
  if (auto attached = client.AttachJob(job->id()); !attached.ok()) {
    Die("attach", attached.status());
  }
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) Die("data plane", plane.status());
  v1::RegisterModelRequest request;
  request.set_job_id(job->id());
  v1::ModelSpec* model = request.mutable_model();
  for (uint32_t l = 0; l < flags.layers; ++l) {
    model->add_layer_elements(flags.elements);
  }
  model->set_dtype(v1::DTYPE_BF16);
  model->mutable_adam()->set_lr(1e-4);
  model->mutable_adam()->set_beta1(0.9);
  model->mutable_adam()->set_beta2(0.999);
  model->mutable_adam()->set_eps(1e-8);
  model->mutable_adam()->set_decoupled_weight_decay(true);
  model->set_grad_slots(2);
  model->set_weight_slots(2);
  model->set_in_order_service(in_order);
  model->set_activation_bytes(flags.activation_bytes);
  auto registered = client.RegisterModel(request);
  if (!registered.ok()) Die("register", registered.status());
  Job out{.id = job->id(), .plane = *std::move(plane), .layout = *registered};
  out.plane->SetErrorText(registered->error_text_offset(),
                          registered->error_text_bytes());
  // Initial weights through the staging slot.
  float* staging = reinterpret_cast<float*>(out.plane->arena() +
                                            registered->staging_offset());
  for (uint32_t l = 0; l < flags.layers; ++l) {
    for (uint64_t i = 0; i < flags.elements; ++i) {
      staging[i] = 0.01f * static_cast<float>((i * 2654435761u + l) % 1000);
    }
    SubmissionEntry init{};
    init.op = static_cast<uint16_t>(RingOp::kInitWeights);
    init.layer = l;
    init.slot_offset = registered->staging_offset();
    init.length = flags.elements * 4;
    if (auto done = out.plane->Call(init, kTimeout); !done.ok()) {
      Die("init", done.status());
    }
  }
  out.next_iteration = registered->iteration();
  return out;
}

// Calls `entry` and adds its latency to `ms`.
void Timed(DataPlane& plane, const SubmissionEntry& entry, const char* what,
           std::vector<double>& ms) {
  const auto asked = Clock::now();
  if (auto done = plane.Call(entry, kTimeout); !done.ok()) {
    Die(what, done.status());
  }
  ms.push_back(1e3 * Seconds(Clock::now() - asked));
}

SubmissionEntry Activation(const Job& job, const Flags& flags, RingOp op,
                           uint32_t layer) {
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(op);
  entry.activation_id = layer + 1;
  if (op != RingOp::kActFree) {
    entry.slot_offset = job.layout.activation_offset();
    entry.length = flags.activation_bytes;
  }
  return entry;
}

void Iterate(Job& job, const Flags& flags) {
  DataPlane& plane = *job.plane;
  const auto start = Clock::now();
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  begin.iteration = job.next_iteration;
  if (auto done = plane.Call(begin, kTimeout); !done.ok()) {
    Die("begin", done.status());
  }
  std::vector<double> put_ms;
  for (uint32_t l = 0; l < flags.layers; ++l) {
    Timed(plane, Activation(job, flags, RingOp::kActPut, l), "put", put_ms);
  }
  std::vector<DataPlane::Ticket> grads;
  for (uint32_t back = 0; back < flags.layers; ++back) {
    const uint32_t l = flags.layers - 1 - back;
    const v1::LayerSlots& slots = job.layout.layers(l);
    if (auto free =
            plane.WaitForRange(slots.weight_offset(), slots.bytes(), kTimeout);
        !free.ok()) {
      Die("weight buffer", free);
    }
    SubmissionEntry fetch{};
    fetch.op = static_cast<uint16_t>(RingOp::kFetchParams);
    fetch.layer = l;
    fetch.slot_offset = slots.weight_offset();
    fetch.length = slots.bytes();
    Timed(plane, fetch, "fetch", job.fetch_ms);
    Timed(plane, Activation(job, flags, RingOp::kActGet, l), "get", job.get_ms);
    // The layer's gradient into its (shared) buffer once the buffer's last
    // GRAD_READY is done, then handed over without waiting.
    if (auto free =
            plane.WaitForRange(slots.grad_offset(), slots.bytes(), kTimeout);
        !free.ok()) {
      Die("gradient buffer", free);
    }
    uint16_t* grad =
        reinterpret_cast<uint16_t*>(plane.arena() + slots.grad_offset());
    for (uint64_t i = 0; i < flags.elements; ++i) {
      grad[i] = 0x3a00 + static_cast<uint16_t>((i + l + back) & 0xff);
    }
    SubmissionEntry ready{};
    ready.op = static_cast<uint16_t>(RingOp::kGradReady);
    ready.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    ready.layer = l;
    ready.slot_offset = slots.grad_offset();
    ready.length = slots.bytes();
    auto ticket = plane.Submit(ready, kTimeout);
    if (!ticket.ok()) Die("grad-ready", ticket.status());
    grads.push_back(*ticket);
    Timed(plane, Activation(job, flags, RingOp::kActFree, l), "free",
          job.free_ms);
  }
  for (DataPlane::Ticket ticket : grads) {
    if (auto done = plane.Wait(ticket, kTimeout); !done.ok()) {
      Die("grad-ready", done.status());
    }
  }
  SubmissionEntry end{};
  end.op = static_cast<uint16_t>(RingOp::kIterEnd);
  end.iteration = job.next_iteration++;
  if (auto done = plane.Call(end, kTimeout); !done.ok()) {
    Die("end", done.status());
  }
  job.iteration_s.push_back(Seconds(Clock::now() - start));
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1,
                         static_cast<size_t>(p * values.size()))];
}

double Mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / values.size();
}

int Run(const Flags& flags) {
  testing::PublicTempDir dir;
  const std::string where = dir.path();
  const uint64_t states = uint64_t{flags.layers} * flags.elements * 16;
  auto daemon = testing::DaemonProcess::Start(
      where, {"--ssd-capacity", absl::StrCat(8 * states + (uint64_t{1} << 30)),
              "--host-pool-size", absl::StrCat(uint64_t{1} << 30),
              "--log-level", "warn"});
  if (!daemon.ok()) Die("lohand", daemon.status());
  auto client = ControlClient::Connect({.socket_path = (*daemon)->socket()});
  if (!client.ok()) Die("connect", client.status());
  Job in_order = OpenJob(**client, flags, "in-order", true);
  Job lanes = OpenJob(**client, flags, "lanes", false);
  std::printf(
      "serve_bench: %u layers x %llu bf16 parameters, 2 gradient and 2 "
      "weight buffers (streamed), %d iterations per mode, interleaved\n",
      flags.layers, static_cast<unsigned long long>(flags.elements),
      flags.iterations);
  // One warm-up each (first updates create the states), then measured.
  Iterate(in_order, flags);
  Iterate(lanes, flags);
  for (Job* job : {&in_order, &lanes}) {
    job->fetch_ms.clear();
    job->get_ms.clear();
    job->free_ms.clear();
    job->iteration_s.clear();
  }
  for (int t = 0; t < flags.iterations; ++t) {
    Iterate(t % 2 == 0 ? in_order : lanes, flags);
    Iterate(t % 2 == 0 ? lanes : in_order, flags);
  }
  std::printf("%-10s %19s %19s %19s %12s\n", "service", "fetch p50/p99 ms",
              "act get p50/p99 ms", "act free p50/p99 ms", "iteration s");
  for (const auto& [name, job] :
       {std::pair{"in order", &in_order}, {"lanes", &lanes}}) {
    std::printf("%-10s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %12.3f\n", name,
                Percentile(job->fetch_ms, 0.5), Percentile(job->fetch_ms, 0.99),
                Percentile(job->get_ms, 0.5), Percentile(job->get_ms, 0.99),
                Percentile(job->free_ms, 0.5), Percentile(job->free_ms, 0.99),
                Mean(job->iteration_s));
  }
  auto ratio = [](const std::vector<double>& a, const std::vector<double>& b,
                  double p) { return Percentile(a, p) / Percentile(b, p); };
  std::printf(
      "lanes / in order: fetch p50 %.3fx, p99 %.3fx; act get p50 %.3fx, "
      "p99 %.3fx; act free p50 %.3fx, p99 %.3fx; iteration %.3fx\n",
      ratio(lanes.fetch_ms, in_order.fetch_ms, 0.5),
      ratio(lanes.fetch_ms, in_order.fetch_ms, 0.99),
      ratio(lanes.get_ms, in_order.get_ms, 0.5),
      ratio(lanes.get_ms, in_order.get_ms, 0.99),
      ratio(lanes.free_ms, in_order.free_ms, 0.5),
      ratio(lanes.free_ms, in_order.free_ms, 0.99),
      Mean(lanes.iteration_s) / Mean(in_order.iteration_s));
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  lohan::Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("layers")) {
      flags.layers = static_cast<uint32_t>(std::atoi(v));
    } else if (const char* v = value("elements")) {
      flags.elements = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("iterations")) {
      flags.iterations = std::atoi(v);
    } else if (const char* v = value("activation_bytes")) {
      flags.activation_bytes = std::strtoull(v, nullptr, 10);
    } else {
      std::fprintf(stderr, "serve_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  return lohan::Run(flags);
}
