#include "daemon/config/config.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/common/check.h"
#include "daemon/config/embedded_default_config.h"
#include "daemon/optim/tuning.h"
#include "layout/byte_size.h"
#include "layout/durability.h"

// Header-only toml++ with exceptions off: errors come back as values.
#define TOML_EXCEPTIONS 0
#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>

namespace lohan {
namespace {

constexpr const char* kLogLevels[] = {"trace", "debug",    "info", "warn",
                                      "error", "critical", "off"};
constexpr const char* kOptimizerIsas[] = {"auto", "avx512", "avx2", "scalar"};
// sockaddr_un.sun_path holds 108 bytes including the terminating NUL, and
// the data-plane socket adds ".data".
constexpr char kDataSocketSuffix[] = ".data";
constexpr size_t kMaxSocketPathLength = 107 - (sizeof(kDataSocketSuffix) - 1);
constexpr uint32_t kMaxOptimizerThreads = 1024;
// A data plane's rings: enough for a few requests in flight, at most what
// the arena's control allowance holds (layout/arena_bytes.h).
constexpr int64_t kMinRingEntries = 8;
constexpr int64_t kMaxRingEntries = 1024;

std::string Where(absl::string_view origin, const toml::node& node) {
  return absl::StrCat(origin, ":", node.source().begin.line);
}

absl::Status BadValue(absl::string_view origin, const toml::node& node,
                      absl::string_view key, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(Where(origin, node), ": key '",
                                                 key, "' must be ", expected));
}

using Setter = std::function<absl::Status(
    const toml::node&, absl::string_view origin, DaemonConfig&)>;

absl::StatusOr<std::string> StringValue(const toml::node& node,
                                        absl::string_view origin,
                                        absl::string_view key) {
  std::optional<std::string> value = node.value_exact<std::string>();
  if (!value) return BadValue(origin, node, key, "a string");
  return *value;
}

Setter StringSetter(std::string DaemonConfig::*field, const char* key) {
  return [field, key](const toml::node& node, absl::string_view origin,
                      DaemonConfig& config) -> absl::Status {
    absl::StatusOr<std::string> value = StringValue(node, origin, key);
    if (!value.ok()) return value.status();
    config.*field = *value;
    return absl::OkStatus();
  };
}

// A byte size: an integer, or a string with units ("8GiB").
absl::StatusOr<uint64_t> SizeValue(const toml::node& node,
                                   absl::string_view origin,
                                   absl::string_view key) {
  if (std::optional<int64_t> as_int = node.value_exact<int64_t>()) {
    if (*as_int < 0) return BadValue(origin, node, key, "a non-negative size");
    return static_cast<uint64_t>(*as_int);
  }
  std::optional<std::string> as_text = node.value_exact<std::string>();
  if (!as_text) {
    return BadValue(origin, node, key,
                    "a size such as \"8GiB\" or a byte count");
  }
  absl::StatusOr<uint64_t> bytes = ParseByteSize(*as_text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(origin, node), ": key '", key, "': ", bytes.status().message()));
  }
  return *bytes;
}

Setter SizeSetter(uint64_t DaemonConfig::*field, const char* key) {
  return [field, key](const toml::node& node, absl::string_view origin,
                      DaemonConfig& config) -> absl::Status {
    absl::StatusOr<uint64_t> bytes = SizeValue(node, origin, key);
    if (!bytes.ok()) return bytes.status();
    config.*field = *bytes;
    return absl::OkStatus();
  };
}

// A size, or "auto" (the field unset: sized to the machine later). `zero`
// says what 0 means, for the error.
Setter AutoOrSizeSetter(std::optional<uint64_t> DaemonConfig::*field,
                        const char* key, const char* zero) {
  return [field, key, zero](const toml::node& node, absl::string_view origin,
                            DaemonConfig& config) -> absl::Status {
    if (node.value_exact<std::string>() == std::optional<std::string>("auto")) {
      (config.*field).reset();
      return absl::OkStatus();
    }
    absl::StatusOr<uint64_t> bytes = SizeValue(node, origin, key);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(bytes.status().message(),
                                                     "; use a size, 0 (", zero,
                                                     ") or \"auto\""));
    }
    config.*field = *bytes;
    return absl::OkStatus();
  };
}

