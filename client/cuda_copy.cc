#include "client/cuda_copy.h"

#include <memory>

#include "absl/strings/str_cat.h"

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA
#include <map>

#include "absl/synchronization/mutex.h"
#include "client/cuda_driver.h"
#endif

namespace lohan::cuda {

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

namespace {

absl::StatusCode CodeOf(CUresult error) {
  switch (error) {
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
      return absl::StatusCode::kAlreadyExists;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
      return absl::StatusCode::kNotFound;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status Failed(const CudaDriver& driver, CUresult error,
                    const char* what) {
  return absl::Status(CodeOf(error),
                      absl::StrCat(what, ": ", driver.ErrorText(error)));
}

absl::Status Probe() {
  absl::StatusOr<const CudaDriver*> driver = LoadCudaDriver();
  if (!driver.ok()) return driver.status();
  int devices = 0;
  if (CUresult error = (*driver)->device_get_count(&devices);
      error != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: cuDeviceGetCount: ",
                     (*driver)->ErrorText(error), "; the driver supports CUDA ",
                     CudaVersionText((*driver)->version)));
  }
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device visible to this process (CUDA_VISIBLE_DEVICES?)");
  }
  return absl::OkStatus();
}

// The driver, or why there is none usable (Available()'s reason).
absl::StatusOr<const CudaDriver*> UsableDriver() {
  if (absl::Status available = Available(); !available.ok()) return available;
  return LoadCudaDriver();
}

class CudaDriverProbe final : public DeviceProbe {
 public:
  absl::StatusOr<int> Current() override {
    absl::StatusOr<const CudaDriver*> driver = UsableDriver();
    if (!driver.ok()) return driver.status();
    CUcontext context = nullptr;
    if (CUresult error = (*driver)->ctx_get_current(&context);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuCtxGetCurrent");
    }
    if (context == nullptr) return kNoCurrentContext;
    CUdevice device = 0;
    if (CUresult error = (*driver)->ctx_get_device(&device);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuCtxGetDevice");
    }
    return static_cast<int>(device);
  }

  absl::StatusOr<bool> HasContext(int device) override {
    absl::StatusOr<const CudaDriver*> driver = UsableDriver();
    if (!driver.ok()) return driver.status();
    CUdevice handle = 0;
    if (CUresult error = (*driver)->device_get(&handle, device);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuDeviceGet");
    }
    unsigned int flags = 0;
    int active = 0;
    if (CUresult error =
            (*driver)->primary_ctx_get_state(handle, &flags, &active);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuDevicePrimaryCtxGetState");
    }
    return active != 0;
  }

  absl::Status Set(int device) override {
    absl::StatusOr<const CudaDriver*> driver = UsableDriver();
    if (!driver.ok()) return driver.status();
    absl::StatusOr<CUcontext> context = PrimaryContext(**driver, device);
    if (!context.ok()) return context.status();
    if (CUresult error = (*driver)->ctx_set_current(*context);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuCtxSetCurrent");
    }
    return absl::OkStatus();
  }

  absl::Status Clear() override {
    absl::StatusOr<const CudaDriver*> driver = UsableDriver();
    if (!driver.ok()) return driver.status();
    if (CUresult error = (*driver)->ctx_set_current(nullptr);
        error != CUDA_SUCCESS) {
      return Failed(**driver, error, "cuCtxSetCurrent(NULL)");
    }
    return absl::OkStatus();
  }

 private:
  // `device`'s primary context, retained on first use and held for the
  // life of the process (as cudaSetDevice does).
  absl::StatusOr<CUcontext> PrimaryContext(const CudaDriver& driver,
                                           int device) {
    absl::MutexLock lock(&mutex_);
    if (auto found = retained_.find(device); found != retained_.end()) {
      return found->second;
    }
    CUdevice handle = 0;
    if (CUresult error = driver.device_get(&handle, device);
        error != CUDA_SUCCESS) {
      return Failed(driver, error,
                    absl::StrCat("CUDA device ", device).c_str());
    }
    CUcontext context = nullptr;
    if (CUresult error = driver.primary_ctx_retain(&context, handle);
        error != CUDA_SUCCESS) {
      return Failed(driver, error, "cuDevicePrimaryCtxRetain");
    }
    retained_.emplace(device, context);
    return context;
  }

  absl::Mutex mutex_;
  std::map<int, CUcontext> retained_ ABSL_GUARDED_BY(mutex_);
};

// Whether the driver knows `pointer` as device (or managed) memory; an
// unknown pointer is CUDA_ERROR_INVALID_VALUE. Creates no context.
absl::StatusOr<bool> IsDevicePointer(const CudaDriver& driver,
                                     CUdeviceptr pointer, const char* what) {
  unsigned int type = 0;
  CUresult error = driver.pointer_get_attribute(
      &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pointer);
  if (error == CUDA_ERROR_INVALID_VALUE) return false;
  if (error != CUDA_SUCCESS) return Failed(driver, error, what);
  if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED) {
    return true;
  }
  int managed = 0;
  error = driver.pointer_get_attribute(
      &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, pointer);
  return error == CUDA_SUCCESS && managed != 0;
}

