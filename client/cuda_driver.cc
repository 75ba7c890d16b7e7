#include "client/cuda_driver.h"

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

#include <dlfcn.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace lohan::cuda {

namespace {

constexpr char kWhatToDo[] =
    "lohan needs a driver for CUDA 12.0 or newer (R525+)";

// cuGetProcAddress as the driver exports it: the CUDA 12 form (_v2, with
// a status out) where it has one, else the CUDA 11.3 form.
class ProcAddress {
 public:
  explicit ProcAddress(void* library)
      : v2_(reinterpret_cast<PFN_cuGetProcAddress_v12000>(
            dlsym(library, "cuGetProcAddress_v2"))),
        v1_(reinterpret_cast<PFN_cuGetProcAddress_v11030>(
            dlsym(library, "cuGetProcAddress"))) {}

  bool Found() const { return v2_ != nullptr || v1_ != nullptr; }

  // `symbol` at kDriverApiVersion with CU_GET_PROC_ADDRESS_DEFAULT; null
  // when the driver has no such entry point for that version.
  void* Get(const char* symbol) const {
    void* function = nullptr;
    CUresult result = CUDA_ERROR_NOT_FOUND;
    if (v2_ != nullptr) {
      CUdriverProcAddressQueryResult found =
          CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      result = v2_(symbol, &function, kDriverApiVersion,
                   CU_GET_PROC_ADDRESS_DEFAULT, &found);
      if (found != CU_GET_PROC_ADDRESS_SUCCESS) return nullptr;
    } else {
      result = v1_(symbol, &function, kDriverApiVersion,
                   CU_GET_PROC_ADDRESS_DEFAULT);
    }
    return result == CUDA_SUCCESS ? function : nullptr;
  }

 private:
  PFN_cuGetProcAddress_v12000 v2_;
  PFN_cuGetProcAddress_v11030 v1_;
};

std::string TooOld(int version) {
  return absl::StrCat("the NVIDIA driver supports CUDA ",
                      CudaVersionText(version), "; ", kWhatToDo,
                      ": update the driver");
}

// The refusal for a driver without cuGetProcAddress (older than CUDA
// 11.3): its version when it still answers cuDriverGetVersion by name.
absl::Status NoProcAddress(void* library, const std::string& name) {
  auto get_version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(
      dlsym(library, "cuDriverGetVersion"));
  int version = 0;
  if (get_version != nullptr && get_version(&version) == CUDA_SUCCESS &&
      version > 0) {
    return absl::FailedPreconditionError(TooOld(version));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(name,
                   " has no cuGetProcAddress: it is not an NVIDIA "
                   "driver for CUDA 11.3 or newer; ",
                   kWhatToDo));
}

template <typename Function>
void Fetch(const ProcAddress& proc, const std::string& where,
           const char* symbol, Function& out, absl::Status& status) {
  if (!status.ok()) return;
  out = reinterpret_cast<Function>(proc.Get(symbol));
  if (out == nullptr) {
    status = absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver (", where, ") has no entry point ",
                     symbol, " for CUDA ", CudaVersionText(kDriverApiVersion),
                     "; ", kWhatToDo, ": update the driver"));
  }
}

// Everything but cuDriverGetVersion, fetched first on its own.
absl::Status FetchAll(const ProcAddress& proc, const std::string& where,
                      CudaDriver& d) {
  absl::Status status;
  Fetch(proc, where, "cuInit", d.init, status);
  Fetch(proc, where, "cuGetErrorName", d.get_error_name, status);
  Fetch(proc, where, "cuGetErrorString", d.get_error_string, status);
  Fetch(proc, where, "cuDeviceGetCount", d.device_get_count, status);
  Fetch(proc, where, "cuDeviceGet", d.device_get, status);
  Fetch(proc, where, "cuDevicePrimaryCtxGetState", d.primary_ctx_get_state,
        status);
  Fetch(proc, where, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, status);
  Fetch(proc, where, "cuCtxGetCurrent", d.ctx_get_current, status);
  Fetch(proc, where, "cuCtxSetCurrent", d.ctx_set_current, status);
  Fetch(proc, where, "cuCtxGetDevice", d.ctx_get_device, status);
  Fetch(proc, where, "cuMemHostRegister", d.mem_host_register, status);
  Fetch(proc, where, "cuMemHostUnregister", d.mem_host_unregister, status);
  Fetch(proc, where, "cuMemcpyHtoDAsync", d.memcpy_htod_async, status);
  Fetch(proc, where, "cuMemcpyDtoHAsync", d.memcpy_dtoh_async, status);
  Fetch(proc, where, "cuPointerGetAttribute", d.pointer_get_attribute, status);
  Fetch(proc, where, "cuStreamAddCallback", d.stream_add_callback, status);
  Fetch(proc, where, "cuStreamSynchronize", d.stream_synchronize, status);
  return status;
}