Setter IntegerSetter(uint32_t DaemonConfig::*field, const char* key,
                     int64_t min, int64_t max) {
  return
      [field, key, min, max](const toml::node& node, absl::string_view origin,
                             DaemonConfig& config) -> absl::Status {
        std::optional<int64_t> value = node.value_exact<int64_t>();
        if (!value || *value < min || *value > max) {
          return BadValue(origin, node, key,
                          absl::StrCat("an integer from ", min, " to ", max));
        }
        config.*field = static_cast<uint32_t>(*value);
        return absl::OkStatus();
      };
}

// A per-user limit (UserLimits field) in [quotas] or [quotas.user.NAME]: a
// count (0 = no limit) or, for sizes, a byte size.
template <typename T>
absl::StatusOr<T> LimitValue(const toml::node& node, absl::string_view origin,
                             absl::string_view key) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    return SizeValue(node, origin, key);
  } else {
    std::optional<int64_t> value = node.value_exact<int64_t>();
    if (!value || *value < 0 || *value > (int64_t{1} << 31)) {
      return BadValue(origin, node, key,
                      "a count from 0 (no limit) to 2147483648");
    }
    return static_cast<T>(*value);
  }
}

// The keys a [quotas] section (or a user's) may hold.
struct LimitKey {
  const char* name;
  absl::Status (*set)(const toml::node&, absl::string_view origin,
                      const std::string& key, UserLimitOverrides&);
};
template <typename T, std::optional<T> UserLimitOverrides::*field>
absl::Status SetLimit(const toml::node& node, absl::string_view origin,
                      const std::string& key, UserLimitOverrides& limits) {
  absl::StatusOr<T> value = LimitValue<T>(node, origin, key);
  if (!value.ok()) return value.status();
  limits.*field = *value;
  return absl::OkStatus();
}
constexpr LimitKey kLimitKeys[] = {
    {"jobs", SetLimit<uint32_t, &UserLimitOverrides::jobs>},
    {"data_planes", SetLimit<uint32_t, &UserLimitOverrides::data_planes>},
    {"control_connections",
     SetLimit<uint32_t, &UserLimitOverrides::control_connections>},
    {"host_pool", SetLimit<uint64_t, &UserLimitOverrides::host_pool_bytes>},
    {"ssd", SetLimit<uint64_t, &UserLimitOverrides::ssd_bytes>},
    {"daemon_memory",
     SetLimit<uint64_t, &UserLimitOverrides::daemon_memory_bytes>},
    {"state_tier", SetLimit<uint64_t, &UserLimitOverrides::state_tier_bytes>},
    {"weight", SetLimit<uint32_t, &UserLimitOverrides::weight>},
};

// Applies the limit keys of `table` (a [quotas...] section, named `section`)
// to `limits`; the keys named in `skip` are left to the caller.
absl::Status ParseLimits(const toml::table& table, absl::string_view origin,
                         const std::string& section, UserLimitOverrides& limits,
                         const std::set<std::string>& skip = {}) {
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    if (skip.count(name) != 0) continue;
    const std::string full_key = absl::StrCat(section, ".", name);
    const LimitKey* found = nullptr;
    for (const LimitKey& limit : kLimitKeys) {
      if (name == limit.name) found = &limit;
    }
    if (found == nullptr) {
      std::vector<std::string> known;
      for (const LimitKey& limit : kLimitKeys) known.push_back(limit.name);
      return absl::InvalidArgumentError(absl::StrCat(
          Where(origin, node), ": unknown key '", full_key,
          "' (a quota section holds: ", absl::StrJoin(known, ", "), ")"));
    }
    if (absl::Status set = found->set(node, origin, full_key, limits);
        !set.ok()) {
      return set;
    }
    if (name == "weight" && (*limits.weight < 1 || *limits.weight > 1000)) {
      return BadValue(origin, node, full_key, "an integer from 1 to 1000");
    }
  }
  return absl::OkStatus();
}

// A [quotas] duration key: a string such as "90s" or "10m", from 0 to
// kMaxReclaimDuration.
absl::Status SetReclaimDuration(const toml::node& node,
                                absl::string_view origin, absl::string_view key,
                                absl::Duration& out) {
  const std::string expected = absl::StrCat(
      "a duration from \"0s\" (none) to \"",
      absl::FormatDuration(kMaxReclaimDuration), "\", such as \"10m\"");
  std::optional<std::string> text = node.value_exact<std::string>();
  absl::Duration value;
  if (!text || !absl::ParseDuration(*text, &value) ||
      value < absl::ZeroDuration() || value > kMaxReclaimDuration) {
    return BadValue(origin, node, key, expected);
  }
  out = value;
  return absl::OkStatus();
}

