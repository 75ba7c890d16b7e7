#include "client/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/manifest.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& path, bool verify) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader(path));
  std::error_code error;
  if (fs::is_regular_file(path, error)) {
    absl::StatusOr<std::unique_ptr<HfCheckpoint>> file =
        HfCheckpoint::OpenFile(path);
    if (!file.ok()) return file.status();
    reader->hf_ = *std::move(file);
    return reader;
  }
  if (absl::Status opened = reader->OpenDirectory(verify); !opened.ok()) {
    return opened;
  }
  return reader;
}

absl::Status CheckpointReader::OpenDirectory(bool verify) {
  const fs::path path(path_);
  const fs::path weights = path / kWeightsFile;
  std::error_code error;
  if (!fs::exists(path / kMetaFile, error)) {  // a Hugging Face checkpoint?
    if (!fs::exists(weights, error) &&
        !fs::exists(path / kHfIndexFile, error)) {
      return MissingCheckpoint(path, weights, /*hugging_face=*/true);
    }
    absl::StatusOr<std::unique_ptr<HfCheckpoint>> hf =
        HfCheckpoint::OpenDirectory(path);
    if (!hf.ok()) return hf.status();
    hf_ = *std::move(hf);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> text = ReadText(path / kMetaFile);
  if (!text.ok()) return text.status();
  absl::StatusOr<JsonValue> meta = ReadMeta(path);
  if (!meta.ok()) return meta.status();
  meta_text_ = *std::move(text);
  if (absl::Status checked = CheckManifest(path, *meta, verify);
      !checked.ok()) {
    return checked;
  }
  if (const JsonValue* step = meta->Find("iteration")) {
    absl::StatusOr<uint64_t> value =
        step->AsUint64((path / kMetaFile).string() + " iteration");
    if (!value.ok()) return value.status();
    iteration_ = *value;
  }
  std::vector<std::string> listed;
  if (const JsonValue* parts = meta->Find("optimizer_state")) {
    for (const JsonValue& part : parts->items()) listed.push_back(part.text());
  }
  if (const JsonValue* plan = meta->Find("sharding")) {
    absl::StatusOr<std::unique_ptr<ShardedTensors>> sharded =
        ShardedTensors::Open(path, *plan, meta->Find("files"));
    if (!sharded.ok()) return sharded.status();
    sharded_ = *std::move(sharded);
    moments_ = std::move(listed);
    return absl::OkStatus();
  }
  if (!fs::exists(weights, error)) {
    return MissingCheckpoint(path, weights, /*hugging_face=*/false);
  }
  if (absl::Status files =
          OpenFiles(weights.string(), (path / kOptimizerFile).string());
      !files.ok()) {
    return files;
  }
  if (optimizer_ != nullptr) moments_ = std::move(listed);
  return absl::OkStatus();
}

absl::Status CheckpointReader::OpenFiles(const std::string& weights,
                                         const std::string& optimizer) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(weights);
  if (!file.ok()) return file.status();
  weights_ = *std::move(file);
  std::error_code error;
  if (!fs::exists(optimizer, error)) {
    return absl::OkStatus();
  }
  file = SafetensorsFile::Open(optimizer);
  if (!file.ok()) return file.status();
  optimizer_ = *std::move(file);
  return absl::OkStatus();
}

uint32_t CheckpointReader::world_size() const {
  return sharded_ != nullptr ? sharded_->world_size() : 1;
}

std::vector<std::pair<std::string, std::vector<int64_t>>>
CheckpointReader::Parameters() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (sharded_ != nullptr) {
    for (const std::string& name : sharded_->names()) {
      out.emplace_back(name, *sharded_->ShapeOf(name));
    }
    return out;
  }
  const std::vector<std::string>& names =
      hf_ != nullptr ? hf_->names() : weights_->order();
  for (const std::string& name : names) {
    out.emplace_back(name, *Shape(name, "weights"));
  }
  return out;
}

std::pair<const SafetensorsFile*, const SafetensorsFile::Entry*>
CheckpointReader::Locate(const std::string& name,
                         const std::string& part) const {
  if (hf_ != nullptr) {
    if (part != "weights") return {nullptr, nullptr};  // weights only
    return hf_->Locate(name);
  }
  const bool weights = part == "weights";
  const SafetensorsFile* file = weights ? weights_.get() : optimizer_.get();
  const SafetensorsFile::Entry* entry =
      file == nullptr ? nullptr
                      : file->Find(weights ? name : part + "/" + name);
  if (entry == nullptr) return {nullptr, nullptr};
  return {file, entry};
}

const std::vector<int64_t>* CheckpointReader::Shape(
    const std::string& name, const std::string& part) const {
  if (sharded_ != nullptr) {
    const bool stored =
        part == "weights" ||
        std::find(moments_.begin(), moments_.end(), part) != moments_.end();
    return stored ? sharded_->ShapeOf(name) : nullptr;
  }
  const SafetensorsFile::Entry* entry = Locate(name, part).second;
  return entry == nullptr ? nullptr : &entry->shape;
}

std::string CheckpointReader::Dtype(const std::string& name,
                                    const std::string& part) const {
  if (Shape(name, part) == nullptr) return "";
  if (sharded_ != nullptr) return sharded_->DtypeOf(name, part);
  return Locate(name, part).second->dtype;
}

absl::Status CheckpointReader::Read(const std::string& name,
                                    const std::string& part, float* out,
                                    uint64_t elements) const {
  const std::vector<int64_t>* shape = Shape(name, part);
  if (shape == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, ": no ", part,
                                            " for parameter ", name));
  }
  if (Elements(*shape) != elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path_, ": ", name, " (", part, ") has ",
                     Elements(*shape), " elements, ", elements, " asked for"));
  }
  return ReadStored(name, part, 0, elements, out);
}

absl::Status CheckpointReader::ReadAs(const std::string& name,
                                      const std::string& part,
                                      const std::vector<int64_t>& shape,
                                      float* out) const {
  return ReadRangeAs(name, part, shape, 0, Elements(shape), out);
}

absl::Status CheckpointReader::ReadRangeAs(const std::string& name,
                                           const std::string& part,
                                           const std::vector<int64_t>& shape,
                                           uint64_t first, uint64_t count,
                                           float* out) const {
  if (absl::Status checked = CheckShape(name, part, shape); !checked.ok()) {
    return checked;
  }
  const uint64_t elements = Elements(shape);
  if (first > elements || count > elements - first) {
    return absl::OutOfRangeError(
        absl::StrCat("checkpoint ", path_, ": elements ", first, " + ", count,
                     " of ", name, " (", part, "), which has ", elements));
  }
  return ReadStored(name, part, first, count, out);
}

absl::Status CheckpointReader::CheckShape(
    const std::string& name, const std::string& part,
    const std::vector<int64_t>& shape) const {
  const std::vector<int64_t>* stored = Shape(name, part);
  if (stored == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", path_, ": no ", part, " for parameter ",
                     name, " (the checkpoint is of another model?)"));
  }
  if (*stored != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path_, ": ", name, " (", part, ") has shape ",
        ShapeText(*stored), ", the model's ", ShapeText(shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadStored(const std::string& name,
                                          const std::string& part,
                                          uint64_t first, uint64_t count,
                                          float* out) const {
  if (sharded_ != nullptr) {
    return sharded_->ReadRange(name, part, first, count, out);
  }
  const auto [file, entry] = Locate(name, part);
  return file->ReadRange(*entry, first, count, out);
}

}  // namespace lohan::checkpoint
