// Fair shares across jobs, measured on a real lohand: synthetic training
// jobs (C++ clients over the real data plane, each its own process, as
// root or, for a second user, as nobody via setpriv) train as fast as they
// can; over a window the daemon's own counters (lohanctl status: each
// session's SSD bytes and optimizer seconds) give each job's share of the
// SSD traffic and of the optimizer, against its fair share (its weight
// over the sum).
//
//   bazel run //bench/session:fair_bench -- [--window=10] [--layers=8]
//       [--elements=1048576] [--light-only] [--greedy-elements=N]
//       [--light-think-ms=100] [--gate-unit=SIZE]
//
// Scenarios: 2 and 4 jobs of equal weight; 2 jobs of two users weighted
// 2:1 (needs root: the second runs as nobody); a light job (a smaller
// model with 100 ms of "device time" per iteration) alone and beside a
// greedy one: its iteration time both ways.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
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

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "fair_bench: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::exit(1);
}

struct WorkerArgs {
  std::string socket, job;
  uint32_t layers = 8;
  uint64_t elements = 1 << 20;
  int think_ms = 0;
};

// A job that trains until killed, as fast as its states move: per
// iteration FETCH_PARAMS of every layer, `think_ms` of device time, every
// GRAD_READY handed over without waiting (from the last layer; one buffer
// per layer), ITER_END. Its update pipeline then keeps a state read and a
// state write in flight: a job that wants more of the SSDs than it gets.
int Worker(const WorkerArgs& args) {
  auto client = ControlClient::Connect({.socket_path = args.socket});
  if (!client.ok()) Die("connect", client.status());
  v1::JobSpec spec;
  spec.set_name(args.job);
  spec.set_host_pool_bytes(uint64_t{args.layers} * args.elements * 4 +
                           args.elements * 4 + (uint64_t{16} << 20));
  auto job = (*client)->CreateJob(spec);
  if (!job.ok()) Die("create", job.status());
  if (auto a = (*client)->AttachJob(job->id()); !a.ok())
    Die("attach", a.status());
  auto plane =
      DataPlane::Open((*client)->hello().data_socket_path(), job->id());
  if (!plane.ok()) Die("data plane", plane.status());
  v1::RegisterModelRequest request;
  request.set_job_id(job->id());
  v1::ModelSpec* model = request.mutable_model();
  for (uint32_t l = 0; l < args.layers; ++l) {
    model->add_layer_elements(args.elements);
  }
  model->set_dtype(v1::DTYPE_BF16);
  model->mutable_adam()->set_lr(1e-4);
  model->mutable_adam()->set_beta1(0.9);
  model->mutable_adam()->set_beta2(0.999);
  model->mutable_adam()->set_eps(1e-8);
  auto layout = (*client)->RegisterModel(request);
  if (!layout.ok()) Die("register", layout.status());
  (*plane)->SetErrorText(layout->error_text_offset(),
                         layout->error_text_bytes());
  float* staging =
      reinterpret_cast<float*>((*plane)->arena() + layout->staging_offset());
  for (uint32_t l = 0; l < args.layers; ++l) {
    for (uint64_t i = 0; i < args.elements; ++i) staging[i] = 0.01f;
    SubmissionEntry init{};
    init.op = static_cast<uint16_t>(RingOp::kInitWeights);
    init.layer = l;
    init.slot_offset = layout->staging_offset();
    init.length = args.elements * 4;
    if (auto d = (*plane)->Call(init, kTimeout); !d.ok())
      Die("init", d.status());
  }
  std::printf("ready %s\n", job->id().c_str());
  std::fflush(stdout);
  signal(SIGPIPE, SIG_IGN);
  for (uint64_t iteration = layout->iteration();; ++iteration) {
    SubmissionEntry begin{};
    begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
    begin.iteration = iteration;
    if (auto d = (*plane)->Call(begin, kTimeout); !d.ok())
      Die("begin", d.status());
    for (uint32_t l = 0; l < args.layers; ++l) {
      SubmissionEntry fetch{};
      fetch.op = static_cast<uint16_t>(RingOp::kFetchParams);
      fetch.layer = l;
      fetch.slot_offset = layout->layers(l).weight_offset();
      fetch.length = layout->layers(l).bytes();
      if (auto d = (*plane)->Call(fetch, kTimeout); !d.ok())
        Die("fetch", d.status());
    }
    if (args.think_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args.think_ms));
    }
    std::vector<DataPlane::Ticket> grads;
    for (uint32_t back = 0; back < args.layers; ++back) {
      const uint32_t l = args.layers - 1 - back;
      SubmissionEntry ready{};
      ready.op = static_cast<uint16_t>(RingOp::kGradReady);
      ready.dtype = static_cast<uint16_t>(RingDtype::kBf16);
      ready.layer = l;
      ready.slot_offset = layout->layers(l).grad_offset();
      ready.length = layout->layers(l).bytes();
      uint16_t* grad =
          reinterpret_cast<uint16_t*>((*plane)->arena() + ready.slot_offset);
      for (uint64_t i = 0; i < args.elements; ++i) grad[i] = 0x3a00;
      auto ticket = (*plane)->Submit(ready, kTimeout);
      if (!ticket.ok()) Die("grad", ticket.status());
      grads.push_back(*ticket);
    }
    for (DataPlane::Ticket ticket : grads) {
      if (auto d = (*plane)->Wait(ticket, kTimeout); !d.ok()) {
        Die("grad", d.status());
      }
    }
    SubmissionEntry end{};
    end.op = static_cast<uint16_t>(RingOp::kIterEnd);
    end.iteration = iteration;
    if (auto d = (*plane)->Call(end, kTimeout); !d.ok()) Die("end", d.status());
  }
}

