#include "daemon/common/memory_release.h"

#include <malloc.h>

namespace lohan {

void ConfigureAllocator() {
  // 256 KiB: a chunk buffer, a plan's or a request's bytes are mappings of
  // their own, unmapped at free.
  (void)mallopt(M_MMAP_THRESHOLD, 256 << 10);
  // One arena, not eight per core: malloc_trim gives back the free pages
  // inside an arena, but of a thread arena's heap not its free top, which
  // kept tens of MiB after a burst of plans (measured after 40 maximal
  // plans and the jobs' deletion, over an idle 18 MiB: +8 to +27 MiB with
  // the default arenas and with two, +1.3 MiB with one). lohand's hot
  // paths hardly allocate (chunk buffers are pooled) and each thread's
  // small blocks come from its own cache (tcache) first.
  (void)mallopt(M_ARENA_MAX, 1);
}

void ReleaseFreedMemory() { (void)malloc_trim(0); }

}  // namespace lohan
