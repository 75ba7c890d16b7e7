#ifndef LOHAN_CLIENT_CUDA_DRIVER_H_
#define LOHAN_CLIENT_CUDA_DRIVER_H_

// The CUDA driver API (libcuda.so.1, installed with the NVIDIA driver),
// loaded with dlopen at run time: liblohan_client links nothing from the
// CUDA toolkit and needs only a driver for CUDA 12.0 or newer (R525+).
// Every entry point is fetched with cuGetProcAddress at API version 12000,
// so its behaviour and signature are CUDA 12.0's on every newer driver,
// and the function pointer types below are the toolkit's versioned
// PFN_*_v<N> typedefs for that version (cudaTypedefs.h).
//
// Only where the client was built against a toolkit (LOHAN_WITH_CUDA=1,
// scripts/bazel/cuda.bzl): the header is empty otherwise.

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lohan::cuda {

// The API version every entry point is requested at, and the oldest driver
// accepted (CUDA 12.0: NVIDIA driver R525).
inline constexpr int kDriverApiVersion = 12000;

// Where the driver is looked for: this environment variable's value when
// set and not empty (a path, or a name for the dynamic loader), else
// "libcuda.so.1".
inline constexpr char kDriverLibraryVariable[] = "LOHAN_CUDA_DRIVER_LIBRARY";
inline constexpr char kDefaultDriverLibrary[] = "libcuda.so.1";

// A loaded, initialized (cuInit(0)) driver: every pointer is non-null. The
// library stays loaded as long as the object lives. Thread-safe (the
// driver is).
struct CudaDriver {
  CudaDriver();
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // Each named as the entry point without "cu", in snake case (cuda.h
  // #defines several cu* names to their _v2 forms).
  // cuDriverGetVersion's answer: 1000 * major + 10 * minor (12040: 12.4).
  int version = 0;

  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_get_state = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device = nullptr;
  PFN_cuMemHostRegister_v6050 mem_host_register = nullptr;
  PFN_cuMemHostUnregister_v4000 mem_host_unregister = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async = nullptr;
  PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async = nullptr;
  PFN_cuPointerGetAttribute_v4000 pointer_get_attribute = nullptr;
  PFN_cuStreamAddCallback_v5000 stream_add_callback = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;

  // "CUDA_ERROR_X (what the driver says it means)", from cuGetErrorName and
  // cuGetErrorString; the number where the driver does not know it.
  std::string ErrorText(CUresult error) const;

  // The dlopen handle, closed by the destructor.
  struct LibraryCloser {
    void operator()(void* handle) const;
  };
  std::unique_ptr<void, LibraryCloser> library;
};

// Loads the driver at `library` (dlopen), fetches every entry point above
// and calls cuInit(0). Each call loads anew (the dynamic loader shares one
// copy of the library between them). FAILED_PRECONDITION, saying what is
// wrong and what to do, when the library cannot be loaded, lacks
// cuGetProcAddress or an entry point, is older than CUDA 12.0, or cuInit
// fails.
absl::StatusOr<std::unique_ptr<CudaDriver>> OpenCudaDriver(
    const std::string& library);

// The process's driver: OpenCudaDriver of $LOHAN_CUDA_DRIVER_LIBRARY or
// "libcuda.so.1", done once (the first call's environment decides; the
// answer, a refusal included, is kept for the life of the process).
// Thread-safe.
absl::StatusOr<const CudaDriver*> LoadCudaDriver();

// "12.4" for 12040.
std::string CudaVersionText(int version);

}  // namespace lohan::cuda

#endif  // LOHAN_WITH_CUDA

#endif  // LOHAN_CLIENT_CUDA_DRIVER_H_
