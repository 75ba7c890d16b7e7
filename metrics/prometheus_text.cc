#include "metrics/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

// The length of the valid UTF-8 sequence at the start of `text` (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF); 0 if none.
size_t Utf8SequenceLength(absl::string_view text) {
  const auto byte = [&text](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

// `text` as valid UTF-8 with `\`, newline and (in label values) `"`
// escaped.
std::string Escape(absl::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t length = Utf8SequenceLength(text);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for the byte that starts no sequence
      text.remove_prefix(1);
      continue;
    }
    if (length == 1) {
      const char c = text[0];
      if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '"' && quote) {
        out += "\\\"";
      } else {
        out += c;
      }
    } else {
      out.append(text.data(), length);
    }
    text.remove_prefix(length);
  }
  return out;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  double value = 0;
};

struct Family {
  const char* name;
  const char* type;  // "gauge" or "counter"
  const char* help;
  std::vector<Sample> samples;
};

void Append(std::string& out, const Family& family) {
  absl::StrAppend(&out, "# HELP ", family.name, " ",
                  Escape(family.help, /*quote=*/false), "\n# TYPE ",
                  family.name, " ", family.type, "\n");
  for (const Sample& sample : family.samples) {
    out += family.name;
    if (!sample.labels.empty()) {
      out += '{';
      for (size_t i = 0; i < sample.labels.size(); ++i) {
        absl::StrAppend(&out, i == 0 ? "" : ",", sample.labels[i].first, "=\"",
                        EscapeLabelValue(sample.labels[i].second), "\"");
      }
      out += '}';
    }
    absl::StrAppend(&out, " ", FormatSampleValue(sample.value), "\n");
  }
}

// A family with one unlabelled sample.
Family One(const char* name, const char* type, const char* help, double value) {
  return Family{name, type, help, {Sample{{}, value}}};
}

