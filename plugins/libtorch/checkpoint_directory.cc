#include "plugins/libtorch/checkpoint_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace lohan::torch_plugin {
namespace fs = std::filesystem;
namespace {

constexpr char kSaveTag[] = ".lohan-save-";
constexpr char kOldTag[] = ".lohan-old-";

bool Alive(long pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

void SyncDirectory(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("checkpoint: syncing " + path.string() + ": " +
                             why);
  }
  ::close(fd);
}

bool IsLohanFile(const std::string& name) {
  return name == "model.safetensors" || name == "optimizer.safetensors" ||
         name == "lohan.json" ||
         (name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0);
}

void RemoveStaleSaves(const fs::path& final) {
  const std::string prefix = "." + final.filename().string();
  std::error_code ignored;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(final.parent_path(), ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest.compare(0, sizeof(kSaveTag) - 1, kSaveTag) == 0) {
      const std::string pid =
          rest.substr(sizeof(kSaveTag) - 1, rest.find('-', sizeof(kSaveTag)) -
                                                (sizeof(kSaveTag) - 1));
      if (pid.empty() ||
          pid.find_first_not_of("0123456789") != std::string::npos) {
        continue;
      }
      const long id = std::stol(pid);
      if (id == ::getpid() || !Alive(id)) fs::remove_all(entry.path(), ignored);
    } else if (rest.compare(0, sizeof(kOldTag) - 1, kOldTag) == 0 &&
               fs::exists(final / "lohan.json")) {
      fs::remove_all(entry.path(), ignored);
    }
  }
}

}  // namespace

fs::path MakeStagingDirectory(const fs::path& final,
                              const std::string& save_id) {
  if (fs::exists(final) && !fs::is_directory(final)) {
    throw std::runtime_error("checkpoint: " + final.string() +
                             " is a file; save() writes a directory");
  }
  fs::create_directories(final.parent_path());
  RemoveStaleSaves(final);
  const fs::path staging =
      final.parent_path() /
      ("." + final.filename().string() + kSaveTag + std::to_string(::getpid()) +
       "-" + save_id.substr(0, 12));
  fs::create_directory(staging);
  return staging;
}

void KeepForeignEntries(const fs::path& final, const fs::path& staging) {
  if (!fs::is_directory(final)) return;
  for (const fs::directory_entry& entry : fs::directory_iterator(final)) {
    const std::string name = entry.path().filename().string();
    if (IsLohanFile(name)) continue;
    const fs::path target = staging / name;
    if (entry.is_symlink()) {
      fs::copy_symlink(entry.path(), target);
      continue;
    }
    std::error_code linked;
    if (entry.is_directory()) {
      fs::copy(entry.path(), target,
               fs::copy_options::recursive | fs::copy_options::copy_symlinks |
                   fs::copy_options::create_hard_links,
               linked);
      if (linked) {
        fs::remove_all(target);
        fs::copy(entry.path(), target,
                 fs::copy_options::recursive | fs::copy_options::copy_symlinks);
      }
      continue;
    }
    fs::create_hard_link(entry.path(), target, linked);
    if (linked) fs::copy_file(entry.path(), target);
  }
}

void SwitchIn(const fs::path& staging, const fs::path& final) {
  SyncDirectory(staging);
  fs::path previous;
  if (!fs::exists(final)) {
    fs::rename(staging, final);
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final.c_str(),
                         RENAME_EXCHANGE) == 0) {
    previous = staging;
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    const std::string name = staging.filename().string();
    previous = final.parent_path() / ("." + final.filename().string() +
                                      kOldTag + name.substr(name.size() - 12));
    fs::rename(final, previous);
    fs::rename(staging, final);
  } else {
    throw std::runtime_error("checkpoint: exchanging " + staging.string() +
                             " and " + final.string() + ": " +
                             std::strerror(errno));
  }
  SyncDirectory(final.parent_path());
  std::error_code ignored;
  if (!previous.empty()) fs::remove_all(previous, ignored);
}

}  // namespace lohan::torch_plugin
