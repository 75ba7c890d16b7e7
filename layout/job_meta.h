#ifndef LOHAN_LAYOUT_JOB_META_H_
#define LOHAN_LAYOUT_JOB_META_H_

// The small per-job record stored next to a job's chunk states and committed
// in the same batch, so the step counter moves with the states.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "layout/dtype.h"

namespace lohan {

struct JobMeta {
  uint64_t layout_fingerprint = 0;  // LayoutFingerprint of the job's layout.
  // Iterations committed so far: also every chunk's Adam step counter.
  uint64_t iteration = 0;
  // Whether the job's "weight16.*" tensors hold the 16-bit copy of the
  // committed weights (in weight16_dtype). Only a pipeline that streams its
  // 16-bit weights keeps them current; any other commit clears this, so a
  // later streamed run knows to rebuild them from the master weights.
  bool has_weight16 = false;
  DType weight16_dtype = DType::kBFloat16;
  // The iteration the job started at (0, or a checkpoint's step restored
  // into a new job): a job past it has trained, so every layer has states.
  // Unknown in metas written before format 3.
  std::optional<uint64_t> first_iteration;

  // Fixed kBytes: magic "LOHANJOB", format version, fields, zero padding.
  // Writes format 3; reads 1 (no weight16 field), 2 (no first_iteration)
  // and 3.
  static constexpr size_t kBytes = 64;
  std::string Encode() const;
  // DATA_LOSS if `bytes` is not an encoded JobMeta.
  static absl::StatusOr<JobMeta> Decode(absl::string_view bytes);
};

}  // namespace lohan

#endif  // LOHAN_LAYOUT_JOB_META_H_
