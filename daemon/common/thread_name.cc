#include "daemon/common/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace lohan {

void NameThisThread(const char* name) {
  char kept[16] = {};
  std::strncpy(kept, name, sizeof(kept) - 1);
  (void)pthread_setname_np(pthread_self(), kept);
}

}  // namespace lohan
