// lohanctl: shows and steers a running lohand.
//   lohanctl status [--json]      daemon, config summary and your jobs
//   lohanctl status --watch [--interval S] [--count N] [--json]
//                                 refreshes like top (see watch.h)
//   lohanctl drain JOB_ID         ends a job's training after the iteration
//                                 in progress, then detaches it
//   lohanctl kill JOB_ID          ends it now (that iteration rolled back)
//   lohanctl jobs [--json]        the jobs you may see (all of them as root)
//   lohanctl jobs delete JOB_ID   deletes a detached job and frees its SSD
//                                 space
//   lohanctl jobs keep [--off] JOB_ID
//                                 pins a job (unpins it): lohand never
//                                 deletes it on its own ([jobs] keep_ended)
//   lohanctl metrics              the status as Prometheus text, as lohand
//                                 writes its [metrics] textfile: your jobs
//                                 (all of them as root)
// In status and jobs a distributed run's jobs (its ranks on this daemon) are
// one entry (run_groups.h); --json lists every job as the daemon reports it.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/control_client.h"
#include "client/ctl/plan_command.h"
#include "client/ctl/run_groups.h"
#include "client/ctl/watch.h"
#include "layout/byte_size.h"
#include "metrics/prometheus_text.h"
#include "plan/model_shape.h"
#include "wire/version.h"

namespace lohan {
namespace {

std::string Json(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    return "{}";
  }
  return json;
}

std::string StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_ATTACHED:
      return "attached";
    case v1::JOB_STATE_DETACHED:
      return "detached";
    default:
      return "unknown";
  }
}

std::string Duration(double seconds) {
  int64_t total = static_cast<int64_t>(seconds);
  const int64_t days = total / 86400;
  const int64_t hours = total % 86400 / 3600;
  const int64_t minutes = total % 3600 / 60;
  const int64_t secs = total % 60;
  if (days > 0) return absl::StrFormat("%dd %02dh %02dm", days, hours, minutes);
  if (hours > 0)
    return absl::StrFormat("%dh %02dm %02ds", hours, minutes, secs);
  if (minutes > 0) return absl::StrFormat("%dm %02ds", minutes, secs);
  return absl::StrFormat("%ds", secs);
}

// When lohand deletes the job on its own ([jobs] keep_ended): "kept" when
// pinned; "-" while a process is attached, or when lohand keeps ended jobs.
std::string AutoDelete(const v1::Job& job) {
  return job.kept() ? "kept" : LocalTime(job.delete_after_unix_seconds());
}

// Jobs on their own, one row each.
void PrintJobTable(const std::vector<v1::Job>& jobs) {
  // As wide as the longest name (up to 64 characters), not less than 20.
  int name_width = 20;
  for (const v1::Job& job : jobs) {
    name_width =
        std::max(name_width, static_cast<int>(job.spec().name().size()));
  }
  const std::string format = absl::StrCat(
      "%-10s %-", name_width, "s %-12s %-9s %-8s %-10s %-10s %-19s %s\n");
  std::printf(format.c_str(), "ID", "NAME", "OWNER", "STATE", "PID",
              "HOST POOL", "ON SSDS", "CREATED", "DELETED AFTER");
  for (const v1::Job& job : jobs) {
    std::printf(
        format.c_str(), job.id().c_str(), job.spec().name().c_str(),
        job.owner_name().c_str(), StateName(job.state()).c_str(),
        job.attached_pid() ? std::to_string(job.attached_pid()).c_str() : "-",
        FormatByteSize(job.spec().host_pool_bytes()).c_str(),
        FormatByteSize(job.ssd_bytes()).c_str(),
        LocalTime(job.created_unix_seconds()).c_str(), AutoDelete(job).c_str());
    if (!job.last_failure().empty()) {
      // Under its row: why the job stopped (a full SSD, say).
      std::printf("           last failure at %s: %s\n",
                  LocalTime(job.last_failure_unix_seconds()).c_str(),
                  job.last_failure().c_str());
    }
    if (job.arena_shrink_asks() + job.arena_grow_asks() + job.planes_closed() !=
        0) {
      // Under its row too: how often it gave way to other users' shares.
      std::printf(
          "           since lohand started: asked to shrink %llu times for "
          "other users' shares and to grow back %llu; data planes closed "
          "for them %llu\n",
          static_cast<unsigned long long>(job.arena_shrink_asks()),
          static_cast<unsigned long long>(job.arena_grow_asks()),
          static_cast<unsigned long long>(job.planes_closed()));
    }
  }
}

