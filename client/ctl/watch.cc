#include "client/ctl/watch.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "layout/byte_size.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;

// One job's counters at one refresh.
struct Sample {
  Clock::time_point at;
  uint64_t read = 0;
  uint64_t written = 0;
  double optimizer_seconds = 0;
};

std::string Limit(uint64_t limit, bool bytes) {
  if (limit == 0) return "no limit";
  return bytes ? FormatByteSize(limit) : std::to_string(limit);
}

std::string Rate(double bytes_per_second) {
  return absl::StrFormat("%.2f", bytes_per_second / 1e9);
}

void PrintTable(const v1::GetStatusResponse& status,
                const std::map<std::string, Sample>& before,
                std::map<std::string, Sample>& now, Clock::time_point at) {
  std::map<std::string, std::string> owners;
  for (const v1::Job& job : status.jobs()) owners[job.id()] = job.owner_name();
  std::printf(
      "lohand %s, up %.0f s; %u jobs, %u attached; pool %s of %s in "
      "use; optimizer %u threads (%s)\n",
      status.daemon_version().c_str(), status.uptime_seconds(),
      status.total_jobs(), status.attached_jobs(),
      FormatByteSize(status.pool().used_bytes()).c_str(),
      FormatByteSize(status.pool().capacity_bytes()).c_str(),
      status.optimizer().threads(), status.optimizer().kernel().c_str());
  uint64_t capacity = 0, used = 0;
  for (const v1::SsdStatus& ssd : status.store().ssds()) {
    capacity += ssd.capacity_bytes();
    used += ssd.used_bytes();
  }
  std::printf("SSD array: %d SSD%s, %s of %s used\n\n",
              status.store().ssds_size(),
              status.store().ssds_size() == 1 ? "" : "s",
              FormatByteSize(used).c_str(), FormatByteSize(capacity).c_str());
  const char* format =
      "%-10s %-10s %-7s %-15s %-9s %-9s %-6s %-10s %-10s %-21s %-21s %s\n";
  std::printf(format, "JOB", "OWNER", "STEP", "ITER s last/avg", "READ GB/s",
              "WRITE GB/s", "OPT %", "ARENA", "SET ASIDE",
              "READ-AHEAD held/share", "STATES in RAM/all", "QUEUED urg/bulk");
  double total_read = 0, total_written = 0, total_optimizer = 0;
  const double threads = std::max(1u, status.optimizer().threads());
  for (const v1::SessionStatus& session : status.sessions()) {
    Sample sample{.at = at,
                  .read = session.ssd_read_bytes(),
                  .written = session.ssd_written_bytes(),
                  .optimizer_seconds = session.optimizer_seconds()};
    now[session.job_id()] = sample;
    std::string read = "-", written = "-", optimizer = "-";
    auto previous = before.find(session.job_id());
    if (previous != before.end()) {
      const double dt =
          std::chrono::duration<double>(at - previous->second.at).count();
      if (dt > 0) {
        const double r = (sample.read - previous->second.read) / dt;
        const double w = (sample.written - previous->second.written) / dt;
        const double o =
            (sample.optimizer_seconds - previous->second.optimizer_seconds) /
            (dt * threads);
        total_read += r;
        total_written += w;
        total_optimizer += o;
        read = Rate(r);
        written = Rate(w);
        optimizer = absl::StrFormat("%.0f", 100 * o);
      }
    }
    std::printf(
        format, session.job_id().c_str(), owners[session.job_id()].c_str(),
        std::to_string(session.iteration()).c_str(),
        absl::StrFormat("%.2f/%.2f%s", session.last_iteration_seconds(),
                        session.mean_iteration_seconds(),
                        session.draining() ? " D" : "")
            .c_str(),
        read.c_str(), written.c_str(), optimizer.c_str(),
        FormatByteSize(session.arena_bytes()).c_str(),
        FormatByteSize(session.ssd_set_aside_bytes()).c_str(),
        absl::StrCat(FormatByteSize(session.read_ahead_held_bytes()), "/",
                     FormatByteSize(session.read_ahead_share_bytes()))
            .c_str(),
        absl::StrCat(FormatByteSize(session.state_tier_bytes()), "/",
                     FormatByteSize(session.state_bytes()))
            .c_str(),
        absl::StrFormat("%u/%u", session.urgent_queued(), session.bulk_queued())
            .c_str());
  }
  if (status.sessions_size() == 0) std::printf("(no job is training)\n");
  std::printf("%-10s %-10s %-7s %-15s %-9s %-9s %-6s\n", "total", "", "", "",
              Rate(total_read).c_str(), Rate(total_written).c_str(),
              absl::StrFormat("%.0f", 100 * total_optimizer).c_str());
  std::printf("\nyour quota: %s (D: draining)\n",
              QuotaLine(status.quota()).c_str());
}

}  // namespace

std::string QuotaLine(const v1::QuotaStatus& quota) {
  return absl::StrFormat(
      "jobs %u of %s, SSD %s held of %s, host pool %s, data planes %s, "
      "control connections %s, daemon memory %s held of %s",
      quota.jobs(), Limit(quota.jobs_limit(), false),
      FormatByteSize(quota.ssd_held_bytes()),
      Limit(quota.ssd_limit_bytes(), true),
      Limit(quota.host_pool_limit_bytes(), true),
      Limit(quota.data_planes_limit(), false),
      Limit(quota.control_connections_limit(), false),
      FormatByteSize(quota.daemon_memory_held_bytes()),
      Limit(quota.daemon_memory_limit_bytes(), true));
}

