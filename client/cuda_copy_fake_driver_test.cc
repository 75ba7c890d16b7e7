// cuda_copy over the fake driver (tests/fake_cuda/fake_libcuda.cc): host
// memory for "device" memory, one worker thread per stream. This proves the
// client's bookkeeping (contexts made current and restored, pinning, stream
// order, callbacks off the caller's thread, error paths) and its use of the
// entry points, not a GPU's behaviour. The process loads the driver once,
// so the environment is set before the first CUDA call (Fake()).
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/cuda_copy.h"
#include "client/cuda_driver.h"
#include "client/device_guard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_driver_path.h"

namespace lohan::cuda {
namespace {

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

using ::testing::HasSubstr;

// The fake's test-only functions (fake_libcuda.cc).
struct FakeFunctions {
  void* (*device_alloc)(int, size_t);
  void (*device_free)(void*);
  CUstream (*stream_create)(int);
  CUstream (*stream_of)(CUstream, int);
  void (*stream_hold)(CUstream, int);
  void (*stream_fail)(CUstream, int);
  int (*retained)(int);
  int (*registered_flags)(const void*);
  int (*current_device)();
  void (*set_current)(int);
};

template <typename Function>
void Find(void* library, const char* name, Function& out) {
  out = reinterpret_cast<Function>(dlsym(library, name));
  if (out == nullptr) std::abort();
}

// Points the client at the fake (before anything loads the driver) and
// finds the fake's helpers in the same loaded copy.
const FakeFunctions& Fake() {
  static const FakeFunctions* const fake = [] {
    setenv(kDriverLibraryVariable, FakeDriverPath().c_str(), 1);
    setenv("FAKE_CUDA_DEVICE_COUNT", "6", 1);
    void* library = dlopen(FakeDriverPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) std::abort();
    auto* found = new FakeFunctions;  // lives with the process, as `library`
    Find(library, "fake_cuda_device_alloc", found->device_alloc);
    Find(library, "fake_cuda_device_free", found->device_free);
    Find(library, "fake_cuda_stream_create", found->stream_create);
    Find(library, "fake_cuda_stream_of", found->stream_of);
    Find(library, "fake_cuda_stream_hold", found->stream_hold);
    Find(library, "fake_cuda_stream_fail", found->stream_fail);
    Find(library, "fake_cuda_retained", found->retained);
    Find(library, "fake_cuda_registered_flags", found->registered_flags);
    Find(library, "fake_cuda_current_device", found->current_device);
    Find(library, "fake_cuda_set_current", found->set_current);
    return found;
  }();
  return *fake;
}

// What an AfterCopy saw.
struct Seen {
  absl::Notification done;
  absl::Status status;
  std::thread::id thread;
  int order = 0;
};

std::atomic<int> calls{0};

void Record(void* argument, absl::Status copied) {
  auto* seen = static_cast<Seen*>(argument);
  seen->status = std::move(copied);
  seen->thread = std::this_thread::get_id();
  seen->order = ++calls;
  seen->done.Notify();
}

bool Wait(Seen& seen) {
  return seen.done.WaitForNotificationWithTimeout(absl::Seconds(10));
}

// "Device memory" on one fake device, freed with the test.
struct DeviceBuffer {
  DeviceBuffer(int device, size_t bytes)
      : pointer(Fake().device_alloc(device, bytes)) {}
  ~DeviceBuffer() { Fake().device_free(pointer); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* pointer;
};

std::vector<unsigned char> Pattern(size_t bytes) {
  std::vector<unsigned char> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i)
    pattern[i] = static_cast<unsigned char>(i * 7 + 1);
  return pattern;
}

int DeviceOf(const void* pointer) {
  int device = -1;
  absl::StatusOr<const CudaDriver*> driver = LoadCudaDriver();
  if (!driver.ok() ||
      (*driver)->pointer_get_attribute(
          &device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
          reinterpret_cast<CUdeviceptr>(pointer)) != CUDA_SUCCESS) {
    return -2;
  }
  return device;
}

class CudaCopyFakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    (void)Fake();
    Fake().set_current(-1);  // a thread that never used CUDA
    device0_retained_ = Fake().retained(0);
  }
  void TearDown() override { Fake().set_current(-1); }
  // Nothing here may create a context on device 0 unless a test says so.
  bool Device0Untouched() const {
    return Fake().retained(0) == device0_retained_;
  }
  int device0_retained_ = 0;
};

TEST_F(CudaCopyFakeDriverTest, IsAvailable) {
  EXPECT_TRUE(BuiltWith());
  EXPECT_TRUE(Available().ok()) << Available();
}

