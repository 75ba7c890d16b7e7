#ifndef LOHAN_CLIENT_CTL_RUN_GROUPS_H_
#define LOHAN_CLIENT_CTL_RUN_GROUPS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/lohan.pb.h"

namespace lohan {

// One entry of lohanctl's job listings: a job on its own, or the jobs of one
// distributed run on this daemon (one owner, one JobSpec.run name), which
// lohanctl shows as one.
struct JobEntry {
  // The job on its own, or the run's jobs by rank. Never empty.
  std::vector<v1::Job> jobs;

  bool is_run() const { return jobs.front().spec().has_run(); }
};

// `unix_seconds` in local time as lohanctl prints times
// ("2026-12-02 03:35:00"); "-" for none (<= 0).
std::string LocalTime(int64_t unix_seconds);

// `jobs` as entries, each where its first job is in `jobs`.
std::vector<JobEntry> GroupRuns(const std::vector<v1::Job>& jobs);

// Committed iterations by job id, of the jobs with an open data plane.
using IterationsByJob = std::map<std::string, uint64_t>;

// The runs (entries with is_run()) as a table with a header: the run's name,
// owner, world size, the ranks on this daemon, how many of them are
// attached, their iterations (one number when all are equal, else each in
// rank order, "-" for a rank not training; the column is left out when
// `iterations` is null), the totals of their host pools (arenas) and SSD
// bytes, and their job ids in rank order; under its run, a line for each
// rank lohand will delete on its own (ended: when) or never (pinned), and
// each rank's last failure.
std::string RunTable(const std::vector<JobEntry>& runs,
                     const IterationsByJob* iterations);

}  // namespace lohan

#endif  // LOHAN_CLIENT_CTL_RUN_GROUPS_H_