// [pool] durable_every: "auto", or a duration from 1s to
// kMaxDurableEverySeconds, such as "10m"; the jobs' durability by time
// (commit_interval then 0).
absl::Status SetDurableEvery(const toml::node& node, absl::string_view origin,
                             DaemonConfig& config) {
  std::optional<std::string> text = node.value_exact<std::string>();
  absl::Duration value;
  if (text && *text == "auto") {
    config.durable_every = absl::Seconds(kAutoDurableEverySeconds);
    config.durable_write_share = kAutoDurableWriteShare;
  } else if (!text || !absl::ParseDuration(*text, &value) ||
             value < absl::Seconds(1) ||
             value > absl::Seconds(kMaxDurableEverySeconds)) {
    return BadValue(origin, node, "pool.durable_every",
                    "\"auto\" (the default: every minute, less often when "
                    "durable writes would take over a tenth of the time) or "
                    "a duration from \"1s\" to \"168h\" (7 days), such as "
                    "\"10m\": how much training a crash of lohand may lose");
  } else {
    config.durable_every = value;
    config.durable_write_share = 0.0;
  }
  config.commit_interval = 0;
  return absl::OkStatus();
}

// A file states the jobs' durability by steps or by time, not both; the
// form it states replaces the other.
absl::Status CheckDurabilityForms(const toml::table& root,
                                  absl::string_view origin,
                                  DaemonConfig& config) {
  const toml::table* pool = root["pool"].as_table();
  if (pool == nullptr) return absl::OkStatus();
  const toml::node* steps = pool->get("commit_interval");
  const toml::node* time = pool->get("durable_every");
  if (steps != nullptr && time != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(origin, *time),
        ": keys 'pool.commit_interval' and 'pool.durable_every' both set; "
        "durability is by steps or by time: keep one"));
  }
  if (steps != nullptr) {
    config.durable_every = absl::ZeroDuration();
    config.durable_write_share = 0.0;
  }
  return absl::OkStatus();
}

// [jobs] keep_ended: "0s" (never), or a duration from kMinKeepEnded to
// kMaxKeepEnded: whole days as "7d", else as absl::ParseDuration reads it
// ("36h", "90m").
absl::Status SetKeepEnded(const toml::node& node, absl::string_view origin,
                          DaemonConfig& config) {
  std::optional<std::string> text = node.value_exact<std::string>();
  absl::Duration value;
  bool parsed = false;
  if (text && text->size() > 1 && text->back() == 'd') {
    int64_t days = 0;
    parsed = absl::SimpleAtoi(text->substr(0, text->size() - 1), &days);
    value = absl::Hours(24) * days;
  } else if (text) {
    parsed = absl::ParseDuration(*text, &value);
  }
  if (!parsed || (value != absl::ZeroDuration() &&
                  (value < kMinKeepEnded || value > kMaxKeepEnded))) {
    return BadValue(origin, node, "jobs.keep_ended",
                    "\"0s\" (ended jobs are deleted by hand only) or a "
                    "duration from \"1s\" to \"3650d\", such as \"7d\" "
                    "or \"36h\"");
  }
  config.keep_ended = value;
  return absl::OkStatus();
}

// The daemon-wide keys of [quotas] (not per user): the reclaim limits.
struct ReclaimKey {
  const char* name;
  absl::Duration DaemonConfig::*field;
};
constexpr ReclaimKey kReclaimKeys[] = {
    {"reclaim_interval", &DaemonConfig::reclaim_interval},
    {"reclaim_grace", &DaemonConfig::reclaim_grace},
    {"regrow_after", &DaemonConfig::regrow_after},
};

