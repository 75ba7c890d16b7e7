#include "daemon/sched/job_meta.h"

#include <cstring>

namespace lohan {
namespace {

constexpr char kMagic[8] = {'L', 'O', 'H', 'A', 'N', 'J', 'O', 'B'};
constexpr uint64_t kFormat = 1;

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
  return out;
}

absl::StatusOr<JobMeta> JobMeta::Decode(absl::string_view bytes) {
  if (bytes.size() != kBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0 ||
      GetU64(bytes, 8) != kFormat) {
    return absl::DataLossError("job meta record: bad size, magic or format");
  }
  for (size_t i = 32; i < kBytes; ++i) {
    if (bytes[i] != '\0') {
      return absl::DataLossError("job meta record: non-zero padding");
    }
  }
  JobMeta meta;
  meta.layout_fingerprint = GetU64(bytes, 16);
  meta.iteration = GetU64(bytes, 24);
  return meta;
}

}  // namespace lohan
