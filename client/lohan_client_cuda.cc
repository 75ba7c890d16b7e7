// The C ABI's CUDA calls (lohan_client.h, "CUDA"): the C++ core is
// cuda_copy.h, arena_pinning.h and ModelChannel's device copies.

#include "absl/strings/str_cat.h"
#include "client/c_abi_handles.h"
#include "client/cuda_copy.h"

using lohan::c_abi::InvalidArgument;
using lohan::c_abi::Report;
using lohan::c_abi::ReturnTicket;

extern "C" {

// ---- CUDA

int lohan_cuda_built_with(void) { return lohan::cuda::BuiltWith() ? 1 : 0; }

int lohan_cuda_available(void) {
  const absl::Status available = lohan::cuda::Available();
  Report(available);
  return available.ok() ? 1 : 0;
}

namespace {

// A device index from the C ABI: >= 0, or kUnspecifiedDevice for the
// functions without one.
bool BadDevice(int device) { return device < 0; }

int CudaRegister(lohan_data_plane* plane, int device, const char* what) {
  if (plane == nullptr) {
    return Report(
        absl::InvalidArgumentError(absl::StrCat(what, ": plane is NULL")));
  }
  return Report(plane->cuda.Register(device, what));
}

int GradReadyFromDevice(lohan_model* model, uint32_t layer, int device,
                        const void* device_source, uint64_t bytes,
                        void* cuda_stream, uint64_t* ticket, const char* what) {
  if (model == nullptr || device_source == nullptr || ticket == nullptr) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat(what, ": model, device_source and ticket are required")));
  }
  return ReturnTicket(model->channel->GradReadyFromDevice(
                          layer, device, device_source, bytes, cuda_stream),
                      ticket);
}

int WeightsToDevice(const lohan_model* model, uint32_t layer, int device,
                    void* device_destination, uint64_t bytes, void* cuda_stream,
                    const char* what) {
  if (model == nullptr || device_destination == nullptr) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat(what, ": model and device_destination are required")));
  }
  return Report(model->channel->WeightsToDevice(
      layer, device, device_destination, bytes, cuda_stream));
}

}  // namespace

int lohan_data_plane_cuda_register(lohan_data_plane* plane) {
  return CudaRegister(plane, lohan::cuda::kUnspecifiedDevice,
                      "lohan_data_plane_cuda_register");
}

int lohan_data_plane_cuda_register_on_device(lohan_data_plane* plane,
                                             int device) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_data_plane_cuda_register_on_device: device is negative");
  }
  return CudaRegister(plane, device,
                      "lohan_data_plane_cuda_register_on_device");
}

int lohan_model_grad_ready_from_device(lohan_model* model, uint32_t layer,
                                       const void* device_source,
                                       uint64_t bytes, void* cuda_stream,
                                       uint64_t* ticket) {
  return GradReadyFromDevice(model, layer, lohan::cuda::kUnspecifiedDevice,
                             device_source, bytes, cuda_stream, ticket,
                             "lohan_model_grad_ready_from_device");
}

int lohan_model_grad_ready_from_device_on_device(
    lohan_model* model, uint32_t layer, int device, const void* device_source,
    uint64_t bytes, void* cuda_stream, uint64_t* ticket) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_model_grad_ready_from_device_on_device: device is negative");
  }
  return GradReadyFromDevice(model, layer, device, device_source, bytes,
                             cuda_stream, ticket,
                             "lohan_model_grad_ready_from_device_on_device");
}

int lohan_model_weights_to_device(const lohan_model* model, uint32_t layer,
                                  void* device_destination, uint64_t bytes,
                                  void* cuda_stream) {
  return WeightsToDevice(model, layer, lohan::cuda::kUnspecifiedDevice,
                         device_destination, bytes, cuda_stream,
                         "lohan_model_weights_to_device");
}

int lohan_model_weights_to_device_on_device(const lohan_model* model,
                                            uint32_t layer, int device,
                                            void* device_destination,
                                            uint64_t bytes, void* cuda_stream) {
  if (BadDevice(device)) {
    return InvalidArgument(
        "lohan_model_weights_to_device_on_device: device is negative");
  }
  return WeightsToDevice(model, layer, device, device_destination, bytes,
                         cuda_stream,
                         "lohan_model_weights_to_device_on_device");
}

}  // extern "C"
