#ifndef LOHAN_PLUGINS_LIBTORCH_DEVICE_TRANSFER_H_
#define LOHAN_PLUGINS_LIBTORCH_DEVICE_TRANSFER_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "lohan/lohan_client.h"
#include "lohan/lohan_steps.h"
#include "plugins/libtorch/layer_plan.h"

namespace lohan::torch_plugin {

// The device every trained parameter of `layers` is on: the CPU or one
// CUDA device. std::invalid_argument naming two parameters and their
// devices when they are on different ones, or naming a parameter on
// another kind of device (meta, ...).
torch::Device TrainingDevice(const std::vector<Layer>& layers);

// Copies between one CUDA device and the job's arena through the C ABI's
// *_on_device calls, on torch's current CUDA stream for that device (the
// stream backward's hooks and step() run on), so torch's work before a
// copy comes first and its work after sees the copy's result, and the
// calling thread never waits for the GPU. Uses only torch's
// device-independent c10 interfaces: no CUDA header or library at build
// time.
class CudaTransfer {
 public:
  // Checks that this process can make the copies: std::invalid_argument
  // for a device that is not CUDA; LohanError LOHAN_UNIMPLEMENTED when
  // liblohan_client was built without CUDA, LOHAN_FAILED_PRECONDITION
  // when it cannot use CUDA here (no driver, one older than CUDA 12.0, no
  // device: lohan_cuda_available's reason), each saying how to go on.
  // Nothing is pinned yet.
  explicit CudaTransfer(torch::Device device);

  // Pins the plane's arena for DMA, on the device (once per plane; the
  // plane undoes it when destroyed). LohanError if the client refuses.
  void PinArena(lohan_data_plane* plane) const;

  // Enqueues on the current stream the copy of `flat` (the layer's
  // gradient back to back, in the training dtype, contiguous, on the
  // device) into the layer's gradient buffer, and GRAD_READY once it is
  // done (the step's hand-over). `flat` may go at once if it was
  // allocated on that stream: torch's caching allocator gives its memory
  // only to work enqueued there after the copy.
  void SubmitGradient(lohan_steps* steps, uint32_t layer,
                      const torch::Tensor& flat) const;

  // The layer's weight buffer (after lohan_model_fetch_params) as a new
  // tensor of `numel` elements of `dtype` on the device, its copy
  // enqueued on the current stream: work enqueued after it sees it.
  torch::Tensor FetchWeights(const lohan_model* model, uint32_t layer,
                             int64_t numel, torch::ScalarType dtype) const;

  const torch::Device& device() const { return device_; }

 private:
  // torch's current stream for the device, as a cudaStream_t.
  void* CurrentStream() const;

  torch::Device device_;
};

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_DEVICE_TRANSFER_H_