std::string OptimizerLine(const v1::OptimizerStatus& optimizer) {
  std::string line =
      absl::StrFormat("%u thread%s, kernel %s", optimizer.threads(),
                      optimizer.threads() == 1 ? "" : "s", optimizer.kernel());
  if (!optimizer.tuning().empty()) {
    absl::StrAppend(&line, ", ", optimizer.tuning());
  }
  if (optimizer.has_calibration()) {
    const v1::OptimizerCalibration& c = optimizer.calibration();
    absl::StrAppendFormat(
        &line, " (%s %s: %.2fx the default, %d candidates in %.1f s)",
        optimizer.source(),
        absl::FormatTime("%Y-%m-%d %H:%M UTC",
                         absl::FromUnixSeconds(c.measured_unix_seconds()),
                         absl::UTCTimeZone()),
        c.speedup_over_default(), c.candidates_size(), c.seconds_taken());
  } else if (!optimizer.source().empty()) {
    absl::StrAppend(&line, " (", optimizer.source(), ")");
  }
  return line;
}

std::string StatesLine(const v1::SessionStatus& session) {
  if (session.state_bytes() == 0) return "";
  std::string line = absl::StrFormat(
      "states %s: %s in RAM (share %s), %s on the SSDs only",
      FormatByteSize(session.state_bytes()),
      FormatByteSize(session.state_tier_bytes()),
      FormatByteSize(session.state_tier_share_bytes()),
      FormatByteSize(session.state_bytes() - session.state_tier_bytes()));
  if (session.state_tier_grad_bytes() > 0) {
    absl::StrAppendFormat(&line, "; streamed gradients %s in RAM",
                          FormatByteSize(session.state_tier_grad_bytes()));
  }
  if (session.durable_iteration() != session.committed_iteration()) {
    // What a crash of lohand would lose now (commit_interval or
    // durable_every).
    const uint64_t lost =
        session.committed_iteration() - session.durable_iteration();
    absl::StrAppendFormat(
        &line,
        ", durable at iteration %d (a crash of lohand now loses %d "
        "iteration%s, %.0f s)",
        session.durable_iteration(), lost, lost == 1 ? "" : "s",
        session.seconds_since_durable());
  }
  const double per = static_cast<double>(session.parameters()) *
                     static_cast<double>(session.session_iterations());
  if (per > 0) {
    absl::StrAppendFormat(
        &line, "; SSD %.2f read, %.2f written B/param/iteration",
        session.ssd_read_bytes() / per, session.ssd_written_bytes() / per);
    if (session.host_update_bytes() > 0) {
      // The updates' own memory traffic, and lohand's copies beside it.
      absl::StrAppendFormat(&line, "; RAM %.2f updated, %.2f copied",
                            session.host_update_bytes() / per,
                            session.host_copied_bytes() / per);
    }
  }
  return line;
}

std::string ArenaLine(const v1::SessionStatus& session) {
  std::string line;
  if (session.arena_bytes() < session.wanted_arena_bytes()) {
    line = absl::StrFormat("arena %s of the %s its job asks for (%s)",
                           FormatByteSize(session.arena_bytes()),
                           FormatByteSize(session.wanted_arena_bytes()),
                           session.arena_note().empty()
                               ? "what the pool had free when the plane opened"
                               : session.arena_note());
  }
  if (session.arena_asked_bytes() != 0) {
    absl::StrAppend(
        &line, line.empty() ? "" : "; ",
        absl::StrFormat("moving to a %s arena at its next "
                        "iteration's end",
                        FormatByteSize(session.arena_asked_bytes())));
  }
  return line;
}

std::string PlanLine(const v1::SessionStatus& session) {
  if (!session.has_plan()) return "";
  const v1::JobPlan& plan = session.plan();
  const double predicted = plan.predicted_iteration_seconds();
  std::string measured = "no iteration measured since";
  if (session.planned_iterations() > 0) {
    const double mean = session.planned_mean_iteration_seconds();
    measured = absl::StrFormat("measured %.3g s over %d iteration%s", mean,
                               session.planned_iterations(),
                               session.planned_iterations() == 1 ? "" : "s");
    if (predicted > 0) {
      absl::StrAppendFormat(&measured, " (%.2fx)", mean / predicted);
    }
  }
  // GetStatus summarises the plan: blocks per mode (lohanctl jobs plan
  // has the whole plan).
  std::string blocks;
  for (const char* mode : {"offload", "swap", "keep", "mixed"}) {
    auto found = plan.block_mode_counts().find(mode);
    const uint32_t count =
        found == plan.block_mode_counts().end() ? 0 : found->second;
    if (count == 0) continue;
    absl::StrAppendFormat(&blocks, "%s%d %s", blocks.empty() ? "" : ", ", count,
                          mode);
  }
  return absl::StrFormat(
      "plan: case %d, predicted %.3g s/iteration (bound by %s / %s), %s; "
      "blocks: %s",
      plan.search_case(), predicted, plan.forward_binding(),
      plan.backward_binding(), measured, blocks.empty() ? "none" : blocks);
}

int Watch(ControlClient& client, const WatchOptions& options) {
  std::map<std::string, Sample> before;
  for (int refresh = 0; options.count == 0 || refresh < options.count;
       ++refresh) {
    if (refresh > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double>(options.interval_seconds));
    }
    absl::StatusOr<v1::GetStatusResponse> status = client.GetStatus();
    const Clock::time_point at = Clock::now();
    if (!status.ok()) {
      std::fprintf(stderr, "lohanctl: %s\n",
                   std::string(status.status().message()).c_str());
      return 1;
    }
    if (options.json) {
      std::string line;
      google::protobuf::util::JsonPrintOptions json;
      json.preserve_proto_field_names = true;
      json.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(*status, &line, json);
      std::printf("%s\n", line.c_str());
    } else {
      if (options.clear) std::printf("\033[H\033[2J");
      std::map<std::string, Sample> now;
      PrintTable(*status, before, now, at);
      before = std::move(now);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace lohan