// Jobs on their own as PrintJobTable does, then each distributed run's jobs
// as one entry (see run_groups.h), with its ranks' iterations when given.
void PrintJobs(const std::vector<v1::Job>& jobs,
               const IterationsByJob* iterations) {
  if (jobs.empty()) {
    std::printf("no jobs\n");
    return;
  }
  std::vector<v1::Job> alone;
  std::vector<JobEntry> runs;
  for (JobEntry& entry : GroupRuns(jobs)) {
    if (entry.is_run()) {
      runs.push_back(std::move(entry));
    } else {
      alone.push_back(std::move(entry.jobs.front()));
    }
  }
  if (!alone.empty()) PrintJobTable(alone);
  if (runs.empty()) return;
  if (!alone.empty()) std::printf("\n");
  std::printf(
      "distributed runs (one job per rank; ranks not listed are on other "
      "daemons)\n%s",
      RunTable(runs, iterations).c_str());
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lohanctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<std::unique_ptr<ControlClient>> Connect(
    const std::string& socket) {
  return ControlClient::Connect(
      {.socket_path = socket,
       .client_name = absl::StrCat("lohanctl ", kLohanVersion)});
}

int Status(const std::string& socket, bool json) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto status = (*client)->GetStatus();
  if (!status.ok()) return Fail(status.status());
  if (json) {
    std::printf("%s\n", Json(*status).c_str());
    return 0;
  }
  const v1::ConfigSummary& config = status->config();
  std::printf("lohand %s (protocol %u.%u), pid %d, up %s (since %s)\n",
              status->daemon_version().c_str(),
              status->daemon_protocol().major(),
              status->daemon_protocol().minor(), status->daemon_pid(),
              Duration(status->uptime_seconds()).c_str(),
              LocalTime(status->started_unix_seconds()).c_str());
  std::printf("  socket       %s\n", config.socket_path().c_str());
  std::printf("  state dir    %s\n", config.state_dir().c_str());
  const v1::PoolStatus& pool = status->pool();
  // Root sees every job's arena: say which are the caller's own.
  std::set<std::string> own_jobs;
  for (const v1::Job& job : status->jobs()) {
    if (job.owner_uid() == getuid()) own_jobs.insert(job.id());
  }
  int own_arenas = 0;
  for (const v1::ArenaStatus& arena : pool.arenas()) {
    own_arenas += own_jobs.count(arena.job_id()) != 0 ? 1 : 0;
  }
  const std::string arenas =
      own_arenas == pool.arenas_size()
          ? absl::StrFormat("%d arena%s of yours", own_arenas,
                            own_arenas == 1 ? "" : "s")
          : absl::StrFormat("%d arena%s, %d of yours", pool.arenas_size(),
                            pool.arenas_size() == 1 ? "" : "s", own_arenas);
  std::printf("  host pool    %s, %s in use (%s)\n",
              FormatByteSize(pool.capacity_bytes()).c_str(),
              FormatByteSize(pool.used_bytes()).c_str(), arenas.c_str());
  if (pool.state_tier_bytes() > 0 && pool.commit_interval() == 0) {
    const std::string stretched =
        pool.durable_write_share() > 0.0
            ? absl::StrFormat(
                  ", less often when durable writes would take over %.0f%% "
                  "of the time",
                  100.0 * pool.durable_write_share())
            : "";
    std::printf(
        "  state tier   %s for jobs' fp32 masters and moments, durable "
        "every %s by default%s (durable_every)\n",
        FormatByteSize(pool.state_tier_bytes()).c_str(),
        absl::FormatDuration(absl::Seconds(pool.durable_every_seconds()))
            .c_str(),
        stretched.c_str());
  } else if (pool.state_tier_bytes() > 0) {
    std::printf(
        "  state tier   %s for jobs' fp32 masters and moments, durable "
        "every %u iteration%s by default (commit interval)\n",
        FormatByteSize(pool.state_tier_bytes()).c_str(), pool.commit_interval(),
        pool.commit_interval() == 1 ? "" : "s");
  } else {
    std::printf("  state tier   off: every job's states on the SSDs\n");
  }
  const v1::StoreStatus& store = status->store();
  std::printf(
      "  SSD array    %d SSD%s, %s stripes, %u B blocks, queue depth "
      "%u%s, %llu tensors\n",
      store.ssds_size(), store.ssds_size() == 1 ? "" : "s",
      FormatByteSize(store.stripe_unit_bytes()).c_str(), store.block_size(),
      store.queue_depth(), store.buffered_io() ? ", BUFFERED I/O" : "",
      static_cast<unsigned long long>(store.tensors()));
  for (const v1::SsdStatus& ssd : store.ssds()) {
    const double percent = ssd.capacity_bytes() == 0
                               ? 0.0
                               : 100.0 * static_cast<double>(ssd.used_bytes()) /
                                     static_cast<double>(ssd.capacity_bytes());
    std::printf("    %-24s %s used of %s (%.0f%%)\n", ssd.path().c_str(),
                FormatByteSize(ssd.used_bytes()).c_str(),
                FormatByteSize(ssd.capacity_bytes()).c_str(), percent);
  }
  std::printf("  optimizer    %s\n",
              OptimizerLine(status->optimizer()).c_str());
  if (status->has_profile()) {
    const v1::HostProfile& p = status->profile();
    std::printf(
        "  measured     SSDs %.2f GB/s read, %.2f GB/s write (%d together); "
        "memcpy %.1f GB/s; optimizer %.0f M parameters/s per thread\n",
        p.array_read_bytes_per_second() / 1e9,
        p.array_write_bytes_per_second() / 1e9, p.ssds_size(),
        p.memcpy_bytes_per_second() / 1e9,
        p.optimizer_parameters_per_second_per_thread() / 1e6);
  } else {
    std::printf(
        "  measured     not yet (lohand measures its machine at "
        "start)\n");
  }
  std::printf("  log level    %s\n", config.log_level().c_str());
  std::printf("  jobs         %u on the daemon, %u attached (yours below)\n",
              status->total_jobs(), status->attached_jobs());
  std::printf("  your quota   %s\n\n", QuotaLine(status->quota()).c_str());
  IterationsByJob iterations;
  for (const v1::SessionStatus& session : status->sessions()) {
    iterations[session.job_id()] = session.iteration();
  }
  PrintJobs({status->jobs().begin(), status->jobs().end()}, &iterations);
  if (status->jobs_not_listed() > 0) {
    std::printf("... and %u more jobs (lohanctl jobs lists them all)\n",
                status->jobs_not_listed());
  }
  if (status->sessions_size() > 0) {
    std::printf("\ntraining (open data planes)\n");
    const char* format =
        "%-10s %-8s %-10s %-7s %-11s %-9s %-10s %-10s %-10s %-16s %s\n";
    std::printf(format, "JOB", "PID", "ARENA", "LAYERS", "BUFFERS", "PARAMS",
                "STEP", "ITER s", "NOT HIDDEN", "ACTS ON SSD",
                "NORM / CLIPPED / SKIPPED / FAILED");
    for (const v1::SessionStatus& session : status->sessions()) {
      // "resident", or how many shared gradient/weight buffers stream.
      const bool resident = session.grad_slots() == session.layers() &&
                            session.weight_slots() == session.layers();
      const std::string buffers =
          resident ? "resident"
                   : absl::StrFormat("%ug/%uw", session.grad_slots(),
                                     session.weight_slots());
      std::printf(
          format, session.job_id().c_str(),
          std::to_string(session.pid()).c_str(),
          FormatByteSize(session.arena_bytes()).c_str(),
          std::to_string(session.layers()).c_str(), buffers.c_str(),
          absl::StrFormat("%.3gM", session.parameters() / 1e6).c_str(),
          std::to_string(session.iteration()).c_str(),
          absl::StrFormat("%.3f", session.last_iteration_seconds()).c_str(),
          absl::StrFormat("%.3f", session.last_end_wait_seconds()).c_str(),
          absl::StrFormat("%d, %s", session.swapped_activations(),
                          FormatByteSize(session.swapped_activation_bytes()))
              .c_str(),
          absl::StrFormat("%.4g / %d / %d / %d", session.last_global_norm(),
                          session.clipped_iterations(),
                          session.skipped_iterations(),
                          session.failed_requests())
              .c_str());
      if (const std::string arena = ArenaLine(session); !arena.empty()) {
        std::printf("           %s\n", arena.c_str());
      }
      if (const std::string plan = PlanLine(session); !plan.empty()) {
        std::printf("           %s\n", plan.c_str());
      }
      if (const std::string states = StatesLine(session); !states.empty()) {
        std::printf("           %s\n", states.c_str());
      }
    }
  }
  return 0;
}

