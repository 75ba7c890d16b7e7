// Elastic shares (issue #47), measured on a real lohand: a job whose
// arena is beyond its share of the host pool trains alone, then beside
// another user's idle data plane that needs that share (the job shrinks to
// a streamed arena), then alone again (it grows back), then while the other
// user opens and closes planes over and over. Prints the job's steps/s in
// each phase against its rate alone, measured in the same run, and what a
// shrink and a grow cost: the seconds the job spent moving against a step,
// and the storage bytes lohand read and wrote meanwhile (/proc/<pid>/io;
// the job is between iterations then, so they are the move's).
//
//   bazel run //bench/session:share_bench -- [--window=20] [--layers=32]
//       [--elements=262144] [--cycles=30] [--job-user=0] [--device-ms=0]
//       [--chunk=0]
//
// Needs root. The job runs as --job-user (0: root, or 65534: nobody), the
// other user as nobody, or as uid 1 (daemon, a third user) when the job
// is nobody's (setpriv). The job is tests/train_client (fp32,
// --fit-arena, 8 shared buffers when streamed), lohand's pool twice its
// resident arena less a MiB, so the job holds just more than half. Between
// "after" and the cycles the other user trains a job of the same shape
// beside it for a window. --device-ms: each job's client also waits that
// long a step, as one whose forward and backward run on its own
// accelerator does (the two jobs then share lohand, not their compute).
// --chunk: parameters per stored chunk, a layer's by default (lohan's own
// default is 4 Mi): small chunks make each step thousands of small SSD
// writes, which measures the disk's small-write rate more than lohan.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/control_client.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/proc_io.h"
#include "tests/harness/subprocess.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;

// What the bench started, stopped however it ends (Die included: exit()
// runs no destructors): the clients first, then lohand, then their
// directory.
struct Started {
  testing::PublicTempDir dir;
  std::unique_ptr<testing::DaemonProcess> daemon;
  std::vector<std::unique_ptr<testing::BackgroundProcess>> processes;
};
std::optional<Started>& Live() {
  static std::optional<Started> live;
  return live;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "share_bench: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  Live().reset();
  std::exit(1);
}

