#include "metrics/prometheus_text.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

// One sample line read back as the format defines it (a strict reader: a
// line that is neither a comment nor a well-formed sample fails the test).
struct ParsedSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::optional<ParsedSample> ParseSample(const std::string& line) {
  ParsedSample sample;
  size_t i = 0;
  while (i < line.size() &&
         (std::isalnum(static_cast<unsigned char>(line[i])) != 0 ||
          line[i] == '_' || line[i] == ':')) {
    sample.name += line[i++];
  }
  if (sample.name.empty()) return std::nullopt;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      std::string label;
      while (i < line.size() && line[i] != '=') label += line[i++];
      if (i + 1 >= line.size() || line[i + 1] != '"') return std::nullopt;
      i += 2;
      std::string value;
      while (true) {
        if (i >= line.size()) return std::nullopt;
        const char c = line[i++];
        if (c == '"') break;
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i >= line.size()) return std::nullopt;
        const char escaped = line[i++];
        if (escaped == 'n') {
          value += '\n';
        } else if (escaped == '\\' || escaped == '"') {
          value += escaped;
        } else {
          return std::nullopt;
        }
      }
      if (!sample.labels.emplace(label, value).second) return std::nullopt;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return std::nullopt;
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return std::nullopt;
  const std::string number = line.substr(i + 1);
  if (number == "NaN") {
    sample.value = std::nan("");
  } else if (number == "+Inf" || number == "-Inf") {
    sample.value = number[0] == '+' ? INFINITY : -INFINITY;
  } else {
    char* end = nullptr;
    sample.value = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0') return std::nullopt;
  }
  return sample;
}

struct Parsed {
  std::vector<ParsedSample> samples;
  // Per family: its HELP and TYPE lines seen, and its type.
  std::map<std::string, int> helps, types;
  std::map<std::string, std::string> type_of;
  // Families in the order their TYPE lines came.
  std::vector<std::string> order;
};

Parsed Parse(const std::string& text) {
  Parsed parsed;
  EXPECT_TRUE(absl::EndsWith(text, "\n"));
  std::string current;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    const std::string l(line);
    if (absl::StartsWith(l, "# HELP ")) {
      const std::string name = l.substr(7, l.find(' ', 7) - 7);
      ++parsed.helps[name];
      current = name;
    } else if (absl::StartsWith(l, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(l, ' ');
      EXPECT_EQ(parts.size(), 4u) << l;
      if (parts.size() != 4) continue;
      ++parsed.types[parts[2]];
      parsed.type_of[parts[2]] = parts[3];
      parsed.order.push_back(parts[2]);
      EXPECT_EQ(parts[2], current) << "TYPE without its HELP before: " << l;
    } else {
      std::optional<ParsedSample> sample = ParseSample(l);
      EXPECT_TRUE(sample.has_value()) << "not a sample line: " << l;
      if (!sample) continue;
      EXPECT_EQ(sample->name, current)
          << "a sample outside its family's block: " << l;
      parsed.samples.push_back(*std::move(sample));
    }
  }
  return parsed;
}

// The value of `name` for job `job_id` (or the unlabelled one).
std::optional<double> Value(const Parsed& parsed, const std::string& name,
                            const std::string& job_id = "") {
  std::optional<double> found;
  for (const ParsedSample& sample : parsed.samples) {
    if (sample.name != name) continue;
    auto id = sample.labels.find("job_id");
    const std::string has = id == sample.labels.end() ? "" : id->second;
    if (has != job_id) continue;
    EXPECT_FALSE(found.has_value()) << name << " twice for '" << job_id << "'";
    found = sample.value;
  }
  return found;
}

v1::Job MakeJob(const std::string& id, const std::string& name, uint32_t uid,
                const std::string& owner, uint64_t ssd_bytes) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_name(name);
  job.set_owner_uid(uid);
  job.set_owner_name(owner);
  job.set_ssd_bytes(ssd_bytes);
  return job;
}

