#include "client/checkpoint/checkpoint_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "client/checkpoint/manifest.h"
#include "client/checkpoint/save_directory.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

std::string NewSaveId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    id += absl::StrFormat("%08x", static_cast<uint32_t>(random()));
  }
  return id;
}

absl::Status WriteSynced(const fs::path& path, const std::string& text) {
  UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return ErrnoToStatus(errno, "checkpoint: creating " + path.string());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t put =
        ::write(fd.get(), text.data() + done, text.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      return ErrnoToStatus(errno, "checkpoint: writing " + path.string());
    }
    done += static_cast<size_t>(put);
  }
  SaveStep();
  if (::fsync(fd.get()) != 0) {
    return ErrnoToStatus(errno, "checkpoint: syncing " + path.string());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointSave>> CheckpointSave::Begin(
    const std::string& directory) {
  const fs::path final = fs::absolute(directory).lexically_normal();
  const fs::path target =
      final.has_filename() ? final : final.parent_path();  // "dir/" -> "dir"
  const std::string save_id = NewSaveId();
  absl::StatusOr<fs::path> staging = MakeStagingDirectory(target, save_id);
  if (!staging.ok()) return staging.status();
  return std::unique_ptr<CheckpointSave>(
      new CheckpointSave(target, *std::move(staging), save_id, true));
}

std::unique_ptr<CheckpointSave> CheckpointSave::Join(
    const std::string& staging, const std::string& save_id) {
  return std::unique_ptr<CheckpointSave>(
      new CheckpointSave(fs::path(), staging, save_id, false));
}

CheckpointSave::~CheckpointSave() {
  writer_.reset();  // closes its files first
  if (owner_ && !committed_) {
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
  }
}

absl::Status CheckpointSave::Open(const v1::CheckpointContents& contents) {
  if (writer_ != nullptr) {
    return absl::FailedPreconditionError(
        "checkpoint: the save is open already");
  }
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
      CheckpointWriter::Create(staging_, save_id_, contents);
  if (!writer.ok()) return writer.status();
  writer_ = *std::move(writer);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FileEntry>> CheckpointSave::CloseFiles() {
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError(
        "checkpoint: the save has no files open (open it with its contents)");
  }
  absl::StatusOr<std::vector<FileEntry>> files = writer_->Close();
  if (files.ok()) own_files_ = *files;
  return files;
}

absl::Status CheckpointSave::Commit(const std::string& meta_json,
                                    std::vector<FileEntry> files) {
  if (!owner_ || committed_ || writer_ == nullptr || own_files_.empty()) {
    return absl::FailedPreconditionError(
        "checkpoint: only the process that began a save commits it, once, "
        "after closing its files");
  }
  if (files.empty()) files = own_files_;
  absl::StatusOr<std::string> meta =
      ComposeMeta(meta_json, writer_->contents(), save_id_, files);
  if (!meta.ok()) return meta.status();
  if (absl::Status written = WriteSynced(staging_ / kMetaFile, *meta);
      !written.ok()) {
    return written;
  }
  if (absl::Status kept = KeepForeignEntries(final_, staging_); !kept.ok()) {
    return kept;
  }
  if (absl::Status switched = SwitchIn(staging_, final_); !switched.ok()) {
    return switched;
  }
  committed_ = true;
  return absl::OkStatus();
}

}  // namespace lohan::checkpoint