// [quotas] itself, and its [quotas.user.NAME] tables.
absl::Status ParseQuotas(const toml::table& quotas, absl::string_view origin,
                         DaemonConfig& config) {
  for (const ReclaimKey& reclaim : kReclaimKeys) {
    const toml::node* node = quotas.get(reclaim.name);
    if (node == nullptr) continue;
    if (absl::Status set = SetReclaimDuration(
            *node, origin, absl::StrCat("quotas.", reclaim.name),
            config.*reclaim.field);
        !set.ok()) {
      return set;
    }
  }
  for (const auto& [key, node] : quotas) {
    if (key.str() != "user") continue;
    const toml::table* users = node.as_table();
    if (users == nullptr) {
      return BadValue(origin, node, "quotas.user",
                      "tables, one per user: [quotas.user.NAME]");
    }
    for (const auto& [user, limits] : *users) {
      const toml::table* table = limits.as_table();
      const std::string section =
          absl::StrCat("quotas.user.", std::string(user.str()));
      if (table == nullptr) {
        return BadValue(origin, limits, section, "a table of limits");
      }
      UserLimitOverrides& overrides =
          config.quota_users[std::string(user.str())];
      if (absl::Status parsed = ParseLimits(*table, origin, section, overrides);
          !parsed.ok()) {
        return parsed;
      }
    }
  }
  UserLimitOverrides defaults;
  if (absl::Status parsed = ParseLimits(
          quotas, origin, "quotas", defaults,
          /*skip=*/
          {"user", "reclaim_interval", "reclaim_grace", "regrow_after"});
      !parsed.ok()) {
    return parsed;
  }
  config.quota_defaults = defaults.Over(config.quota_defaults);
  return absl::OkStatus();
}

Setter BoolSetter(bool DaemonConfig::*field, const char* key) {
  return [field, key](const toml::node& node, absl::string_view origin,
                      DaemonConfig& config) -> absl::Status {
    std::optional<bool> value = node.value_exact<bool>();
    if (!value) return BadValue(origin, node, key, "true or false");
    config.*field = *value;
    return absl::OkStatus();
  };
}

// Keys by "section.name", each with the code that stores its value.
const std::map<std::string, Setter>& KeySetters() {
  static const auto* setters = new std::map<std::string, Setter>{
      {"daemon.socket",
       StringSetter(&DaemonConfig::socket_path, "daemon.socket")},
      {"daemon.state_dir",
       StringSetter(&DaemonConfig::state_dir, "daemon.state_dir")},
      {"daemon.log_level",
       StringSetter(&DaemonConfig::log_level, "daemon.log_level")},
      {"daemon.control_idle_timeout",
       IntegerSetter(&DaemonConfig::control_idle_timeout_seconds,
                     "daemon.control_idle_timeout", 1, 86400)},
      {"store.ssd_paths",
       [](const toml::node& node, absl::string_view origin,
          DaemonConfig& config) -> absl::Status {
         const toml::array* array = node.as_array();
         if (array == nullptr) {
           return BadValue(origin, node, "store.ssd_paths",
                           "an array of strings");
         }
         std::vector<std::string> paths;
         for (const toml::node& element : *array) {
           absl::StatusOr<std::string> path =
               StringValue(element, origin, "store.ssd_paths");
           if (!path.ok()) {
             return BadValue(origin, element, "store.ssd_paths",
                             "an array of strings");
           }
           paths.push_back(*path);
         }
         config.ssd_paths = std::move(paths);
         return absl::OkStatus();
       }},
      {"store.capacity_per_ssd",
       SizeSetter(&DaemonConfig::ssd_capacity_bytes, "store.capacity_per_ssd")},
      {"store.stripe_unit",
       SizeSetter(&DaemonConfig::stripe_unit_bytes, "store.stripe_unit")},
      {"store.block_size", IntegerSetter(&DaemonConfig::block_size,
                                         "store.block_size", 512, 1 << 20)},
      {"store.queue_depth",
       IntegerSetter(&DaemonConfig::queue_depth, "store.queue_depth", 1, 1024)},
      {"store.gate_unit",
       SizeSetter(&DaemonConfig::gate_unit_bytes, "store.gate_unit")},
      {"store.allow_buffered_io",
       BoolSetter(&DaemonConfig::allow_buffered_io, "store.allow_buffered_io")},
      {"store.profile_probe",
       SizeSetter(&DaemonConfig::profile_probe_bytes, "store.profile_probe")},
      {"pool.host_pool_size",
       SizeSetter(&DaemonConfig::host_pool_bytes, "pool.host_pool_size")},
      {"pool.state_tier", AutoOrSizeSetter(&DaemonConfig::state_tier_bytes,
                                           "pool.state_tier", "no tier")},
      {"pool.state_tier_updates",
       StringSetter(&DaemonConfig::state_tier_updates,
                    "pool.state_tier_updates")},
      {"pool.durable_every", SetDurableEvery},
      {"pool.commit_interval",
       IntegerSetter(&DaemonConfig::commit_interval, "pool.commit_interval", 1,
                     kMaxCommitInterval)},
      {"pool.ring_entries",
       [](const toml::node& node, absl::string_view origin,
          DaemonConfig& config) -> absl::Status {
         std::optional<int64_t> value = node.value_exact<int64_t>();
         if (!value || *value < kMinRingEntries || *value > kMaxRingEntries ||
             (*value & (*value - 1)) != 0) {
           return BadValue(origin, node, "pool.ring_entries",
                           absl::StrCat("a power of two from ", kMinRingEntries,
                                        " to ", kMaxRingEntries));
         }
         config.ring_entries = static_cast<uint32_t>(*value);
         return absl::OkStatus();
       }},
      {"optimizer.threads",
       IntegerSetter(&DaemonConfig::optimizer_threads, "optimizer.threads", 0,
                     kMaxOptimizerThreads)},
      {"optimizer.isa",
       StringSetter(&DaemonConfig::optimizer_isa, "optimizer.isa")},
      {"optimizer.tuning",
       StringSetter(&DaemonConfig::optimizer_tuning, "optimizer.tuning")},
      {"optimizer.read_ahead",
       AutoOrSizeSetter(&DaemonConfig::optimizer_read_ahead_bytes,
                        "optimizer.read_ahead", "no read-ahead")},
      {"jobs.keep_ended", SetKeepEnded},
      {"metrics.textfile",
       StringSetter(&DaemonConfig::metrics_textfile, "metrics.textfile")},
      {"metrics.interval",
       [](const toml::node& node, absl::string_view origin,
          DaemonConfig& config) -> absl::Status {
         std::optional<std::string> text = node.value_exact<std::string>();
         absl::Duration value;
         if (!text || !absl::ParseDuration(*text, &value) ||
             value < kMinMetricsInterval || value > kMaxMetricsInterval) {
           return BadValue(
               origin, node, "metrics.interval",
               absl::StrCat("a duration from \"",
                            absl::FormatDuration(kMinMetricsInterval),
                            "\" to \"",
                            absl::FormatDuration(kMaxMetricsInterval),
                            "\", such as \"15s\""));
         }
         config.metrics_interval = value;
         return absl::OkStatus();
       }},
  };
  return *setters;
}

}  // namespace