v1::GetStatusResponse TwoJobs() {
  v1::GetStatusResponse status;
  status.set_daemon_version("0.1.0");
  status.set_started_unix_seconds(1700000000);
  status.mutable_pool()->set_capacity_bytes(64ull << 30);
  status.mutable_pool()->set_used_bytes(3ull << 30);
  status.mutable_pool()->set_state_tier_bytes(16ull << 30);
  v1::SsdStatus* ssd = status.mutable_store()->add_ssds();
  ssd->set_path("/srv/nvme0");
  ssd->set_capacity_bytes(1ull << 40);
  ssd->set_used_bytes(123456789);
  ssd = status.mutable_store()->add_ssds();
  ssd->set_path("/srv/nvme1");
  ssd->set_capacity_bytes(1ull << 40);
  ssd->set_used_bytes(987654321);
  status.set_total_jobs(5);
  status.set_attached_jobs(2);
  status.set_data_planes(3);
  status.set_jobs_not_listed(1);
  status.mutable_optimizer()->set_busy_seconds(7.25);
  *status.add_jobs() = MakeJob("j-000001", "gpt-small", 1001, "alice", 4096);
  *status.add_jobs() = MakeJob("j-000002", "llama", 0, "root", 8192);
  // Alice's job gave way twice (its plane closed once), grew back once.
  status.mutable_jobs(0)->set_arena_shrink_asks(2);
  status.mutable_jobs(0)->set_arena_grow_asks(1);
  status.mutable_jobs(0)->set_planes_closed(1);
  v1::SessionStatus* session = status.add_sessions();
  session->set_job_id("j-000002");
  session->set_iteration(42);
  session->set_last_iteration_seconds(1.25);
  session->set_mean_iteration_seconds(0.1);
  session->set_ssd_read_bytes(11111111111);
  session->set_ssd_written_bytes(2222222222);
  session->set_host_update_bytes(33333333333);
  session->set_host_copied_bytes(444444444);
  session->set_arena_bytes(1ull << 30);
  session->set_wanted_arena_bytes(2ull << 30);
  session->set_state_tier_bytes(555555);
  session->set_optimizer_seconds(3.0e-3);
  return status;
}

const std::vector<std::string> kFamilies = {
    "lohan_build_info",
    "lohan_start_time_seconds",
    "lohan_pool_capacity_bytes",
    "lohan_pool_used_bytes",
    "lohan_ssd_capacity_bytes",
    "lohan_ssd_used_bytes",
    "lohan_state_tier_capacity_bytes",
    "lohan_jobs",
    "lohan_jobs_attached",
    "lohan_data_planes",
    "lohan_jobs_not_listed",
    "lohan_optimizer_seconds_total",
    "lohan_job_ssd_held_bytes",
    "lohan_job_arena_shrink_asks_total",
    "lohan_job_arena_grow_asks_total",
    "lohan_job_planes_closed_total",
    "lohan_job_steps_total",
    "lohan_job_last_step_seconds",
    "lohan_job_mean_step_seconds",
    "lohan_job_ssd_read_bytes_total",
    "lohan_job_ssd_written_bytes_total",
    "lohan_job_host_update_bytes_total",
    "lohan_job_host_copied_bytes_total",
    "lohan_job_arena_bytes",
    "lohan_job_wanted_arena_bytes",
    "lohan_job_state_tier_bytes",
    "lohan_job_optimizer_seconds_total",
};

TEST(PrometheusTextTest, EveryFamilyHasOneHelpAndOneTypeWhateverTheJobs) {
  v1::GetStatusResponse none;
  v1::GetStatusResponse many = TwoJobs();
  for (int i = 0; i < 3; ++i) {
    *many.add_sessions() = many.sessions(0);
    many.mutable_sessions(i + 1)->set_job_id("j-00000" + std::to_string(i + 3));
  }
  for (const v1::GetStatusResponse* status : {&none, &many}) {
    const Parsed parsed = Parse(RenderPrometheusText(*status));
    EXPECT_EQ(parsed.order, kFamilies);
    for (const std::string& family : kFamilies) {
      EXPECT_EQ(parsed.helps.at(family), 1) << family;
      EXPECT_EQ(parsed.types.at(family), 1) << family;
      // Prometheus's conventions: counters end in _total, nothing else
      // does.
      EXPECT_EQ(parsed.type_of.at(family),
                absl::EndsWith(family, "_total") ? "counter" : "gauge")
          << family;
    }
    for (const ParsedSample& sample : parsed.samples) {
      EXPECT_TRUE(parsed.types.count(sample.name)) << sample.name;
    }
  }
}

