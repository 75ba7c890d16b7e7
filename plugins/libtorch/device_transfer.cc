#include "plugins/libtorch/device_transfer.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>
#include <string>

#include "plugins/libtorch/lohan_error.h"

namespace lohan::torch_plugin {
namespace {

std::string Where(const std::vector<Layer>& layers, size_t layer,
                  size_t param) {
  return layers[layer].names[param] + " (on " +
         layers[layer].params[param].device().str() + ")";
}

}  // namespace

torch::Device TrainingDevice(const std::vector<Layer>& layers) {
  // PlanLayers gives at least one layer, each with parameters.
  const size_t first = 0;
  const torch::Device device = layers.at(first).params.at(0).device();
  for (size_t l = 0; l < layers.size(); ++l) {
    for (size_t p = 0; p < layers[l].params.size(); ++p) {
      if (layers[l].params[p].device() != device) {
        throw std::invalid_argument(
            "lohan Engine: parameters " + Where(layers, first, 0) + " and " +
            Where(layers, l, p) +
            " are on different devices; move the whole module to one "
            "(model->to(device)) before creating the Engine");
      }
    }
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw std::invalid_argument(
        "lohan Engine: parameter " + Where(layers, first, 0) +
        ": the engine trains modules on the CPU or on one CUDA device");
  }
  return device;
}

CudaTransfer::CudaTransfer(torch::Device device) : device_(device) {
  if (!device_.is_cuda() || !device_.has_index()) {
    throw std::invalid_argument("lohan CudaTransfer: " + device_.str() +
                                " is not a CUDA device with an index");
  }
  if (lohan_cuda_built_with() == 0) {
    throw LohanError(
        LOHAN_UNIMPLEMENTED,
        "lohan Engine: the module is on " + device_.str() +
            " but liblohan_client was built without CUDA, so it cannot copy "
            "gradients and weights to and from the GPU; rebuild it where "
            "the CUDA toolkit (nvcc) is installed, or train the module on "
            "the CPU");
  }
  if (lohan_cuda_available() == 0) {
    throw LohanError(
        LOHAN_FAILED_PRECONDITION,
        "lohan Engine: the module is on " + device_.str() +
            " but liblohan_client cannot use CUDA in this process (" +
            lohan_last_error() +
            "); run where an NVIDIA driver for CUDA 12.0 or newer and a GPU "
            "are present, or train the module on the CPU "
            "(model->to(torch::kCPU))");
  }
}

void CudaTransfer::PinArena(lohan_data_plane* plane) const {
  ThrowIfFailed(
      lohan_data_plane_cuda_register_on_device(plane, device_.index()));
}

void* CudaTransfer::CurrentStream() const {
  // CUDA's guard implementation is registered by libc10_cuda, which a
  // process holding CUDA tensors has loaded; getStream is the current
  // stream, native_handle its cudaStream_t.
  const c10::impl::DeviceGuardImplInterface* cuda =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return cuda->getStream(device_).native_handle();
}

void CudaTransfer::SubmitGradient(lohan_steps* steps, uint32_t layer,
                                  const torch::Tensor& flat) const {
  if (flat.device() != device_ || !flat.is_contiguous()) {
    throw std::logic_error("lohan CudaTransfer: a gradient on " +
                           flat.device().str() + ", not contiguous on " +
                           device_.str());
  }
  ThrowIfFailed(lohan_steps_grad_ready_from_device(
      steps, layer, device_.index(), flat.data_ptr(),
      static_cast<uint64_t>(flat.numel()) * flat.element_size(),
      CurrentStream()));
}

torch::Tensor CudaTransfer::FetchWeights(const lohan_model* model,
                                         uint32_t layer, int64_t numel,
                                         torch::ScalarType dtype) const {
  torch::Tensor flat =
      torch::empty({numel}, torch::TensorOptions(dtype).device(device_));
  ThrowIfFailed(lohan_model_weights_to_device_on_device(
      model, layer, device_.index(), flat.data_ptr(),
      static_cast<uint64_t>(numel) * flat.element_size(), CurrentStream()));
  return flat;
}

}  // namespace lohan::torch_plugin
