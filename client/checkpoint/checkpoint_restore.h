#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_RESTORE_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_RESTORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "client/checkpoint/checkpoint_reader.h"
#include "proto/checkpoint.pb.h"

namespace lohan::checkpoint {

// Layer `layer`'s `part` as the job holds it, from the checkpoint, into
// `out` (`elements` floats): the layer's flat vector, or with world > 1
// this rank's shard of it (zero padding past the layer's end). Each
// parameter is found under its name or one of its aliases, and only the
// elements of it this rank holds are read, straight into `out`
// (CheckpointReader::ReadRangeAs): no buffer of a parameter's size besides
// `out`. NOT_FOUND for a parameter the checkpoint lacks ("of another
// model?"), INVALID_ARGUMENT for another shape or an `out` of the wrong
// size, naming the parameter.
absl::Status StageLayer(const CheckpointReader& reader,
                        const v1::CheckpointLayer& layer,
                        const std::string& part, uint32_t rank, uint32_t world,
                        float* out, uint64_t elements);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_RESTORE_H_
