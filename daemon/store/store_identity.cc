#include "daemon/store/store_identity.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

constexpr char kFileName[] = "lohan.store";

std::string PathOf(const std::string& ssd_path) {
  return absl::StrCat(ssd_path, "/", kFileName);
}

std::string Encode(const DeviceIdentity& id) {
  return absl::StrCat("lohan store ", id.store_id, "\ndevice ", id.device,
                      " of ", id.devices, "\nstripe_unit ", id.stripe_unit,
                      "\nblock_size ", id.block_size, "\n");
}

absl::Status SyncFd(int fd, const std::string& what) {
  if (::fsync(fd) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync ", what));
  }
  return absl::OkStatus();
}

std::string Describe(const DeviceIdentity& id) {
  return absl::StrCat("store ", id.store_id, ", device ", id.device, " of ",
                      id.devices, ", stripe_unit ", id.stripe_unit,
                      ", block_size ", id.block_size);
}

}  // namespace

std::string NewStoreId() {
  uint8_t bytes[16] = {};
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string hex;
  for (uint8_t b : bytes) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

absl::StatusOr<std::optional<DeviceIdentity>> ReadDeviceIdentity(
    const std::string& ssd_path) {
  const std::string path = PathOf(ssd_path);
  std::ifstream in(path);
  if (!in) {
    if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) {
      return std::optional<DeviceIdentity>();
    }
    return ErrnoToStatus(errno, absl::StrCat("read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  DeviceIdentity id;
  char store_id[65] = {};
  unsigned long long stripe_unit = 0;
  char tail = 0;
  const bool ok =
      std::sscanf(text.str().c_str(),
                  "lohan store %64s device %u of %u stripe_unit %llu "
                  "block_size %u %c",
                  store_id, &id.device, &id.devices, &stripe_unit,
                  &id.block_size, &tail) == 5;
  if (!ok) {
    return absl::DataLossError(
        absl::StrCat(path,
                     " is not a lohan store identity file (it should say which "
                     "store the SSD's data belongs to)"));
  }
  id.store_id = store_id;
  id.stripe_unit = stripe_unit;
  return std::optional<DeviceIdentity>(id);
}

absl::Status WriteDeviceIdentity(const std::string& ssd_path,
                                 const DeviceIdentity& identity) {
  const std::string path = PathOf(ssd_path);
  const std::string tmp = path + ".tmp";
  const std::string data = Encode(identity);
  {
    UniqueFd fd(
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
    if (::write(fd.get(), data.data(), data.size()) !=
        static_cast<ssize_t>(data.size())) {
      return ErrnoToStatus(errno, absl::StrCat("write ", tmp));
    }
    if (absl::Status s = SyncFd(fd.get(), tmp); !s.ok()) return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", tmp));
  }
  UniqueFd dir(::open(ssd_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid())
    return ErrnoToStatus(errno, absl::StrCat("open ", ssd_path));
  return SyncFd(dir.get(), ssd_path);
}

absl::Status CheckDevices(const std::vector<std::string>& ssd_paths,
                          const DeviceIdentity& geometry,
                          bool catalog_id_known) {
  for (size_t i = 0; i < ssd_paths.size(); ++i) {
    absl::StatusOr<std::optional<DeviceIdentity>> found =
        ReadDeviceIdentity(ssd_paths[i]);
    if (!found.ok()) return found.status();
    if (!found->has_value()) continue;
    const DeviceIdentity& have = **found;
    if (!catalog_id_known) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD path ", ssd_paths[i], " holds the data of another store (",
          Describe(have), ", ", PathOf(ssd_paths[i]),
          ") whose catalog is not in this state_dir: point state_dir at "
          "that store's state directory, or, to give the SSD to a new "
          "store and lose that data, delete ",
          ssd_paths[i], "/lohan.data and ", PathOf(ssd_paths[i])));
    }
    DeviceIdentity want = geometry;
    want.device = static_cast<uint32_t>(i);
    want.devices = static_cast<uint32_t>(ssd_paths.size());
    if (have != want) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD path ", ssd_paths[i], " belongs to ", Describe(have), " (",
          PathOf(ssd_paths[i]), "); this state_dir's catalog is ",
          Describe(want),
          ": the SSD paths are not the ones this store was made with, or "
          "not in the same order"));
    }
  }
  return absl::OkStatus();
}

absl::Status ClaimDevices(const std::vector<std::string>& ssd_paths,
                          const DeviceIdentity& geometry) {
  for (size_t i = 0; i < ssd_paths.size(); ++i) {
    absl::StatusOr<std::optional<DeviceIdentity>> found =
        ReadDeviceIdentity(ssd_paths[i]);
    if (!found.ok()) return found.status();
    if (found->has_value()) continue;
    DeviceIdentity id = geometry;
    id.device = static_cast<uint32_t>(i);
    id.devices = static_cast<uint32_t>(ssd_paths.size());
    if (absl::Status s = WriteDeviceIdentity(ssd_paths[i], id); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> IdOfDevices(
    const std::vector<std::string>& ssd_paths) {
  std::optional<std::string> id;
  for (const std::string& path : ssd_paths) {
    absl::StatusOr<std::optional<DeviceIdentity>> found =
        ReadDeviceIdentity(path);
    if (!found.ok() || !found->has_value()) continue;
    if (id.has_value() && *id != (*found)->store_id) return std::nullopt;
    id = (*found)->store_id;
  }
  return id;
}

}  // namespace lohan
