#include "plan/layout_bytes.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "layout/arena_bytes.h"
#include "layout/dtype.h"
#include "layout/dtype_traits.h"
#include "layout/job_space.h"
#include "layout/model_layout.h"

namespace lohan {
namespace {

// Parameters past this are no model's, and keep every sum below within 64
// bits (16 bytes of states a parameter, twice, block-rounded per chunk).
constexpr uint64_t kMaxLayoutParameters = uint64_t{1} << 56;

}  // namespace

uint64_t PluginArenaBytes(const std::vector<uint64_t>& layer_elements,
                          uint64_t element_bytes, uint64_t activation_bytes,
                          uint64_t stream_buffers) {
  return ArenaBytes(ArenaShape{.layer_elements = layer_elements,
                               .element_bytes = element_bytes,
                               .activation_bytes = activation_bytes,
                               .grad_buffers = stream_buffers,
                               .weight_buffers = stream_buffers});
}

uint64_t PluginStreamBuffers(uint64_t layers) {
  return layers > 1 ? std::min(kPluginStreamBuffers, layers - 1) : 0;
}

absl::StatusOr<JobLayoutBytes> LayoutBytes(
    const std::vector<uint64_t>& layer_elements, bool streamed,
    uint64_t activation_bytes, uint64_t store_block_bytes) {
  uint64_t parameters = 0;
  for (uint64_t n : layer_elements) {
    if (__builtin_add_overflow(parameters, n, &parameters) ||
        parameters > kMaxLayoutParameters) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model's layers hold more than ",
                       kMaxLayoutParameters, " parameters"));
    }
  }
  if (activation_bytes > kMaxLayoutParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("an activation area of ", activation_bytes, " bytes"));
  }
  if (store_block_bytes == 0 ||
      (store_block_bytes & (store_block_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the store's block size must be a power of two, got ",
                     store_block_bytes));
  }
  // What lohan.init registers for a 16-bit model by default.
  ModelLayout layout;
  layout.layer_elements = layer_elements;
  layout.grad_dtype = DType::kBFloat16;
  layout.weight16_dtype = DType::kBFloat16;
  if (absl::Status valid = ValidateLayout(layout); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lohand would refuse the model's layout: ", valid.message()));
  }
  const StateLayout state(layout);
  JobLayoutBytes bytes;
  bytes.stream_buffers =
      streamed ? PluginStreamBuffers(layer_elements.size()) : 0;
  const bool streaming = bytes.stream_buffers > 0;
  bytes.arena_bytes =
      PluginArenaBytes(layer_elements, DTypeSize(layout.grad_dtype),
                       activation_bytes, bytes.stream_buffers);
  // The daemon streams both gradients and 16-bit weights through the SSDs
  // when the plugin shares its buffers (JobSession::RegisterModel).
  // With the weights they hold for their fetch (streamed, 16-bit).
  bytes.update_buffer_bytes =
      kDefaultChunkBuffers *
          ChunkBufferFor(state, layout.grad_dtype, streaming, streaming).bytes +
      (streaming ? WeightHandoffFor(state, 2, kDefaultChunkBuffers).bytes()
                 : 0);
  const KeptSpace kept = KeptTensorSpace(state, streaming, store_block_bytes);
  bytes.ssd_state_bytes = kept.footprint;
  bytes.ssd_state_tensor_bytes = kept.tensor_bytes;
  bytes.ssd_scratch_bytes =
      streaming
          ? GradScratchFootprint(state, layout.grad_dtype, store_block_bytes)
          : 0;
  bytes.ssd_set_aside_bytes =
      SetAsideBytes(state, layout.grad_dtype, streaming, streaming,
                    store_block_bytes, kDefaultChunkBuffers);
  bytes.chunk_elements.reserve(state.total_chunks());
  for (size_t layer = 0; layer < state.num_layers(); ++layer) {
    for (size_t chunk = 0; chunk < state.num_chunks(layer); ++chunk) {
      bytes.chunk_elements.push_back(state.chunk_count(layer, chunk));
    }
  }
  return bytes;
}

}  // namespace lohan
