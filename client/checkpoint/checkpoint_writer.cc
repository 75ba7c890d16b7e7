#include "client/checkpoint/checkpoint_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/manifest.h"
#include "client/checkpoint/save_directory.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kParts[] = {"weights", "exp_avg", "exp_avg_sq",
                                  "max_exp_avg_sq"};

absl::Status CheckContents(const v1::CheckpointContents& contents) {
  if (contents.parts().empty() || contents.parts(0) != "weights") {
    return absl::InvalidArgumentError(
        "checkpoint: the parts to save must start with \"weights\"");
  }
  for (const std::string& part : contents.parts()) {
    bool known = false;
    for (const char* name : kParts) known = known || part == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: unknown part \"", part,
                       "\" (weights, exp_avg, exp_avg_sq, max_exp_avg_sq)"));
    }
  }
  if (contents.world_size() > 1 && contents.rank() >= contents.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: rank ", contents.rank(), " of world size ",
                     contents.world_size()));
  }
  for (int l = 0; l < contents.layers_size(); ++l) {
    const v1::CheckpointLayer& layer = contents.layers(l);
    for (const v1::CheckpointTensor& tensor : layer.tensors()) {
      const std::vector<int64_t> shape(tensor.shape().begin(),
                                       tensor.shape().end());
      for (int64_t size : shape) {
        if (size < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "checkpoint: ", tensor.name(), " has a negative size"));
        }
      }
      if (tensor.offset() + Elements(shape) > layer.elements()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: ", tensor.name(), " lies past layer ", l,
                         "'s ", layer.elements(), " elements"));
      }
    }
  }
  return absl::OkStatus();
}

std::string Prefix(const std::string& part) {
  return part == "weights" ? "" : part + "/";
}

JsonValue Counts(const std::vector<uint64_t>& values) {
  std::vector<JsonValue> items;
  for (uint64_t value : values) items.push_back(JsonValue::Number(value));
  return JsonValue::Array(std::move(items));
}

// lohan.json's "sharding": how the shard files cut every layer.
JsonValue ShardingPlan(const v1::CheckpointContents& contents) {
  const uint32_t world = contents.world_size();
  std::vector<JsonValue> files, layers;
  for (uint32_t r = 0; r < world; ++r) {
    files.push_back(JsonValue::String(ShardFileName(r, world)));
  }
  for (const v1::CheckpointLayer& layer : contents.layers()) {
    std::vector<JsonValue> names, shapes;
    std::vector<uint64_t> offsets;
    for (const v1::CheckpointTensor& tensor : layer.tensors()) {
      names.push_back(JsonValue::String(tensor.name()));
      shapes.push_back(Counts({tensor.shape().begin(), tensor.shape().end()}));
      offsets.push_back(tensor.offset());
    }
    layers.push_back(JsonValue::Object(
        {{"numel", JsonValue::Number(layer.elements())},
         {"shard", JsonValue::Number(ShardElements(layer.elements(), world))},
         {"names", JsonValue::Array(std::move(names))},
         {"shapes", JsonValue::Array(std::move(shapes))},
         {"offsets", Counts(offsets)}}));
  }
  return JsonValue::Object({{"world_size", JsonValue::Number(world)},
                            {"files", JsonValue::Array(std::move(files))},
                            {"layers", JsonValue::Array(std::move(layers))}});
}

}  // namespace

uint64_t ShardElements(uint64_t elements, uint32_t world) {
  return world <= 1 ? elements : (elements + world - 1) / world;
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const fs::path& staging, const std::string& save_id,
    const v1::CheckpointContents& contents) {
  if (absl::Status checked = CheckContents(contents); !checked.ok()) {
    return checked;
  }
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(contents));
  if (absl::Status opened = writer->OpenFiles(staging, save_id); !opened.ok()) {
    return opened;
  }
  return writer;
}

absl::Status CheckpointWriter::OpenFiles(const fs::path& staging,
                                         const std::string& save_id) {
  std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"},
      {"lohan_job", contents_.job_name()},
      {"lohan_iteration", std::to_string(contents_.iteration())},
      {kSaveIdKey, save_id}};
  // Per file, its parts; its tensors per layer, per part, per parameter.
  std::vector<std::pair<std::string, std::vector<TensorDecl>>> files;
  if (sharded()) {
    metadata.emplace_back("lohan_rank", std::to_string(contents_.rank()));
    metadata.emplace_back("lohan_world_size",
                          std::to_string(contents_.world_size()));
    std::vector<TensorDecl> declared;
    for (uint32_t l = 0; l < static_cast<uint32_t>(contents_.layers_size());
         ++l) {
      for (const std::string& part : contents_.parts()) {
        declared.push_back({absl::StrCat("layer.", l, "/", part),
                            {static_cast<int64_t>(ElementsOf(l))}});
      }
    }
    files.emplace_back(ShardFileName(contents_.rank(), contents_.world_size()),
                       std::move(declared));
  } else {
    std::vector<TensorDecl> weights, moments;
    for (const v1::CheckpointLayer& layer : contents_.layers()) {
      for (const std::string& part : contents_.parts()) {
        for (const v1::CheckpointTensor& tensor : layer.tensors()) {
          (part == "weights" ? weights : moments)
              .push_back({Prefix(part) + tensor.name(),
                          {tensor.shape().begin(), tensor.shape().end()}});
        }
      }
    }
    files.emplace_back(kWeightsFile, std::move(weights));
    if (contents_.parts_size() > 1) {
      files.emplace_back(kOptimizerFile, std::move(moments));
    }
  }
  for (auto& [name, declared] : files) {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> file =
        SafetensorsWriter::Create((staging / name).string(),
                                  std::move(declared), metadata);
    if (!file.ok()) return file.status();
    file_names_.push_back(name);
    files_.push_back(*std::move(file));
  }
  return absl::OkStatus();
}

