// The driver loader over the fake driver (tests/fake_cuda), whose reported
// version, missing entry point and cuInit result come from its environment
// at each call; OpenCudaDriver loads anew each time, so one process tries
// every case. What the fake proves and does not: see fake_libcuda.cc.
#include "client/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_driver_path.h"

namespace lohan::cuda {
namespace {

#if defined(LOHAN_WITH_CUDA) && LOHAN_WITH_CUDA

using ::testing::HasSubstr;

// Sets the fake's environment for one test, and clears it afterwards.
class CudaDriverTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("FAKE_CUDA_DRIVER_VERSION");
    unsetenv("FAKE_CUDA_MISSING");
    unsetenv("FAKE_CUDA_INIT_ERROR");
  }
};

TEST_F(CudaDriverTest, LoadsEveryEntryPointAndReportsTheVersion) {
  setenv("FAKE_CUDA_DRIVER_VERSION", "12040", 1);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver(FakeDriverPath());
  ASSERT_TRUE(driver.ok()) << driver.status();
  const CudaDriver& d = **driver;
  EXPECT_EQ(d.version, 12040);
  EXPECT_EQ(CudaVersionText(d.version), "12.4");
  for (const void* entry :
       {reinterpret_cast<const void*>(d.init),
        reinterpret_cast<const void*>(d.driver_get_version),
        reinterpret_cast<const void*>(d.get_error_name),
        reinterpret_cast<const void*>(d.get_error_string),
        reinterpret_cast<const void*>(d.device_get_count),
        reinterpret_cast<const void*>(d.device_get),
        reinterpret_cast<const void*>(d.primary_ctx_get_state),
        reinterpret_cast<const void*>(d.primary_ctx_retain),
        reinterpret_cast<const void*>(d.ctx_get_current),
        reinterpret_cast<const void*>(d.ctx_set_current),
        reinterpret_cast<const void*>(d.ctx_get_device),
        reinterpret_cast<const void*>(d.mem_host_register),
        reinterpret_cast<const void*>(d.mem_host_unregister),
        reinterpret_cast<const void*>(d.memcpy_htod_async),
        reinterpret_cast<const void*>(d.memcpy_dtoh_async),
        reinterpret_cast<const void*>(d.pointer_get_attribute),
        reinterpret_cast<const void*>(d.stream_add_callback),
        reinterpret_cast<const void*>(d.stream_synchronize)}) {
    EXPECT_NE(entry, nullptr);
  }
  int devices = 0;
  EXPECT_EQ(d.device_get_count(&devices), CUDA_SUCCESS);  // cuInit was called
  EXPECT_EQ(devices, 4);
  EXPECT_EQ(d.ErrorText(CUDA_ERROR_INVALID_VALUE),
            "CUDA_ERROR_INVALID_VALUE (invalid argument)");
  EXPECT_EQ(d.ErrorText(static_cast<CUresult>(12345)), "CUDA error 12345");
  // Every entry point was asked for at 12000 with the default flags.
  auto odd_requests = reinterpret_cast<int (*)()>(
      dlsym(d.library.get(), "fake_cuda_odd_requests"));
  ASSERT_NE(odd_requests, nullptr);
  EXPECT_EQ(odd_requests(), 0);
}

TEST_F(CudaDriverTest, AcceptsCuda12Point0) {
  setenv("FAKE_CUDA_DRIVER_VERSION", "12000", 1);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver(FakeDriverPath());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ((*driver)->version, 12000);
}

TEST_F(CudaDriverTest, RefusesADriverOlderThanCuda12) {
  setenv("FAKE_CUDA_DRIVER_VERSION", "11080", 1);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver(FakeDriverPath());
  ASSERT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.status().message(),
            "the NVIDIA driver supports CUDA 11.8; lohan needs a driver for "
            "CUDA 12.0 or newer (R525+): update the driver");
}

TEST_F(CudaDriverTest, RefusesAMissingLibrary) {
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver("/nonexistent/libcuda.so.1");
  ASSERT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(driver.status().message(),
              HasSubstr("no NVIDIA driver: /nonexistent/libcuda.so.1 cannot "
                        "be loaded (/nonexistent/libcuda.so.1: cannot open "
                        "shared object file"));
  EXPECT_THAT(driver.status().message(),
              HasSubstr("lohan needs a driver for CUDA 12.0 or newer (R525+) "
                        "and a GPU. Use the *_from_host / *_to_host functions "
                        "on a machine without a GPU"));
}

TEST_F(CudaDriverTest, RefusesALibraryThatIsNoDriver) {
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver("libm.so.6");
  ASSERT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.status().message(),
            "libm.so.6 has no cuGetProcAddress: it is not an NVIDIA driver "
            "for CUDA 11.3 or newer; lohan needs a driver for CUDA 12.0 or "
            "newer (R525+)");
}

TEST_F(CudaDriverTest, RefusesADriverWithoutAnEntryPoint) {
  setenv("FAKE_CUDA_MISSING", "cuMemHostRegister", 1);
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver(FakeDriverPath());
  ASSERT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.status().message(),
            absl::StrCat("the NVIDIA driver (", FakeDriverPath(),
                         ") has no entry point cuMemHostRegister for CUDA "
                         "12.0; lohan needs a driver for CUDA 12.0 or newer "
                         "(R525+): update the driver"));
}

TEST_F(CudaDriverTest, RefusesWhenCuInitFails) {
  setenv("FAKE_CUDA_INIT_ERROR", "100", 1);  // CUDA_ERROR_NO_DEVICE
  absl::StatusOr<std::unique_ptr<CudaDriver>> driver =
      OpenCudaDriver(FakeDriverPath());
  ASSERT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.status().message(),
            absl::StrCat("cuInit failed: CUDA_ERROR_NO_DEVICE (no "
                         "CUDA-capable device is detected) "
                         "(CUDA_VISIBLE_DEVICES?); the NVIDIA driver (",
                         FakeDriverPath(), ") supports CUDA 12.8"));
}

TEST_F(CudaDriverTest, LoadCudaDriverLoadsTheConfiguredLibraryOnce) {
  setenv(kDriverLibraryVariable, FakeDriverPath().c_str(), 1);
  absl::StatusOr<const CudaDriver*> first = LoadCudaDriver();
  ASSERT_TRUE(first.ok()) << first.status();
  // Kept for the process, whatever the environment says later.
  setenv(kDriverLibraryVariable, "/nonexistent/libcuda.so.1", 1);
  absl::StatusOr<const CudaDriver*> second = LoadCudaDriver();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  unsetenv(kDriverLibraryVariable);
}

#else  // built without CUDA

TEST(CudaDriverTest, NeedsAToolkitAtBuildTime) {
  GTEST_SKIP() << "built without a CUDA toolkit: cuda_driver.h is empty";
}

#endif

}  // namespace
}  // namespace lohan::cuda
