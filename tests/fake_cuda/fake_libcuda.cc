// A fake NVIDIA driver (libcuda.so.1) on host memory, for testing
// liblohan_client's driver loader (client/cuda_driver.h) and its CUDA copies
// (client/cuda_copy.h) on machines without a GPU. Loaded through
// LOHAN_CUDA_DRIVER_LIBRARY.
//
// What it proves: that the client finds the entry points through
// cuGetProcAddress(_v2) at API version 12000 and calls them with the
// toolkit's signatures for that version (every function here is stored
// through the same PFN_*_v<N> typedef the client uses, and the exported
// cuGetProcAddress forms are checked against cuda.h's declarations), and
// the client's bookkeeping: which context is current when, which primary
// contexts get retained, pinning, stream order, callbacks off the caller's
// thread, error paths. What it cannot prove: anything about a GPU (real
// DMA, a real driver's rules for pageable memory, timing, errors only
// hardware raises, interplay with torch's runtime).
//
// Model: FAKE_CUDA_DEVICE_COUNT devices (default 4), each with a primary
// context (a struct) that is "active" once retained. "Device memory" is
// host memory handed out by fake_cuda_device_alloc, kept in a table so
// cuPointerGetAttribute can answer; registered host ranges in another.
// Every stream (the legacy stream of each device, and those made by
// fake_cuda_stream_create) has one worker thread that runs its copies and
// callbacks in order. Environment, read at each call: FAKE_CUDA_DRIVER_VERSION
// (cuDriverGetVersion's answer, default 12080), FAKE_CUDA_MISSING (an entry
// point name cuGetProcAddress says it lacks), FAKE_CUDA_INIT_ERROR (what
// cuInit returns, default 0).

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

// The declarations under their exported names, as the driver sees them.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

struct CUctx_st {
  int device = 0;
};

// One stream: a worker thread running its tasks in order.
struct CUstream_st {
  explicit CUstream_st(int on_device) : device(on_device) {
    worker = std::thread([this] { Run(); });
  }

  // Queues `task`, run with the stream's sticky error (CUDA_SUCCESS while
  // none was injected).
  void Enqueue(std::function<void(CUresult)> task) {
    std::lock_guard<std::mutex> lock(mutex);
    tasks.push_back(std::move(task));
    changed.notify_all();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return !held && !tasks.empty(); });
      std::function<void(CUresult)> task = std::move(tasks.front());
      tasks.pop_front();
      const CUresult status = error;
      lock.unlock();
      task(status);
      lock.lock();
    }
  }

  const int device;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void(CUresult)>> tasks;
  bool held = false;
  CUresult error = CUDA_SUCCESS;
  std::thread worker;
};

namespace {

constexpr int kMaxDevices = 8;

struct Range {
  size_t bytes = 0;
  int device = 0;
  unsigned int flags = 0;
};

// Everything but the thread's current context. Never destroyed: stream
// workers run until the process exits.
struct State {
  std::mutex mutex;
  bool initialized = false;
  CUctx_st contexts[kMaxDevices];
  int retained[kMaxDevices] = {};
  CUstream_st* legacy[kMaxDevices] = {};
  std::map<uintptr_t, Range> device_memory;
  std::map<uintptr_t, Range> registered;
  std::atomic<int> odd_requests{0};

  State() {
    for (int d = 0; d < kMaxDevices; ++d) contexts[d].device = d;
  }
};

State& S() {
  static State* const state = new State;
  return *state;
}

thread_local CUcontext current = nullptr;

int EnvInt(const char* name, int otherwise) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? std::atoi(value) : otherwise;
}

int DeviceCount() {
  const int count = EnvInt("FAKE_CUDA_DEVICE_COUNT", 4);
  return count < 0 ? 0 : count > kMaxDevices ? kMaxDevices : count;
}

// The range of `table` holding [address, address + bytes), or null.
const Range* Find(const std::map<uintptr_t, Range>& table, uintptr_t address,
                  size_t bytes) {
  auto after = table.upper_bound(address);
  if (after == table.begin()) return nullptr;
  auto found = std::prev(after);
  if (address + bytes > found->first + found->second.bytes) return nullptr;
  return &found->second;
}

CUstream_st* LegacyStream(int device) {
  std::lock_guard<std::mutex> lock(S().mutex);
  if (S().legacy[device] == nullptr) {
    S().legacy[device] = new CUstream_st(device);
  }
  return S().legacy[device];
}

