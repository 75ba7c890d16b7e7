#ifndef LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_
#define LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "plugins/libtorch/safetensors.h"
#include "plugins/libtorch/sharded_checkpoint.h"

namespace lohan::torch_plugin {

// The Python plugin's checkpoint directory (plugins/pytorch/lohan/
// checkpoint.py), which both plugins write and resume from:
// - model.safetensors: the fp32 master weights by parameter name;
// - optimizer.safetensors (optional): exp_avg/<name>, exp_avg_sq/<name>;
// - lohan.json: the job, the step, the layer plan (names per layer), the
//   optimizer parts present, and the manifest: the save's id (also in each
//   file's safetensors metadata) and each file's size and CRC-32.
inline constexpr char kWeightsFile[] = "model.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kMetaFile[] = "lohan.json";

// One layer as a checkpoint stores it: its parameters' names, shapes and
// offsets in the layer's flat fp32 vector.
struct CheckpointLayer {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;
};

// What lohan.json records besides the layers and the manifest.
struct CheckpointMeta {
  std::string job_name;
  std::string job_id;
  uint64_t iteration = 0;  // committed Adam steps
  std::string dtype = "fp32";
  double lr = 0.0;
};

// A layer's flat fp32 values of `part` ("weights", "exp_avg",
// "exp_avg_sq"), valid until the next call.
using ReadLayer =
    std::function<const float*(size_t layer, const std::string& part)>;

// Writes a checkpoint of `layers` into `directory`, replacing what it held
// as a whole: a complete new checkpoint goes into a hidden sibling
// (.<name>.lohan-save-<pid>-<id>) with the old directory's other entries
// hard-linked in, is fsynced and exchanged with the old directory in one
// renameat2(RENAME_EXCHANGE) (two renames where the filesystem lacks it).
// An interrupted save leaves the previous checkpoint whole. `parts`:
// "weights" first, then the moments to store. Memory holds one layer at a
// time (read_layer's). Errors: std::runtime_error naming the path.
void WriteCheckpoint(const std::string& directory,
                     const std::vector<CheckpointLayer>& layers,
                     const ReadLayer& read_layer,
                     const std::vector<std::string>& parts,
                     const CheckpointMeta& meta);

// A checkpoint directory, checked against its manifest on opening (every
// listed file present, of its size and CRC-32, from the same save), read
// tensor by tensor: a one-process checkpoint, or a sharded one saved by
// data-parallel ranks (ShardedTensors: each parameter assembled from the
// shards that hold it), whatever number of ranks saved it. Errors:
// std::invalid_argument saying what is wrong (missing, torn, mixed,
// damaged) and, for a tensor, which one.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& directory);

  const std::string& path() const { return path_; }
  uint64_t iteration() const { return iteration_; }
  // The optimizer parts it holds ("exp_avg", "exp_avg_sq"); empty for a
  // weights-only checkpoint.
  const std::vector<std::string>& moments() const { return moments_; }
  // The data-parallel ranks that saved it (1: one process).
  uint32_t world_size() const;
  // Every parameter it holds and its shape.
  std::vector<std::pair<std::string, std::vector<int64_t>>> Parameters() const;
  // `part` of parameter `name` into `out`; throws when the checkpoint has
  // no such tensor or it is not of `shape`.
  void Read(const std::string& name, const std::string& part,
            const std::vector<int64_t>& shape, float* out) const;

 private:
  std::string path_;
  uint64_t iteration_ = 0;
  std::vector<std::string> moments_;
  std::unique_ptr<SafetensorsFile> weights_;
  std::unique_ptr<SafetensorsFile> optimizer_;
  std::unique_ptr<ShardedTensors> sharded_;  // instead of the two files
};

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_