// The per-job families filled from a SessionStatus.
struct SessionFamily {
  Family family;
  double (*value)(const v1::SessionStatus&);
};

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  return Escape(value, /*quote=*/true);
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string RenderPrometheusText(const v1::GetStatusResponse& status) {
  std::vector<Family> families;
  families.push_back(
      Family{"lohan_build_info",
             "gauge",
             "lohand's version (the label); always 1.",
             {Sample{{{"version", status.daemon_version()}}, 1}}});
  families.push_back(One("lohan_start_time_seconds", "gauge",
                         "When lohand started, in seconds since the Unix "
                         "epoch.",
                         static_cast<double>(status.started_unix_seconds())));
  const v1::PoolStatus& pool = status.pool();
  families.push_back(One("lohan_pool_capacity_bytes", "gauge",
                         "The pinned host pool ([pool] host_pool_size).",
                         static_cast<double>(pool.capacity_bytes())));
  families.push_back(One("lohan_pool_used_bytes", "gauge",
                         "Host pool bytes the open data planes' arenas hold, "
                         "over every user.",
                         static_cast<double>(pool.used_bytes())));
  Family ssd_capacity{"lohan_ssd_capacity_bytes",
                      "gauge",
                      "Bytes lohand may use on each SSD path "
                      "([store] capacity_per_ssd).",
                      {}};
  Family ssd_used{"lohan_ssd_used_bytes",
                  "gauge",
                  "Bytes in use on each SSD path, over every job.",
                  {}};
  for (const v1::SsdStatus& ssd : status.store().ssds()) {
    ssd_capacity.samples.push_back(
        {{{"path", ssd.path()}}, static_cast<double>(ssd.capacity_bytes())});
    ssd_used.samples.push_back(
        {{{"path", ssd.path()}}, static_cast<double>(ssd.used_bytes())});
  }
  families.push_back(std::move(ssd_capacity));
  families.push_back(std::move(ssd_used));
  families.push_back(One("lohan_state_tier_capacity_bytes", "gauge",
                         "Host memory for jobs' optimizer states ([pool] "
                         "state_tier, resolved; 0: no tier).",
                         static_cast<double>(pool.state_tier_bytes())));
  families.push_back(One("lohan_jobs", "gauge",
                         "Jobs in lohand's registry, over every user.",
                         status.total_jobs()));
  families.push_back(One("lohan_jobs_attached", "gauge",
                         "Jobs a live process is attached to, over every "
                         "user.",
                         status.attached_jobs()));
  families.push_back(One("lohan_data_planes", "gauge",
                         "Open data planes (training processes), over every "
                         "user.",
                         status.data_planes()));
  families.push_back(One("lohan_jobs_not_listed", "gauge",
                         "Jobs left out of the per-job series (lohand reports "
                         "at most 256 jobs, the caller's own first).",
                         status.jobs_not_listed()));
  families.push_back(One("lohan_optimizer_seconds_total", "counter",
                         "Seconds the CPU optimizer spent on jobs' updates "
                         "since lohand started, over every job.",
                         status.optimizer().busy_seconds()));

  // Every per-job sample carries the same four labels.
  std::map<std::string, Labels> job_labels;
  Family ssd_held{"lohan_job_ssd_held_bytes",
                  "gauge",
                  "SSD bytes the job's tensors hold now (optimizer states, "
                  "16-bit copies, scratch, swapped activations).",
                  {}};
  Family shrink_asks{"lohan_job_arena_shrink_asks_total",
                     "counter",
                     "Times lohand asked the job to move to a smaller arena "
                     "for another user's share of the host pool, since "
                     "lohand started.",
                     {}};
  Family grow_asks{"lohan_job_arena_grow_asks_total",
                   "counter",
                   "Times lohand asked the job to move to a larger arena, "
                   "the pool having room again, since lohand started.",
                   {}};
  Family planes_closed{"lohan_job_planes_closed_total",
                       "counter",
                       "The job's data planes lohand closed to take host "
                       "pool or SSD space back for another user's share, "
                       "since lohand started.",
                       {}};
  for (const v1::Job& job : status.jobs()) {
    Labels labels = {{"job_id", job.id()},
                     {"job_name", job.spec().name()},
                     {"owner_uid", absl::StrCat(job.owner_uid())},
                     {"owner", job.owner_name()}};
    ssd_held.samples.push_back({labels, static_cast<double>(job.ssd_bytes())});
    shrink_asks.samples.push_back(
        {labels, static_cast<double>(job.arena_shrink_asks())});
    grow_asks.samples.push_back(
        {labels, static_cast<double>(job.arena_grow_asks())});
    planes_closed.samples.push_back(
        {labels, static_cast<double>(job.planes_closed())});
    job_labels[job.id()] = std::move(labels);
  }
  families.push_back(std::move(ssd_held));
  families.push_back(std::move(shrink_asks));
  families.push_back(std::move(grow_asks));
  families.push_back(std::move(planes_closed));

  SessionFamily per_session[] = {
      {{"lohan_job_steps_total",
        "counter",
        "Iterations (Adam steps) the job has committed.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.iteration());
       }},
      {{"lohan_job_last_step_seconds",
        "gauge",
        "The job's last iteration, ITER_BEGIN to the end of ITER_END.",
        {}},
       [](const v1::SessionStatus& s) { return s.last_iteration_seconds(); }},
      {{"lohan_job_mean_step_seconds",
        "gauge",
        "The job's mean iteration time since its data plane opened.",
        {}},
       [](const v1::SessionStatus& s) { return s.mean_iteration_seconds(); }},
      {{"lohan_job_ssd_read_bytes_total",
        "counter",
        "Bytes the job read from the SSDs since its data plane opened.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.ssd_read_bytes());
       }},
      {{"lohan_job_ssd_written_bytes_total",
        "counter",
        "Bytes the job wrote to the SSDs since its data plane opened.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.ssd_written_bytes());
       }},
      {{"lohan_job_host_update_bytes_total",
        "counter",
        "Host memory bytes the job's updates read and wrote since its data "
        "plane opened.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.host_update_bytes());
       }},
      {{"lohan_job_host_copied_bytes_total",
        "counter",
        "Host memory bytes lohand copied to run the job's updates since its "
        "data plane opened.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.host_copied_bytes());
       }},
      {{"lohan_job_arena_bytes",
        "gauge",
        "Host pool bytes the job's data plane holds (its arena).",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.arena_bytes());
       }},
      {{"lohan_job_wanted_arena_bytes",
        "gauge",
        "The arena the job asks for (more than it holds when it opened "
        "at what the pool had free).",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.wanted_arena_bytes());
       }},
      {{"lohan_job_state_tier_bytes",
        "gauge",
        "Bytes of the job's optimizer states the state tier holds copies "
        "of in RAM.",
        {}},
       [](const v1::SessionStatus& s) {
         return static_cast<double>(s.state_tier_bytes());
       }},
      {{"lohan_job_optimizer_seconds_total",
        "counter",
        "Seconds the job's updates spent in the CPU optimizer since its "
        "data plane opened.",
        {}},
       [](const v1::SessionStatus& s) { return s.optimizer_seconds(); }},
  };
  for (const v1::SessionStatus& session : status.sessions()) {
    auto labels = job_labels.find(session.job_id());
    const Labels& with = labels != job_labels.end()
                             ? labels->second
                             : Labels{{"job_id", session.job_id()},
                                      {"job_name", ""},
                                      {"owner_uid", ""},
                                      {"owner", ""}};
    for (SessionFamily& entry : per_session) {
      entry.family.samples.push_back({with, entry.value(session)});
    }
  }
  for (SessionFamily& entry : per_session) {
    families.push_back(std::move(entry.family));
  }

  std::string out;
  for (const Family& family : families) Append(out, family);
  return out;
}

}  // namespace lohan