// The stream a handle names with the current context, or null: the three
// default-stream handles mean the current device's legacy stream.
CUresult Resolve(CUstream handle, CUstream_st** stream) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (handle == nullptr || handle == CU_STREAM_LEGACY ||
      handle == CU_STREAM_PER_THREAD) {
    *stream = LegacyStream(current->device);
    return CUDA_SUCCESS;
  }
  if (handle->device != current->device) return CUDA_ERROR_INVALID_HANDLE;
  *stream = handle;
  return CUDA_SUCCESS;
}

// ---- the entry points

CUresult FakeInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult forced =
      static_cast<CUresult>(EnvInt("FAKE_CUDA_INIT_ERROR", 0));
  if (forced != CUDA_SUCCESS) return forced;
  std::lock_guard<std::mutex> lock(S().mutex);
  S().initialized = true;
  return CUDA_SUCCESS;
}

bool Initialized() {
  std::lock_guard<std::mutex> lock(S().mutex);
  return S().initialized;
}

CUresult FakeDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = EnvInt("FAKE_CUDA_DRIVER_VERSION", 12080);
  return CUDA_SUCCESS;
}

struct ErrorName {
  CUresult error;
  const char* name;
  const char* text;
};

constexpr ErrorName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
};

CUresult LookUpError(CUresult error, const char** out, bool name) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorName& known : kErrors) {
    if (known.error == error) {
      *out = name ? known.name : known.text;
      return CUDA_SUCCESS;
    }
  }
  *out = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult FakeGetErrorName(CUresult error, const char** out) {
  return LookUpError(error, out, /*name=*/true);
}

CUresult FakeGetErrorString(CUresult error, const char** out) {
  return LookUpError(error, out, /*name=*/false);
}

CUresult FakeDeviceGetCount(int* count) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = DeviceCount();
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGet(CUdevice_v1* device, int ordinal) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult FakePrimaryCtxGetState(CUdevice_v1 device, unsigned int* flags,
                                int* active) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(S().mutex);
  *flags = 0;
  *active = S().retained[device] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult FakePrimaryCtxRetain(CUcontext* context, CUdevice_v1 device) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= DeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(S().mutex);
  ++S().retained[device];
  *context = &S().contexts[device];
  return CUDA_SUCCESS;
}

CUresult FakeCtxGetCurrent(CUcontext* context) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *context = current;
  return CUDA_SUCCESS;
}

CUresult FakeCtxSetCurrent(CUcontext context) {
  if (context != nullptr) {
    std::lock_guard<std::mutex> lock(S().mutex);
    if (S().retained[context->device] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  current = context;
  return CUDA_SUCCESS;
}

CUresult FakeCtxGetDevice(CUdevice_v1* device) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = current->device;
  return CUDA_SUCCESS;
}

bool Overlaps(const std::map<uintptr_t, Range>& table, uintptr_t address,
              size_t bytes) {
  for (const auto& [base, range] : table) {
    if (address < base + range.bytes && base < address + bytes) return true;
  }
  return false;
}

CUresult FakeMemHostRegister(void* base, size_t bytes, unsigned int flags) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (base == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto address = reinterpret_cast<uintptr_t>(base);
  std::lock_guard<std::mutex> lock(S().mutex);
  if (Overlaps(S().registered, address, bytes)) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  S().registered[address] = Range{bytes, current->device, flags};
  return CUDA_SUCCESS;
}

CUresult FakeMemHostUnregister(void* base) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(S().mutex);
  if (S().registered.erase(reinterpret_cast<uintptr_t>(base)) == 0) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  return CUDA_SUCCESS;
}

// A copy between host memory and [device, device + bytes) of the stream's
// device, run by the stream's worker (skipped after an injected error).
CUresult EnqueueCopy(void* to, const void* from, CUdeviceptr_v2 device,
                     size_t bytes, CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult resolved = Resolve(handle, &stream); resolved != CUDA_SUCCESS) {
    return resolved;
  }
  {
    std::lock_guard<std::mutex> lock(S().mutex);
    const Range* range = Find(S().device_memory, device, bytes);
    if (range == nullptr || range->device != stream->device) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  stream->Enqueue([to, from, bytes](CUresult error) {
    if (error == CUDA_SUCCESS) std::memcpy(to, from, bytes);
  });
  return CUDA_SUCCESS;
}