TEST_F(CudaCopyFakeDriverTest, PinsPortablyOnTheJobsDeviceAndUnpins) {
  std::vector<unsigned char> arena(4096);
  ASSERT_TRUE(RegisterHost(arena.data(), arena.size(), 1).ok());
  EXPECT_EQ(Fake().registered_flags(arena.data()), CU_MEMHOSTREGISTER_PORTABLE);
  EXPECT_EQ(DeviceOf(arena.data()), 1);
  EXPECT_EQ(Fake().current_device(), -1);  // left without a context
  EXPECT_TRUE(Device0Untouched());
  EXPECT_EQ(RegisterHost(arena.data(), arena.size(), 1).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(UnregisterHost(arena.data(), 1).ok());
  EXPECT_EQ(Fake().registered_flags(arena.data()), -1);
  absl::Status again = UnregisterHost(arena.data(), 1);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(),
              HasSubstr("cuMemHostUnregister of the arena: "
                        "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"));
  EXPECT_EQ(Fake().current_device(), -1);
}

TEST_F(CudaCopyFakeDriverTest, UnspecifiedDevicePinsOnTheCurrentOne) {
  Fake().set_current(2);
  std::vector<unsigned char> arena(4096);
  ASSERT_TRUE(
      RegisterHost(arena.data(), arena.size(), kUnspecifiedDevice).ok());
  EXPECT_EQ(DeviceOf(arena.data()), 2);
  EXPECT_EQ(Fake().current_device(), 2);
  ASSERT_TRUE(UnregisterHost(arena.data(), kUnspecifiedDevice).ok());
  EXPECT_EQ(Fake().current_device(), 2);
  EXPECT_TRUE(Device0Untouched());
}

TEST_F(CudaCopyFakeDriverTest, UnspecifiedDeviceWithoutAContextPinsOnDevice0) {
  std::vector<unsigned char> arena(4096);
  ASSERT_TRUE(
      RegisterHost(arena.data(), arena.size(), kUnspecifiedDevice).ok());
  EXPECT_EQ(DeviceOf(arena.data()), 0);  // as the runtime API would
  EXPECT_EQ(Fake().current_device(), -1);
  ASSERT_TRUE(UnregisterHost(arena.data(), kUnspecifiedDevice).ok());
  EXPECT_EQ(Fake().current_device(), -1);
}

TEST_F(CudaCopyFakeDriverTest, CopiesRunLaterInStreamOrderOffTheCallersThread) {
  constexpr size_t kBytes = 1 << 16;
  const std::vector<unsigned char> source = Pattern(kBytes);
  std::vector<unsigned char> back(kBytes, 0);
  DeviceBuffer device(1, kBytes);
  CUstream stream = Fake().stream_create(1);
  Fake().stream_hold(stream, 1);
  Seen to_device, to_host;
  ASSERT_TRUE(CopyToDeviceThen(device.pointer, source.data(), kBytes, 1, stream,
                               &Record, &to_device)
                  .ok());
  ASSERT_TRUE(CopyToHostThen(back.data(), device.pointer, kBytes, 1, stream,
                             &Record, &to_host)
                  .ok());
  // Both calls returned with nothing done yet: the stream is held.
  EXPECT_FALSE(to_device.done.HasBeenNotified());
  EXPECT_FALSE(to_host.done.HasBeenNotified());
  EXPECT_EQ(std::memcmp(back.data(), std::vector<unsigned char>(kBytes).data(),
                        kBytes),
            0);
  EXPECT_EQ(Fake().current_device(), -1);
  EXPECT_TRUE(Device0Untouched());
  Fake().stream_hold(stream, 0);
  ASSERT_TRUE(Wait(to_device));
  ASSERT_TRUE(Wait(to_host));
  EXPECT_TRUE(to_device.status.ok()) << to_device.status;
  EXPECT_TRUE(to_host.status.ok()) << to_host.status;
  EXPECT_LT(to_device.order, to_host.order);
  EXPECT_NE(to_device.thread, std::this_thread::get_id());
  EXPECT_NE(to_host.thread, std::this_thread::get_id());
  EXPECT_EQ(back, source);  // the device-to-host copy ran after the other
}

TEST_F(CudaCopyFakeDriverTest, TheLegacyStreamIsTheGivenDevicesAndRestored) {
  constexpr size_t kBytes = 4096;
  const std::vector<unsigned char> source = Pattern(kBytes);
  DeviceBuffer device(3, kBytes);
  Fake().set_current(2);  // torch's current device is another one
  CUstream legacy3 = Fake().stream_of(nullptr, 3);
  Fake().stream_hold(legacy3, 1);
  Seen seen;
  ASSERT_TRUE(CopyToDeviceThen(device.pointer, source.data(), kBytes, 3,
                               /*stream=*/nullptr, &Record, &seen)
                  .ok());
  EXPECT_EQ(Fake().current_device(), 2);
  EXPECT_FALSE(seen.done.HasBeenNotified());
  Fake().stream_hold(legacy3, 0);
  ASSERT_TRUE(Wait(seen));
  EXPECT_TRUE(seen.status.ok()) << seen.status;
  EXPECT_EQ(std::memcmp(device.pointer, source.data(), kBytes), 0);
}