DaemonConfig DefaultConfig() {
  absl::StatusOr<DaemonConfig> config = ParseConfigToml(
      kEmbeddedDefaultConfigToml, "<built-in lohand.toml>", DaemonConfig{});
  // The embedded file is ours and tested; failing here is a build bug.
  LOHAN_CHECK(config.ok());
  return *std::move(config);
}

absl::StatusOr<DaemonConfig> ParseConfigToml(absl::string_view text,
                                             absl::string_view origin,
                                             const DaemonConfig& base) {
  toml::parse_result parsed =
      toml::parse(std::string_view(text.data(), text.size()),
                  std::string_view(origin.data(), origin.size()));
  if (!parsed) {
    const toml::parse_error& error = parsed.error();
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", error.source().begin.line, ":",
                     error.source().begin.column,
                     ": not valid TOML: ", std::string(error.description())));
  }
  DaemonConfig config = base;
  const toml::table& root = parsed.table();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* section_table = section_node.as_table();
    if (section_table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(origin, section_node), ": unknown key '", section,
          "' (keys live in the sections [daemon], [store], [pool], "
          "[optimizer], [quotas], [metrics], [jobs])"));
    }
    if (section == "quotas") {
      if (absl::Status parsed = ParseQuotas(*section_table, origin, config);
          !parsed.ok()) {
        return parsed;
      }
      continue;
    }
    for (const auto& [key, node] : *section_table) {
      const std::string full_key =
          absl::StrCat(section, ".", std::string(key.str()));
      auto setter = KeySetters().find(full_key);
      if (setter == KeySetters().end()) {
        std::vector<std::string> known;
        for (const auto& [name, unused] : KeySetters()) known.push_back(name);
        return absl::InvalidArgumentError(
            absl::StrCat(Where(origin, node), ": unknown key '", full_key,
                         "' (known keys: ", absl::StrJoin(known, ", "), ")"));
      }
      if (absl::Status status = setter->second(node, origin, config);
          !status.ok()) {
        return status;
      }
    }
  }
  if (absl::Status forms = CheckDurabilityForms(root, origin, config);
      !forms.ok()) {
    return forms;
  }
  return config;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file '", path, "'"));
  }
  std::stringstream text;
  text << file.rdbuf();
  return ParseConfigToml(text.str(), path, DefaultConfig());
}

