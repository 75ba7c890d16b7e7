#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/hf_checkpoint.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/safetensors.h"
#include "client/checkpoint/sharded_tensors.h"

namespace lohan::checkpoint {

// A checkpoint, read tensor by tensor (nothing is loaded whole), in any of
// the formats README.md describes: lohan's one-process model.safetensors
// (+ optimizer.safetensors), or its ranks' shard files (each parameter
// assembled from the shards that hold it, whatever number of ranks saved
// it); a Hugging Face directory (no lohan.json; model.safetensors, or the
// shards model.safetensors.index.json names); a bare safetensors file.
// The last two hold weights only: iteration 0, no moments, meta_json "{}",
// world size 1. Tensors are stored as F32, BF16 or F16 and read as fp32.
// Opening checks lohan.json's manifest (every listed file present, of its
// size, from the same save; with `verify`, also every file's CRC-32), or a
// Hugging Face index against its shards.
class CheckpointReader {
 public:
  // `path`: a checkpoint directory or a safetensors file. NOT_FOUND for a
  // directory that is no checkpoint (naming the previous checkpoint an
  // interrupted save set aside, if any); DATA_LOSS for a missing, torn,
  // mixed or damaged file, or a Hugging Face index its shards belie.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& path, bool verify);

  const std::string& path() const { return path_; }
  // lohan.json as stored ("{}" for a Hugging Face checkpoint or a file).
  const std::string& meta_json() const { return meta_text_; }
  uint64_t iteration() const { return iteration_; }
  // The optimizer parts it holds ("exp_avg", ...); empty without them.
  const std::vector<std::string>& moments() const { return moments_; }
  // The data-parallel ranks that saved it (1: one process).
  uint32_t world_size() const;
  // Every parameter it holds and its shape, in the order stored.
  std::vector<std::pair<std::string, std::vector<int64_t>>> Parameters() const;
  // The shape of `part` ("weights" or a moment) of parameter `name`;
  // nullptr when the checkpoint lacks it.
  const std::vector<int64_t>* Shape(const std::string& name,
                                    const std::string& part) const;
  // The dtype `part` of parameter `name` is stored in ("F32", "BF16",
  // "F16", or one Read refuses, e.g. "I64"); "" when the checkpoint lacks
  // it.
  std::string Dtype(const std::string& name, const std::string& part) const;
  // `part` of parameter `name` into `out`, which holds `elements` floats:
  // NOT_FOUND when the checkpoint lacks it, INVALID_ARGUMENT when it has
  // another element count or a dtype lohan does not read.
  absl::Status Read(const std::string& name, const std::string& part,
                    float* out, uint64_t elements) const;
  // Read, for a parameter of `shape`: NOT_FOUND or INVALID_ARGUMENT saying
  // "the checkpoint is of another model?" / both shapes.
  absl::Status ReadAs(const std::string& name, const std::string& part,
                      const std::vector<int64_t>& shape, float* out) const;
  // Elements [first, first + count) of `part` of parameter `name` (its
  // flat, row-major vector) into `out`, which holds `count` floats, for a
  // parameter of `shape`: ReadAs's errors, and OUT_OF_RANGE for a range
  // past its end. Straight into `out` (16-bit dtypes through a buffer of at
  // most 1 MiB; a sharded parameter from the rank files the range spans):
  // nothing of the parameter's size is held besides `out`.
  absl::Status ReadRangeAs(const std::string& name, const std::string& part,
                           const std::vector<int64_t>& shape, uint64_t first,
                           uint64_t count, float* out) const;

 private:
  explicit CheckpointReader(std::string path) : path_(std::move(path)) {}
  absl::Status OpenDirectory(bool verify);
  absl::Status OpenFiles(const std::string& weights,
                         const std::string& optimizer);
  // The file and entry of `part` of `name` in a checkpoint not sharded by
  // ranks; both nullptr when it lacks them.
  std::pair<const SafetensorsFile*, const SafetensorsFile::Entry*> Locate(
      const std::string& name, const std::string& part) const;
  // OK when the checkpoint holds `part` of `name` of `shape`, else ReadAs's
  // NOT_FOUND or INVALID_ARGUMENT.
  absl::Status CheckShape(const std::string& name, const std::string& part,
                          const std::vector<int64_t>& shape) const;
  // Elements [first, first + count) of a part known to be stored.
  absl::Status ReadStored(const std::string& name, const std::string& part,
                          uint64_t first, uint64_t count, float* out) const;

  std::string path_;
  std::string meta_text_ = "{}";
  uint64_t iteration_ = 0;
  std::vector<std::string> moments_;
  std::unique_ptr<SafetensorsFile> weights_;
  std::unique_ptr<SafetensorsFile> optimizer_;
  // Instead of the two files: a sharded checkpoint, or a Hugging Face
  // directory or bare file.
  std::unique_ptr<ShardedTensors> sharded_;
  std::unique_ptr<HfCheckpoint> hf_;
};

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_