CUresult FakeMemcpyHtoDAsync(CUdeviceptr_v2 destination, const void* source,
                             size_t bytes, CUstream stream) {
  return EnqueueCopy(reinterpret_cast<void*>(destination), source, destination,
                     bytes, stream);
}

CUresult FakeMemcpyDtoHAsync(void* destination, CUdeviceptr_v2 source,
                             size_t bytes, CUstream stream) {
  return EnqueueCopy(destination, reinterpret_cast<const void*>(source), source,
                     bytes, stream);
}

CUresult FakePointerGetAttribute(void* data, CUpointer_attribute attribute,
                                 CUdeviceptr_v2 pointer) {
  std::lock_guard<std::mutex> lock(S().mutex);
  const Range* on_device = Find(S().device_memory, pointer, 1);
  const Range* range =
      on_device != nullptr ? on_device : Find(S().registered, pointer, 1);
  if (range == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) =
          on_device != nullptr ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = range->device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult FakeStreamAddCallback(CUstream handle, CUstreamCallback callback,
                               void* data, unsigned int flags) {
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* stream = nullptr;
  if (CUresult resolved = Resolve(handle, &stream); resolved != CUDA_SUCCESS) {
    return resolved;
  }
  stream->Enqueue([handle, callback, data](CUresult error) {
    callback(handle, error, data);
  });
  return CUDA_SUCCESS;
}

CUresult FakeStreamSynchronize(CUstream handle) {
  CUstream_st* stream = nullptr;
  if (CUresult resolved = Resolve(handle, &stream); resolved != CUDA_SUCCESS) {
    return resolved;
  }
  std::mutex done_mutex;
  std::condition_variable done_changed;
  bool done = false;
  CUresult result = CUDA_SUCCESS;
  stream->Enqueue([&](CUresult error) {
    std::lock_guard<std::mutex> lock(done_mutex);
    result = error;
    done = true;
    done_changed.notify_all();
  });
  std::unique_lock<std::mutex> lock(done_mutex);
  done_changed.wait(lock, [&] { return done; });
  return result;
}

// Each stored through the client's typedef: a signature mismatch does not
// compile.
struct Entry {
  const char* name;
  void* function;
};

template <typename Pfn>
Entry Make(const char* name, Pfn function) {
  return Entry{name, reinterpret_cast<void*>(function)};
}

const Entry* Entries(size_t* count) {
  static const Entry entries[] = {
      Make<PFN_cuInit_v2000>("cuInit", &FakeInit),
      Make<PFN_cuDriverGetVersion_v2020>("cuDriverGetVersion",
                                         &FakeDriverGetVersion),
      Make<PFN_cuGetErrorName_v6000>("cuGetErrorName", &FakeGetErrorName),
      Make<PFN_cuGetErrorString_v6000>("cuGetErrorString", &FakeGetErrorString),
      Make<PFN_cuDeviceGetCount_v2000>("cuDeviceGetCount", &FakeDeviceGetCount),
      Make<PFN_cuDeviceGet_v2000>("cuDeviceGet", &FakeDeviceGet),
      Make<PFN_cuDevicePrimaryCtxGetState_v7000>("cuDevicePrimaryCtxGetState",
                                                 &FakePrimaryCtxGetState),
      Make<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain",
                                               &FakePrimaryCtxRetain),
      Make<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", &FakeCtxGetCurrent),
      Make<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", &FakeCtxSetCurrent),
      Make<PFN_cuCtxGetDevice_v2000>("cuCtxGetDevice", &FakeCtxGetDevice),
      Make<PFN_cuMemHostRegister_v6050>("cuMemHostRegister",
                                        &FakeMemHostRegister),
      Make<PFN_cuMemHostUnregister_v4000>("cuMemHostUnregister",
                                          &FakeMemHostUnregister),
      Make<PFN_cuMemcpyHtoDAsync_v3020>("cuMemcpyHtoDAsync",
                                        &FakeMemcpyHtoDAsync),
      Make<PFN_cuMemcpyDtoHAsync_v3020>("cuMemcpyDtoHAsync",
                                        &FakeMemcpyDtoHAsync),
      Make<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute",
                                            &FakePointerGetAttribute),
      Make<PFN_cuStreamAddCallback_v5000>("cuStreamAddCallback",
                                          &FakeStreamAddCallback),
      Make<PFN_cuStreamSynchronize_v2000>("cuStreamSynchronize",
                                          &FakeStreamSynchronize),
  };
  *count = sizeof(entries) / sizeof(entries[0]);
  return entries;
}

