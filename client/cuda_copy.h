#ifndef LOHAN_CLIENT_CUDA_COPY_H_
#define LOHAN_CLIENT_CUDA_COPY_H_

#include <cstddef>

#include "absl/status/status.h"

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
//   thread, which both runtimes read: a copy makes the device holding its
//   device pointer current only while it enqueues, then restores the
//   previous one, so torch's current device never moves.
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

// Pins [base, base + bytes) for DMA from every context
// (cudaHostRegisterPortable).
absl::Status RegisterHost(void* base, size_t bytes);
absl::Status UnregisterHost(void* base);

// Called exactly once, on a CUDA thread, when what was enqueued on the
// stream before it (the copy) is done: with OK, or with the stream's error
// (the copy then did not complete). Must not call CUDA, and must not lock
// or wait (that would hold up the stream): hand the work to another thread
// (DataPlane::Deliver).
using AfterCopy = void (*)(void* argument, absl::Status copied);

// cudaMemcpyAsync on `stream` (a cudaStream_t; NULL is the legacy default
// stream), then `after(argument, ...)` from a stream callback on the same
// stream, both enqueued on the device that holds the device pointer (so the
// legacy stream is that device's for both). The callback also runs when the
// stream hits an error, so whoever waits on it is never left hanging. On an
// error return `after` never runs and no copy is in flight.
absl::Status CopyToHostThen(void* host_destination, const void* device_source,
                            size_t bytes, void* stream, AfterCopy after,
                            void* argument);
absl::Status CopyToDeviceThen(void* device_destination, const void* host_source,
                              size_t bytes, void* stream, AfterCopy after,
                              void* argument);

}  // namespace lohan::cuda

#endif  // LOHAN_CLIENT_CUDA_COPY_H_
