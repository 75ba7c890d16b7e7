#ifndef LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_
#define LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_

// Checkpoints through liblohan_client's C ABI (lohan/lohan_checkpoint.h):
// the one format and implementation both plugins use.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lohan/lohan_checkpoint.h"

namespace lohan::torch_plugin {

inline constexpr char kWeightsFile[] = "model.safetensors";

// One layer as a checkpoint stores it: its parameters' names, shapes and
// offsets in the layer's flat fp32 vector, and its elements.
struct CheckpointLayer {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;
  uint64_t elements = 0;
};

// A checkpoint opened for reading, every file's CRC-32 checked first.
// Errors: std::invalid_argument saying what is wrong (missing, torn,
// mixed, damaged, another model's tensor).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& directory);

  uint64_t iteration() const { return iteration_; }
  // The optimizer parts it holds ("exp_avg", "exp_avg_sq"); empty for a
  // weights-only checkpoint.
  const std::vector<std::string>& moments() const { return moments_; }
  // `part` of parameter `name` into `out`; throws when the checkpoint has
  // no such tensor or it holds another element count than `shape`'s.
  void Read(const std::string& name, const std::string& part,
            const std::vector<int64_t>& shape, float* out) const;
  // A new job's layer `index` (`layer`'s parameters) from the checkpoint:
  // each of `parts` ("weights" first) staged through `model` and
  // initialized (lohan_checkpoint_restore_layer); after "weights" the
  // staging buffer holds the layer's fp32 values. Throws
  // std::invalid_argument for a parameter missing or of another shape.
  void Restore(lohan_model* model, const CheckpointLayer& layer, uint32_t index,
               const std::vector<std::string>& parts) const;

 private:
  struct Closer {
    void operator()(lohan_checkpoint* checkpoint) const {
      lohan_checkpoint_destroy(checkpoint);
    }
  };
  std::unique_ptr<lohan_checkpoint, Closer> handle_;
  uint64_t iteration_ = 0;
  std::vector<std::string> moments_;
};

// Writes a checkpoint of the job behind `model` into `directory`, replacing
// what it held as a whole: every layer's `parts` ("weights" first, then
// the moments) read from the job, and `meta_json` (the plugin's fields) in
// lohan.json. Errors: LohanError.
void WriteCheckpoint(const std::string& directory, lohan_model* model,
                     const std::vector<CheckpointLayer>& layers,
                     const std::vector<std::string>& parts,
                     const std::string& job_name, uint64_t iteration,
                     const std::string& meta_json);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_H_