TEST_F(CudaCopyFakeDriverTest, UnspecifiedDeviceCopiesOnThePointersDevice) {
  constexpr size_t kBytes = 4096;
  const std::vector<unsigned char> source = Pattern(kBytes);
  std::vector<unsigned char> back(kBytes, 0);
  DeviceBuffer device(1, kBytes);
  std::memcpy(device.pointer, source.data(), kBytes);
  Seen seen;
  ASSERT_TRUE(CopyToHostThen(back.data(), device.pointer, kBytes,
                             kUnspecifiedDevice, /*stream=*/nullptr, &Record,
                             &seen)
                  .ok());
  EXPECT_EQ(Fake().current_device(), -1);
  EXPECT_TRUE(Device0Untouched());
  ASSERT_TRUE(Wait(seen));
  EXPECT_TRUE(seen.status.ok()) << seen.status;
  EXPECT_EQ(back, source);
}

TEST_F(CudaCopyFakeDriverTest, AStreamErrorReachesTheCallback) {
  constexpr size_t kBytes = 4096;
  std::vector<unsigned char> back(kBytes, 0);
  DeviceBuffer device(1, kBytes);
  std::memset(device.pointer, 0xab, kBytes);
  CUstream stream = Fake().stream_create(1);
  Fake().stream_fail(stream, CUDA_ERROR_ILLEGAL_ADDRESS);
  Seen seen;
  ASSERT_TRUE(CopyToHostThen(back.data(), device.pointer, kBytes, 1, stream,
                             &Record, &seen)
                  .ok());
  ASSERT_TRUE(Wait(seen));
  EXPECT_EQ(seen.status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(seen.status.message(), HasSubstr("CUDA error 700 on the stream"));
  EXPECT_EQ(back, std::vector<unsigned char>(kBytes, 0));
}

TEST_F(CudaCopyFakeDriverTest,
       RefusesAStreamOfAnotherDeviceWithoutCallingBack) {
  constexpr size_t kBytes = 4096;
  const std::vector<unsigned char> source = Pattern(kBytes);
  DeviceBuffer device(1, kBytes);
  CUstream other = Fake().stream_create(2);
  Fake().set_current(2);
  Seen seen;
  absl::Status copied = CopyToDeviceThen(device.pointer, source.data(), kBytes,
                                         1, other, &Record, &seen);
  EXPECT_EQ(copied.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(copied.message(),
              HasSubstr("cuMemcpyHtoDAsync arena to device: "
                        "CUDA_ERROR_INVALID_HANDLE (invalid resource handle)"));
  EXPECT_EQ(Fake().current_device(), 2);
  EXPECT_FALSE(
      seen.done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
}

TEST_F(CudaCopyFakeDriverTest, RefusesAHostPointerWhereADevicePointerGoes) {
  std::vector<unsigned char> host(4096), back(4096);
  Seen seen;
  absl::Status copied =
      CopyToHostThen(back.data(), host.data(), host.size(), kUnspecifiedDevice,
                     nullptr, &Record, &seen);
  EXPECT_EQ(copied.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(copied.message(),
            "the gradient's device pointer: not a CUDA device pointer");
  EXPECT_FALSE(seen.done.HasBeenNotified());
}

TEST_F(CudaCopyFakeDriverTest, DeviceGuardOverTheDriverProbe) {
  DeviceProbe& probe = DriverProbe();
  EXPECT_EQ(*probe.Current(), DeviceProbe::kNoCurrentContext);
  EXPECT_FALSE(*probe.HasContext(5));
  Fake().set_current(4);
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(5).ok());
    EXPECT_EQ(Fake().current_device(), 5);
    EXPECT_EQ(*probe.Current(), 5);
    EXPECT_TRUE(*probe.HasContext(5));
  }
  EXPECT_EQ(Fake().current_device(), 4);  // set back
  Fake().set_current(-1);
  {
    DeviceGuard guard(probe);
    ASSERT_TRUE(guard.Enter(5).ok());
    EXPECT_EQ(Fake().current_device(), 5);
  }
  EXPECT_EQ(Fake().current_device(), -1);  // cleared, not set to device 0
  EXPECT_TRUE(Device0Untouched());
  // Retained once for the process, however often it is made current.
  EXPECT_EQ(Fake().retained(5), 1);
  DeviceGuard bad(probe);
  EXPECT_EQ(bad.Enter(9).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fake().current_device(), -1);
}

#else  // built without CUDA

TEST(CudaCopyFakeDriverTest, NeedsAToolkitAtBuildTime) {
  GTEST_SKIP() << "built without a CUDA toolkit";
}

#endif

}  // namespace
}  // namespace lohan::cuda