namespace {

// A size flag given as text ("64GiB") into `out`; nothing when not given.
absl::Status SetSize(const std::optional<std::string>& text, const char* flag,
                     uint64_t& out) {
  if (!text) return absl::OkStatus();
  absl::StatusOr<uint64_t> bytes = ParseByteSize(*text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag ", flag, ": ", bytes.status().message()));
  }
  out = *bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyOverrides(const ConfigOverrides& overrides,
                            DaemonConfig& config) {
  if (overrides.socket_path) config.socket_path = *overrides.socket_path;
  if (overrides.state_dir) config.state_dir = *overrides.state_dir;
  if (overrides.log_level) config.log_level = *overrides.log_level;
  if (overrides.ssd_paths) config.ssd_paths = *overrides.ssd_paths;
  if (absl::Status set = SetSize(overrides.ssd_capacity, "--ssd-capacity",
                                 config.ssd_capacity_bytes);
      !set.ok()) {
    return set;
  }
  if (absl::Status set = SetSize(overrides.host_pool_size, "--host-pool-size",
                                 config.host_pool_bytes);
      !set.ok()) {
    return set;
  }
  if (overrides.state_tier == std::optional<std::string>("auto")) {
    config.state_tier_bytes.reset();
  } else if (overrides.state_tier) {
    uint64_t bytes = 0;
    if (absl::Status set = SetSize(overrides.state_tier, "--state-tier", bytes);
        !set.ok()) {
      return set;
    }
    config.state_tier_bytes = bytes;
  }
  if (absl::Status set = SetSize(overrides.profile_probe, "--profile-probe",
                                 config.profile_probe_bytes);
      !set.ok()) {
    return set;
  }
  if (overrides.ring_entries) {
    const int64_t entries = *overrides.ring_entries;
    if (entries < kMinRingEntries || entries > kMaxRingEntries ||
        (entries & (entries - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --ring-entries must be a power of two from ", kMinRingEntries,
          " to ", kMaxRingEntries, "; got ", entries));
    }
    config.ring_entries = static_cast<uint32_t>(*overrides.ring_entries);
  }
  if (overrides.optimizer_threads) {
    if (*overrides.optimizer_threads < 0 ||
        *overrides.optimizer_threads > kMaxOptimizerThreads) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --optimizer-threads must be from 0 (auto) to ",
                       kMaxOptimizerThreads));
    }
    config.optimizer_threads =
        static_cast<uint32_t>(*overrides.optimizer_threads);
  }
  if (overrides.optimizer_tuning) {
    const std::string& value = *overrides.optimizer_tuning;
    if (value != "auto" && value != "default") {
      if (absl::StatusOr<KernelTuning> tuning = ParseTuning(value);
          !tuning.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --optimizer-tuning: ", tuning.status().message(),
            "; or use auto (timed at the first start) or default"));
      }
    }
    config.optimizer_tuning = value;
  }
  return absl::OkStatus();
}

