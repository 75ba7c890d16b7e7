// lohand: the lohan daemon. Reads its config (built-in defaults, then the
// config file, then flags), checks the machine, serves the control plane on a
// unix socket until SIGTERM or SIGINT, then shuts down cleanly.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/common/caller.h"
#include "daemon/common/memory_release.h"
#include "daemon/config/config.h"
#include "daemon/config/host_check.h"
#include "daemon/config/trusted_path.h"
#include "daemon/ipc/unix_listener.h"
#include "daemon/jobs/job_registry.h"
#include "daemon/main/service_notify.h"
#include "daemon/main/watchdog.h"
#include "daemon/metrics/textfile_writer.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/isa.h"
#include "daemon/optim/tuning.h"
#include "daemon/optim/worker_pool.h"
#include "daemon/pool/host_pool.h"
#include "daemon/profile/host_profile.h"
#include "daemon/profile/optimizer_kernel.h"
#include "daemon/quota/daemon_memory.h"
#include "daemon/quota/space_ledger.h"
#include "daemon/quota/user_limits.h"
#include "daemon/rpc/control_probe.h"
#include "daemon/rpc/control_server.h"
#include "daemon/rpc/ended_job_sweeper.h"
#include "daemon/sched/fair_gates.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/session/job_settings.h"
#include "daemon/session/session_manager.h"
#include "daemon/store/tensor_store.h"
#include "layout/byte_size.h"
#include "metrics/prometheus_text.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"
#include "wire/version.h"

