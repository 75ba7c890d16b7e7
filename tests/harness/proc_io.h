#ifndef LOHAN_TESTS_HARNESS_PROC_IO_H_
#define LOHAN_TESTS_HARNESS_PROC_IO_H_

// A process's storage bytes so far, as the kernel counts them
// (/proc/<pid>/io read_bytes and write_bytes: what reached the block
// layer, O_DIRECT included, the page cache's hits not): how benches count
// the SSD bytes a step costs.
#include <sys/types.h>

#include <cstdint>

namespace lohan::testing {

struct ProcIo {
  uint64_t read = 0;
  uint64_t written = 0;
};

// Process `pid`'s (0: this process's). Zeros when the file cannot be read
// (a gone process, or another user's without the right to read it).
ProcIo ReadProcIo(pid_t pid = 0);

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_HARNESS_PROC_IO_H_