namespace {

// [metrics]: off, or a file node_exporter's textfile collector reads (it
// takes only "*.prom"; lohand's temporary file beside it is "*.prom.tmp").
absl::Status ValidateMetrics(const DaemonConfig& config) {
  const std::string& path = config.metrics_textfile;
  if (path.empty()) return absl::OkStatus();
  constexpr absl::string_view kSuffix = ".prom";
  const size_t slash = path.rfind('/');
  if (path[0] != '/' || slash == std::string::npos ||
      path.size() - slash - 1 <= kSuffix.size() ||
      !absl::EndsWith(path, kSuffix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'metrics.textfile' must be an absolute path to a file named "
        "*.prom (node_exporter's textfile collector reads only those), "
        "e.g. /var/lib/node_exporter/textfile_collector/lohan.prom, or "
        "\"\" for none; got '",
        path, "'"));
  }
  if (config.metrics_interval < kMinMetricsInterval ||
      config.metrics_interval > kMaxMetricsInterval) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'metrics.interval' must be from ",
                     absl::FormatDuration(kMinMetricsInterval), " to ",
                     absl::FormatDuration(kMaxMetricsInterval), "; got ",
                     absl::FormatDuration(config.metrics_interval)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const DaemonConfig& config) {
  auto require_absolute = [](absl::string_view key,
                             const std::string& path) -> absl::Status {
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", key, "' must be an absolute path, got '", path, "'"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = require_absolute("daemon.socket", config.socket_path);
      !s.ok()) {
    return s;
  }
  if (config.socket_path.size() > kMaxSocketPathLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'daemon.socket' is ", config.socket_path.size(),
                     " characters long; a unix socket path holds at most ",
                     kMaxSocketPathLength));
  }
  if (absl::Status s = require_absolute("daemon.state_dir", config.state_dir);
      !s.ok()) {
    return s;
  }
  if (std::find(std::begin(kLogLevels), std::end(kLogLevels),
                config.log_level) == std::end(kLogLevels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'daemon.log_level' is '", config.log_level,
                     "'; use one of: ", absl::StrJoin(kLogLevels, ", ")));
  }
  if (config.ssd_paths.empty()) {
    return absl::InvalidArgumentError(
        "key 'store.ssd_paths' is empty; name at least one SSD directory");
  }
  std::set<std::string> seen;
  for (const std::string& path : config.ssd_paths) {
    if (absl::Status s = require_absolute("store.ssd_paths", path); !s.ok()) {
      return s;
    }
    if (!seen.insert(path).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key 'store.ssd_paths' names '", path, "' more than once"));
    }
  }
  if (config.ssd_capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        "key 'store.capacity_per_ssd' must be more than 0");
  }
  if ((config.block_size & (config.block_size - 1)) != 0 ||
      config.block_size < 512) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'store.block_size' must be a power of two, at least 512; got ",
        config.block_size));
  }
  if (config.stripe_unit_bytes == 0 ||
      config.stripe_unit_bytes % config.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'store.stripe_unit' must be a positive multiple of "
                     "store.block_size (",
                     config.block_size, "); got ", config.stripe_unit_bytes));
  }
  if (config.ssd_capacity_bytes < config.stripe_unit_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'store.capacity_per_ssd' (",
                     FormatByteSize(config.ssd_capacity_bytes),
                     ") is smaller than one stripe unit (",
                     FormatByteSize(config.stripe_unit_bytes), ")"));
  }
  if ((config.ring_entries & (config.ring_entries - 1)) != 0 ||
      config.ring_entries < kMinRingEntries ||
      config.ring_entries > kMaxRingEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'pool.ring_entries' must be a power of two from ", kMinRingEntries,
        " to ", kMaxRingEntries, "; got ", config.ring_entries));
  }
  if (config.host_pool_bytes == 0) {
    // A pool nothing fits in: every job would be refused.
    return absl::InvalidArgumentError(
        "key 'pool.host_pool_size' must be more than 0");
  }
  if (config.state_tier_updates != "in_place" &&
      config.state_tier_updates != "copy") {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'pool.state_tier_updates' is '", config.state_tier_updates,
        "'; use one of: in_place, copy"));
  }
  if (std::find(std::begin(kOptimizerIsas), std::end(kOptimizerIsas),
                config.optimizer_isa) == std::end(kOptimizerIsas)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key 'optimizer.isa' is '", config.optimizer_isa,
                     "'; use one of: ", absl::StrJoin(kOptimizerIsas, ", ")));
  }
  if (config.optimizer_tuning != "auto" &&
      config.optimizer_tuning != "default") {
    if (absl::StatusOr<KernelTuning> tuning =
            ParseTuning(config.optimizer_tuning);
        !tuning.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key 'optimizer.tuning': ", tuning.status().message(),
                       "; or use auto (timed at the first start) or default"));
    }
  }
  if (config.optimizer_threads > kMaxOptimizerThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'optimizer.threads' must be at most ", kMaxOptimizerThreads));
  }
  if (absl::Status s = ValidateMetrics(config); !s.ok()) return s;
  return absl::OkStatus();
}

std::string DataSocketPath(const DaemonConfig& config) {
  return absl::StrCat(config.socket_path, kDataSocketSuffix);
}

uint32_t EffectiveOptimizerThreads(const DaemonConfig& config,
                                   uint32_t online_cores) {
  if (config.optimizer_threads != 0) return config.optimizer_threads;
  return std::max<uint32_t>(1, online_cores / 2);
}

uint64_t GateUnitBytes(const DaemonConfig& config) {
  if (config.gate_unit_bytes != 0) return config.gate_unit_bytes;
  return std::max<uint64_t>(uint64_t{8} << 20, 4 * config.ssd_paths.size() *
                                                   config.stripe_unit_bytes);
}

}  // namespace lohan
