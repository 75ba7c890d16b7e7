#include "plan/trainer_host.h"

#include <algorithm>

namespace lohan {

uint64_t TrainerHostBytes::total() const {
  return activations + activation_read + frozen_weights +
         std::max(checkpoint_load, checkpoint_save) + device;
}

TrainerHostBytes TrainerHostOf(const TrainerHostInputs& in) {
  TrainerHostBytes bytes;
  bytes.activations = in.host_activation_bytes;
  bytes.activation_read = in.largest_ssd_tensor_bytes;
  bytes.frozen_weights = in.frozen_host_bytes;
  bytes.checkpoint_load = 0;
  bytes.checkpoint_save = in.largest_parameter * in.save_element_bytes;
  bytes.device = in.device_in_host_bytes;
  bytes.arena_mapped = in.arena_bytes;
  return bytes;
}

}  // namespace lohan