namespace lohan {
namespace {

constexpr char kSystemConfigPath[] = "/etc/lohan/lohand.toml";

struct CommandLine {
  std::optional<std::string> config_path;
  ConfigOverrides overrides;
  bool check_only = false;
  bool salvage = false;
  bool reprofile = false;
};

std::string SocketDirectory(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : socket_path.substr(0, slash);
}

absl::Status MakeDirectories(const std::string& path, mode_t mode) {
  struct stat info {};
  if (stat(path.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is not a directory"));
    }
    return absl::OkStatus();
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status status = MakeDirectories(path.substr(0, slash), 0755);
        !status.ok()) {
      return status;
    }
  }
  if (mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonConfig> ResolveConfig(const CommandLine& command_line) {
  DaemonConfig config = DefaultConfig();
  std::string origin = "built-in defaults";
  if (command_line.config_path) {
    absl::StatusOr<DaemonConfig> loaded =
        LoadConfigFile(*command_line.config_path);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
    origin = *command_line.config_path;
  } else if (access(kSystemConfigPath, F_OK) == 0) {
    absl::StatusOr<DaemonConfig> loaded = LoadConfigFile(kSystemConfigPath);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
    origin = kSystemConfigPath;
  }
  // Name what set a bad value: the file (or the defaults) if it is bad on
  // its own, else the command line's options, which override it.
  const bool base_valid = ValidateConfig(config).ok();
  if (absl::Status status = ApplyOverrides(command_line.overrides, config);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateConfig(config); !status.ok()) {
    const std::string culprit =
        base_valid ? "the command line's options" : origin;
    return absl::Status(status.code(),
                        absl::StrCat(culprit, ": ", status.message()));
  }
  return config;
}

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

StoreOptions StoreOptionsOf(const DaemonConfig& config) {
  StoreOptions options;
  options.ssd_paths = config.ssd_paths;
  options.state_dir = absl::StrCat(config.state_dir, "/store");
  options.stripe_unit = config.stripe_unit_bytes;
  options.block_size = config.block_size;
  options.queue_depth = config.queue_depth;
  options.device_capacity_bytes = config.ssd_capacity_bytes;
  options.allow_buffered_io = config.allow_buffered_io;
  options.gate_unit_bytes = GateUnitBytes(config);
  options.warn = [](const std::string& message) {
    spdlog::warn("store: {}", message);
  };
  return options;
}

absl::StatusOr<std::unique_ptr<TensorStore>> OpenStore(
    const DaemonConfig& config) {
  absl::StatusOr<std::unique_ptr<TensorStore>> store =
      TensorStore::Open(StoreOptionsOf(config));
  if (!store.ok()) {
    return Prefixed(store.status(), "opening the SSD store (keys store.*): ");
  }
  return store;
}

// The optimizer's threads and its kernel, chosen once at start (timed on
// those threads before anything else uses them, unless configured).
struct Optimizer {
  std::unique_ptr<WorkerPool> pool;
  std::optional<AdamUpdater> updater;
  v1::OptimizerStatus status;  // what GetStatus reports of it
};

absl::StatusOr<Optimizer> StartOptimizer(const DaemonConfig& config,
                                         bool recalibrate) {
  std::optional<Isa> isa;
  if (config.optimizer_isa != "auto") {
    absl::StatusOr<Isa> parsed = ParseIsa(config.optimizer_isa);
    if (!parsed.ok()) return Prefixed(parsed.status(), "key 'optimizer.isa': ");
    isa = *parsed;
  }
  absl::StatusOr<std::optional<Isa>> forced = ForcedIsa(isa);
  if (!forced.ok()) return Prefixed(forced.status(), "key 'optimizer.isa': ");
  Optimizer optimizer;
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Create(
      {.num_threads = static_cast<int>(EffectiveOptimizerThreads(
           config, static_cast<uint32_t>(sysconf(_SC_NPROCESSORS_ONLN))))});
  if (!pool.ok()) return Prefixed(pool.status(), "key 'optimizer.threads': ");
  optimizer.pool = *std::move(pool);
  absl::StatusOr<KernelChoice> choice = ChooseOptimizerKernel(
      optimizer.pool.get(), {.state_dir = config.state_dir,
                             .tuning = config.optimizer_tuning,
                             .forced_isa = *forced,
                             .recalibrate = recalibrate});
  if (!choice.ok()) {
    return Prefixed(choice.status(), "key 'optimizer.tuning': ");
  }
  absl::StatusOr<AdamUpdater> updater =
      AdamUpdater::Create(optimizer.pool.get(), choice->isa);
  if (!updater.ok()) return Prefixed(updater.status(), "key 'optimizer.isa': ");
  optimizer.updater = updater->WithTuning(choice->tuning);
  v1::OptimizerStatus& status = optimizer.status;
  status.set_threads(static_cast<uint32_t>(optimizer.pool->num_threads()));
  status.set_kernel(optimizer.updater->kernel_name());
  status.set_tuning(TuningName(choice->tuning));
  status.set_source(choice->source);
  if (choice->calibration) *status.mutable_calibration() = *choice->calibration;
  spdlog::info(
      "optimizer kernel {}, tuning {} ({}{})", status.kernel(), status.tuning(),
      status.source(),
      choice->calibration
          ? absl::StrFormat(": %.2fx the default",
                            choice->calibration->speedup_over_default())
          : "");
  return optimizer;
}

// [optimizer] read_ahead as resolved on this machine.
std::string ReadAheadText(const DaemonConfig& config,
                          const HostMemory& memory) {
  const std::string bytes = FormatByteSize(ResolveReadAhead(config, memory));
  if (config.optimizer_read_ahead_bytes.has_value()) return bytes;
  return absl::StrCat(bytes, " (auto: each job holds what its backward fills)");
}

void LogConfig(const DaemonConfig& config) {
  spdlog::info(
      "socket {}, state dir {}, SSD paths [{}], host pool {}, "
      "optimizer threads {}, read-ahead {} shared by the jobs",
      config.socket_path, config.state_dir,
      absl::StrJoin(config.ssd_paths, ", "),
      FormatByteSize(config.host_pool_bytes),
      EffectiveOptimizerThreads(
          config, static_cast<uint32_t>(sysconf(_SC_NPROCESSORS_ONLN))),
      ReadAheadText(config, ReadHostMemory()));
}

// A daemon_memory left 0 by the config, sized to this machine.
UserLimits WithDaemonMemory(UserLimits limits) {
  if (limits.daemon_memory_bytes == 0) {
    limits.daemon_memory_bytes = DefaultDaemonMemoryLimit(
        static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
        static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  }
  return limits;
}

// [quotas] with every [quotas.user.NAME] resolved to its uid now: a name
// that is no user stops the daemon rather than silently limiting nobody.
absl::StatusOr<QuotaTable> ResolveQuotas(const DaemonConfig& config) {
  std::map<uid_t, UserLimits> by_uid;
  for (const auto& [name, overrides] : config.quota_users) {
    passwd entry{};
    passwd* found = nullptr;
    char buffer[4096];
    if (getpwnam_r(name.c_str(), &entry, buffer, sizeof(buffer), &found) != 0 ||
        found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("section [quotas.user.", name, "]: no user named '",
                       name, "' on this machine"));
    }
    by_uid[found->pw_uid] =
        WithDaemonMemory(overrides.Over(config.quota_defaults));
  }
  return QuotaTable(WithDaemonMemory(config.quota_defaults), std::move(by_uid));
}

// Tells systemd `state` (Type=notify; nothing without $NOTIFY_SOCKET). A
// failure never stops the daemon and is logged once.
void Notify(const ServiceNotifier& systemd, absl::string_view state) {
  if (absl::Status status = systemd.Notify(state); !status.ok()) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      spdlog::warn("systemd: {} (later failures not logged)",
                   std::string(status.message()));
    }
  }
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lohand: %s\n", std::string(status.message()).c_str());
  return 1;
}

int Run(const CommandLine& command_line) {
  absl::StatusOr<DaemonConfig> config = ResolveConfig(command_line);
  if (!config.ok()) return Fail(config.status());

  auto logger = spdlog::stderr_color_mt("lohand");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(config->log_level));
  spdlog::set_default_logger(logger);

