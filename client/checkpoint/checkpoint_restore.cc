#include "client/checkpoint/checkpoint_restore.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/checkpoint_writer.h"

namespace lohan::checkpoint {

absl::Status StageLayer(const CheckpointReader& reader,
                        const v1::CheckpointLayer& layer,
                        const std::string& part, uint32_t rank, uint32_t world,
                        float* out, uint64_t elements) {
  const uint64_t size = ShardElements(layer.elements(), world);
  if (elements != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: the layer takes ", size, " elements here, ",
                     elements, " given"));
  }
  const uint64_t first = world > 1 ? uint64_t{rank} * size : 0;
  std::memset(out, 0, 4 * elements);
  for (const v1::CheckpointTensor& tensor : layer.tensors()) {
    const std::vector<int64_t> shape(tensor.shape().begin(),
                                     tensor.shape().end());
    const uint64_t begin = std::max(tensor.offset(), first);
    const uint64_t end =
        std::min(tensor.offset() + Elements(shape), first + size);
    if (begin >= end) continue;  // not in this rank's shard
    std::string found = tensor.name();
    for (const std::string& alias : tensor.aliases()) {
      if (reader.Shape(found, part) != nullptr) break;
      if (reader.Shape(alias, part) != nullptr) found = alias;
    }
    if (absl::Status read =
            reader.ReadRangeAs(found, part, shape, begin - tensor.offset(),
                               end - begin, out + (begin - first));
        !read.ok()) {
      return read;
    }
  }
  return absl::OkStatus();
}

}  // namespace lohan::checkpoint