// Which device holds the device pointer, asked of the driver (for
// kUnspecifiedDevice only).
absl::StatusOr<int> DeviceOfPointer(const CudaDriver& driver,
                                    const void* pointer, const char* what) {
  const auto address = reinterpret_cast<CUdeviceptr>(pointer);
  absl::StatusOr<bool> on_device = IsDevicePointer(driver, address, what);
  if (!on_device.ok()) return on_device.status();
  if (!*on_device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a CUDA device pointer"));
  }
  int device = 0;
  if (CUresult error = driver.pointer_get_attribute(
          &device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
      error != CUDA_SUCCESS) {
    return Failed(driver, error, what);
  }
  return device;
}

// Enters `guard` on `device`; kUnspecifiedDevice: on the thread's current
// device (nothing switched), or device 0 where none is current.
absl::Status EnterOn(DeviceGuard& guard, int device) {
  if (device != kUnspecifiedDevice) return guard.Enter(device);
  absl::StatusOr<int> current = DriverProbe().Current();
  if (!current.ok()) return current.status();
  if (*current != DeviceProbe::kNoCurrentContext) return absl::OkStatus();
  return guard.Enter(0);
}

}  // namespace

bool BuiltWith() { return true; }

DeviceProbe& DriverProbe() {
  static CudaDriverProbe* const probe = new CudaDriverProbe;
  return *probe;
}

absl::Status Available() {
  static const absl::Status* const probed = new absl::Status(Probe());
  return *probed;
}

absl::Status RegisterHost(void* base, size_t bytes, int device) {
  absl::StatusOr<const CudaDriver*> driver = UsableDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(DriverProbe());
  if (absl::Status entered = EnterOn(guard, device); !entered.ok()) {
    return entered;
  }
  if (CUresult error = (*driver)->mem_host_register(
          base, bytes, CU_MEMHOSTREGISTER_PORTABLE);
      error != CUDA_SUCCESS) {
    return Failed(**driver, error, "cuMemHostRegister of the arena");
  }
  return absl::OkStatus();
}

absl::Status UnregisterHost(void* base, int device) {
  absl::StatusOr<const CudaDriver*> driver = UsableDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(DriverProbe());
  if (absl::Status entered = EnterOn(guard, device); !entered.ok()) {
    return entered;
  }
  if (CUresult error = (*driver)->mem_host_unregister(base);
      error != CUDA_SUCCESS) {
    return Failed(**driver, error, "cuMemHostUnregister of the arena");
  }
  return absl::OkStatus();
}

namespace {

struct Pending {
  AfterCopy after;
  void* argument;
};

void CUDA_CB RunAfterCopy(CUstream, CUresult status, void* data) {
  std::unique_ptr<Pending> pending(static_cast<Pending*>(data));
  // No driver call in here (not even for the error's name).
  pending->after(
      pending->argument,
      status == CUDA_SUCCESS
          ? absl::OkStatus()
          : absl::InternalError(absl::StrCat(
                "CUDA error ", static_cast<int>(status),
                " on the stream before the copy to or from the arena "
                "completed (see torch.cuda for the cause)")));
}

// Enqueues the copy itself on `stream` (the right context is current).
CUresult EnqueueCopy(const CudaDriver& driver, void* destination,
                     const void* source, size_t bytes, bool to_host,
                     CUstream stream) {
  return to_host ? driver.memcpy_dtoh_async(
                       destination, reinterpret_cast<CUdeviceptr>(source),
                       bytes, stream)
                 : driver.memcpy_htod_async(
                       reinterpret_cast<CUdeviceptr>(destination), source,
                       bytes, stream);
}

absl::Status CopyThen(void* destination, const void* source, size_t bytes,
                      bool to_host, int device, void* stream, AfterCopy after,
                      void* argument) {
  absl::StatusOr<const CudaDriver*> loaded = UsableDriver();
  if (!loaded.ok()) return loaded.status();
  const CudaDriver& driver = **loaded;
  if (device == kUnspecifiedDevice) {
    absl::StatusOr<int> found =
        DeviceOfPointer(driver, to_host ? source : destination,
                        to_host ? "the gradient's device pointer"
                                : "the weights' device pointer");
    if (!found.ok()) return found.status();
    device = *found;
  }
  DeviceGuard guard(DriverProbe());
  if (absl::Status entered = guard.Enter(device); !entered.ok()) {
    return entered;
  }
  auto cu_stream = static_cast<CUstream>(stream);
  if (CUresult error =
          EnqueueCopy(driver, destination, source, bytes, to_host, cu_stream);
      error != CUDA_SUCCESS) {
    return Failed(driver, error,
                  to_host ? "cuMemcpyDtoHAsync device to arena"
                          : "cuMemcpyHtoDAsync arena to device");
  }
  auto pending = std::make_unique<Pending>(Pending{after, argument});
  if (CUresult error = driver.stream_add_callback(cu_stream, &RunAfterCopy,
                                                  pending.get(), /*flags=*/0);
      error != CUDA_SUCCESS) {
    // The copy is enqueued: let it land (or fail) before the caller frees
    // or reuses the arena bytes it touches.
    (void)driver.stream_synchronize(cu_stream);
    return Failed(driver, error, "cuStreamAddCallback");
  }
  (void)pending.release();  // RunAfterCopy owns it now.
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyToHostThen(void* host_destination, const void* device_source,
                            size_t bytes, int device, void* stream,
                            AfterCopy after, void* argument) {
  return CopyThen(host_destination, device_source, bytes, /*to_host=*/true,
                  device, stream, after, argument);
}

absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, int device, void* stream,
                              AfterCopy after, void* argument) {
  return CopyThen(device_destination, host_source, bytes, /*to_host=*/false,
                  device, stream, after, argument);
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
DeviceProbe& DriverProbe() {
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
