#ifndef LOHAN_CLIENT_CHECKPOINT_HF_CHECKPOINT_H_
#define LOHAN_CLIENT_CHECKPOINT_HF_CHECKPOINT_H_

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/safetensors.h"

namespace lohan::checkpoint {

// The index of a sharded Hugging Face checkpoint: {"metadata": {...},
// "weight_map": {tensor name: file name in the same directory}}.
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";

// A Hugging Face checkpoint: weights only, by tensor name, in one
// safetensors file (model.safetensors, or a bare file given by path) or in
// the shard files model.safetensors.index.json maps names to. Every file's
// header is read once, at open; tensors are then found by name (nothing is
// read whole) and read through the file that holds them.
class HfCheckpoint {
 public:
  // `directory`'s index and the shards it names, else (no index) its
  // model.safetensors (NOT_FOUND when missing). DATA_LOSS naming the index
  // and what is wrong for an index that is damaged (no JSON object, no
  // "weight_map" object of file names, a tensor named twice), names a file
  // outside the directory (a '/', "." or ".."), a file that is missing, or a
  // tensor its file lacks; a damaged shard's SafetensorsFile::Open error.
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> OpenDirectory(
      const std::filesystem::path& directory);
  // The tensors of one safetensors file; SafetensorsFile::Open's errors.
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> OpenFile(
      const std::string& path);

  // Every tensor, in the index's order (one file: its header's).
  const std::vector<std::string>& names() const { return names_; }
  // The file holding tensor `name` and its entry there; both nullptr when
  // the checkpoint has no tensor `name`.
  std::pair<const SafetensorsFile*, const SafetensorsFile::Entry*> Locate(
      const std::string& name) const;

 private:
  HfCheckpoint() = default;
  absl::Status OpenIndexed(const std::filesystem::path& directory);
  // The shard `file` of `directory` the index names, opened once.
  absl::StatusOr<const SafetensorsFile*> Shard(
      const std::filesystem::path& directory, const std::string& file);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> by_file_name_;
  std::map<std::string, const SafetensorsFile*> where_;  // by tensor name
  std::vector<std::string> names_;
};

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_HF_CHECKPOINT_H_
