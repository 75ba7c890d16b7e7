#include "daemon/pool/shared_arena.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "layout/byte_size.h"
#include "spdlog/spdlog.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

struct Region {
  UniqueFd fd;
  uint8_t* base = nullptr;
};

std::string MemlockLimitText() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "RLIMIT_MEMLOCK unknown";
  auto text = [](rlim_t value) {
    return value == RLIM_INFINITY ? std::string("unlimited")
                                  : FormatByteSize(value);
  };
  return absl::StrCat("RLIMIT_MEMLOCK soft ", text(limit.rlim_cur), ", hard ",
                      text(limit.rlim_max),
                      "; raise LimitMEMLOCK= or run as root");
}

// memfd + ftruncate + seals + mmap. On failure nothing is left behind.
absl::StatusOr<Region> MakeRegion(const std::string& name, uint64_t bytes,
                                  unsigned int extra_flags) {
  const int raw =
      memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | extra_flags);
  if (raw < 0) return ErrnoToStatus(errno, "memfd_create");
  Region region;
  region.fd.reset(raw);
  if (ftruncate(raw, static_cast<off_t>(bytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("ftruncate memfd to ", bytes));
  }
  if (fcntl(raw, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, "sealing memfd");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, raw, 0);
  if (base == MAP_FAILED) {
    return ErrnoToStatus(errno, absl::StrCat("mmap ", bytes, " bytes"));
  }
  region.base = static_cast<uint8_t*>(base);
  return region;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedArena>> SharedArena::Create(
    const Options& options) {
  const uint64_t bytes = options.bytes;
  if (bytes == 0 || bytes % kPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena size ", bytes, " must be a positive multiple of ", kPageBytes));
  }
  if (bytes > static_cast<uint64_t>(SIZE_MAX / 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena size ", bytes, " is too large"));
  }

  absl::StatusOr<Region> region = absl::UnavailableError("not tried");
  bool huge = false;
  if (options.try_huge_pages && bytes % kHugePageBytes == 0) {
    region = MakeRegion(options.name, bytes, MFD_HUGETLB);
    huge = region.ok();
    if (!huge) {
      spdlog::info("arena {} ({}): no huge pages ({}), using 4 KiB pages",
                   options.name, FormatByteSize(bytes),
                   std::string(region.status().message()));
    }
  }
  if (!huge) {
    region = MakeRegion(options.name, bytes, 0);
    if (!region.ok()) {
      if (region.status().code() == absl::StatusCode::kResourceExhausted) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot create a ", FormatByteSize(bytes),
                         " arena: ", region.status().message()));
      }
      return region.status();
    }
  }

  bool locked = false;
  if (options.lock_in_ram) {
    if (mlock(region->base, bytes) != 0) {
      const int error = errno;
      munmap(region->base, bytes);
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot lock the ", FormatByteSize(bytes), " (", bytes,
          " bytes) arena in RAM: ", ErrnoToStatus(error, "mlock").message(),
          " (", MemlockLimitText(), ")"));
    }
    locked = true;
  }
  return std::unique_ptr<SharedArena>(new SharedArena(
      std::move(region->fd), region->base, bytes, huge, locked));
}

SharedArena::SharedArena(UniqueFd fd, uint8_t* base, uint64_t size,
                         bool huge_pages, bool locked)
    : fd_(std::move(fd)),
      base_(base),
      size_(size),
      huge_pages_(huge_pages),
      locked_(locked) {}

SharedArena::~SharedArena() {
  // munmap drops the lock too; the fd closes in UniqueFd's destructor.
  munmap(base_, size_);
}

}  // namespace lohan
