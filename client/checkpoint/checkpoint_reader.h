#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/safetensors.h"
#include "client/checkpoint/sharded_tensors.h"

namespace lohan::checkpoint {

// A checkpoint, read tensor by tensor (nothing is loaded whole), in either
// format: one process's model.safetensors (+ optimizer.safetensors), or
// the ranks' shard files (each parameter assembled from the shards that
// hold it, whatever number of ranks saved it). Also a bare safetensors file
// of fp32 weights (no lohan.json). Opening checks lohan.json's manifest
// (every listed file present, of its size, from the same save; with
// `verify`, also every file's CRC-32).
class CheckpointReader {
 public:
  // NOT_FOUND for a directory that is no checkpoint (naming the previous
  // checkpoint an interrupted save set aside, if any); DATA_LOSS for a
  // missing, torn, mixed or damaged file.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& path, bool verify);

  const std::string& path() const { return path_; }
  // lohan.json as stored ("{}" for a bare file).
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
  // `part` of parameter `name` into `out`, which holds `elements` floats:
  // NOT_FOUND when the checkpoint lacks it, INVALID_ARGUMENT when it has
  // another element count.
  absl::Status Read(const std::string& name, const std::string& part,
                    float* out, uint64_t elements) const;
  // Read, for a parameter of `shape`: NOT_FOUND or INVALID_ARGUMENT saying
  // "the checkpoint is of another model?" / both shapes.
  absl::Status ReadAs(const std::string& name, const std::string& part,
                      const std::vector<int64_t>& shape, float* out) const;

 private:
  explicit CheckpointReader(std::string path) : path_(std::move(path)) {}
  absl::Status OpenDirectory(bool verify);
  absl::Status OpenFiles(const std::string& weights,
                         const std::string& optimizer);
  // The file and the key of `part` of `name` in a one-process checkpoint.
  std::pair<const SafetensorsFile*, std::string> Locate(
      const std::string& name, const std::string& part) const;

  std::string path_;
  std::string meta_text_ = "{}";
  uint64_t iteration_ = 0;
  std::vector<std::string> moments_;
  std::unique_ptr<SafetensorsFile> weights_;
  std::unique_ptr<SafetensorsFile> optimizer_;
  std::unique_ptr<ShardedTensors> sharded_;  // instead of the two files
};

// A shape as Python prints a tuple: (2, 3), (4,), ().
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_READER_H_
