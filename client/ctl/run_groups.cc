#include "client/ctl/run_groups.h"

#include <algorithm>
#include <ctime>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "layout/byte_size.h"

namespace lohan {

std::string LocalTime(int64_t unix_seconds) {
  if (unix_seconds <= 0) return "-";
  const time_t seconds = unix_seconds;
  tm local{};
  localtime_r(&seconds, &local);
  char text[32];
  strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

namespace {

// "7" when every rank is at iteration 7, else each in rank order ("7,6,-").
std::string Iterations(const JobEntry& run, const IterationsByJob& iterations) {
  std::vector<std::string> each;
  for (const v1::Job& job : run.jobs) {
    auto found = iterations.find(job.id());
    each.push_back(found == iterations.end() ? "-"
                                             : absl::StrCat(found->second));
  }
  const bool all_equal =
      std::all_of(each.begin(), each.end(),
                  [&](const std::string& one) { return one == each.front(); });
  return all_equal ? each.front() : absl::StrJoin(each, ",");
}

// "attached", "detached", or "1 of 2 attached".
std::string State(const JobEntry& run) {
  const size_t attached = std::count_if(
      run.jobs.begin(), run.jobs.end(),
      [](const v1::Job& job) { return job.state() == v1::JOB_STATE_ATTACHED; });
  if (attached == run.jobs.size()) return "attached";
  if (attached == 0) return "detached";
  return absl::StrCat(attached, " of ", run.jobs.size(), " attached");
}

// The world size the ranks were given; each distinct one if they disagree.
std::string WorldSize(const JobEntry& run) {
  std::set<uint32_t> sizes;
  for (const v1::Job& job : run.jobs)
    sizes.insert(job.spec().run().world_size());
  return absl::StrJoin(sizes, ",");
}

}  // namespace

std::vector<JobEntry> GroupRuns(const std::vector<v1::Job>& jobs) {
  std::vector<JobEntry> entries;
  // (owner, run name) -> its entry's index.
  std::map<std::pair<uint32_t, std::string>, size_t> runs;
  for (const v1::Job& job : jobs) {
    if (!job.spec().has_run()) {
      entries.push_back({.jobs = {job}});
      continue;
    }
    auto [at, added] = runs.try_emplace(
        std::make_pair(job.owner_uid(), job.spec().run().name()),
        entries.size());
    if (added) entries.emplace_back();
    entries[at->second].jobs.push_back(job);
  }
  for (JobEntry& entry : entries) {
    std::stable_sort(entry.jobs.begin(), entry.jobs.end(),
                     [](const v1::Job& a, const v1::Job& b) {
                       return a.spec().run().rank() < b.spec().run().rank();
                     });
  }
  return entries;
}

std::string RunTable(const std::vector<JobEntry>& runs,
                     const IterationsByJob* iterations) {
  // As wide as the longest name (up to 64 characters), not less than 20.
  int name_width = 20;
  for (const JobEntry& run : runs) {
    name_width =
        std::max(name_width,
                 static_cast<int>(run.jobs.front().spec().run().name().size()));
  }
  auto row = [&](const std::vector<std::string>& cells) {
    std::string line =
        absl::StrFormat("%-*s %-12s %-6s %-11s %-16s", name_width, cells[0],
                        cells[1], cells[2], cells[3], cells[4]);
    size_t next = 5;
    if (iterations != nullptr) {
      absl::StrAppendFormat(&line, " %-10s", cells[next++]);
    }
    absl::StrAppendFormat(&line, " %-10s %-10s %s\n", cells[next],
                          cells[next + 1], cells[next + 2]);
    return line;
  };
  std::vector<std::string> header = {"RUN", "OWNER", "WORLD", "RANKS HERE",
                                     "STATE"};
  if (iterations != nullptr) header.push_back("ITERATION");
  for (const char* cell : {"HOST POOL", "ON SSDS", "JOBS"}) {
    header.push_back(cell);
  }
  std::string table = row(header);
  for (const JobEntry& run : runs) {
    std::vector<std::string> ranks, ids;
    uint64_t host_pool = 0, ssd = 0;
    for (const v1::Job& job : run.jobs) {
      ranks.push_back(absl::StrCat(job.spec().run().rank()));
      ids.push_back(job.id());
      host_pool += job.spec().host_pool_bytes();
      ssd += job.ssd_bytes();
    }
    const v1::Job& first = run.jobs.front();
    std::vector<std::string> cells = {first.spec().run().name(),
                                      first.owner_name(), WorldSize(run),
                                      absl::StrJoin(ranks, ","), State(run)};
    if (iterations != nullptr) cells.push_back(Iterations(run, *iterations));
    cells.push_back(FormatByteSize(host_pool));
    cells.push_back(FormatByteSize(ssd));
    cells.push_back(absl::StrJoin(ids, " "));
    table += row(cells);
    for (const v1::Job& job : run.jobs) {
      // Under its run: when lohand deletes an ended rank on its own.
      if (job.kept()) {
        absl::StrAppendFormat(&table,
                              "  rank %u (%s) kept: lohand never deletes it "
                              "on its own\n",
                              job.spec().run().rank(), job.id());
      } else if (job.delete_after_unix_seconds() > 0) {
        absl::StrAppendFormat(&table,
                              "  rank %u (%s) ended at %s, deleted after %s\n",
                              job.spec().run().rank(), job.id(),
                              LocalTime(job.ended_unix_seconds()),
                              LocalTime(job.delete_after_unix_seconds()));
      }
      if (job.last_failure().empty()) continue;
      // Why a rank stopped (a full SSD, say).
      absl::StrAppendFormat(&table, "  rank %u (%s) last failure at %s: %s\n",
                            job.spec().run().rank(), job.id(),
                            LocalTime(job.last_failure_unix_seconds()),
                            job.last_failure());
    }
  }
  return table;
}

}  // namespace lohan
