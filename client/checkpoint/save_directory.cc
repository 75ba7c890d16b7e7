#include "client/checkpoint/save_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/manifest.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr char kSaveTag[] = ".lohan-save-";
constexpr char kOldTag[] = ".lohan-old-";

SaveFaultsForTesting& Faults() {
  static SaveFaultsForTesting faults;
  return faults;
}

bool Alive(long pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

absl::Status SyncDirectory(const fs::path& path) {
  SaveStep();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) {
    return ErrnoToStatus(errno, "checkpoint: syncing " + path.string());
  }
  return absl::OkStatus();
}

absl::Status StatusOf(const std::error_code& error, const std::string& what) {
  return ErrnoToStatus(error.value(), "checkpoint: " + what);
}

// The pid a staging directory's name carries after its tag; -1 if none.
long PidOfStaging(const std::string& rest) {
  const size_t from = sizeof(kSaveTag) - 1;
  const std::string pid = rest.substr(from, rest.find('-', from) - from);
  if (pid.empty() || pid.size() > 9 ||
      pid.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stol(pid);
}

void RemoveStaleSaves(const fs::path& final) {
  const std::string prefix = "." + final.filename().string();
  std::error_code ignored;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(final.parent_path(), ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest.rfind(kSaveTag, 0) == 0) {
      const long pid = PidOfStaging(rest);
      if (pid > 0 && (pid == ::getpid() || !Alive(pid))) {
        fs::remove_all(entry.path(), ignored);
      }
    } else if (rest.rfind(kOldTag, 0) == 0 && fs::exists(final / kMetaFile)) {
      fs::remove_all(entry.path(), ignored);
    }
  }
}

absl::Status LinkEntry(const fs::directory_entry& entry,
                       const fs::path& target) {
  std::error_code error;
  if (entry.is_symlink()) {
    fs::copy_symlink(entry.path(), target, error);
    return error ? StatusOf(error, "keeping " + entry.path().string())
                 : absl::OkStatus();
  }
  if (entry.is_directory()) {
    fs::copy(entry.path(), target,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks |
                 fs::copy_options::create_hard_links,
             error);
    if (!error) return absl::OkStatus();
    fs::remove_all(target, error);
    fs::copy(entry.path(), target,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks,
             error);
  } else {
    fs::create_hard_link(entry.path(), target, error);
    if (error) fs::copy_file(entry.path(), target, error);
  }
  return error ? StatusOf(error, "keeping " + entry.path().string())
               : absl::OkStatus();
}

}  // namespace

void SetSaveFaultsForTesting(SaveFaultsForTesting faults) {
  Faults() = std::move(faults);
}

void SaveStep() {
  if (Faults().step) Faults().step();
}

absl::StatusOr<fs::path> MakeStagingDirectory(const fs::path& final,
                                              const std::string& save_id) {
  std::error_code error;
  if (fs::exists(final, error) && !fs::is_directory(final, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint path ", final.string(),
                     " is a file; engine.save writes a directory"));
  }
  fs::create_directories(final.parent_path(), error);
  if (error) return StatusOf(error, "creating " + final.parent_path().string());
  RemoveStaleSaves(final);
  const fs::path staging =
      final.parent_path() / absl::StrCat(".", final.filename().string(),
                                         kSaveTag, ::getpid(), "-",
                                         save_id.substr(0, 12));
  fs::create_directory(staging, error);
  if (error) return StatusOf(error, "creating " + staging.string());
  return staging;
}

absl::Status KeepForeignEntries(const fs::path& final,
                                const fs::path& staging) {
  std::error_code error;
  if (!fs::is_directory(final, error)) return absl::OkStatus();
  for (const fs::directory_entry& entry :
       fs::directory_iterator(final, error)) {
    const std::string name = entry.path().filename().string();
    if (IsLohanFile(name)) continue;
    if (absl::Status kept = LinkEntry(entry, staging / name); !kept.ok()) {
      return kept;
    }
  }
  return error ? StatusOf(error, "listing " + final.string())
               : absl::OkStatus();
}

absl::Status SwitchIn(const fs::path& staging, const fs::path& final) {
  if (absl::Status synced = SyncDirectory(staging); !synced.ok()) return synced;
  fs::path previous;
  std::error_code error;
  SaveStep();
  if (!fs::exists(final, error)) {
    fs::rename(staging, final, error);
    if (error) return StatusOf(error, "renaming " + staging.string());
  } else if (!Faults().no_exchange &&
             ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final.c_str(),
                         RENAME_EXCHANGE) == 0) {
    previous = staging;
  } else if (Faults().no_exchange || errno == EINVAL || errno == ENOSYS ||
             errno == ENOTSUP) {
    const std::string name = staging.filename().string();
    previous = final.parent_path() /
               (absl::StrCat(".", final.filename().string(), kOldTag,
                             name.substr(name.size() - 12)));
    fs::rename(final, previous, error);
    if (error) return StatusOf(error, "setting " + final.string() + " aside");
    SaveStep();
    fs::rename(staging, final, error);
    if (error) return StatusOf(error, "renaming " + staging.string());
  } else {
    return ErrnoToStatus(errno, "checkpoint: exchanging " + staging.string() +
                                    " and " + final.string());
  }
  if (absl::Status synced = SyncDirectory(final.parent_path()); !synced.ok()) {
    return synced;
  }
  if (!previous.empty()) {
    SaveStep();
    fs::remove_all(previous, error);
  }
  return absl::OkStatus();
}

}  // namespace lohan::checkpoint
