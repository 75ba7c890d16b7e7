#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_WRITER_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/safetensors.h"
#include "proto/checkpoint.pb.h"

namespace lohan::checkpoint {

// A file of a save and its manifest entry.
using FileEntry = std::pair<std::string, FileDigest>;

// The safetensors files of one save in its staging directory, streamed
// layer by layer (memory never holds more than the layer given):
// - one process: model.safetensors (every parameter's weights by name) and,
//   with moments, optimizer.safetensors (`<part>/<name>`), both written at
//   once, each in its declared order (per layer, per part, per tensor);
// - data-parallel rank r of W: shard-<r>-of-<W>.safetensors, a flat tensor
//   `layer.<i>/<part>` per layer and part: r's shard of the layer.
// Each file's safetensors metadata names the job, the iteration and the
// save (and the rank and world size).
class CheckpointWriter {
 public:
  // INVALID_ARGUMENT for contents that cannot be written (parts not
  // starting with "weights" or naming an unknown part, a rank outside the
  // world, a tensor past its layer's elements).
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(
      const std::filesystem::path& staging, const std::string& save_id,
      const v1::CheckpointContents& contents);

  // The layer's `part`: the flat fp32 vector (this rank's shard of it with
  // data-parallel ranks), `elements` long. Layers in order, and each
  // layer's parts in the contents' order (FAILED_PRECONDITION otherwise).
  absl::Status Write(uint32_t layer, const std::string& part, const float* data,
                     uint64_t elements);
  // Syncs every file; FAILED_PRECONDITION unless every layer's every part
  // was written. The files' manifest entries.
  absl::StatusOr<std::vector<FileEntry>> Close();

  // The elements of layer `index` a Write takes.
  uint64_t ElementsOf(uint32_t index) const;
  const v1::CheckpointContents& contents() const { return contents_; }

 private:
  explicit CheckpointWriter(v1::CheckpointContents contents)
      : contents_(std::move(contents)) {}
  absl::Status OpenFiles(const std::filesystem::path& staging,
                         const std::string& save_id);
  bool sharded() const { return contents_.world_size() > 1; }

  v1::CheckpointContents contents_;
  std::vector<std::string> file_names_;
  std::vector<std::unique_ptr<SafetensorsWriter>> files_;
  // The next (layer, part) Write takes.
  uint32_t next_layer_ = 0;
  int next_part_ = 0;
};

// Layer `elements` cut into `world` shards: ceil(elements / world).
uint64_t ShardElements(uint64_t elements, uint32_t world);

// lohan.json of a save: the contents' job_name, iteration and layers (each
// layer's parameter names), `meta_json` (the plugin's own fields, a JSON
// object: the job's id, dtype, options), then the save's optimizer_state,
// save_id, files (every file's bytes and CRC-32) and, with data-parallel
// ranks, sharding (world_size, the shard files, how they cut every layer).
// The contents' and the save's keys replace a plugin's of the same name.
absl::StatusOr<std::string> ComposeMeta(const std::string& meta_json,
                                        const v1::CheckpointContents& contents,
                                        const std::string& save_id,
                                        const std::vector<FileEntry>& files);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_WRITER_H_
