#include "client/cuda_copy.h"

#include <memory>

#include "absl/strings/str_cat.h"

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
#include <cuda.h>  // driver types only: its functions come by entry point
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

using PrimaryCtxGetStateFn = CUresult(CUDAAPI*)(CUdevice, unsigned int*, int*);
using DeviceGetFn = CUresult(CUDAAPI*)(CUdevice*, int);
using CtxSetCurrentFn = CUresult(CUDAAPI*)(CUcontext);
using CtxGetCurrentFn = CUresult(CUDAAPI*)(CUcontext*);

// The driver functions the probe needs, looked up once (none of them, nor
// the look-up, creates a context). Null where the driver lacks them.
struct DriverFunctions {
  PrimaryCtxGetStateFn primary_ctx_get_state = nullptr;
  DeviceGetFn device_get = nullptr;
  CtxSetCurrentFn ctx_set_current = nullptr;
  CtxGetCurrentFn ctx_get_current = nullptr;
};

template <typename Function>
Function EntryPoint(const char* symbol) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &function, /*cudaVersion=*/12000,
                                       cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Function>(function);
}

const DriverFunctions& Driver() {
  static const DriverFunctions* const functions = [] {
    auto* loaded = new DriverFunctions;
    loaded->primary_ctx_get_state =
        EntryPoint<PrimaryCtxGetStateFn>("cuDevicePrimaryCtxGetState");
    loaded->device_get = EntryPoint<DeviceGetFn>("cuDeviceGet");
    loaded->ctx_set_current = EntryPoint<CtxSetCurrentFn>("cuCtxSetCurrent");
    loaded->ctx_get_current = EntryPoint<CtxGetCurrentFn>("cuCtxGetCurrent");
    return loaded;
  }();
  return *functions;
}

class CudaRuntimeProbe final : public DeviceProbe {
 public:
  absl::StatusOr<int> Current() override {
    // Nothing bound: say so (cudaGetDevice would answer the runtime's
    // default or the device it last set, as if it were current).
    if (const DriverFunctions& driver = Driver();
        driver.ctx_get_current != nullptr) {
      CUcontext context = nullptr;
      if (driver.ctx_get_current(&context) == CUDA_SUCCESS &&
          context == nullptr) {
        return kNoCurrentContext;
      }
    }
    int device = 0;
    if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
      return Failed(error, "cudaGetDevice");
    }
    return device;
  }

  absl::StatusOr<bool> HasContext(int device) override {
    const DriverFunctions& driver = Driver();
    if (driver.primary_ctx_get_state == nullptr ||
        driver.device_get == nullptr) {
      return true;  // cannot tell: set it back, as before
    }
    CUdevice handle = 0;
    if (driver.device_get(&handle, device) != CUDA_SUCCESS) return true;
    unsigned int flags = 0;
    int active = 0;
    if (driver.primary_ctx_get_state(handle, &flags, &active) != CUDA_SUCCESS) {
      return true;
    }
    return active != 0;
  }

  absl::Status Set(int device) override {
    if (cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
      return Failed(error, "cudaSetDevice");
    }
    return absl::OkStatus();
  }

  absl::Status Clear() override {
    const DriverFunctions& driver = Driver();
    if (driver.ctx_set_current == nullptr) {
      return absl::UnavailableError("the driver has no cuCtxSetCurrent");
    }
    if (driver.ctx_set_current(nullptr) != CUDA_SUCCESS) {
      return absl::InternalError("cuCtxSetCurrent(NULL) failed");
    }
    return absl::OkStatus();
  }
};

// Where the device pointer lives, asked of CUDA (for kUnspecifiedDevice
// only: it may create a context on the current device).
absl::StatusOr<int> DeviceOfPointer(const void* pointer, const char* what) {
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
  return attributes.device;
}

// Enters `guard` on `device`; kUnspecifiedDevice: on the thread's current
// device (nothing switched).
absl::Status EnterOn(DeviceGuard& guard, int device) {
  if (device == kUnspecifiedDevice) return absl::OkStatus();
  return guard.Enter(device);
}

}  // namespace

bool BuiltWith() { return true; }

DeviceProbe& RuntimeProbe() {
  static CudaRuntimeProbe* const probe = new CudaRuntimeProbe;
  return *probe;
}

absl::Status Available() {
  static const absl::Status* const probed = new absl::Status(Probe());
  return *probed;
}

absl::Status RegisterHost(void* base, size_t bytes, int device) {
  if (absl::Status available = Available(); !available.ok()) return available;
  DeviceGuard guard(RuntimeProbe());
  if (absl::Status entered = EnterOn(guard, device); !entered.ok()) {
    return entered;
  }
  if (cudaError_t error =
          cudaHostRegister(base, bytes, cudaHostRegisterPortable);
      error != cudaSuccess) {
    return Failed(error, "cudaHostRegister of the arena");
  }
  return absl::OkStatus();
}

absl::Status UnregisterHost(void* base, int device) {
  DeviceGuard guard(RuntimeProbe());
  if (absl::Status entered = EnterOn(guard, device); !entered.ok()) {
    return entered;
  }
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
                      cudaMemcpyKind kind, int device, void* stream,
                      AfterCopy after, void* argument) {
  if (absl::Status available = Available(); !available.ok()) return available;
  const bool to_host = kind == cudaMemcpyDeviceToHost;
  if (device == kUnspecifiedDevice) {
    absl::StatusOr<int> found =
        DeviceOfPointer(to_host ? source : destination,
                        to_host ? "the gradient's device pointer"
                                : "the weights' device pointer");
    if (!found.ok()) return found.status();
    device = *found;
  }
  DeviceGuard guard(RuntimeProbe());
  if (absl::Status entered = guard.Enter(device); !entered.ok()) {
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
                            size_t bytes, int device, void* stream,
                            AfterCopy after, void* argument) {
  return CopyThen(host_destination, device_source, bytes,
                  cudaMemcpyDeviceToHost, device, stream, after, argument);
}

absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, int device, void* stream,
                              AfterCopy after, void* argument) {
  return CopyThen(device_destination, host_source, bytes,
                  cudaMemcpyHostToDevice, device, stream, after, argument);
}

#else  // built without CUDA

namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "liblohan_client was built without CUDA (no toolkit was found at build "
      "time: install one or set CUDA_HOME, and rebuild); use the "
      "*_from_host / *_to_host functions");
}

class NotBuiltProbe final : public DeviceProbe {
 public:
  absl::StatusOr<int> Current() override { return NotBuilt(); }
  absl::StatusOr<bool> HasContext(int) override { return NotBuilt(); }
  absl::Status Set(int) override { return NotBuilt(); }
  absl::Status Clear() override { return NotBuilt(); }
};

}  // namespace

bool BuiltWith() { return false; }
DeviceProbe& RuntimeProbe() {
  static NotBuiltProbe* const probe = new NotBuiltProbe;
  return *probe;
}
absl::Status Available() { return NotBuilt(); }
absl::Status RegisterHost(void*, size_t, int) { return NotBuilt(); }
absl::Status UnregisterHost(void*, int) { return NotBuilt(); }
absl::Status CopyToHostThen(void*, const void*, size_t, int, void*, AfterCopy,
                            void*) {
  return NotBuilt();
}
absl::Status CopyToDeviceThen(void*, const void*, size_t, int, void*, AfterCopy,
                              void*) {
  return NotBuilt();
}

#endif

}  // namespace lohan::cuda