absl::Status CheckVersion(const ProcAddress& proc, const std::string& where,
                          CudaDriver& d) {
  absl::Status status;
  Fetch(proc, where, "cuDriverGetVersion", d.driver_get_version, status);
  if (!status.ok()) return status;
  if (d.driver_get_version(&d.version) != CUDA_SUCCESS || d.version <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver (", where,
                     ") does not say its version; ", kWhatToDo));
  }
  if (d.version < kDriverApiVersion) {
    return absl::FailedPreconditionError(TooOld(d.version));
  }
  return absl::OkStatus();
}

absl::Status Initialize(const std::string& where, const CudaDriver& d) {
  const CUresult result = d.init(0);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cuInit failed: ", d.ErrorText(result),
      result == CUDA_ERROR_NO_DEVICE ? " (CUDA_VISIBLE_DEVICES?)" : "",
      "; the NVIDIA driver (", where, ") supports CUDA ",
      CudaVersionText(d.version)));
}

// A pointer into read-only data (not a std::string the compiler could build
// from immediates): the library visibly names libcuda.so.1, which
// tests/c_abi_test.cc checks.
const char* DriverLibrary() {
  const char* configured = std::getenv(kDriverLibraryVariable);
  return configured != nullptr && configured[0] != '\0' ? configured
                                                        : kDefaultDriverLibrary;
}

}  // namespace

CudaDriver::CudaDriver() = default;
CudaDriver::~CudaDriver() = default;

void CudaDriver::LibraryCloser::operator()(void* handle) const {
  if (handle != nullptr) (void)dlclose(handle);
}

std::string CudaDriver::ErrorText(CUresult error) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name == nullptr ||
      get_error_name(error, &name) != CUDA_SUCCESS || name == nullptr) {
    return absl::StrCat("CUDA error ", static_cast<int>(error));
  }
  if (get_error_string == nullptr ||
      get_error_string(error, &text) != CUDA_SUCCESS || text == nullptr) {
    return name;
  }
  return absl::StrCat(name, " (", text, ")");
}

std::string CudaVersionText(int version) {
  return absl::StrCat(version / 1000, ".", version % 1000 / 10);
}

absl::StatusOr<std::unique_ptr<CudaDriver>> OpenCudaDriver(
    const std::string& library) {
  auto driver = std::make_unique<CudaDriver>();
  (void)dlerror();
  driver->library.reset(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (driver->library == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "no NVIDIA driver: ", library, " cannot be loaded (",
        why != nullptr ? why : "no reason given", "); ", kWhatToDo,
        " and a GPU. Use the *_from_host / *_to_host functions on a machine "
        "without a GPU"));
  }
  const ProcAddress proc(driver->library.get());
  if (!proc.Found()) return NoProcAddress(driver->library.get(), library);
  if (absl::Status version = CheckVersion(proc, library, *driver);
      !version.ok()) {
    return version;
  }
  if (absl::Status fetched = FetchAll(proc, library, *driver); !fetched.ok()) {
    return fetched;
  }
  if (absl::Status initialized = Initialize(library, *driver);
      !initialized.ok()) {
    return initialized;
  }
  return driver;
}

absl::StatusOr<const CudaDriver*> LoadCudaDriver() {
  using Loaded = absl::StatusOr<std::unique_ptr<CudaDriver>>;
  static const Loaded* const loaded =
      new Loaded(OpenCudaDriver(DriverLibrary()));
  if (!loaded->ok()) return loaded->status();
  return loaded->value().get();
}

}  // namespace lohan::cuda

#endif  // LOHAN_WITH_CUDA
