#ifndef LOHAN_CLIENT_CHECKPOINT_SHARDED_TENSORS_H_
#define LOHAN_CLIENT_CHECKPOINT_SHARDED_TENSORS_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/safetensors.h"

namespace lohan::checkpoint {

// The parameters of a sharded checkpoint (a save by data-parallel ranks).
// lohan.json's "sharding" names the world size W and one file per rank;
// layer i's flat fp32 vector of numel elements is cut into W shards of
// shard = ceil(numel / W) elements (zero padding past its end), and rank
// r's file holds `layer.<i>/<part>`: elements [r * shard, r * shard +
// shard). A parameter is read from the pieces of the shards its elements
// fall in; nothing is read whole.
class ShardedTensors {
 public:
  // `plan`: lohan.json's "sharding"; `manifest`: its "files" (checked
  // already). DATA_LOSS naming what does not hold together (a shard file
  // the manifest lacks, a world size the files do not match, a layer
  // whose parameters do not fit it).
  static absl::StatusOr<std::unique_ptr<ShardedTensors>> Open(
      const std::filesystem::path& directory, const JsonValue& plan,
      const JsonValue* manifest);

  uint32_t world_size() const { return static_cast<uint32_t>(files_.size()); }
  // nullptr when the checkpoint has no parameter `name`.
  const std::vector<int64_t>* ShapeOf(const std::string& name) const;
  // The dtype rank 0's file stores `part` of parameter `name`'s layer in
  // ("F32" as lohan writes it); "" when it lacks it.
  std::string DtypeOf(const std::string& name, const std::string& part) const;
  // Every parameter, in the layers' order.
  const std::vector<std::string>& names() const { return names_; }
  // Elements [first, first + count) of `part` of parameter `name` (of
  // ShapeOf's elements) into `out`, which holds `count` floats, from the
  // shards the range spans; NOT_FOUND for an unknown parameter or when a
  // shard lacks the part, OUT_OF_RANGE for a range past the parameter's
  // end, DATA_LOSS when a shard is not of its layer's shard size.
  absl::Status ReadRange(const std::string& name, const std::string& part,
                         uint64_t first, uint64_t count, float* out) const;

 private:
  struct Place {
    size_t layer = 0;
    uint64_t offset = 0;  // in the layer's flat vector
    std::vector<int64_t> shape;
  };
  explicit ShardedTensors(std::string path) : path_(std::move(path)) {}
  absl::Status AddLayer(size_t index, const JsonValue& layer, uint64_t world,
                        const std::string& where);

  std::string path_;
  std::vector<uint64_t> shard_;                          // per layer
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // by rank
  std::map<std::string, Place> where_;
  std::vector<std::string> names_;
};

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_SHARDED_TENSORS_H_
