#ifndef LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_SAVE_H_
#define LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_SAVE_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/checkpoint_writer.h"
#include "proto/checkpoint.pb.h"

namespace lohan::checkpoint {

// One save of a checkpoint directory, all or nothing: its files go into a
// hidden staging directory beside it (save_directory.h), and Commit writes
// lohan.json and switches the whole directory in; a save destroyed before
// its Commit removes its staging directory, and the previous checkpoint is
// untouched. With data-parallel ranks, rank 0 Begins the save, tells every
// rank the staging directory and save id (they Join), every rank writes
// its shard file, and rank 0 Commits with every rank's file entries.
class CheckpointSave {
 public:
  // A save into `directory` (made if missing; FAILED_PRECONDITION when it
  // is a file). Removes what earlier interrupted saves left beside it.
  static absl::StatusOr<std::unique_ptr<CheckpointSave>> Begin(
      const std::string& directory);
  // Another rank's part of a save Begun elsewhere; it writes its files into
  // `staging` and never commits or removes it.
  static std::unique_ptr<CheckpointSave> Join(const std::string& staging,
                                              const std::string& save_id);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  const std::filesystem::path& staging() const { return staging_; }
  const std::string& save_id() const { return save_id_; }

  // Creates this process's files for `contents` (CheckpointWriter).
  absl::Status Open(const v1::CheckpointContents& contents);
  // The writer Open made; nullptr before.
  CheckpointWriter* writer() { return writer_.get(); }
  // Syncs this process's files; their manifest entries.
  absl::StatusOr<std::vector<FileEntry>> CloseFiles();
  // Writes lohan.json (ComposeMeta of `meta_json` with `files`, every file
  // of the save: every rank's; empty: this process's own) into the staging
  // directory, links in the user's files of the old checkpoint and switches
  // the directory in. Only for a save Begun here, after CloseFiles.
  absl::Status Commit(const std::string& meta_json,
                      std::vector<FileEntry> files);

 private:
  CheckpointSave(std::filesystem::path final, std::filesystem::path staging,
                 std::string save_id, bool owner)
      : final_(std::move(final)),
        staging_(std::move(staging)),
        save_id_(std::move(save_id)),
        owner_(owner) {}

  std::filesystem::path final_;  // empty for a joined save
  std::filesystem::path staging_;
  std::string save_id_;
  bool owner_ = false;
  bool committed_ = false;
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<FileEntry> own_files_;
};

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_CHECKPOINT_SAVE_H_
