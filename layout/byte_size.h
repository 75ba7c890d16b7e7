#ifndef LOHAN_LAYOUT_BYTE_SIZE_H_
#define LOHAN_LAYOUT_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

// Parses "4096", "64KiB", "8 GiB", "1.5TiB", "512MB" (decimal units: KB, MB,
// GB, TB; binary: KiB, MiB, GiB, TiB; "B" or nothing for bytes).
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// Formats with the largest binary unit that keeps the number >= 1,
// e.g. 8589934592 -> "8.0 GiB", 512 -> "512 B".
std::string FormatByteSize(uint64_t bytes);

}  // namespace lohan

#endif  // LOHAN_LAYOUT_BYTE_SIZE_H_
