#include "daemon/common/meminfo.h"

#include <fstream>
#include <sstream>
#include <string>

namespace lohan {
namespace {

uint64_t ReadMeminfoField(const std::string& field) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string name;
    uint64_t kib = 0;
    if (fields >> name >> kib && name == field) return kib * 1024;
  }
  return 0;
}

}  // namespace

uint64_t MemAvailableBytes() { return ReadMeminfoField("MemAvailable:"); }
uint64_t MemTotalBytes() { return ReadMeminfoField("MemTotal:"); }

}  // namespace lohan