struct JobPlan {
  std::string name;
  bool as_nobody = false;
  uint32_t layers = 8;
  uint64_t elements = 1 << 20;
  int think_ms = 0;
  double weight = 1;
};

struct Share {
  double ssd_bytes = 0, optimizer_seconds = 0, iterations = 0;
};

// Runs `plans` side by side for `window` seconds after each has done an
// iteration; each job's counters over the window.
std::map<std::string, Share> RunScenario(const std::string& dir,
                                         const std::string& bin,
                                         const std::vector<JobPlan>& plans,
                                         double window) {
  auto daemon = testing::DaemonProcess::Start(
      dir, {"--config", dir + "/lohand.toml", "--ssd-capacity", "8GiB",
            "--host-pool-size", "1GiB", "--log-level", "warn"});
  if (!daemon.ok()) Die("lohand", daemon.status());
  std::vector<std::unique_ptr<testing::BackgroundProcess>> workers;
  std::map<std::string, std::string> names;  // job id -> plan name
  for (const JobPlan& plan : plans) {
    std::vector<std::string> argv;
    if (plan.as_nobody) {
      argv = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
              "--clear-groups"};
    }
    for (const std::string& arg :
         {bin, std::string("--worker"), (*daemon)->socket(), plan.name,
          std::to_string(plan.layers), std::to_string(plan.elements),
          std::to_string(plan.think_ms)}) {
      argv.push_back(arg);
    }
    auto worker = testing::BackgroundProcess::Start(argv);
    if (!worker.ok()) Die("worker " + plan.name, worker.status());
    const std::string& line = (*worker)->first_line();
    if (line.rfind("ready ", 0) != 0) {
      Die("worker " + plan.name, absl::InternalError(line));
    }
    names[line.substr(6)] = plan.name;
    workers.push_back(*std::move(worker));
  }
  auto client = ControlClient::Connect({.socket_path = (*daemon)->socket()});
  if (!client.ok()) Die("connect", client.status());
  auto sample = [&]() {
    std::map<std::string, Share> now;
    auto status = (*client)->GetStatus();
    if (!status.ok()) Die("status", status.status());
    for (const v1::SessionStatus& s : status->sessions()) {
      now[names[s.job_id()]] = Share{
          .ssd_bytes =
              static_cast<double>(s.ssd_read_bytes() + s.ssd_written_bytes()),
          .optimizer_seconds = s.optimizer_seconds(),
          .iterations = static_cast<double>(s.session_iterations())};
    }
    return now;
  };
  // Every job past its first iteration.
  for (bool warm = false; !warm;) {
    std::map<std::string, Share> now = sample();
    warm = now.size() == plans.size();
    for (const auto& [name, share] : now) warm = warm && share.iterations >= 1;
    if (!warm) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::map<std::string, Share> before = sample();
  std::this_thread::sleep_for(std::chrono::duration<double>(window));
  std::map<std::string, Share> after = sample();
  workers.clear();  // SIGKILL each
  std::map<std::string, Share> delta;
  for (const auto& [name, share] : after) {
    const Share& was = before[name];
    delta[name] = Share{share.ssd_bytes - was.ssd_bytes,
                        share.optimizer_seconds - was.optimizer_seconds,
                        share.iterations - was.iterations};
  }
  return delta;
}

