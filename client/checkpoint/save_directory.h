#ifndef LOHAN_CLIENT_CHECKPOINT_SAVE_DIRECTORY_H_
#define LOHAN_CLIENT_CHECKPOINT_SAVE_DIRECTORY_H_

// The all-or-nothing replacement of a checkpoint directory: a save writes
// a complete checkpoint into a hidden sibling, .<name>.lohan-save-<pid>-<id>
// (the first 12 characters of the save id), and switches it in with one
// rename exchange (two renames where the filesystem lacks it, the previous
// checkpoint set aside as .<name>.lohan-old-<id> between them).

#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lohan::checkpoint {

// A new, empty hidden sibling of `final` (an absolute path) to write a
// checkpoint into. First removes what interrupted saves left beside
// `final` (staging directories of processes gone, previous checkpoints
// set aside once `final` is whole). FAILED_PRECONDITION when `final` is a
// file.
absl::StatusOr<std::filesystem::path> MakeStagingDirectory(
    const std::filesystem::path& final, const std::string& save_id);

// Hard-links (or copies) every entry of `final` but lohan's own files into
// `staging`, so a save never drops a user's file.
absl::Status KeepForeignEntries(const std::filesystem::path& final,
                                const std::filesystem::path& staging);

// fsyncs `staging`, puts it in place of `final` and fsyncs the parent; the
// previous checkpoint is deleted. On an error `final` is as it was.
absl::Status SwitchIn(const std::filesystem::path& staging,
                      const std::filesystem::path& final);

// Faults a test injects into every save of the process: `step` is called
// before each durable step of a save (each tensor written, each fsync, the
// switch, the removal of the previous checkpoint), so a test can kill the
// process there; `no_exchange` makes the switch take two renames.
struct SaveFaultsForTesting {
  std::function<void()> step;
  bool no_exchange = false;
};
void SetSaveFaultsForTesting(SaveFaultsForTesting faults);
// Calls the injected step, if any.
void SaveStep();

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_SAVE_DIRECTORY_H_
