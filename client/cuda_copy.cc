#include "client/cuda_copy.h"

#include <memory>

#include "absl/strings/str_cat.h"

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lohan::cuda {

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

namespace {

absl::StatusCode CodeOf(cudaError_t error) {
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kNotFound;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status Failed(cudaError_t error, const char* what) {
  (void)cudaGetLastError();  // do not leave it for the next call to find
  return absl::Status(CodeOf(error),
                      absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                   cudaGetErrorString(error), ")"));
}

std::string Version(int version) {
  return absl::StrCat(version / 1000, ".", version % 1000 / 10);
}

absl::Status Probe() {
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  int driver = 0;
  (void)cudaDriverGetVersion(&driver);
  if (driver == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no NVIDIA driver: libcuda.so.1 cannot be loaded (liblohan_client "
        "carries the CUDA ",
        Version(runtime),
        " runtime; it needs a GPU and its driver). Use the *_from_host / "
        "*_to_host functions on a machine without one"));
  }
  if (driver / 1000 < runtime / 1000) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the NVIDIA driver is too old: it supports CUDA ", Version(driver),
        ", liblohan_client carries the CUDA ", Version(runtime),
        " runtime; update the driver or rebuild lohan against an older "
        "toolkit"));
  }
  int devices = 0;
  if (cudaError_t error = cudaGetDeviceCount(&devices); error != cudaSuccess) {
    absl::Status failed = Failed(error, "no usable CUDA device");
    return absl::FailedPreconditionError(
        absl::StrCat(failed.message(), "; driver supports CUDA ",
                     Version(driver), ", runtime ", Version(runtime)));
  }
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device visible to this process (CUDA_VISIBLE_DEVICES?)");
  }
  return absl::OkStatus();
}

// While it lives, the device holding a device pointer is current on this
// thread; then the previous one again. Needed because "current device" is
// in the end the driver's current context of the thread, which torch's
// runtime reads too: leaving another device's context current would move
// torch's current device under it.
class OnDeviceOf {
 public:
  OnDeviceOf() = default;
  OnDeviceOf(const OnDeviceOf&) = delete;
  OnDeviceOf& operator=(const OnDeviceOf&) = delete;
  ~OnDeviceOf() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

  absl::Status Enter(const void* pointer, const char* what) {
    cudaPointerAttributes attributes{};
    if (cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
        error != cudaSuccess) {
      return Failed(error, what);
    }
    if (attributes.type != cudaMemoryTypeDevice &&
        attributes.type != cudaMemoryTypeManaged) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": not a CUDA device pointer"));
    }
    if (cudaError_t error = cudaGetDevice(&previous_); error != cudaSuccess) {
      return Failed(error, what);
    }
    if (attributes.device != previous_) {
      if (cudaError_t error = cudaSetDevice(attributes.device);
          error != cudaSuccess) {
        return Failed(error, what);
      }
      switched_ = true;
    }
    return absl::OkStatus();
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

bool BuiltWith() { return true; }

absl::Status Available() {
  static const absl::Status* const probed = new absl::Status(Probe());
  return *probed;
}

absl::Status RegisterHost(void* base, size_t bytes) {
  if (absl::Status available = Available(); !available.ok()) return available;
  if (cudaError_t error =
          cudaHostRegister(base, bytes, cudaHostRegisterPortable);
      error != cudaSuccess) {
    return Failed(error, "cudaHostRegister of the arena");
  }
  return absl::OkStatus();
}

absl::Status UnregisterHost(void* base) {
  if (cudaError_t error = cudaHostUnregister(base); error != cudaSuccess) {
    return Failed(error, "cudaHostUnregister of the arena");
  }
  return absl::OkStatus();
}

namespace {

struct Pending {
  AfterCopy after;
  void* argument;
};

void CUDART_CB RunAfterCopy(cudaStream_t, cudaError_t status, void* data) {
  std::unique_ptr<Pending> pending(static_cast<Pending*>(data));
  // No CUDA call in here (not even for the error's name).
  pending->after(
      pending->argument,
      status == cudaSuccess
          ? absl::OkStatus()
          : absl::InternalError(absl::StrCat(
                "CUDA error ", static_cast<int>(status),
                " on the stream before the copy to or from the arena "
                "completed (see torch.cuda for the cause)")));
}

absl::Status CopyThen(void* destination, const void* source, size_t bytes,
                      cudaMemcpyKind kind, void* stream, AfterCopy after,
                      void* argument) {
  if (absl::Status available = Available(); !available.ok()) return available;
  const bool to_host = kind == cudaMemcpyDeviceToHost;
  OnDeviceOf device;
  if (absl::Status entered =
          device.Enter(to_host ? source : destination,
                       to_host ? "the gradient's device pointer"
                               : "the weights' device pointer");
      !entered.ok()) {
    return entered;
  }
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (cudaError_t error =
          cudaMemcpyAsync(destination, source, bytes, kind, cuda_stream);
      error != cudaSuccess) {
    return Failed(error, to_host ? "cudaMemcpyAsync device to arena"
                                 : "cudaMemcpyAsync arena to device");
  }
  auto pending = std::make_unique<Pending>(Pending{after, argument});
  if (cudaError_t error = cudaStreamAddCallback(cuda_stream, &RunAfterCopy,
                                                pending.get(), /*flags=*/0);
      error != cudaSuccess) {
    // The copy is enqueued: let it land (or fail) before the caller frees
    // or reuses the arena bytes it touches.
    (void)cudaStreamSynchronize(cuda_stream);
    return Failed(error, "cudaStreamAddCallback");
  }
  (void)pending.release();  // RunAfterCopy owns it now.
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyToHostThen(void* host_destination, const void* device_source,
                            size_t bytes, void* stream, AfterCopy after,
                            void* argument) {
  return CopyThen(host_destination, device_source, bytes,
                  cudaMemcpyDeviceToHost, stream, after, argument);
}

absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, void* stream, AfterCopy after,
                              void* argument) {
  return CopyThen(device_destination, host_source, bytes,
                  cudaMemcpyHostToDevice, stream, after, argument);
}

#else  // built without CUDA

namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "liblohan_client was built without CUDA (no toolkit was found at build "
      "time: install one or set CUDA_HOME, and rebuild); use the "
      "*_from_host / *_to_host functions");
}

}  // namespace

bool BuiltWith() { return false; }
absl::Status Available() { return NotBuilt(); }
absl::Status RegisterHost(void*, size_t) { return NotBuilt(); }
absl::Status UnregisterHost(void*) { return NotBuilt(); }
absl::Status CopyToHostThen(void*, const void*, size_t, void*, AfterCopy,
                            void*) {
  return NotBuilt();
}
absl::Status CopyToDeviceThen(void*, const void*, size_t, void*, AfterCopy,
                              void*) {
  return NotBuilt();
}

#endif

}  // namespace lohan::cuda
