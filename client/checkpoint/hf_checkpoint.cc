#include "client/checkpoint/hf_checkpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/manifest.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

// DATA_LOSS: the index of `directory` is damaged (`what`).
absl::Status BadIndex(const fs::path& directory, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", directory.string(),
                                          ": ", kHfIndexFile, " ", what));
}

// Whether `name` is a plain file name, one that stays inside the directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::OpenDirectory(
    const fs::path& directory) {
  std::error_code error;
  if (!fs::exists(directory / kHfIndexFile, error)) {
    return OpenFile((directory / kWeightsFile).string());
  }
  std::unique_ptr<HfCheckpoint> checkpoint(new HfCheckpoint());
  if (absl::Status opened = checkpoint->OpenIndexed(directory); !opened.ok()) {
    return opened;
  }
  return checkpoint;
}

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::OpenFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<HfCheckpoint> checkpoint(new HfCheckpoint());
  checkpoint->names_ = (*file)->order();
  for (const std::string& name : checkpoint->names_) {
    checkpoint->where_[name] = file->get();
  }
  checkpoint->files_.push_back(*std::move(file));
  return checkpoint;
}

absl::Status HfCheckpoint::OpenIndexed(const fs::path& directory) {
  absl::StatusOr<std::string> text = ReadText(directory / kHfIndexFile);
  if (!text.ok()) return text.status();
  absl::StatusOr<JsonValue> index = JsonValue::Parse(*text, kHfIndexFile);
  if (!index.ok()) {
    return BadIndex(directory,
                    absl::StrCat("is damaged: ", index.status().message()));
  }
  const JsonValue* map = index->Find("weight_map");
  if (map == nullptr || !map->is_object()) {
    return BadIndex(directory, "has no \"weight_map\" object");
  }
  for (const auto& [name, file] : map->members()) {
    if (file.kind() != JsonValue::Kind::kString) {
      return BadIndex(directory, "maps tensor " + name + " to no file name");
    }
    if (where_.contains(name)) {
      return BadIndex(directory, "names tensor " + name + " twice");
    }
    absl::StatusOr<const SafetensorsFile*> shard =
        Shard(directory, file.text());
    if (!shard.ok()) return shard.status();
    if ((*shard)->Find(name) == nullptr) {
      return BadIndex(directory, absl::StrCat("puts tensor ", name, " in ",
                                              file.text(), ", which lacks it"));
    }
    where_[name] = *shard;
    names_.push_back(name);
  }
  return absl::OkStatus();
}

absl::StatusOr<const SafetensorsFile*> HfCheckpoint::Shard(
    const fs::path& directory, const std::string& file) {
  if (const auto opened = by_file_name_.find(file);
      opened != by_file_name_.end()) {
    return opened->second;
  }
  if (!IsPlainFileName(file)) {
    return BadIndex(directory, absl::StrCat("names the file \"", file,
                                            "\", outside its directory"));
  }
  std::error_code error;
  if (!fs::is_regular_file(directory / file, error)) {
    return BadIndex(directory,
                    absl::StrCat("names ", file, ", which is missing"));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
      SafetensorsFile::Open((directory / file).string());
  if (!opened.ok()) return opened.status();
  files_.push_back(*std::move(opened));
  by_file_name_[file] = files_.back().get();
  return files_.back().get();
}

std::pair<const SafetensorsFile*, const SafetensorsFile::Entry*>
HfCheckpoint::Locate(const std::string& name) const {
  const auto found = where_.find(name);
  if (found == where_.end()) return {nullptr, nullptr};
  return {found->second, found->second->Find(name)};
}

}  // namespace lohan::checkpoint
