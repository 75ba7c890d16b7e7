// The C ABI round trip, through a C program linked against
// liblohan_client.so, against a real daemon; the asynchronous requests and
// copies through tests/async_client (C++ on the C ABI only); and what the
// shared library itself needs and carries.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// From @local_cuda//:config: whether the client was built with CUDA.
#ifndef LOHAN_WITH_CUDA
#define LOHAN_WITH_CUDA 0
#endif

TEST(CAbi, RoundTrip) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RunResult result = RunCommand({Runfile("tests/c_client/lohan_c_client"),
                                 (*daemon)->socket(), "roundtrip", "c-job"});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_THAT(result.out,
              HasSubstr("hello: daemon 0.1.0 protocol 1.0 uid " +
                        std::to_string(getuid()) + " jobs-capability 1\n"));
  EXPECT_THAT(result.out, HasSubstr("create: j-000001 name c-job owner " +
                                    std::to_string(getuid()) + " state 1\n"));
  EXPECT_THAT(result.out, HasSubstr("attach: state 2 pid "));
  EXPECT_THAT(result.out, HasSubstr("list: 1 jobs\n"));
  EXPECT_THAT(result.out,
              HasSubstr("delete-while-attached: FAILED_PRECONDITION\n"));
  EXPECT_THAT(result.out, HasSubstr("status: json ok\n"));
  EXPECT_THAT(result.out, HasSubstr("delete: ok\n"));
  EXPECT_THAT(result.out, HasSubstr("null-name: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("bad-name: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-plane-job: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-model-plane: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-model: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out, HasSubstr("null-settings: INVALID_ARGUMENT\n"));
  EXPECT_THAT(result.out,
              HasSubstr("settings-eps: INVALID_ARGUMENT field adam.eps\n"));
  EXPECT_THAT(result.out, HasSubstr("settings-ok: OK field ''\n"));
  // The daemon is still serving after the bad requests.
  RunResult list = RunCommand(
      {Runfile("tests/c_client/lohan_c_client"), (*daemon)->socket(), "list"});
  EXPECT_EQ(list.exit_code, 0) << list.out;
  EXPECT_EQ(list.out, "");
}

TEST(CAbi, NoDaemonIsUnavailableNamingTheSocket) {
  PublicTempDir dir;
  const std::string socket = dir.path() + "/nobody-home.sock";
  RunResult result =
      RunCommand({Runfile("tests/c_client/lohan_c_client"), socket, "list"});
  EXPECT_EQ(result.exit_code, 14);  // LOHAN_UNAVAILABLE
  EXPECT_THAT(
      result.out,
      HasSubstr("connect: UNAVAILABLE: no lohand answers at " + socket));
}

TEST(CAbi, UnknownJobIsNotFound) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RunResult result = RunCommand({Runfile("tests/c_client/lohan_c_client"),
                                 (*daemon)->socket(), "attach", "j-424242"});
  EXPECT_EQ(result.exit_code, 5);  // LOHAN_NOT_FOUND
  EXPECT_THAT(result.out, HasSubstr("no job 'j-424242'"));
}

