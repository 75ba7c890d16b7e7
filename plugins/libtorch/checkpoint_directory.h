#ifndef LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_DIRECTORY_H_
#define LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_DIRECTORY_H_

#include <filesystem>
#include <string>

namespace lohan::torch_plugin {

// The all-or-nothing replacement of a checkpoint directory, named as the
// Python plugin names it (checkpoint.py), so either plugin cleans up after
// the other.

// A new, empty hidden sibling of `final` to write a checkpoint into:
// .<name>.lohan-save-<pid>-<first 12 of save_id>. First removes what
// interrupted saves left beside `final` (staging directories of processes
// gone, previous checkpoints set aside once `final` is whole).
std::filesystem::path MakeStagingDirectory(const std::filesystem::path& final,
                                           const std::string& save_id);

// Hard-links (or copies) every entry of `final` but lohan's own files into
// `staging`, so a save never drops a user's file.
void KeepForeignEntries(const std::filesystem::path& final,
                        const std::filesystem::path& staging);

// fsyncs `staging`, puts it in place of `final` (one rename exchange, or
// two renames) and fsyncs the parent; the previous checkpoint is deleted.
void SwitchIn(const std::filesystem::path& staging,
              const std::filesystem::path& final);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_CHECKPOINT_DIRECTORY_H_
