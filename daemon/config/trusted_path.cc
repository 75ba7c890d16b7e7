#include "daemon/config/trusted_path.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lohan {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Mode(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

// Why `path` (a directory, `is_target` the one lohand keeps files in, else
// one above it) is not trusted; empty when it is.
std::string Untrusted(const std::string& path, const struct stat& info,
                      uid_t owner, bool is_target) {
  if (!S_ISDIR(info.st_mode)) return "is not a directory";
  if (info.st_uid != owner && info.st_uid != 0) {
    return absl::StrCat("is owned by uid ", info.st_uid,
                        ", neither root nor lohand's uid ", owner);
  }
  const bool others_write = (info.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (!others_write) return "";
  if (!is_target && (info.st_mode & S_ISVTX) != 0) return "";
  return absl::StrCat(
      "is writable by ", (info.st_mode & S_IWOTH) != 0 ? "others" : "its group",
      " (mode ", Mode(info.st_mode), ")", is_target ? "" : " and not sticky");
}

}  // namespace

namespace {

// `directory` as the config names it; `existing`, the directory to judge:
// itself, or (when it does not exist yet) the one it would be made in.
absl::Status CheckDirectory(const std::string& directory,
                            const std::string& existing, uid_t owner,
                            absl::string_view key) {
  const bool is_target_itself = existing == directory;
  char resolved[PATH_MAX];
  if (realpath(existing.c_str(), resolved) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key '", key, "': ", directory, ": ", std::strerror(errno)));
  }
  const std::string target = resolved;
  for (std::string path = target;; path = Parent(path)) {
    struct stat info {};
    if (stat(path.c_str(), &info) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("key '", key, "': ", path, ": ", std::strerror(errno)));
    }
    const bool is_target = is_target_itself && path == target;
    if (std::string why = Untrusted(path, info, owner, is_target);
        !why.empty()) {
      const std::string about =
          !is_target            ? absl::StrCat(path, ", above ", directory, ",")
          : directory == target ? directory
                                : absl::StrCat(directory, " (", target, ")");
      return absl::FailedPreconditionError(absl::StrCat(
          "key '", key, "': ", about, " ", why,
          ": another local user could replace or rename what lohand keeps "
          "there. lohand needs the directories it keeps files in owned by "
          "root or its own uid and writable by no one else (directories "
          "above them may be sticky, as /tmp is). Fix: `chown root ",
          path, " && chmod go-w ", path, "`, or choose another path"));
    }
    if (path == "/") return absl::OkStatus();
  }
}

// CheckTrustedDirectory, or for a missing directory the nearest existing
// one above it, which is where it would be made.
absl::Status CheckExistingOrAbove(const std::string& directory, uid_t owner,
                                  absl::string_view key) {
  std::string path = directory;
  struct stat info {};
  while (stat(path.c_str(), &info) != 0 && errno == ENOENT && path != "/" &&
         path != ".") {
    path = Parent(path);
  }
  return CheckDirectory(directory, path, owner, key);
}

}  // namespace

absl::Status CheckTrustedDirectory(const std::string& directory, uid_t owner,
                                   absl::string_view key) {
  return CheckDirectory(directory, directory, owner, key);
}

absl::Status CheckTrustedPaths(const DaemonConfig& config, uid_t owner) {
  if (absl::Status s = CheckExistingOrAbove(Parent(config.socket_path), owner,
                                            "daemon.socket");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckExistingOrAbove(config.state_dir, owner, "daemon.state_dir");
      !s.ok()) {
    return s;
  }
  for (const std::string& path : config.ssd_paths) {
    struct stat info {};
    if (stat(path.c_str(), &info) == 0 && S_ISBLK(info.st_mode)) continue;
    if (absl::Status s = CheckExistingOrAbove(path, owner, "store.ssd_paths");
        !s.ok()) {
      return s;
    }
  }
  // node_exporter's directory, which lohand does not make: it must exist.
  if (!config.metrics_textfile.empty()) {
    if (absl::Status s = CheckTrustedDirectory(Parent(config.metrics_textfile),
                                               owner, "metrics.textfile");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace lohan