uint64_t CheckpointWriter::ElementsOf(uint32_t index) const {
  return ShardElements(contents_.layers(index).elements(),
                       contents_.world_size());
}

absl::Status CheckpointWriter::Write(uint32_t layer, const std::string& part,
                                     const float* data, uint64_t elements) {
  if (next_layer_ >= static_cast<uint32_t>(contents_.layers_size()) ||
      layer != next_layer_ || part != contents_.parts(next_part_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: layer ", layer, " (", part,
        ") written out of order: the save expects ",
        next_layer_ < static_cast<uint32_t>(contents_.layers_size())
            ? absl::StrCat("layer ", next_layer_, " (",
                           contents_.parts(next_part_), ")")
            : std::string("no more layers")));
  }
  if (elements != ElementsOf(layer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: layer ", layer, " (", part, ") given ", elements,
        " elements, the save takes ", ElementsOf(layer)));
  }
  if (sharded()) {
    SaveStep();
    absl::Status written = files_[0]->Write(
        absl::StrCat("layer.", layer, "/", part), data, elements);
    if (!written.ok()) return written;
  } else {
    SafetensorsWriter& file = *files_[part == "weights" ? 0 : 1];
    for (const v1::CheckpointTensor& tensor :
         contents_.layers(layer).tensors()) {
      SaveStep();
      const std::vector<int64_t> shape(tensor.shape().begin(),
                                       tensor.shape().end());
      absl::Status written =
          file.Write(Prefix(part) + tensor.name(), data + tensor.offset(),
                     Elements(shape));
      if (!written.ok()) return written;
    }
  }
  if (++next_part_ == contents_.parts_size()) {
    next_part_ = 0;
    ++next_layer_;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FileEntry>> CheckpointWriter::Close() {
  if (next_layer_ != static_cast<uint32_t>(contents_.layers_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: the save was closed after ", next_layer_,
                     " of ", contents_.layers_size(), " layers"));
  }
  std::vector<FileEntry> entries;
  for (size_t i = 0; i < files_.size(); ++i) {
    SaveStep();
    absl::StatusOr<FileDigest> digest = files_[i]->Close();
    if (!digest.ok()) return digest.status();
    entries.emplace_back(file_names_[i], *digest);
  }
  return entries;
}

absl::StatusOr<std::string> ComposeMeta(const std::string& meta_json,
                                        const v1::CheckpointContents& contents,
                                        const std::string& save_id,
                                        const std::vector<FileEntry>& files) {
  absl::StatusOr<JsonValue> meta =
      JsonValue::Parse(meta_json.empty() ? "{}" : meta_json, "the save's meta");
  if (!meta.ok()) return meta.status();
  if (!meta->is_object()) {
    return absl::InvalidArgumentError(
        "checkpoint: the save's meta must be a JSON object");
  }
  // What the contents say already, so no plugin composes it again: the
  // job, its step and each layer's parameters by name (a list per layer).
  std::vector<JsonValue> layers;
  for (const v1::CheckpointLayer& layer : contents.layers()) {
    std::vector<JsonValue> names;
    for (const v1::CheckpointTensor& tensor : layer.tensors()) {
      names.push_back(JsonValue::String(tensor.name()));
    }
    layers.push_back(JsonValue::Array(std::move(names)));
  }
  std::vector<std::pair<std::string, JsonValue>> described = {
      {"job_name", JsonValue::String(contents.job_name())},
      {"iteration", JsonValue::Number(contents.iteration())},
      {"layers", JsonValue::Array(std::move(layers))}};
  std::vector<JsonValue> moments;
  for (int p = 1; p < contents.parts_size(); ++p) {
    moments.push_back(JsonValue::String(contents.parts(p)));
  }
  std::vector<std::pair<std::string, JsonValue>> listed;
  for (const auto& [name, digest] : files) {
    listed.emplace_back(
        name, JsonValue::Object({{"bytes", JsonValue::Number(digest.bytes)},
                                 {"crc32", JsonValue::Number(digest.crc32)}}));
  }
  std::vector<std::pair<std::string, JsonValue>> added = {
      {"optimizer_state", JsonValue::Array(std::move(moments))},
      {"save_id", JsonValue::String(save_id)},
      {"files", JsonValue::Object(std::move(listed))}};
  if (contents.world_size() > 1)
    added.emplace_back("sharding", ShardingPlan(contents));
  auto& members = meta->mutable_members();
  const auto drop = [&](const std::string& key) {
    std::erase_if(members, [&](const auto& m) { return m.first == key; });
  };
  for (auto& [key, value] : added) {
    drop(key);
    members.emplace_back(key, std::move(value));
  }
  for (auto& [key, value] : described) drop(key);
  members.insert(members.begin(), std::make_move_iterator(described.begin()),
                 std::make_move_iterator(described.end()));
  return meta->Dump() + "\n";
}

}  // namespace lohan::checkpoint