void Report(const char* title, const std::vector<JobPlan>& plans,
            const std::map<std::string, Share>& got, double window) {
  double weights = 0, ssd = 0, optimizer = 0;
  for (const JobPlan& plan : plans) weights += plan.weight;
  for (const auto& [name, share] : got) {
    ssd += share.ssd_bytes;
    optimizer += share.optimizer_seconds;
  }
  std::printf("\n%s (window %.0f s): SSD %.2f GB/s, optimizer %.0f%% busy\n",
              title, window, ssd / window / 1e9, 100 * optimizer / window);
  std::printf("  %-10s %6s %9s %9s %9s %9s %9s\n", "job", "weight", "fair",
              "SSD", "SSD/fair", "optim", "opt/fair");
  for (const JobPlan& plan : plans) {
    const Share& share = got.at(plan.name);
    const double fair = plan.weight / weights;
    const double s = share.ssd_bytes / ssd,
                 o = share.optimizer_seconds / optimizer;
    std::printf("  %-10s %6.1f %8.1f%% %8.1f%% %9.3f %8.1f%% %9.3f\n",
                plan.name.c_str(), plan.weight, 100 * fair, 100 * s, s / fair,
                100 * o, o / fair);
  }
}

struct LightOptions {
  bool only = false;             // just the light-job scenario
  uint64_t greedy_elements = 0;  // per layer of the greedy job; 0: elements
  int think_ms = 100;            // the light job's device time
  std::string gate_unit;         // store.gate_unit; empty: the default
};