  if (command_line.salvage) {
    // The operator's answer to a damaged catalog, which a normal start
    // refuses: rebuilt from what is intact, with a report. It writes in
    // the state directory: only one that is lohand's own.
    if (absl::Status status = CheckTrustedPaths(*config, geteuid());
        !status.ok()) {
      return Fail(status);
    }
    absl::StatusOr<std::string> report =
        TensorStore::Salvage(StoreOptionsOf(*config));
    if (!report.ok()) {
      return Fail(Prefixed(report.status(), "--salvage: "));
    }
    std::printf("lohand: salvaged the store catalog in %s\n%s\n",
                config->state_dir.c_str(), report->c_str());
    return 0;
  }
  if (absl::Status status = CheckHost(*config); !status.ok()) {
    return Fail(status);
  }
  // Declared before the store: the store gives space back to the ledger
  // until it is destroyed.
  absl::StatusOr<QuotaTable> quotas = ResolveQuotas(*config);
  if (!quotas.ok()) return Fail(quotas.status());
  SpaceLedger ledger(config->ssd_capacity_bytes * config->ssd_paths.size(),
                     &*quotas);
  // Jobs share the SSD array and the optimizer by their owners' weights
  // (FairSsdGate says why one read and one write at a time). A slot is held
  // briefly for the flow whose turn it still is (FairQueue): 300 us kept
  // the array's throughput in bench/session/fair_bench (1 ms cost a
  // quarter of it with weights 2:1) while most of the weights' effect
  // stayed; a pipeline that has more asks again within microseconds.
  constexpr absl::Duration kAnticipation = absl::Microseconds(300);
  // A job that missed turns gets them back while it is at most this many of
  // its requests behind (FairQueue): a pipeline's depth, the transfers a
  // job has on their way at once (PipelineOptions::buffers), in gate parts
  // (store.gate_unit; a 1 M-parameter chunk's 12 MB state is two). In
  // fair_bench, weights 2:1 gave 1.42, 1.50, 1.75 and 2.07:1 with 0, 1, 2
  // and 4 whole transfers (16: the same as 4); with parts, 1.65:1 at 4 and
  // 1.80:1 at 8 (SSD shares within 10% of fair in every scenario).
  constexpr int kCatchUp = 8;
  FairQueue ssd_reads(1, kAnticipation, kCatchUp);
  FairQueue ssd_writes(1, kAnticipation, kCatchUp);
  // One Step uses every optimizer thread.
  FairQueue optimizer_queue(1, kAnticipation, kCatchUp);
  const HostMemory host_memory = ReadHostMemory();
  // The read-ahead memory ([optimizer] read_ahead) is the daemon's, shared
  // by all jobs by their owners' weights: a lone job may fill it.
  MemoryShares read_ahead_shares(ResolveReadAhead(*config, host_memory));
  // The state tier ([pool] state_tier) likewise: copies of jobs' committed
  // optimizer states, taken only while the machine keeps its floor free.
  absl::StatusOr<uint64_t> state_tier_bytes =
      ResolveStateTier(*config, host_memory);
  if (!state_tier_bytes.ok()) return Fail(state_tier_bytes.status());
  MemoryShares state_tier_shares(*state_tier_bytes);
  const StateTierMemory state_tier{
      .shares = *state_tier_bytes > 0 ? &state_tier_shares : nullptr,
      .keep_available_bytes = StateTierFloorBytes(host_memory),
      .update_in_place = config->state_tier_updates == "in_place"};
  spdlog::info("state tier {} shared by the jobs (keeps {} of memory free)",
               FormatByteSize(*state_tier_bytes),
               FormatByteSize(state_tier.keep_available_bytes));
  FairSsdGate ssd_gate(
      &ssd_reads, &ssd_writes, [&ledger, &quotas](absl::string_view job) {
        // A user's jobs share the user's weight.
        std::optional<uid_t> owner = ledger.OwnerOf(job);
        return owner.has_value()
                   ? FairSsdGate::Share{static_cast<double>(
                                            quotas->For(*owner).weight),
                                        absl::StrCat("uid ", *owner)}
                   : FairSsdGate::Share{};
      });
  if (command_line.check_only) {
    // What the real start would refuse about the state it finds: another
    // daemon on it, or a store made for other SSDs or a larger capacity.
    const std::string socket_lock = absl::StrCat(config->socket_path, ".lock");
    UniqueFd lock(open(socket_lock.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (lock.valid() && flock(lock.get(), LOCK_EX | LOCK_NB) != 0 &&
        errno == EWOULDBLOCK) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("key 'daemon.socket': ", config->socket_path,
                       " is held by a running lohand")));
    }
    if (absl::Status status = TensorStore::Check(StoreOptionsOf(*config));
        !status.ok()) {
      return Fail(Prefixed(status, "the SSD store (keys store.*): "));
    }
    LogConfig(*config);
    std::printf("lohand: configuration OK\n");
    return 0;
  }
  // systemd (Type=notify) hears what the start is doing (STATUS), READY=1
  // once lohand serves and STOPPING=1 when it stops.
  ServiceNotifier systemd;
  if (absl::StatusOr<ServiceNotifier> notifier =
          ServiceNotifier::FromEnvironment();
      notifier.ok()) {
    systemd = *std::move(notifier);
  } else {
    spdlog::error("not notifying systemd: {}",
                  std::string(notifier.status().message()));
  }
  if (absl::Status status = MakeDirectories(config->state_dir, 0700);
      !status.ok()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("key 'daemon.state_dir': ", status.message())));
  }
  if (absl::Status status =
          MakeDirectories(SocketDirectory(config->socket_path), 0755);
      !status.ok()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("key 'daemon.socket': ", status.message())));
  }
  // Again now that every directory exists: each must be lohand's own.
  if (absl::Status status = CheckTrustedPaths(*config, geteuid());
      !status.ok()) {
    return Fail(status);
  }

  // Signals go to sigwait below, never to a handler on some other thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(config->socket_path);
  if (!listener.ok()) return Fail(listener.status());
  absl::StatusOr<std::unique_ptr<UnixListener>> data_listener =
      UnixListener::Bind(DataSocketPath(*config));
  if (!data_listener.ok()) return Fail(data_listener.status());

  Notify(systemd,
         StatusLine(absl::StrCat("opening the jobs and the SSD store (SSDs: ",
                                 config->ssd_paths.size(), ")")));
  absl::StatusOr<std::unique_ptr<JobRegistry>> jobs =
      JobRegistry::Open({.state_dir = config->state_dir,
                         .host_pool_capacity_bytes = config->host_pool_bytes,
                         .ssd_capacity_bytes = ledger.capacity_bytes(),
                         .quotas = &*quotas,
                         .keep_ended = config->keep_ended});
  if (!jobs.ok()) return Fail(jobs.status());

  absl::StatusOr<std::unique_ptr<TensorStore>> store = OpenStore(*config);
  if (!store.ok()) return Fail(store.status());
  // Streamed gradients of iterations a crash cut short: never committed,
  // never needed again; free their space now rather than at the job's next
  // registration.
  std::vector<std::string> known;
  for (const v1::Job& job : (*jobs)->List(Caller{.uid = 0})) {
    known.push_back(job.id());
    if (absl::Status dropped =
            JobPipeline::DropScratchTensors(store->get(), job.id());
        !dropped.ok()) {
      spdlog::warn("job {}: dropping scratch tensors: {}", job.id(),
                   std::string(dropped.message()));
    }
  }
  // Tensors of jobs deleted while their space could not be freed (a crash
  // in between, an I/O error).
  for (const std::string& job : (*store)->DeleteJobsExcept(known)) {
    spdlog::info("freed the SSD space of deleted job {}", job);
  }
  for (const v1::Job& job : (*jobs)->List(Caller{.uid = 0})) {
    ledger.Track(job.id(), job.owner_uid(), job.spec().ssd_bytes());
  }
  (*store)->SetSpaceBudget(&ledger);
  (*store)->SetIoGate(&ssd_gate);
  // A refusal for SSD space names its owner's ended jobs that hold some
  // (cleared at shutdown, before the registry goes).
  ledger.SetEndedJobs([registry = jobs->get()](uid_t owner) {
    std::vector<SpaceLedger::EndedJob> ended;
    for (const v1::Job& job : registry->EndedOf(owner)) {
      ended.push_back({.id = job.id(), .name = job.spec().name()});
    }
    return ended;
  });
  Notify(systemd, StatusLine("starting the optimizer (its kernels timed on "
                             "this machine unless cached)"));
  absl::StatusOr<Optimizer> optimizer =
      StartOptimizer(*config, command_line.reprofile);
  if (!optimizer.ok()) return Fail(optimizer.status());

  // Measured beside the serving (cached in the state directory).
  const HostProfiler profiler(config->state_dir,
                              {.ssd_paths = config->ssd_paths,
                               .block_size = config->block_size,
                               .queue_depth = config->queue_depth,
                               .allow_buffered_io = config->allow_buffered_io,
                               .probe_bytes = config->profile_probe_bytes,
                               .updater = &*optimizer->updater,
                               .optimizer_threads = static_cast<uint32_t>(
                                   optimizer->pool->num_threads())},
                              command_line.reprofile);

  HostPool pool({.capacity_bytes = config->host_pool_bytes});
  // Every job's defaults, resolved against its RegisterModel by the
  // session (ResolveJobSettings).
  const JobDefaults job_defaults{
      .commit_interval = config->commit_interval,
      .durable_every_seconds = absl::ToDoubleSeconds(config->durable_every),
      .durable_write_share = config->durable_write_share,
      .read_ahead_bytes = read_ahead_shares.capacity(),
      .read_ahead_adapts = !config->optimizer_read_ahead_bytes.has_value(),
      .read_ahead_shares = &read_ahead_shares,
      .state_tier = state_tier};
  std::unique_ptr<SessionManager> sessions = SessionManager::Start(
      *std::move(data_listener), {.jobs = jobs->get(),
                                  .pool = &pool,
                                  .store = store->get(),
                                  .updater = &*optimizer->updater,
                                  .quotas = &*quotas,
                                  .ledger = &ledger,
                                  .optimizer_queue = &optimizer_queue,
                                  .job_defaults = job_defaults,
                                  .ring_entries = config->ring_entries,
                                  .reclaim_interval = config->reclaim_interval,
                                  .reclaim_grace = config->reclaim_grace,
                                  .regrow_after = config->regrow_after});

  const DaemonParts parts{.config = &*config,
                          .jobs = jobs->get(),
                          .store = store->get(),
                          .optimizer = &*optimizer->updater,
                          .optimizer_threads = static_cast<uint32_t>(
                              optimizer->pool->num_threads()),
                          .optimizer_status = &optimizer->status,
                          .pool = &pool,
                          .sessions = sessions.get(),
                          .state_tier_bytes = *state_tier_bytes,
                          .quotas = &*quotas,
                          .ledger = &ledger,
                          .profiler = &profiler,
                          .job_deleted = [&](const std::string& job_id) {
                            ssd_reads.Forget(job_id);
                            ssd_writes.Forget(job_id);
                            optimizer_queue.Forget(job_id);
                            sessions->ForgetJob(job_id);
                          }};
  absl::StatusOr<std::unique_ptr<ControlServer>> server =
      ControlServer::Start(parts, *std::move(listener));
  if (!server.ok()) return Fail(server.status());
  // [jobs] keep_ended: jobs no process has been attached to for that long
  // are deleted, unless pinned; stopped first at shutdown.
  std::unique_ptr<EndedJobSweeper> sweeper;
  if (config->keep_ended > absl::ZeroDuration()) {
    sweeper = EndedJobSweeper::Start({.jobs = jobs->get(),
                                      .sessions = sessions.get(),
                                      .store = store->get(),
                                      .ledger = &ledger,
                                      .job_deleted = parts.job_deleted,
                                      .keep_ended = config->keep_ended});
    spdlog::info(
        "jobs no process has been attached to for {} are deleted unless "
        "pinned ([jobs] keep_ended; looked for every {})",
        absl::FormatDuration(config->keep_ended),
        absl::FormatDuration(
            EndedJobSweeper::SweepInterval(config->keep_ended)));
  } else {
    spdlog::info("ended jobs are kept until deleted ([jobs] keep_ended 0s)");
  }

  spdlog::info("lohand {} (protocol {}.{}) serving on {}, pid {}",
               kLohanVersion, kProtocolMajor, kProtocolMinor,
               config->socket_path, getpid());
  LogConfig(*config);
  const StoreStats store_stats = (*store)->Stats();
  spdlog::info("SSD store: {} SSDs, {} tensors; optimizer kernel {}",
               store_stats.devices.size(), store_stats.tensors,
               optimizer->updater->kernel_name());
  // [metrics] textfile: the status as root sees it, for node_exporter's
  // textfile collector; stopped (and its file removed) before the server.
  std::unique_ptr<TextfileWriter> metrics;
  if (!config->metrics_textfile.empty()) {
    absl::StatusOr<std::unique_ptr<TextfileWriter>> writer =
        TextfileWriter::Start({.path = config->metrics_textfile,
                               .interval = config->metrics_interval,
                               .render = [control = server->get()] {
                                 return RenderPrometheusText(
                                     control->Status(Caller{.uid = 0}));
                               }});
    if (!writer.ok()) {
      return Fail(Prefixed(writer.status(), "key 'metrics.textfile': "));
    }
    metrics = *std::move(writer);
    spdlog::info("metrics: writing {} every {}", config->metrics_textfile,
                 absl::FormatDuration(config->metrics_interval));
    const std::string directory = SocketDirectory(config->metrics_textfile);
    struct stat info {};
    if (stat(directory.c_str(), &info) == 0 && (info.st_mode & S_IXOTH) != 0) {
      spdlog::warn(
          "metrics: {} names every user's jobs, and any local user may "
          "reach it ({} is mode {:04o}); to keep job names among their "
          "owners, let only node_exporter's group in: `chgrp GROUP {} && "
          "chmod 0750 {}`",
          config->metrics_textfile, directory, info.st_mode & 07777, directory,
          directory);
    }
  }

  // Every part serves from here on: the store open, the optimizer timed,
  // the control and data sockets answering (the planner's profile of the
  // machine goes on measuring beside the serving, as HostProfiler does).
  Notify(
      systemd,
      absl::StrCat("READY=1\n",
                   StatusLine(absl::StrFormat(
                       "serving on %s (SSDs: %d, host pool %s, optimizer %s)",
                       config->socket_path, store_stats.devices.size(),
                       FormatByteSize(config->host_pool_bytes),
                       optimizer->updater->kernel_name()))));
  // systemd's watchdog (WatchdogSec=), pinged only while the control plane
  // answers a GetStatus through lohand's socket (Watchdog says when).
  std::unique_ptr<Watchdog> watchdog;
  if (absl::StatusOr<absl::Duration> interval =
          WatchdogIntervalFromEnvironment();
      !interval.ok()) {
    spdlog::error("no systemd watchdog: {}",
                  std::string(interval.status().message()));
  } else if (*interval > absl::ZeroDuration() && systemd.enabled()) {
    watchdog = Watchdog::Start(
        *interval,
        [socket = config->socket_path](absl::Duration deadline) {
          return ProbeControlPlane(socket, deadline);
        },
        [&systemd] { Notify(systemd, "WATCHDOG=1"); });
    spdlog::info("systemd watchdog: {}, checked every {}",
                 absl::FormatDuration(*interval),
                 absl::FormatDuration(*interval / 2));
  }

  int received = 0;
  while (sigwait(&stop_signals, &received) != 0) {
  }
  spdlog::info("{} received, shutting down", strsignal(received));
  // The watchdog first (before the control server it probes): no ping
  // follows STOPPING=1.
  if (watchdog != nullptr) watchdog->Stop();
  Notify(systemd,
         absl::StrCat("STOPPING=1\n",
                      StatusLine(absl::StrCat("stopping: ", strsignal(received),
                                              " received"))));
  if (sweeper != nullptr) sweeper->Stop();
  if (metrics != nullptr) {
    metrics->Stop();
    spdlog::info("metrics: stopped, {} removed", config->metrics_textfile);
  }
  (*server)->Shutdown();
  sessions->Shutdown();
  server->reset();
  sessions.reset();
  ledger.SetEndedJobs(nullptr);
  for (const auto& [name, queue] : {std::pair{"SSD reads", &ssd_reads},
                                    {"SSD writes", &ssd_writes},
                                    {"optimizer", &optimizer_queue}}) {
    for (const auto& [job, flow] : queue->Stats()) {
      spdlog::info(
          "{} of job {}: {} grants, {} units, {:.3f} s waited, {:.3f} s active",
          name, job, flow.grants, flow.cost, flow.waited_seconds,
          flow.active_seconds);
    }
  }
  spdlog::info("lohand stopped");
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  lohan::ConfigureAllocator();  // before any thread
  lohan::CommandLine command_line;
  CLI::App app{
      "lohand: the lohan daemon. Owns the SSD array, the pinned host pool and "
      "the CPU optimizer workers, and serves training jobs over a unix "
      "socket.\n"
      "Config: built-in defaults (deploy/lohand.toml), then the config file "
      "(--config, else /etc/lohan/lohand.toml if present), then flags.",
      "lohand"};
  app.set_version_flag("--version", lohan::kLohanVersion);
  std::string config_path;
  app.add_option("-c,--config", config_path, "TOML config file");
  std::string socket, state_dir, log_level, pool_size, ssd_capacity;
  std::string state_tier;
  std::vector<std::string> ssd_paths;
  int64_t threads = -1;
  app.add_option("--socket", socket, "unix socket path [daemon.socket]");
  app.add_option("--state-dir", state_dir,
                 "durable state directory [daemon.state_dir]");
  app.add_option("--ssd-path", ssd_paths,
                 "SSD directory; repeat for several [store.ssd_paths]");
  app.add_option("--ssd-capacity", ssd_capacity,
                 "bytes to use on each SSD path, e.g. 500GiB "
                 "[store.capacity_per_ssd]");
  app.add_option("--host-pool-size", pool_size,
                 "pinned host pool, e.g. 8GiB [pool.host_pool_size]");
  app.add_option("--state-tier", state_tier,
                 "host memory for optimizer states, e.g. 16GiB, 0 or auto "
                 "[pool.state_tier]");
  app.add_option("--optimizer-threads", threads,
                 "optimizer threads, 0 = auto [optimizer.threads]");
  int64_t ring_entries = 0;
  app.add_option("--ring-entries", ring_entries,
                 "entries per data-plane ring, a power of two from 8 to 1024 "
                 "[pool.ring_entries]");
  std::string tuning;
  app.add_option("--optimizer-tuning", tuning,
                 "auto (timed at the first start, cached), default, or e.g. "
                 "prefetch=256,stream=on,chunks=16 [optimizer.tuning]");
  app.add_option("--log-level", log_level,
                 "trace|debug|info|warn|error|critical|off "
                 "[daemon.log_level]");
  app.add_flag("--check-config", command_line.check_only,
               "check the config and this machine, then exit");
  std::string profile_probe;
  app.add_option("--profile-probe", profile_probe,
                 "bytes to write and read on each SSD to measure it, 0: "
                 "none [store.profile_probe]");
  app.add_flag("--reprofile", command_line.reprofile,
               "measure the machine again for the planner (lohanctl plan "
               "--this-machine) and time the optimizer kernels again "
               "(optimizer.tuning = auto), even if cached");
  app.add_flag("--salvage", command_line.salvage,
               "rebuild a damaged store catalog (which lohand refuses to "
               "start with) from what is intact, report what was left "
               "out, then exit; lohand must not be running");
  // A flag given twice: the last one wins, as in most daemons' command lines.
  for (CLI::Option* option : app.get_options()) {
    if (option->get_name() != "--ssd-path") {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  CLI11_PARSE(app, argc, argv);

  if (!config_path.empty()) command_line.config_path = config_path;
  auto& overrides = command_line.overrides;
  if (app.count("--socket")) overrides.socket_path = socket;
  if (app.count("--state-dir")) overrides.state_dir = state_dir;
  if (app.count("--ssd-path")) overrides.ssd_paths = ssd_paths;
  if (app.count("--host-pool-size")) overrides.host_pool_size = pool_size;
  if (app.count("--state-tier")) overrides.state_tier = state_tier;
  if (app.count("--ssd-capacity")) overrides.ssd_capacity = ssd_capacity;
  if (app.count("--profile-probe")) overrides.profile_probe = profile_probe;
  if (app.count("--optimizer-threads")) overrides.optimizer_threads = threads;
  if (app.count("--ring-entries")) overrides.ring_entries = ring_entries;
  if (app.count("--optimizer-tuning")) overrides.optimizer_tuning = tuning;
  if (app.count("--log-level")) overrides.log_level = log_level;
  return lohan::Run(command_line);
}