bool Missing(const char* symbol) {
  const char* missing = std::getenv("FAKE_CUDA_MISSING");
  return missing != nullptr && std::strcmp(missing, symbol) == 0;
}

CUresult GetProcAddress(const char* symbol, void** function, int version,
                        cuuint64_t flags) {
  if (symbol == nullptr || function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (version != 12000 || flags != CU_GET_PROC_ADDRESS_DEFAULT) {
    ++S().odd_requests;
  }
  *function = nullptr;
  size_t count = 0;
  const Entry* entries = Entries(&count);
  for (size_t i = 0; i < count; ++i) {
    if (std::strcmp(entries[i].name, symbol) == 0 && !Missing(symbol)) {
      *function = entries[i].function;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// ---- exported: the two cuGetProcAddress forms, checked against cuda.h

FAKE_EXPORT CUresult CUDAAPI
cuGetProcAddress_v2(const char* symbol, void** function, int version,
                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  const CUresult result = GetProcAddress(symbol, function, version, flags);
  if (status != nullptr) {
    *status = result == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS
                                     : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return result;
}

FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol,
                                              void** function, int version,
                                              cuuint64_t flags) {
  return GetProcAddress(symbol, function, version, flags);
}

// ---- exported for tests only (none of these is a driver function)

// "Device memory" of `device`: zeroed host memory the fake's copies and
// cuPointerGetAttribute know as the device's.
FAKE_EXPORT void* fake_cuda_device_alloc(int device, size_t bytes) {
  void* memory = std::calloc(1, bytes);
  std::lock_guard<std::mutex> lock(S().mutex);
  S().device_memory[reinterpret_cast<uintptr_t>(memory)] =
      Range{bytes, device, 0};
  return memory;
}

FAKE_EXPORT void fake_cuda_device_free(void* memory) {
  {
    std::lock_guard<std::mutex> lock(S().mutex);
    S().device_memory.erase(reinterpret_cast<uintptr_t>(memory));
  }
  std::free(memory);
}

// A new stream on `device` (never destroyed).
FAKE_EXPORT CUstream fake_cuda_stream_create(int device) {
  return new CUstream_st(device);
}

// The stream `handle` names for `device` (the default-stream handles: the
// device's legacy stream), for the two functions below.
FAKE_EXPORT CUstream fake_cuda_stream_of(CUstream handle, int device) {
  const auto value = reinterpret_cast<uintptr_t>(handle);
  return value <= 2 ? LegacyStream(device) : handle;
}

// While held, the stream's worker starts nothing: what is enqueued waits.
FAKE_EXPORT void fake_cuda_stream_hold(CUstream stream, int held) {
  std::lock_guard<std::mutex> lock(stream->mutex);
  stream->held = held != 0;
  stream->changed.notify_all();
}

// From now on the stream's copies are skipped and its callbacks get
// `error`, as after a device fault.
FAKE_EXPORT void fake_cuda_stream_fail(CUstream stream, int error) {
  std::lock_guard<std::mutex> lock(stream->mutex);
  stream->error = static_cast<CUresult>(error);
}

// How many times `device`'s primary context was retained.
FAKE_EXPORT int fake_cuda_retained(int device) {
  std::lock_guard<std::mutex> lock(S().mutex);
  return S().retained[device];
}

// The registration flags of the range starting at `base`; -1 when none.
FAKE_EXPORT int fake_cuda_registered_flags(const void* base) {
  std::lock_guard<std::mutex> lock(S().mutex);
  auto found = S().registered.find(reinterpret_cast<uintptr_t>(base));
  return found == S().registered.end() ? -1
                                       : static_cast<int>(found->second.flags);
}

// The calling thread's current device; -1 when no context is current.
FAKE_EXPORT int fake_cuda_current_device() {
  return current == nullptr ? -1 : current->device;
}

// As torch's cudaSetDevice would: retains `device`'s primary context and
// makes it current on the calling thread (-1: none current).
FAKE_EXPORT void fake_cuda_set_current(int device) {
  if (device < 0) {
    current = nullptr;
    return;
  }
  CUcontext context = nullptr;
  (void)FakePrimaryCtxRetain(&context, device);
  current = context;
}

// How many cuGetProcAddress requests asked for another version than 12000
// or for other flags than CU_GET_PROC_ADDRESS_DEFAULT.
FAKE_EXPORT int fake_cuda_odd_requests() { return S().odd_requests.load(); }

#endif  // LOHAN_WITH_CUDA