TEST(CAbi, AsynchronousRequestsAndCopiesAtTheEdges) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RunResult result = RunCommand({Runfile("tests/async_client"), "checks",
                                 "--socket", (*daemon)->socket()});
  ASSERT_EQ(result.exit_code, 0)
      << result.out << result.err << (*daemon)->Log();
  const std::string& out = result.out;
  EXPECT_THAT(out, HasSubstr("nulls: 35 of 35 INVALID_ARGUMENT\n"));
  EXPECT_THAT(out, HasSubstr("state-roundtrip: ok\n"));
  EXPECT_THAT(out, HasSubstr("state-bad-part: INVALID_ARGUMENT: part 7 is not "
                             "LOHAN_STATE_EXP_AVG (1)"));
  EXPECT_THAT(out, HasSubstr("state-max-without-amsgrad: INVALID_ARGUMENT: "));
  EXPECT_THAT(out, HasSubstr("max_exp_avg_sq exists only with AMSGrad"));
  EXPECT_THAT(out, HasSubstr("state-layer-out-of-range: INVALID_ARGUMENT"));
  EXPECT_THAT(out, HasSubstr("state-in-iteration: FAILED_PRECONDITION: "
                             "INIT_STATE: optimizer states are staged only "
                             "between iterations\n"));
  EXPECT_THAT(out, HasSubstr("short-gradient: INVALID_ARGUMENT: layer 0 has "
                             "256 bytes of gradient, not 252\n"));
  EXPECT_THAT(out, HasSubstr("long-weights: INVALID_ARGUMENT: layer 0 has 256 "
                             "bytes of weights, not 264\n"));
  EXPECT_THAT(out, HasSubstr("layer-out-of-range: INVALID_ARGUMENT"));
  EXPECT_THAT(out, HasSubstr("wait-twice: NOT_FOUND: ticket "));
  EXPECT_THAT(out, HasSubstr("was already waited for"));
  EXPECT_THAT(out, HasSubstr("poll-consumed: NOT_FOUND\n"));
  EXPECT_THAT(out, HasSubstr("wait-never-issued: INVALID_ARGUMENT: ticket "));
  EXPECT_THAT(out, HasSubstr("was never issued by this data plane"));
  // 15 requests in flight, waited for in reverse order; four fail, each
  // with its own text, one fails for another reason.
  EXPECT_THAT(out, HasSubstr("in-flight: 15 requests submitted\n"));
  for (int a = 0; a < 4; ++a) {
    EXPECT_THAT(out, HasSubstr("in-flight act_put " + std::to_string(10 + a) +
                               ": OK\n"));
    EXPECT_THAT(out,
                HasSubstr("in-flight act_free " + std::to_string(1000 + a) +
                          ": NOT_FOUND: ACT_FREE: activation " +
                          std::to_string(1000 + a) + " is not held\n"));
  }
  for (int l = 0; l < 3; ++l) {
    EXPECT_THAT(out, HasSubstr("in-flight fetch_params " + std::to_string(l) +
                               ": OK\n"));
    EXPECT_THAT(
        out, HasSubstr("in-flight grad_ready " + std::to_string(l) + ": OK\n"));
  }
  EXPECT_THAT(out, HasSubstr("in-flight grad_ready again 0: "
                             "FAILED_PRECONDITION: GRAD_READY: layer 0: "
                             "gradient already delivered"));
  EXPECT_THAT(out, HasSubstr("in-flight act_get: restored\n"));
  EXPECT_THAT(out, HasSubstr("threads: 4 threads x 40 rounds, 0 bad\n"));
  EXPECT_THAT(out, HasSubstr("cuda: built-with " +
                             std::to_string(LOHAN_WITH_CUDA) + " available "));
  if (out.find("available 0") != std::string::npos) {
    // No usable GPU here (or no CUDA built in): a reason, and every CUDA
    // call fails cleanly with it.
    const char* code =
        LOHAN_WITH_CUDA ? "FAILED_PRECONDITION: " : "UNIMPLEMENTED: ";
    EXPECT_THAT(out, Not(HasSubstr("reason: \n")));
    EXPECT_THAT(out, HasSubstr(std::string("cuda-register: ") + code));
    EXPECT_THAT(out,
                HasSubstr(std::string("cuda-grad-ready-from-device: ") + code));
    EXPECT_THAT(out, HasSubstr(std::string("cuda-weights-to-device: ") + code));
    const std::string bare(code, std::strlen(code) - 2);  // no ": "
    EXPECT_THAT(out, HasSubstr("cuda-on-device: " + bare + " " + bare + " " +
                               bare + "\n"));
    if (!LOHAN_WITH_CUDA) {
      EXPECT_THAT(out, HasSubstr("built without CUDA"));
    }
  } else {
    EXPECT_THAT(out, HasSubstr("cuda-roundtrip: ok\n"));
  }
  EXPECT_THAT(out, HasSubstr("checks: 0 failures\n"));
}

TEST(CAbi, LibraryNeedsNoCudaLibraryAndLoadsTheDriverWhenBuiltWithCuda) {
  const std::string library = Runfile("client/liblohan_client.so");
  if (access("/usr/bin/readelf", X_OK) != 0) GTEST_SKIP() << "no readelf";
  RunResult dynamic = RunCommand({"/usr/bin/readelf", "-d", "-W", library});
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.err;
  EXPECT_THAT(dynamic.out, HasSubstr("(NEEDED)"));  // it read the section
  // Whatever CUDA a user has installed (or none) does not matter.
  EXPECT_THAT(dynamic.out, Not(HasSubstr("libcudart")));
  EXPECT_THAT(dynamic.out, Not(HasSubstr("libcuda.so")));
  // With CUDA built in, the client opens the driver by name at run time
  // (client/cuda_driver.h): nothing of the toolkit is linked.
  std::ifstream in(library, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(bytes.find("libcuda.so.1") != std::string::npos,
            bool{LOHAN_WITH_CUDA});
  // Only the C ABI is exported.
  RunResult symbols =
      RunCommand({"/usr/bin/readelf", "--dyn-syms", "-W", library});
  ASSERT_EQ(symbols.exit_code, 0);
  EXPECT_THAT(symbols.out, HasSubstr(" lohan_cuda_available\n"));
  EXPECT_THAT(symbols.out, Not(HasSubstr(" cuda")));
  EXPECT_THAT(symbols.out, Not(HasSubstr("__cudart")));
}

}  // namespace
}  // namespace lohan::testing