// The daemon's status as the caller may see it (GetStatus names only the
// caller's jobs unless it is root), rendered as lohand's textfile is.
int Metrics(const std::string& socket) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto status = (*client)->GetStatus();
  if (!status.ok()) return Fail(status.status());
  std::fputs(RenderPrometheusText(*status).c_str(), stdout);
  return 0;
}

int Jobs(const std::string& socket, bool json) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto jobs = (*client)->ListJobs();
  if (!jobs.ok()) return Fail(jobs.status());
  if (json) {
    v1::ListJobsResponse response;
    for (const v1::Job& job : *jobs) *response.add_jobs() = job;
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  PrintJobs(*jobs, nullptr);
  return 0;
}

int DetachJob(const std::string& socket, const std::string& job_id) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto job = (*client)->DetachJob(job_id);
  if (!job.ok()) return Fail(job.status());
  std::printf("detached %s\n", job_id.c_str());
  return 0;
}

// Drain or kill; a drain waits until the job is detached, saying so.
int StopJob(const std::string& socket, const std::string& job_id, bool drain) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto outcome = (*client)->StopJob(job_id, drain);
  if (!outcome.ok()) return Fail(outcome.status());
  std::printf("%s: %s\n", job_id.c_str(), outcome->c_str());
  std::fflush(stdout);
  while (true) {
    auto jobs = (*client)->ListJobs();
    if (!jobs.ok()) return Fail(jobs.status());
    bool attached = false;
    for (const v1::Job& job : *jobs) {
      attached = attached ||
                 (job.id() == job_id && job.state() == v1::JOB_STATE_ATTACHED);
    }
    if (!attached) break;
    usleep(100 * 1000);
  }
  std::printf("%s: detached\n", job_id.c_str());
  return 0;
}

