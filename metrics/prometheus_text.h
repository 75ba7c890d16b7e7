#ifndef LOHAN_METRICS_PROMETHEUS_TEXT_H_
#define LOHAN_METRICS_PROMETHEUS_TEXT_H_

// lohand's status as Prometheus metrics: the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), which
// node_exporter's textfile collector reads from a *.prom file and
// `lohanctl metrics` prints. A pure function of a GetStatusResponse: whom
// it names is whom the status names (every job for root, the caller's own
// otherwise), so the caller's visibility is the daemon's.

#include <string>

#include "absl/strings/string_view.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The text for `status`: each family's HELP and TYPE lines once, then its
// samples; no timestamps (the textfile collector refuses them). Families
// (labels in braces):
//   daemon-wide  lohan_build_info{version} 1, lohan_start_time_seconds,
//                lohan_pool_capacity_bytes, lohan_pool_used_bytes,
//                lohan_ssd_capacity_bytes{path}, lohan_ssd_used_bytes{path},
//                lohan_state_tier_capacity_bytes, lohan_jobs,
//                lohan_jobs_attached, lohan_data_planes,
//                lohan_jobs_not_listed, lohan_optimizer_seconds_total
//   per job      (labels job_id, job_name, owner_uid, owner)
//                every job listed: lohan_job_ssd_held_bytes,
//                lohan_job_arena_shrink_asks_total,
//                lohan_job_arena_grow_asks_total,
//                lohan_job_planes_closed_total; and for a job with an open
//                data plane: lohan_job_steps_total,
//                lohan_job_last_step_seconds, lohan_job_mean_step_seconds,
//                lohan_job_ssd_read_bytes_total,
//                lohan_job_ssd_written_bytes_total,
//                lohan_job_host_update_bytes_total,
//                lohan_job_host_copied_bytes_total, lohan_job_arena_bytes,
//                lohan_job_wanted_arena_bytes, lohan_job_state_tier_bytes,
//                lohan_job_optimizer_seconds_total
// A family with no sample (no job has a data plane) still has its HELP and
// TYPE. Label values are escaped as the format asks (backslash, double
// quote, newline) and made valid UTF-8 (a bad byte becomes U+FFFD), so no
// value from a user, a path or a name can end a line or a label early.
std::string RenderPrometheusText(const v1::GetStatusResponse& status);

// A label value as the format writes it between its double quotes.
std::string EscapeLabelValue(absl::string_view value);

// A sample value: integers exactly, other numbers in the shortest form that
// reads back as the same double; NaN, +Inf and -Inf as the format spells
// them.
std::string FormatSampleValue(double value);

}  // namespace lohan

#endif  // LOHAN_METRICS_PROMETHEUS_TEXT_H_
