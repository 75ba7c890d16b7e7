#include "daemon/optim/tuning.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lohan {

std::string TuningName(const KernelTuning& tuning) {
  return absl::StrCat("prefetch=", tuning.prefetch_elements,
                      ",stream=", tuning.stream_half_copy ? "on" : "off",
                      ",chunks=", tuning.chunks_per_task);
}

absl::StatusOr<KernelTuning> ParseTuning(absl::string_view text) {
  KernelTuning tuning;
  for (absl::string_view field :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    field = absl::StripAsciiWhitespace(field);
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(field, absl::MaxSplits('=', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    uint64_t number = 0;
    if (key == "prefetch" && absl::SimpleAtoi(value, &number) &&
        number <= (1u << 20)) {
      tuning.prefetch_elements = number;
    } else if (key == "stream" && (value == "on" || value == "off")) {
      tuning.stream_half_copy = value == "on";
    } else if (key == "chunks" && absl::SimpleAtoi(value, &number) &&
               number >= 1 && number <= 4096) {
      tuning.chunks_per_task = number;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer tuning: bad field \"", field, "\" in \"", text,
          "\"; expected e.g. ", TuningName(KernelTuning{}),
          " (prefetch: elements 0..1048576, stream: on|off, chunks: "
          "1..4096)"));
    }
  }
  return tuning;
}

}  // namespace lohan
