#ifndef LOHAN_DAEMON_POOL_SHARED_ARENA_H_
#define LOHAN_DAEMON_POOL_SHARED_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "wire/unique_fd.h"

namespace lohan {

// One job's shared-memory region: an anonymous memfd, sized once and sealed
// against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
// mapped MAP_SHARED read-write into this process and, by default, locked in
// RAM. The fd is what a client receives (SCM_RIGHTS) and maps itself; because
// of the seals a client can never truncate the region under the daemon (which
// would turn the daemon's accesses into SIGBUS).
//
// Huge pages: when Options::try_huge_pages is set and `bytes` is a multiple of
// the 2 MiB huge page size, MFD_HUGETLB is tried first; if the machine has no
// free huge pages the arena falls back to normal pages with one log line.
// A client must map the whole fd (length size(), offset 0).
//
// Ownership: the arena owns the fd and the mapping; the destructor unmaps and
// closes (the memory itself lives until every process that received the fd
// has closed and unmapped it). Not copyable, not movable: hold it by
// unique_ptr. Thread safety: immutable after Create; the bytes at base() are
// shared with other processes and carry no synchronisation of their own.
class SharedArena {
 public:
  static constexpr uint64_t kPageBytes = 4096;
  static constexpr uint64_t kHugePageBytes = 2 * 1024 * 1024;

  struct Options {
    // Shows in /proc/<pid>/fd and /proc/<pid>/maps as "memfd:<name>".
    std::string name = "lohan-arena";
    // Size of the region. REQUIRES: > 0 and a multiple of kPageBytes.
    uint64_t bytes = 0;
    bool try_huge_pages = true;
    // mlock the mapping. Failure is RESOURCE_EXHAUSTED naming the size and
    // RLIMIT_MEMLOCK (root has CAP_IPC_LOCK and is not limited).
    bool lock_in_ram = true;
  };

  // INVALID_ARGUMENT for a bad size; RESOURCE_EXHAUSTED when the memory
  // cannot be had or locked; other errno-derived codes otherwise.
  static absl::StatusOr<std::unique_ptr<SharedArena>> Create(
      const Options& options);

  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;
  ~SharedArena();

  // The memfd. Still owned by the arena: pass it on (SCM_RIGHTS duplicates
  // it), never close it.
  int fd() const { return fd_.get(); }
  uint64_t size() const { return size_; }
  uint8_t* base() const { return base_; }
  bool huge_pages() const { return huge_pages_; }
  bool locked() const { return locked_; }

 private:
  SharedArena(UniqueFd fd, uint8_t* base, uint64_t size, bool huge_pages,
              bool locked);

  const UniqueFd fd_;
  uint8_t* const base_;
  const uint64_t size_;
  const bool huge_pages_;
  const bool locked_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_POOL_SHARED_ARENA_H_