TEST(PrometheusTextTest, NumbersAreTheStatusGiven) {
  const v1::GetStatusResponse status = TwoJobs();
  const Parsed parsed = Parse(RenderPrometheusText(status));
  EXPECT_EQ(Value(parsed, "lohan_build_info"), 1.0);
  EXPECT_EQ(Value(parsed, "lohan_start_time_seconds"), 1700000000.0);
  EXPECT_EQ(Value(parsed, "lohan_pool_capacity_bytes"), 64.0 * (1 << 30));
  EXPECT_EQ(Value(parsed, "lohan_pool_used_bytes"), 3.0 * (1 << 30));
  EXPECT_EQ(Value(parsed, "lohan_state_tier_capacity_bytes"), 16.0 * (1 << 30));
  EXPECT_EQ(Value(parsed, "lohan_jobs"), 5.0);
  EXPECT_EQ(Value(parsed, "lohan_jobs_attached"), 2.0);
  EXPECT_EQ(Value(parsed, "lohan_data_planes"), 3.0);
  EXPECT_EQ(Value(parsed, "lohan_jobs_not_listed"), 1.0);
  EXPECT_EQ(Value(parsed, "lohan_optimizer_seconds_total"), 7.25);
  std::map<std::string, double> used, capacity;
  for (const ParsedSample& sample : parsed.samples) {
    if (sample.name == "lohan_ssd_used_bytes") {
      used[sample.labels.at("path")] = sample.value;
    }
    if (sample.name == "lohan_ssd_capacity_bytes") {
      capacity[sample.labels.at("path")] = sample.value;
    }
  }
  EXPECT_EQ(used, (std::map<std::string, double>{{"/srv/nvme0", 123456789},
                                                 {"/srv/nvme1", 987654321}}));
  EXPECT_EQ(capacity,
            (std::map<std::string, double>{{"/srv/nvme0", 1099511627776.0},
                                           {"/srv/nvme1", 1099511627776.0}}));

  EXPECT_EQ(Value(parsed, "lohan_job_ssd_held_bytes", "j-000001"), 4096.0);
  EXPECT_EQ(Value(parsed, "lohan_job_ssd_held_bytes", "j-000002"), 8192.0);
  // The share counts are the job's, whether or not it has a plane open:
  // every job listed has them, zeros included.
  EXPECT_EQ(Value(parsed, "lohan_job_arena_shrink_asks_total", "j-000001"),
            2.0);
  EXPECT_EQ(Value(parsed, "lohan_job_arena_grow_asks_total", "j-000001"), 1.0);
  EXPECT_EQ(Value(parsed, "lohan_job_planes_closed_total", "j-000001"), 1.0);
  for (const char* name :
       {"lohan_job_arena_shrink_asks_total", "lohan_job_arena_grow_asks_total",
        "lohan_job_planes_closed_total"}) {
    EXPECT_EQ(Value(parsed, name, "j-000002"), 0.0) << name;
  }
  const v1::SessionStatus& s = status.sessions(0);
  const std::map<std::string, double> expected = {
      {"lohan_job_steps_total", static_cast<double>(s.iteration())},
      {"lohan_job_last_step_seconds", s.last_iteration_seconds()},
      {"lohan_job_mean_step_seconds", s.mean_iteration_seconds()},
      {"lohan_job_ssd_read_bytes_total",
       static_cast<double>(s.ssd_read_bytes())},
      {"lohan_job_ssd_written_bytes_total",
       static_cast<double>(s.ssd_written_bytes())},
      {"lohan_job_host_update_bytes_total",
       static_cast<double>(s.host_update_bytes())},
      {"lohan_job_host_copied_bytes_total",
       static_cast<double>(s.host_copied_bytes())},
      {"lohan_job_arena_bytes", static_cast<double>(s.arena_bytes())},
      {"lohan_job_wanted_arena_bytes",
       static_cast<double>(s.wanted_arena_bytes())},
      {"lohan_job_state_tier_bytes", static_cast<double>(s.state_tier_bytes())},
      {"lohan_job_optimizer_seconds_total", s.optimizer_seconds()},
  };
  for (const auto& [name, value] : expected) {
    // Exactly: the text reads back as the very double.
    EXPECT_EQ(Value(parsed, name, "j-000002"), value) << name;
    // Only jobs with a data plane have session series.
    EXPECT_EQ(Value(parsed, name, "j-000001"), std::nullopt) << name;
  }
  // Every per-job sample names its job and owner.
  for (const ParsedSample& sample : parsed.samples) {
    if (!absl::StartsWith(sample.name, "lohan_job_")) continue;
    const std::string id = sample.labels.at("job_id");
    EXPECT_EQ(sample.labels.size(), 4u) << sample.name;
    EXPECT_EQ(sample.labels.at("job_name"),
              id == "j-000001" ? "gpt-small" : "llama");
    EXPECT_EQ(sample.labels.at("owner_uid"), id == "j-000001" ? "1001" : "0");
    EXPECT_EQ(sample.labels.at("owner"), id == "j-000001" ? "alice" : "root");
  }
}

