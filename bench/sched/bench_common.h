#ifndef LOHAN_BENCH_SCHED_BENCH_COMMON_H_
#define LOHAN_BENCH_SCHED_BENCH_COMMON_H_

// What sched_bench's comparisons share: its flags, a clock, errors that
// end the run (removing its temporary directory), and the process's
// storage bytes.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "daemon/optim/optim_types.h"
#include "tests/harness/proc_io.h"

namespace lohan {
namespace sched_bench {

struct Flags {
  std::string dir = "/tmp";
  size_t layers = 8;
  uint64_t params = uint64_t{16} << 20;
  uint64_t chunk = uint64_t{4} << 20;
  size_t ssds = 2;
  int threads = 2;
  size_t buffers = 4;
  int rounds = 2;
  double backward_ms = 0;
  double forward_ms = 0;  // --compare=clip: simulated forward per layer.
  int steps = 3;          // --compare=clip: iterations per job and round.
  DType grad = DType::kBFloat16;
  bool clip_always = false;
  enum class Compare {
    kSchedules,
    kLayouts,
    kClip
  } compare = Compare::kSchedules;
  bool streamed = false;  // --compare=clip: --layout=streamed.
  size_t slots = 2;       // --compare=layouts: the streamed client's K.
  // --compare=clip: the +read-ahead job's PipelineOptions::read_ahead_bytes.
  uint64_t read_ahead_mib = 256;
  uint64_t gate_unit_mib = 0;  // 0: no gate
};

// Seconds on a monotonic clock.
double Now();

uint64_t TotalParams(const Flags& flags);

// The bench's temporary directory, once made (Die removes it).
extern std::string g_root;

// Removes `path` and everything under it (best effort).
void RemoveTree(const std::string& path);

// Prints "sched_bench: <message>", removes g_root and exits with 1.
[[noreturn]] void Die(const std::string& message);
// Die unless `s` is OK.
void Check(const absl::Status& s, const char* what);

// The process's storage bytes so far: ReadProcIo() (this process's).
using testing::ProcIo;
using testing::ReadProcIo;

}  // namespace sched_bench
}  // namespace lohan

#endif  // LOHAN_BENCH_SCHED_BENCH_COMMON_H_