int JobPlan(const std::string& socket, const std::string& job_id) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto plan = (*client)->GetJobPlan(job_id);
  if (!plan.ok()) return Fail(plan.status());
  std::printf("%s\n", Json(*plan).c_str());
  return 0;
}

int KeepJob(const std::string& socket, const std::string& job_id, bool keep) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto job = (*client)->KeepJob(job_id, keep);
  if (!job.ok()) return Fail(job.status());
  if (keep) {
    std::printf("kept %s: lohand will not delete it on its own\n",
                job_id.c_str());
  } else if (job->delete_after_unix_seconds() > 0) {
    std::printf("%s no longer kept: lohand deletes it after %s\n",
                job_id.c_str(),
                LocalTime(job->delete_after_unix_seconds()).c_str());
  } else {
    std::printf("%s no longer kept\n", job_id.c_str());
  }
  return 0;
}

int DeleteJob(const std::string& socket, const std::string& job_id) {
  auto client = Connect(socket);
  if (!client.ok()) return Fail(client.status());
  if (absl::Status status = (*client)->DeleteJob(job_id); !status.ok()) {
    return Fail(status);
  }
  std::printf("deleted %s\n", job_id.c_str());
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  CLI::App app{"lohanctl: shows and steers a running lohand.", "lohanctl"};
  app.set_version_flag("--version", lohan::kLohanVersion);
  std::string socket = lohan::DefaultSocketPath();
  app.add_option("-s,--socket", socket,
                 "lohand's socket (default: $LOHAN_SOCKET, else "
                 "/run/lohan/lohand.sock)");

  bool status_json = false;
  bool watch = false;
  lohan::WatchOptions watch_options;
  watch_options.clear = isatty(STDOUT_FILENO) != 0;
  CLI::App* status = app.add_subcommand(
      "status", "daemon version, uptime, config summary and your jobs");
  status->add_flag("--json", status_json,
                   "print JSON (with --watch: one object per line)");
  status->add_flag("-w,--watch", watch,
                   "refresh like top: per job SSD rates, optimizer share, "
                   "queues; totals; your quota");
  status
      ->add_option("--interval", watch_options.interval_seconds,
                   "--watch: seconds between refreshes (default 2)")
      ->check(CLI::PositiveNumber);
  status
      ->add_option("--count", watch_options.count,
                   "--watch: refreshes, then exit (default: until ^C)")
      ->check(CLI::NonNegativeNumber);
  std::string drain_id, kill_id;
  CLI::App* drain = app.add_subcommand(
      "drain",
      "end a job's training after the iteration in progress, then detach "
      "it (yours, or any as root); waits until it is detached");
  drain->add_option("job_id", drain_id, "the job's id, e.g. j-000001")
      ->required();
  CLI::App* kill = app.add_subcommand(
      "kill",
      "end a job's training now: the iteration in progress is rolled back, "
      "the committed ones kept; then detach it");
  kill->add_option("job_id", kill_id, "the job's id, e.g. j-000001")
      ->required();

  bool jobs_json = false;
  CLI::App* jobs =
      app.add_subcommand("jobs", "the jobs you may see (all of them as root)");
  jobs->add_flag("--json", jobs_json, "print JSON");
  std::string delete_id;
  CLI::App* jobs_delete =
      jobs->add_subcommand("delete", "delete a detached job");
  jobs_delete->add_option("job_id", delete_id, "the job's id, e.g. j-000001")
      ->required();
  std::string keep_id;
  bool keep_off = false;
  CLI::App* jobs_keep = jobs->add_subcommand(
      "keep",
      "pin a job: lohand never deletes it on its own (it deletes jobs no "
      "process has been attached to for [jobs] keep_ended); yours, or any "
      "as root");
  jobs_keep->add_flag("--off", keep_off,
                      "unpin it: lohand deletes it once it has ended for "
                      "keep_ended");
  jobs_keep->add_option("job_id", keep_id, "the job's id, e.g. j-000001")
      ->required();
  std::string plan_id;
  CLI::App* jobs_plan = jobs->add_subcommand(
      "plan",
      "a job's whole activation plan, as JSON (status shows its summary); "
      "yours, or any as root");
  jobs_plan->add_option("job_id", plan_id, "the job's id, e.g. j-000001")
      ->required();
  std::string detach_id;
  CLI::App* jobs_detach = jobs->add_subcommand(
      "detach",
      "unbind a job from the process attached to it (a process that hangs "
      "on to a job it no longer trains); yours, or any as root");
  jobs_detach->add_option("job_id", detach_id, "the job's id, e.g. j-000001")
      ->required();

  CLI::App* metrics = app.add_subcommand(
      "metrics",
      "the daemon's status as Prometheus text (what lohand writes to its "
      "[metrics] textfile for node_exporter): your jobs, all of them as "
      "root");

  lohan::PlanOptions plan_options;
  std::vector<uint64_t> batches;
  CLI::App* plan = app.add_subcommand(
      "plan",
      "what fits on a machine, how fast, and why: the activation plan "
      "(keep, host, SSD or recompute per saved tensor), the predicted "
      "iteration time by resource, the largest batch and model (needs no "
      "daemon)");
  plan->add_option("--model", plan_options.model,
                   "a preset (" + absl::StrJoin(lohan::PresetNames(), ", ") +
                       ") or a Hugging Face config.json")
      ->required();
  plan->add_option("--batch", batches, "batch sizes, e.g. 8,16,32,64")
      ->required()
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  plan->add_option("--seq", plan_options.seq, "sequence length (1024)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  plan->add_option("--device-memory", plan_options.device_memory,
                   "the GPU's memory, e.g. 24GiB");
  plan->add_option("--device-tflops", plan_options.device_tflops,
                   "its sustained 16-bit TFLOPS");
  plan->add_option("--h2d-gbps", plan_options.h2d_gbps,
                   "host-to-device GB/s (PCIe 4.0 x16: about 25)");
  plan->add_option("--d2h-gbps", plan_options.d2h_gbps, "device-to-host GB/s");
  plan->add_option("--host-memory", plan_options.host_memory,
                   "host memory lohand may pin for the job, e.g. 256GiB");
  plan->add_option(
      "--state-tier", plan_options.state_tier,
      "host memory for the job's optimizer states: \"split\" (the default "
      "for a described machine: the plan divides --host-memory between "
      "lohand's pool and its state tier), a size beside --host-memory, or "
      "0 (none); --this-machine: lohand's [pool] state_tier (or your "
      "quota)");
  int64_t commit_interval = 0;
  plan->add_option("--commit-interval", commit_interval,
                   "iterations between durable commits of the states in the "
                   "tier (default 1; --this-machine: lohand's)");
  plan->add_option("--ssds", plan_options.ssds, "NVMe SSDs in the array");
  plan->add_option("--ssd-read-gbps", plan_options.ssd_read_gbps,
                   "read GB/s of each SSD");
  plan->add_option("--ssd-write-gbps", plan_options.ssd_write_gbps,
                   "write GB/s of each SSD");
  plan->add_option("--ssd-capacity", plan_options.ssd_capacity,
                   "all SSDs' space lohand may use (default: no limit)");
  plan->add_option("--optimizer-gparams", plan_options.optimizer_gparams,
                   "the CPU optimizer's billions of parameters per second "
                   "(default: hidden behind backward)");
  plan->add_flag("--eager-attention", plan_options.eager_attention,
                 "attention that saves its scores (transformers' \"eager\"); "
                 "default: a fused kernel (\"sdpa\")");
  plan->add_option("--loss-chunk-tokens", plan_options.loss_chunk_tokens,
                   "the loss a chunk of this many tokens at a time, as the "
                   "plugin computes it for Hugging Face causal LMs (default: "
                   "256 MiB of fp32 logits a chunk)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  plan->add_option("--recompute-unit", plan_options.recompute_unit,
                   "how a recomputed block's backward runs: auto (the "
                   "default: the block when its working set fits the "
                   "device, else a sublayer), block, or sublayer (one "
                   "attention or MLP at a time: lohan.init("
                   "recompute_unit=\"sublayer\"))");
  plan->add_option("--param-unit", plan_options.param_unit,
                   "the unit a block's weights stream at: auto (the "
                   "default: the block when the working set fits the device "
                   "with it, else a sublayer), block, or sublayer (each "
                   "attention's or MLP's weights only while it runs: "
                   "lohan.init(param_unit=\"sublayer\"); needs a sublayer-"
                   "at-a-time backward)");
  plan->add_flag("--full-logits", plan_options.full_logits,
                 "the loss over the full logits (the model's own loss: "
                 "lohan.init(chunked_loss=False), or a model it cannot "
                 "chunk)");
  plan->add_flag("--this-machine", plan_options.this_machine,
                 "take host memory (lohand's pool, or your quota), the SSDs "
                 "(as lohand measured them) and the optimizer from the "
                 "running lohand; describe the device with the flags");
  plan->add_flag("--device-is-host", plan_options.device_is_host,
                 "training runs on the CPU itself (no GPU): backward's "
                 "compute and the CPU optimizer share the cores");
  plan->add_flag("--per-block", plan_options.per_block,
                 "decide whole blocks (recompute, swap or keep each), as "
                 "the plugin applies plans today; default: each saved "
                 "tensor");
  plan->add_flag("--json", plan_options.json, "print JSON");
  plan->add_flag("--tensors", plan_options.tensors,
                 "also print each block's decisions");
  plan->add_option("--plot", plan_options.plot_path,
                   "write an SVG of predicted iteration time against "
                   "offloaded activations, the chosen points marked");

  CLI11_PARSE(app, argc, argv);
  if (plan->parsed()) {
    plan_options.batches = batches;
    plan_options.socket = socket;
    if (plan->count("--commit-interval") > 0) {
      plan_options.commit_interval = commit_interval;
    }
    return lohan::RunPlan(plan_options);
  }
  if (metrics->parsed()) return lohan::Metrics(socket);
  if (!status->parsed() && !jobs->parsed() && !drain->parsed() &&
      !kill->parsed()) {
    std::fprintf(stderr,
                 "lohanctl: name a command: status, jobs, drain, kill, plan, "
                 "metrics (see --help)\n");
    return 2;
  }
  if (drain->parsed()) return lohan::StopJob(socket, drain_id, true);
  if (kill->parsed()) return lohan::StopJob(socket, kill_id, false);
  if (status->parsed() && watch) {
    auto client = lohan::Connect(socket);
    if (!client.ok()) return lohan::Fail(client.status());
    watch_options.json = status_json;
    return lohan::Watch(**client, watch_options);
  }
  if (status->parsed()) return lohan::Status(socket, status_json);
  if (jobs_delete->parsed()) return lohan::DeleteJob(socket, delete_id);
  if (jobs_keep->parsed()) return lohan::KeepJob(socket, keep_id, !keep_off);
  if (jobs_plan->parsed()) return lohan::JobPlan(socket, plan_id);
  if (jobs_detach->parsed()) return lohan::DetachJob(socket, detach_id);
  return lohan::Jobs(socket, jobs_json);
}
