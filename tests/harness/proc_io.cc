#include "tests/harness/proc_io.h"

#include <fstream>
#include <string>

namespace lohan::testing {

ProcIo ReadProcIo(pid_t pid) {
  ProcIo io;
  std::ifstream file(pid == 0 ? std::string("/proc/self/io")
                              : "/proc/" + std::to_string(pid) + "/io");
  std::string key;
  uint64_t value = 0;
  while (file >> key >> value) {
    if (key == "read_bytes:") io.read = value;
    if (key == "write_bytes:") io.written = value;
  }
  return io;
}

}  // namespace lohan::testing
