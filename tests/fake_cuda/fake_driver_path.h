#ifndef LOHAN_TESTS_FAKE_CUDA_FAKE_DRIVER_PATH_H_
#define LOHAN_TESTS_FAKE_CUDA_FAKE_DRIVER_PATH_H_

// Where a test that lists //tests/fake_cuda:libfake_cuda.so in its data
// finds it (Bazel's runfiles), for LOHAN_CUDA_DRIVER_LIBRARY.

#include <cstdlib>
#include <string>

namespace lohan::cuda {

inline std::string FakeDriverPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "lohan") +
         "/tests/fake_cuda/libfake_cuda.so";
}

}  // namespace lohan::cuda

#endif  // LOHAN_TESTS_FAKE_CUDA_FAKE_DRIVER_PATH_H_
