#ifndef LOHAN_CLIENT_CUDA_COPY_H_
#define LOHAN_CLIENT_CUDA_COPY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "client/device_guard.h"

// The CUDA side of the data plane: pinning the job's arena and copying
// between GPU memory and the arena on the caller's stream. Built against the
// toolkit's runtime API where one was found at build time
// (scripts/bazel/cuda.bzl defines LOHAN_WITH_CUDA=1), with the static runtime
// linked into liblohan_client.so; otherwise every function here says so.
//
// Living beside another CUDA runtime: a training process usually has
// torch's own (dynamic) libcudart too. The two runtimes are two clients of
// the same driver (libcuda.so.1) and both use each device's primary context,
// so:
// - a stream is a driver handle (cudaStream_t is CUstream): torch's stream
//   (torch.cuda.current_stream().cuda_stream) can be passed here as is, and
//   our copies and host functions are ordered with torch's kernels on it;
// - device pointers are the primary context's, valid in both;
// - cudaHostRegister with cudaHostRegisterPortable pins the pages and makes
//   every context treat them as pinned, so torch's copies from the arena
//   (e.g. tensor.copy_ from a torch.frombuffer view) are DMA'ed as well.
// - "current device" is, underneath, the driver's current context of the
//   thread, which both runtimes read: every call here makes the job's
//   device current only while it runs (a DeviceGuard, device_guard.h), then
//   restores the previous one, so torch's current device never moves, and a
//   thread that had no context is left without one (no context is created
//   on a device, e.g. GPU 0, that the job does not use).
//
// Thread-safe (the CUDA runtime is).
namespace lohan::cuda {

// Whether this library was built against a CUDA toolkit.
bool BuiltWith();

// OK when CUDA can be used in this process: built with it, a driver new
// enough for the runtime inside, at least one device. Otherwise
// UNIMPLEMENTED (not built with CUDA) or FAILED_PRECONDITION saying which.
// Probed once.
absl::Status Available();

// For `device` below: the caller did not say. Registration then runs on
// the thread's current device; a copy asks CUDA where its device pointer
// lives (cudaPointerGetAttributes, which may create a context on the
// current device when the thread has none). Only the ABI functions without
// a device argument pass it.
inline constexpr int kUnspecifiedDevice = -1;

// The real probe (cudaGetDevice / cudaSetDevice, and the driver's
// cuCtxGetCurrent / cuDevicePrimaryCtxGetState / cuCtxSetCurrent through
// cudaGetDriverEntryPointByVersion, so no libcuda link). Where the driver
// entry points cannot be had, HasContext says true (so the previous device
// is set back, as before guards knew better) and Clear fails. Built without
// CUDA: every call is UNIMPLEMENTED.
DeviceProbe& RuntimeProbe();

// Pins [base, base + bytes) for DMA from every context
// (cudaHostRegisterPortable), the call made on `device` (a CUDA device
// index, or kUnspecifiedDevice). Unregister on the device registered with.
absl::Status RegisterHost(void* base, size_t bytes, int device);
absl::Status UnregisterHost(void* base, int device);

// Called exactly once, on a CUDA thread, when what was enqueued on the
// stream before it (the copy) is done: with OK, or with the stream's error
// (the copy then did not complete). Must not call CUDA, and must not lock
// or wait (that would hold up the stream): hand the work to another thread
// (DataPlane::Deliver).
using AfterCopy = void (*)(void* argument, absl::Status copied);

// cudaMemcpyAsync on `stream` (a cudaStream_t; NULL is the legacy default
// stream), then `after(argument, ...)` from a stream callback on the same
// stream, both enqueued on `device`, which must hold the device pointer and
// the stream (kUnspecifiedDevice: the device holding the pointer, asked of
// CUDA); the legacy stream is then that device's for both. The callback also
// runs when the stream hits an error, so whoever waits on it is never left
// hanging. On an error return `after` never runs and no copy is in flight.
absl::Status CopyToHostThen(void* host_destination, const void* device_source,
                            size_t bytes, int device, void* stream,
                            AfterCopy after, void* argument);
absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, int device, void* stream,
                              AfterCopy after, void* argument);

}  // namespace lohan::cuda

#endif  // LOHAN_CLIENT_CUDA_COPY_H_
