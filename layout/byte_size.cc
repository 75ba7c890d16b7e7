#include "layout/byte_size.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lohan {
namespace {

struct Unit {
  absl::string_view suffix;
  double multiplier;
};

constexpr Unit kUnits[] = {
    {"kib", 1024.0},
    {"mib", 1024.0 * 1024},
    {"gib", 1024.0 * 1024 * 1024},
    {"tib", 1024.0 * 1024 * 1024 * 1024},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
    {"b", 1.0},
};

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const std::string lowered =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  absl::string_view number = lowered;
  double multiplier = 1.0;
  for (const Unit& unit : kUnits) {
    if (absl::EndsWith(number, unit.suffix)) {
      number.remove_suffix(unit.suffix.size());
      multiplier = unit.multiplier;
      break;
    }
  }
  number = absl::StripAsciiWhitespace(number);
  const std::string invalid = absl::StrCat(
      "'", text, "' is not a byte size (examples: 4096, 64KiB, 8GiB, 1.5TB)");
  if (number.empty()) return absl::InvalidArgumentError(invalid);
  const std::string digits(number);
  if (digits.find_first_not_of("0123456789.") != std::string::npos) {
    return absl::InvalidArgumentError(invalid);
  }
  char* end = nullptr;
  const double value = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(value)) {
    return absl::InvalidArgumentError(invalid);
  }
  const double bytes = std::round(value * multiplier);
  if (bytes >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat("'", text, "' is too large"));
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", value, kNames[unit]);
}

}  // namespace lohan
