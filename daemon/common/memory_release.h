#ifndef LOHAN_DAEMON_COMMON_MEMORY_RELEASE_H_
#define LOHAN_DAEMON_COMMON_MEMORY_RELEASE_H_

namespace lohan {

// How lohand's allocator gives memory back: called once at start, before
// any thread, it fixes the size above which an allocation is its own
// mapping (glibc otherwise raises that threshold as large buffers are
// freed, and later large buffers, a plan's or a model's, stay in the
// heap after they are freed) and keeps the number of arenas small.
void ConfigureAllocator();

// Returns the pages the allocator holds free to the OS (malloc_trim): after
// work whose memory is freed at once and may not come again soon (a plan,
// a refused or closed model, a deleted job), so a user's burst does not
// stay in lohand's RSS. Costs a walk of the heap: not for hot paths.
void ReleaseFreedMemory();

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_MEMORY_RELEASE_H_
