#include "layout/job_meta.h"

#include <cstring>

namespace lohan {
namespace {

constexpr char kMagic[8] = {'L', 'O', 'H', 'A', 'N', 'J', 'O', 'B'};
// 1: fingerprint, iteration. 2: + the weight16 code (0: none, else 1 +
// DType), in what format 1 kept as zero padding. 3: + 1 + first_iteration
// (0: unknown), in what format 2 kept as zero padding.
constexpr uint64_t kFormat = 3;

void PutU64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetU64(absl::string_view in, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[at + i]);
  return v;
}

}  // namespace

std::string JobMeta::Encode() const {
  std::string out(kBytes, '\0');
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  PutU64(out, 8, kFormat);
  PutU64(out, 16, layout_fingerprint);
  PutU64(out, 24, iteration);
  PutU64(out, 32, has_weight16 ? 1 + static_cast<uint64_t>(weight16_dtype) : 0);
  PutU64(out, 40, first_iteration.has_value() ? 1 + *first_iteration : 0);
  return out;
}

absl::StatusOr<JobMeta> JobMeta::Decode(absl::string_view bytes) {
  if (bytes.size() != kBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0 ||
      GetU64(bytes, 8) < 1 || GetU64(bytes, 8) > kFormat) {
    return absl::DataLossError("job meta record: bad size, magic or format");
  }
  // Formats 1 and 2 have zero padding where later formats have fields,
  // so one check covers every format.
  const uint64_t weight16 = GetU64(bytes, 32);
  if (weight16 > 1 + static_cast<uint64_t>(DType::kFloat16)) {
    return absl::DataLossError("job meta record: bad 16-bit weight dtype");
  }
  for (size_t i = 48; i < kBytes; ++i) {
    if (bytes[i] != '\0') {
      return absl::DataLossError("job meta record: non-zero padding");
    }
  }
  JobMeta meta;
  meta.layout_fingerprint = GetU64(bytes, 16);
  meta.iteration = GetU64(bytes, 24);
  meta.has_weight16 = weight16 != 0;
  if (meta.has_weight16) meta.weight16_dtype = static_cast<DType>(weight16 - 1);
  if (const uint64_t first = GetU64(bytes, 40); first != 0) {
    meta.first_iteration = first - 1;
    if (*meta.first_iteration > meta.iteration) {
      return absl::DataLossError(
          "job meta record: first iteration after the current one");
    }
  }
  return meta;
}

}  // namespace lohan