TEST(PrometheusTextTest, AHostileNameCannotBreakTheFile) {
  // Quotes, a closing brace, newlines that would start new samples,
  // backslashes (one before a quote, one at the end) and a byte that is no
  // UTF-8.
  const std::string hostile =
      "evil\"} 1\nlohan_jobs 999\n# TYPE lohan_jobs counter\\\"x\\\xff";
  v1::GetStatusResponse status = TwoJobs();
  status.mutable_jobs(1)->mutable_spec()->set_name(hostile);
  status.mutable_jobs(1)->set_owner_name("o\\wner\n\"");
  status.mutable_store()->mutable_ssds(0)->set_path("/srv/\"}\n");
  const std::string text = RenderPrometheusText(status);
  const Parsed parsed = Parse(text);
  // Nothing was injected: the one lohan_jobs sample is the status's.
  EXPECT_EQ(parsed.types.at("lohan_jobs"), 1);
  EXPECT_EQ(Value(parsed, "lohan_jobs"), 5.0);
  EXPECT_EQ(parsed.order, kFamilies);
  // Each value reads back as given, the bad byte as U+FFFD.
  const std::string read_back =
      "evil\"} 1\nlohan_jobs 999\n# TYPE lohan_jobs counter\\\"x\\\xEF\xBF\xBD";
  int seen = 0;
  for (const ParsedSample& sample : parsed.samples) {
    if (sample.labels.count("job_id") &&
        sample.labels.at("job_id") == "j-000002") {
      EXPECT_EQ(sample.labels.at("job_name"), read_back) << sample.name;
      EXPECT_EQ(sample.labels.at("owner"), "o\\wner\n\"");
      ++seen;
    }
  }
  EXPECT_EQ(seen, 15);  // the four job families and the eleven session's
  EXPECT_THAT(text, HasSubstr("job_name=\"evil\\\"} 1\\nlohan_jobs 999\\n# "
                              "TYPE lohan_jobs counter\\\\\\\"x\\\\\xEF\xBF"
                              "\xBD\""));
  EXPECT_THAT(text, HasSubstr("lohan_ssd_used_bytes{path=\"/srv/\\\"}\\n\"} "
                              "123456789\n"));
}

TEST(PrometheusTextTest, LabelValuesAreEscapedAsTheFormatSays) {
  EXPECT_EQ(EscapeLabelValue("plain-name_1.x"), "plain-name_1.x");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(EscapeLabelValue("a\nb"), "a\\nb");
  // Valid UTF-8 passes; what is not becomes U+FFFD, byte by byte.
  EXPECT_EQ(EscapeLabelValue("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(EscapeLabelValue("a\xC3"), "a\xEF\xBF\xBD");
  EXPECT_EQ(EscapeLabelValue("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(EscapeLabelValue("\xED\xA0\x80"),  // a surrogate
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(PrometheusTextTest, SampleValuesReadBackExactly) {
  EXPECT_EQ(FormatSampleValue(0), "0");
  EXPECT_EQ(FormatSampleValue(123), "123");
  EXPECT_EQ(FormatSampleValue(68719476736.0), "68719476736");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatSampleValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatSampleValue(-INFINITY), "-Inf");
  for (double value : {1.0 / 3, 2.5e-9, 12345.678901234567, 1e300}) {
    EXPECT_EQ(std::strtod(FormatSampleValue(value).c_str(), nullptr), value);
  }
}

TEST(PrometheusTextTest, ASessionWhoseJobIsNotListedKeepsItsId) {
  v1::GetStatusResponse status = TwoJobs();
  status.mutable_sessions(0)->set_job_id("j-000009");
  const Parsed parsed = Parse(RenderPrometheusText(status));
  EXPECT_EQ(Value(parsed, "lohan_job_steps_total", "j-000009"), 42.0);
}

}  // namespace
}  // namespace lohan