int Run(double window, uint32_t layers, uint64_t elements,
        const LightOptions& light_options) {
  testing::PublicTempDir dir;
  // The worker runs as nobody too: a copy it can reach.
  const std::string bin = dir.path() + "/fair_bench";
  {
    std::ifstream in("/proc/self/exe", std::ios::binary);
    std::ofstream out(bin, std::ios::binary);
    out << in.rdbuf();
  }
  chmod(bin.c_str(), 0755);
  auto config = [&](const std::string& text) {
    std::ofstream config_file(dir.path() + "/lohand.toml");
    if (!light_options.gate_unit.empty()) {
      config_file << "[store]\ngate_unit = \"" << light_options.gate_unit
                  << "\"\n";
    }
    config_file << text;
    config_file.close();
    // A fresh daemon state for each scenario.
    testing::RunCommand(
        {"/bin/rm", "-rf", dir.path() + "/state", dir.path() + "/ssd0"});
  };
  std::printf(
      "fair_bench: jobs of %u layers x %llu bf16 parameters (resident "
      "buffers; states on the SSDs)\n",
      layers, static_cast<unsigned long long>(elements));
  auto plan = [&](const char* name) {
    return JobPlan{.name = name, .layers = layers, .elements = elements};
  };
  for (int jobs : {1, 2, 4}) {
    if (light_options.only) break;
    config("");
    std::vector<JobPlan> plans;
    for (int j = 0; j < jobs; ++j) {
      plans.push_back(plan(absl::StrCat("job", j).c_str()));
    }
    Report(absl::StrCat(jobs, " jobs, equal weights").c_str(), plans,
           RunScenario(dir.path(), bin, plans, window), window);
  }
  if (!light_options.only && getuid() == 0) {
    config("[quotas.user.root]\nweight = 2\n");
    std::vector<JobPlan> plans = {plan("root"), plan("nobody")};
    plans[0].weight = 2;
    plans[1].as_nobody = true;
    Report("2 users weighted 2:1 (root 2, nobody 1)", plans,
           RunScenario(dir.path(), bin, plans, window), window);
    // A user's jobs share the user's weight: root's two jobs, a quarter
    // each, beside nobody's one, half (the weights below are each job's
    // share of its user's, for the report).
    config("");
    plans = {plan("root-a"), plan("root-b"), plan("nobody")};
    plans[0].weight = plans[1].weight = 0.5;
    plans[2].as_nobody = true;
    Report("2 users, equal weights, root with 2 jobs", plans,
           RunScenario(dir.path(), bin, plans, window), window);
  } else if (!light_options.only) {
    std::printf(
        "\n(2:1 between users skipped: needs root for a second "
        "uid)\n");
  }
  config("");
  JobPlan light = plan("light");
  light.layers = 2;
  light.think_ms = light_options.think_ms;
  JobPlan greedy = plan("greedy");
  if (light_options.greedy_elements != 0) {
    greedy.elements = light_options.greedy_elements;
  }
  auto alone = RunScenario(dir.path(), bin, {light}, window);
  config("");
  auto beside = RunScenario(dir.path(), bin, {light, greedy}, window);
  const double t_alone = window / alone["light"].iterations;
  const double t_beside = window / beside["light"].iterations;
  std::printf(
      "\nlight job (2 layers x %llu, %d ms device time per iteration): "
      "%.3f s/iteration alone, %.3f s beside a greedy job of %u layers x "
      "%llu (%.2fx); the greedy job did %.0f iterations, %.2f GB/s of SSD "
      "traffic\n",
      static_cast<unsigned long long>(light.elements), light.think_ms, t_alone,
      t_beside, greedy.layers, static_cast<unsigned long long>(greedy.elements),
      t_beside / t_alone, beside["greedy"].iterations,
      beside["greedy"].ssd_bytes / window / 1e9);
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--worker") {
    lohan::WorkerArgs args{.socket = argv[2], .job = argv[3]};
    args.layers = static_cast<uint32_t>(std::atoi(argv[4]));
    args.elements = std::strtoull(argv[5], nullptr, 10);
    args.think_ms = std::atoi(argv[6]);
    return lohan::Worker(args);
  }
  double window = 10;
  uint32_t layers = 8;
  uint64_t elements = 1 << 20;
  lohan::LightOptions light;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--window=", 0) == 0) {
      window = std::atof(arg.c_str() + 9);
    } else if (arg.rfind("--layers=", 0) == 0) {
      layers = static_cast<uint32_t>(std::atoi(arg.c_str() + 9));
    } else if (arg.rfind("--elements=", 0) == 0) {
      elements = std::strtoull(arg.c_str() + 11, nullptr, 10);
    } else if (arg == "--light-only") {
      light.only = true;
    } else if (arg.rfind("--greedy-elements=", 0) == 0) {
      light.greedy_elements = std::strtoull(arg.c_str() + 18, nullptr, 10);
    } else if (arg.rfind("--gate-unit=", 0) == 0) {
      light.gate_unit = arg.substr(12);
    } else if (arg.rfind("--light-think-ms=", 0) == 0) {
      light.think_ms = std::atoi(arg.c_str() + 17);
    } else {
      std::fprintf(stderr, "fair_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  return lohan::Run(window, layers, elements, light);
}