// A process started, kept in Live() (Die if it did not start).
testing::BackgroundProcess* Keep(
    const std::string& what,
    absl::StatusOr<std::unique_ptr<testing::BackgroundProcess>> started) {
  if (!started.ok()) Die(what, started.status());
  Live()->processes.push_back(*std::move(started));
  return Live()->processes.back().get();
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// lohand's storage bytes so far, read and written.
uint64_t StorageBytes(pid_t pid) {
  const testing::ProcIo io = testing::ReadProcIo(pid);
  return io.read + io.written;
}

// One look at the job: its open plane (iteration, arena) and lohand's
// bytes.
struct Sample {
  double at = 0;  // seconds since the bench began
  uint64_t iteration = 0;
  uint64_t arena = 0;
  uint64_t wanted = 0;
  bool registered = false;
  uint64_t bytes = 0;
};

class Bench {
 public:
  Bench(testing::DaemonProcess& daemon, ControlClient& control)
      : daemon_(daemon), control_(control), start_(Clock::now()) {}

  Sample Look() {
    Sample sample{.at = Seconds(start_), .bytes = StorageBytes(daemon_.pid())};
    auto status = control_.GetStatus();
    if (!status.ok()) Die("status", status.status());
    for (const v1::SessionStatus& open : status->sessions()) {
      if (open.job_id() != job_id_) continue;
      sample.iteration = open.iteration();
      sample.arena = open.arena_bytes();
      sample.wanted = open.wanted_arena_bytes();
      sample.registered = open.layers() != 0;
    }
    samples_.push_back(sample);
    return sample;
  }

  // Looks every 20 ms until `holds` (at most `patience` seconds).
  template <typename Predicate>
  Sample Until(Predicate holds, double patience, const char* what) {
    const auto began = Clock::now();
    while (Seconds(began) < patience) {
      Sample sample = Look();
      if (holds(sample)) return sample;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Die(what, absl::DeadlineExceededError("not within the patience"));
  }

  // A window of `seconds`, looking all along: its steps/s and lohand's
  // bytes per step.
  struct Window {
    double steps_per_second = 0;
    double bytes_per_step = 0;
  };
  Window Measure(double seconds) {
    const Sample first = Look();
    Sample last = first;
    while (last.at - first.at < seconds) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      last = Look();
    }
    const double steps = static_cast<double>(last.iteration - first.iteration);
    return {steps / (last.at - first.at),
            static_cast<double>(last.bytes - first.bytes) / steps};
  }

  // How many times the job's plane changed size since look `since`.
  int MovesSince(size_t since) const {
    int moves = 0;
    uint64_t arena = 0;
    for (size_t i = since; i < samples_.size(); ++i) {
      const Sample& sample = samples_[i];
      if (!sample.registered) continue;
      if (arena != 0 && sample.arena != arena) ++moves;
      arena = sample.arena;
    }
    return moves;
  }
  size_t looks() const { return samples_.size(); }
  void set_job_id(std::string id) { job_id_ = std::move(id); }

 private:
  testing::DaemonProcess& daemon_;
  ControlClient& control_;
  const Clock::time_point start_;
  std::string job_id_;
  std::vector<Sample> samples_;
};

// The job's moves so far (train_client's --moves-file): each one's lohand
// storage bytes per parameter and seconds, against a resident step's.
void ReportMoves(const std::string& path, uint64_t parameters,
                 double step_seconds, bool bytes_known) {
  std::ifstream moves(path);
  uint64_t from = 0, to = 0, read = 0, written = 0;
  double seconds = 0;
  while (moves >> from >> to >> seconds >> read >> written) {
    std::printf("  %s %.1f -> %.1f MiB: %.2f s (%.2fx a resident step)",
                to < from ? "shrink" : "grow", from / 1048576.0, to / 1048576.0,
                seconds, seconds / step_seconds);
    if (!bytes_known) {  // another user cannot read lohand's /proc/<pid>/io
      std::printf("\n");
      continue;
    }
    std::printf(
        ", lohand read %.3g MB (%.2f B/param) and wrote %.3g MB (%.2f "
        "B/param)\n",
        read / 1e6, static_cast<double>(read) / parameters, written / 1e6,
        static_cast<double>(written) / parameters);
  }
}

struct Options {
  double window = 20;
  uint32_t layers = 32;
  uint64_t elements = 256 << 10;
  int cycles = 30;
  uid_t job_user = 0;
  // What an accelerator would compute per step (train_client --device-ms,
  // waited): 0, the jobs' clients only hand over gradients.
  double device_ms = 0;
  // Parameters per stored chunk (train_client --chunk); 0: a layer's.
  uint64_t chunk = 0;
};

int Run(const Options& options) {
  if (getuid() != 0) {
    std::fprintf(stderr,
                 "share_bench: needs root (the other users run through "
                 "setpriv)\n");
    return 2;
  }
  if (options.job_user != 0 && options.job_user != 65534) {
    std::fprintf(stderr, "share_bench: --job-user is 0 or 65534\n");
    return 2;
  }
  const uid_t other_user = options.job_user == 0 ? 65534 : 1;
  Live().emplace();
  const testing::PublicTempDir& dir = Live()->dir;
  const std::string hostile =
      testing::CopyForOtherUsers("tests/hostile_client", dir.path());
  const std::string trainer =
      testing::CopyForOtherUsers("tests/train_client", dir.path());
  const uint64_t layer_bytes = options.elements * 4;
  const uint64_t chunk = options.chunk != 0 ? options.chunk : options.elements;
  // Resident: a gradient and a weight buffer per layer, the staging slot
  // and a MiB of rings: the pool is twice that less a MiB.
  const uint64_t resident =
      2 * options.layers * layer_bytes + layer_bytes + (1 << 20);
  const uint64_t pool = ((2 * resident) >> 20 << 20) - (1 << 20);
  {
    std::ofstream config(dir.path() + "/lohand.toml");
    config << "[quotas]\nregrow_after = \"5s\"\n";
  }
  auto daemon = testing::DaemonProcess::Start(
      dir.path(), {"--config", dir.path() + "/lohand.toml", "--ssd-capacity",
                   "4GiB", "--host-pool-size", absl::StrCat(pool >> 20, "MiB"),
                   "--log-level", "info"});
  if (!daemon.ok()) Die("lohand", daemon.status());
  Live()->daemon = *std::move(daemon);
  testing::DaemonProcess& lohand = *Live()->daemon;
  auto control = ControlClient::Connect({.socket_path = lohand.socket()});
  if (!control.ok()) Die("connect", control.status());
  Bench bench(lohand, **control);

  // What the job and the other users write (their uids may not write in
  // the directory itself).
  const std::string out = dir.path() + "/out";
  if (mkdir(out.c_str(), 0700) != 0 || chmod(out.c_str(), 01777) != 0) {
    Die("mkdir", absl::ErrnoToStatus(errno, out));
  }
  const std::string stop = dir.path() + "/stop";
  const std::string moves_file = out + "/moves";
  std::vector<std::string> layers(options.layers,
                                  std::to_string(options.elements));
  // A training process of job `name` as `user` until `until` exists,
  // dumping its weights to `weights`, with `more` flags.
  auto train = [&](const std::string& what, uid_t user, const std::string& name,
                   const std::string& until, const std::string& weights,
                   std::vector<std::string> more) {
    std::vector<std::string> argv = {trainer,
                                     "--socket",
                                     lohand.socket(),
                                     "--job",
                                     name,
                                     "--layers",
                                     absl::StrJoin(layers, ","),
                                     "--fit-arena",
                                     "--grad-slots",
                                     "8",
                                     "--weight-slots",
                                     "8",
                                     "--iterations",
                                     "100000000",
                                     "--until-file",
                                     until,
                                     "--out",
                                     weights,
                                     "--device-ms",
                                     absl::StrCat(options.device_ms),
                                     "--chunk",
                                     absl::StrCat(chunk)};
    argv.insert(argv.end(), more.begin(), more.end());
    return Keep(what,
                testing::BackgroundProcess::Start(testing::AsUser(user, argv)));
  };
  testing::BackgroundProcess* job =
      train("job", options.job_user, "job", stop, out + "/weights",
            {"--moves-file", moves_file, "--lohand-pid",
             std::to_string(lohand.pid())});
  auto jobs = (*control)->ListJobs();
  if (!jobs.ok() || jobs->empty()) Die("jobs", jobs.status());
  bench.set_job_id((*jobs)[0].id());
  const uint64_t parameters = uint64_t{options.layers} * options.elements;
  std::printf(
      "share_bench: uid %u's job of %u layers x %llu fp32 parameters (%.1f "
      "MiB arena resident, 8 shared buffers streamed) in a %llu MiB pool; "
      "the other user (uid %u)'s idle plane asks for half the pool; "
      "regrow_after 5s, reclaim_interval and reclaim_grace their defaults "
      "(1m, 15m); chunks of %llu parameters; each job's device %.0f ms a "
      "step\n",
      options.job_user, options.layers,
      static_cast<unsigned long long>(options.elements), resident / 1048576.0,
      static_cast<unsigned long long>(pool >> 20), other_user,
      static_cast<unsigned long long>(chunk), options.device_ms);
  bench.Until([](const Sample& s) { return s.iteration >= 3; }, 120,
              "the job's first steps");

  // Alone, after a warm-up window not counted: the first steps fill the
  // state tier and fault the arena in, which would make the reference low
  // against every later phase.
  (void)bench.Measure(options.window / 2);
  const Bench::Window resident_rate = bench.Measure(options.window);
  const double alone = resident_rate.steps_per_second;
  std::printf("  alone: %.3f steps/s, lohand's storage %.2f B/param a step\n",
              alone, resident_rate.bytes_per_step / parameters);

  // Beside the other user's idle plane: the job shrinks.
  const std::string half = std::to_string(pool / 2);
  const auto asked = Clock::now();
  testing::BackgroundProcess* idle =
      Keep("the other user's plane",
           testing::BackgroundProcess::Start(testing::AsUser(
               other_user, {hostile, "register-await", lohand.socket(), "idle",
                            out + "/idle-told", half})));
  if (idle->first_line().rfind("registered", 0) != 0) {
    Die("the other user's plane", absl::InternalError(idle->first_line()));
  }
  const double opened_in = Seconds(asked);
  const Sample shrunk = bench.Until(
      [](const Sample& s) { return s.registered && s.arena < s.wanted; }, 120,
      "the shrink");
  const Bench::Window streamed = bench.Measure(options.window);
  std::printf(
      "  beside the other user's idle plane: %.3f steps/s (%.2fx alone), "
      "%.2f B/param a step; its plane opened in %.2f s\n",
      streamed.steps_per_second, streamed.steps_per_second / alone,
      streamed.bytes_per_step / parameters, opened_in);

  // The other user leaves: the job grows back after regrow_after.
  idle->Stop(SIGKILL);
  const Sample left = bench.Look();
  const Sample grown = bench.Until(
      [](const Sample& s) { return s.registered && s.arena == s.wanted; }, 120,
      "the grow");
  const Bench::Window regrown = bench.Measure(options.window);
  const double after = regrown.steps_per_second;
  std::printf(
      "  after it left: %.3f steps/s (%.2fx alone), %.2f B/param a step; "
      "grown back %.1f s after it left\n",
      after, after / alone, regrown.bytes_per_step / parameters,
      grown.at - left.at);
  ReportMoves(moves_file, parameters, 1 / alone, options.job_user == 0);

  // The other user trains a job of the same shape beside it (the two share
  // the machine's cores as well as the pool).
  const std::string other_stop = dir.path() + "/other-stop";
  testing::BackgroundProcess* other =
      train("the other user's job", other_user, "other", other_stop,
            out + "/other-weights", {});
  const double other_started = bench.Look().at;
  auto other_iteration = [&]() -> std::optional<uint64_t> {
    auto status = (*control)->GetStatus();
    if (!status.ok()) Die("status", status.status());
    for (const v1::Job& job : status->jobs()) {
      if (job.owner_uid() != other_user) continue;
      for (const v1::SessionStatus& open : status->sessions()) {
        if (open.job_id() == job.id() && open.layers() != 0) {
          return open.iteration();
        }
      }
    }
    return std::nullopt;
  };
  while (other_iteration().value_or(0) < 3) {
    if (bench.Look().at - other_started > 120) {
      Die("the other user's job", absl::DeadlineExceededError("no steps"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint64_t other_from = *other_iteration();
  const double other_from_at = bench.Look().at;
  const Bench::Window beside_training = bench.Measure(options.window);
  const uint64_t other_to = other_iteration().value_or(other_from);
  const double other_rate =
      (other_to - other_from) / (bench.Look().at - other_from_at);
  std::printf(
      "  beside the other user training a job of the same shape: %.3f "
      "steps/s (%.2fx alone), lohand's storage for both %.2f B/param a "
      "step of it; the other job %.3f "
      "steps/s (both together %.2fx the job alone)\n",
      beside_training.steps_per_second,
      beside_training.steps_per_second / alone,
      beside_training.bytes_per_step / parameters, other_rate,
      (beside_training.steps_per_second + other_rate) / alone);
  std::ofstream(other_stop) << "stop\n";
  if (const int code = other->Stop(0); code != 0) {
    Die("the other user's job",
        absl::InternalError(absl::StrCat("exit ", code, "\n", lohand.Log())));
  }

  // The other user opens a plane, holds it a second and closes it, over
  // and over, from a minute after the shrink (reclaim_interval).
  while (bench.Look().at - shrunk.at < 61) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const size_t cycles_look = bench.looks();
  const Sample cycles_from = bench.Look();
  int opened = 0;
  std::string refusal;  // the first one
  for (int i = 0; i < options.cycles; ++i) {
    auto started = testing::BackgroundProcess::Start(testing::AsUser(
        other_user, {hostile, "register-await", lohand.socket(),
                     absl::StrCat("cycle-", i), out + "/cycle-told", half}));
    const std::string said = started.ok()
                                 ? (*started)->first_line()
                                 : std::string(started.status().message());
    testing::BackgroundProcess* plane =
        started.ok() ? Keep("a plane", std::move(started)) : nullptr;
    if (said.rfind("registered", 0) == 0) {
      ++opened;
    } else if (refusal.empty()) {
      refusal = said;
    }
    const auto held = Clock::now();
    while (Seconds(held) < 1) {
      bench.Look();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (plane != nullptr) plane->Stop(SIGKILL);
  }
  const Sample cycles_to = bench.Look();
  const double cycling = (cycles_to.iteration - cycles_from.iteration) /
                         (cycles_to.at - cycles_from.at);
  std::printf(
      "  while the other user opened %d planes one after the other, each "
      "held a second (%d opened; %.1f s): %.3f steps/s (%.2fx alone); the "
      "job moved %d times\n",
      options.cycles, opened, cycles_to.at - cycles_from.at, cycling,
      cycling / alone, bench.MovesSince(cycles_look));
  if (!refusal.empty())
    std::printf("    the first refusal: %s\n", refusal.c_str());

  std::ofstream(stop) << "stop\n";
  const int exit_code = job->Stop(0);
  if (exit_code != 0) {
    Die("the job", absl::InternalError(
                       absl::StrCat("exit ", exit_code, "\n", lohand.Log())));
  }
  Live().reset();
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) {
  lohan::Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string(name) + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    bool parsed = true;
    if (const char* v = value("--window")) {
      parsed = absl::SimpleAtod(v, &options.window) && options.window > 0;
    } else if (const char* v = value("--layers")) {
      parsed = absl::SimpleAtoi(v, &options.layers) && options.layers > 0;
    } else if (const char* v = value("--elements")) {
      parsed = absl::SimpleAtoi(v, &options.elements) && options.elements > 0;
    } else if (const char* v = value("--cycles")) {
      parsed = absl::SimpleAtoi(v, &options.cycles) && options.cycles >= 0;
    } else if (const char* v = value("--job-user")) {
      parsed = absl::SimpleAtoi(v, &options.job_user);
    } else if (const char* v = value("--device-ms")) {
      parsed = absl::SimpleAtod(v, &options.device_ms) &&
               options.device_ms >= 0 && options.device_ms <= 60000;
    } else if (const char* v = value("--chunk")) {
      parsed = absl::SimpleAtoi(v, &options.chunk);
    } else {
      std::fprintf(stderr, "share_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
    if (!parsed) {
      std::fprintf(stderr,
                   "share_bench: %s: not a valid value (--window and "
                   "--layers, --elements > 0; --cycles, --chunk >= 0; "
                   "--device-ms 0..60000)\n",
                   argv[i]);
      return 2;
    }
  }
  return lohan::Run(options);
}
