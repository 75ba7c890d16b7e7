#ifndef LOHAN_CLIENT_CUDA_COPY_H_
#define LOHAN_CLIENT_CUDA_COPY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "client/device_guard.h"

// The CUDA side of the data plane: pinning the job's arena and copying
// between GPU memory and the arena on the caller's stream. Built where a
// toolkit was found at build time (scripts/bazel/cuda.bzl defines
// LOHAN_WITH_CUDA=1), over the driver API loaded at run time
// (cuda_driver.h: libcuda.so.1, any driver for CUDA 12.0 or newer; nothing
// from the toolkit is linked in or needed at run time); otherwise every
// function here says so.
//
// Living beside a CUDA runtime: a training process usually has torch's
// libcudart. It is another client of the same driver, and both use each
// device's primary context, so:
// - a stream is a driver handle (cudaStream_t is CUstream; the legacy and
//   per-thread default streams, 0, 0x1 and 0x2, mean the same in both
//   APIs): torch's stream (torch.cuda.current_stream().cuda_stream) can be
//   passed here as is, and our copies and callbacks are ordered with
//   torch's kernels on it;
// - device pointers are the primary context's, valid in both;
// - cuMemHostRegister with CU_MEMHOSTREGISTER_PORTABLE pins the pages and
//   makes every context treat them as pinned, so torch's copies from the
//   arena (e.g. tensor.copy_ from a torch.frombuffer view) are DMA'ed too;
// - "current device" is the driver's current context of the thread, which
//   torch's runtime reads too: every call here makes the job's device's
//   primary context current only while it runs (a DeviceGuard,
//   device_guard.h), then restores the previous one, so torch's current
//   device never moves, and a thread that had no context is left without
//   one (no context is created on a device, e.g. GPU 0, that the job does
//   not use).
//
// Thread-safe (the driver is).
namespace lohan::cuda {

// Whether this library was built against a CUDA toolkit.
bool BuiltWith();

// OK when CUDA can be used in this process: built with it, a driver for
// CUDA 12.0 or newer loaded (LoadCudaDriver), at least one device.
// Otherwise UNIMPLEMENTED (not built with CUDA) or FAILED_PRECONDITION
// saying which and what to do. Probed once.
absl::Status Available();

// For `device` below: the caller did not say. Registration then runs on
// the thread's current device, or on device 0 when the thread has no
// current context (creating its primary context, as the runtime API
// would); a copy asks the driver which device holds its device pointer
// (cuPointerGetAttribute, which creates no context). Only the ABI functions
// without a device argument pass it.
inline constexpr int kUnspecifiedDevice = -1;

// The real probe, over the driver: Current is cuCtxGetCurrent +
// cuCtxGetDevice, HasContext cuDevicePrimaryCtxGetState, Set retains the
// device's primary context (once per device, held for the life of the
// process, as the runtime's cudaSetDevice does) and makes it current with
// cuCtxSetCurrent, Clear is cuCtxSetCurrent(NULL). Every call fails with
// Available()'s reason where the driver cannot be loaded; built without
// CUDA, UNIMPLEMENTED.
DeviceProbe& DriverProbe();

// Pins [base, base + bytes) for DMA from every context
// (CU_MEMHOSTREGISTER_PORTABLE), the call made on `device` (a CUDA device
// index, or kUnspecifiedDevice). Unregister on the device registered with.
absl::Status RegisterHost(void* base, size_t bytes, int device);
absl::Status UnregisterHost(void* base, int device);

// Called exactly once, on a driver thread, when what was enqueued on the
// stream before it (the copy) is done: with OK, or with the stream's error
// (the copy then did not complete). Must not call CUDA, and must not lock
// or wait (that would hold up the stream): hand the work to another thread
// (DataPlane::Deliver).
using AfterCopy = void (*)(void* argument, absl::Status copied);

// cuMemcpyDtoHAsync / cuMemcpyHtoDAsync on `stream` (a CUstream, i.e. a
// cudaStream_t; NULL is the legacy default stream), then `after(argument,
// ...)` from a cuStreamAddCallback callback on the same stream, both
// enqueued with `device`'s primary context current; it must hold the
// device pointer and the stream (kUnspecifiedDevice: the device holding
// the pointer, asked of the driver); the legacy stream is then that
// device's for both. Returns once both are enqueued (the copy itself is
// asynchronous to the caller where the host side is pinned, as the
// registered arena is). The callback also runs when the stream hits an
// error, so whoever waits on it is never left hanging. On an error return
// `after` never runs and no copy is in flight.
absl::Status CopyToHostThen(void* host_destination, const void* device_source,
                            size_t bytes, int device, void* stream,
                            AfterCopy after, void* argument);
absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, int device, void* stream,
                              AfterCopy after, void* argument);

}  // namespace lohan::cuda

#endif  // LOHAN_CLIENT_CUDA_COPY_H_
