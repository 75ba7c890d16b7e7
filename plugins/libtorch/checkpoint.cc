#include "plugins/libtorch/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "plugins/libtorch/checkpoint_directory.h"
#include "plugins/libtorch/json_value.h"

namespace lohan::torch_plugin {
namespace fs = std::filesystem;
namespace {

constexpr char kSaveIdKey[] = "lohan_save_id";

std::string NewSaveId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char word[9];
    std::snprintf(word, sizeof(word), "%08x", static_cast<unsigned>(random()));
    id += word;
  }
  return id;
}

std::string Number(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  std::string out = text;
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

// lohan.json as the Python plugin writes it (json.dumps(indent=1)).
std::string MetaJson(
    const CheckpointMeta& meta, const std::vector<CheckpointLayer>& layers,
    const std::vector<std::string>& moments, const std::string& save_id,
    const std::vector<std::pair<std::string, FileDigest>>& files) {
  std::ostringstream out;
  out << "{\n \"job_name\": " << JsonQuoted(meta.job_name)
      << ",\n \"job_id\": " << JsonQuoted(meta.job_id)
      << ",\n \"iteration\": " << meta.iteration
      << ",\n \"dtype\": " << JsonQuoted(meta.dtype) << ",\n \"layers\": [";
  for (size_t i = 0; i < layers.size(); ++i) {
    out << (i > 0 ? "," : "") << "\n  [";
    for (size_t j = 0; j < layers[i].names.size(); ++j) {
      out << (j > 0 ? "," : "") << "\n   " << JsonQuoted(layers[i].names[j]);
    }
    out << "\n  ]";
  }
  out << "\n ],\n \"adam\": {\n  \"lr\": " << Number(meta.lr)
      << ",\n  \"amsgrad\": false\n },\n \"loss_scaling\": {\n  \"scale\": "
         "1.0,\n  \"good_steps\": 0,\n  \"dynamic\": false\n },\n"
         " \"optimizer_state\": [";
  for (size_t i = 0; i < moments.size(); ++i) {
    out << (i > 0 ? "," : "") << "\n  " << JsonQuoted(moments[i]);
  }
  out << (moments.empty() ? "]" : "\n ]")
      << ",\n \"save_id\": " << JsonQuoted(save_id) << ",\n \"files\": {";
  for (size_t i = 0; i < files.size(); ++i) {
    out << (i > 0 ? "," : "") << "\n  " << JsonQuoted(files[i].first)
        << ": {\n   \"bytes\": " << files[i].second.bytes
        << ",\n   \"crc32\": " << files[i].second.crc32 << "\n  }";
  }
  out << "\n }\n}\n";
  return out.str();
}

void WriteFiles(const fs::path& path,
                const std::vector<CheckpointLayer>& layers,
                const ReadLayer& read_layer,
                const std::vector<std::string>& parts,
                const CheckpointMeta& meta, const std::string& save_id) {
  const std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"},
      {"lohan_job", meta.job_name},
      {"lohan_iteration", std::to_string(meta.iteration)},
      {kSaveIdKey, save_id}};
  const std::vector<std::string> moments(parts.begin() + 1, parts.end());
  std::vector<std::pair<std::string, std::vector<std::string>>> files = {
      {kWeightsFile, {"weights"}}};
  if (!moments.empty()) files.emplace_back(kOptimizerFile, moments);
  std::vector<std::pair<std::string, FileDigest>> manifest;
  for (const auto& [file_name, file_parts] : files) {
    // Per layer, every part of it: the order the data is read in.
    std::vector<TensorDecl> declared;
    for (const CheckpointLayer& layer : layers) {
      for (const std::string& part : file_parts) {
        const std::string prefix = part == "weights" ? "" : part + "/";
        for (size_t i = 0; i < layer.names.size(); ++i) {
          declared.push_back({prefix + layer.names[i], layer.shapes[i]});
        }
      }
    }
    SafetensorsWriter writer((path / file_name).string(), std::move(declared),
                             metadata);
    for (size_t l = 0; l < layers.size(); ++l) {
      const CheckpointLayer& layer = layers[l];
      for (const std::string& part : file_parts) {
        const std::string prefix = part == "weights" ? "" : part + "/";
        const float* flat = read_layer(l, part);
        for (size_t i = 0; i < layer.names.size(); ++i) {
          writer.Write(prefix + layer.names[i], flat + layer.offsets[i],
                       Elements(layer.shapes[i]));
        }
      }
    }
    manifest.emplace_back(file_name, writer.Close());
  }
  const std::string text = MetaJson(meta, layers, moments, save_id, manifest);
  std::FILE* out = std::fopen((path / kMetaFile).c_str(), "wb");
  if (out == nullptr ||
      std::fwrite(text.data(), 1, text.size(), out) != text.size() ||
      std::fflush(out) != 0 || ::fsync(fileno(out)) != 0) {
    if (out != nullptr) std::fclose(out);
    throw std::runtime_error("checkpoint: writing " +
                             (path / kMetaFile).string());
  }
  std::fclose(out);
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::invalid_argument Missing(const fs::path& directory, const fs::path& what) {
  const std::string old_prefix =
      "." + directory.filename().string() + ".lohan-old-";
  std::error_code ignored;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(directory.parent_path(), ignored)) {
    if (entry.path().filename().string().compare(0, old_prefix.size(),
                                                 old_prefix) == 0) {
      return std::invalid_argument("checkpoint: " + what.string() +
                                   " does not exist: a save into " +
                                   directory.string() +
                                   " was interrupted between its two renames; "
                                   "the previous checkpoint is whole in " +
                                   entry.path().string() + " (rename it to " +
                                   directory.filename().string() + ")");
    }
  }
  return std::invalid_argument("checkpoint: " + what.string() +
                               " does not exist: not a lohan checkpoint "
                               "(Engine::save(dir) writes one)");
}

// Every file the manifest lists: present, of its size and CRC-32, from the
// save lohan.json names.
void CheckManifest(const fs::path& path, const JsonValue& meta) {
  const JsonValue* save_id = meta.Find("save_id");
  const JsonValue* files = meta.Find("files");
  if (save_id == nullptr || files == nullptr) return;  // before manifests
  for (const auto& [name, entry] : files->members()) {
    const fs::path file = path / name;
    const std::string where = "checkpoint " + path.string();
    if (!fs::exists(file)) {
      throw std::invalid_argument(where + " is incomplete: lohan.json lists " +
                                  name + ", which is missing");
    }
    const JsonValue* bytes = entry.Find("bytes");
    const JsonValue* crc = entry.Find("crc32");
    if (bytes == nullptr || crc == nullptr) {
      throw std::invalid_argument(where + ": lohan.json's entry for " + name +
                                  " lacks bytes or crc32");
    }
    const uint64_t size = fs::file_size(file);
    if (size != bytes->AsUint64(where)) {
      throw std::invalid_argument(where + " is torn: " + name + " has " +
                                  std::to_string(size) +
                                  " bytes, lohan.json says " + bytes->text());
    }
    const auto found = SafetensorsFile(file.string()).metadata();
    const auto id = found.find(kSaveIdKey);
    if (id == found.end() || id->second != save_id->text()) {
      throw std::invalid_argument(
          where + " is mixed: " + name + " comes from save " +
          (id == found.end() ? "(none)" : id->second) + ", lohan.json from " +
          "save " + save_id->text() +
          "; it was assembled from two saves, "
          "load neither part without the other");
    }
    const FileDigest digest = DigestFile(file.string());
    if (digest.crc32 != crc->AsUint64(where)) {
      char text[80];
      std::snprintf(text, sizeof(text), "CRC-32 %08x, lohan.json says %08llx",
                    digest.crc32,
                    static_cast<unsigned long long>(crc->AsUint64(where)));
      throw std::invalid_argument(where + ": " + name + " is damaged (" + text +
                                  ")");
    }
  }
}

}  // namespace

void WriteCheckpoint(const std::string& directory,
                     const std::vector<CheckpointLayer>& layers,
                     const ReadLayer& read_layer,
                     const std::vector<std::string>& parts,
                     const CheckpointMeta& meta) {
  if (parts.empty() || parts.front() != "weights") {
    throw std::logic_error("WriteCheckpoint: parts must start with weights");
  }
  const fs::path final = fs::absolute(directory).lexically_normal();
  const std::string save_id = NewSaveId();
  const fs::path staging = MakeStagingDirectory(final, save_id);
  try {
    WriteFiles(staging, layers, read_layer, parts, meta, save_id);
    KeepForeignEntries(final, staging);
    SwitchIn(staging, final);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

CheckpointReader::CheckpointReader(const std::string& directory)
    : path_(directory) {
  const fs::path path(directory);
  const fs::path weights = path / kWeightsFile;
  const bool has_meta = fs::exists(path / kMetaFile);
  if (!has_meta && !fs::exists(weights)) throw Missing(path, weights);
  std::vector<std::string> listed;
  if (has_meta) {
    const JsonValue meta = JsonValue::Parse(ReadText(path / kMetaFile),
                                            (path / kMetaFile).string());
    if (!meta.is_object()) {
      throw std::invalid_argument("checkpoint: " + (path / kMetaFile).string() +
                                  " is not a JSON object");
    }
    CheckManifest(path, meta);
    if (const JsonValue* step = meta.Find("iteration")) {
      iteration_ = step->AsUint64((path / kMetaFile).string() + " iteration");
    }
    if (const JsonValue* parts = meta.Find("optimizer_state")) {
      for (const JsonValue& part : parts->items())
        listed.push_back(part.text());
    }
    if (const JsonValue* plan = meta.Find("sharding")) {
      sharded_ =
          std::make_unique<ShardedTensors>(path, *plan, meta.Find("files"));
      moments_ = std::move(listed);
      return;
    }
  }
  if (!fs::exists(weights)) throw Missing(path, weights);
  weights_ = std::make_unique<SafetensorsFile>(weights.string());
  if (fs::exists(path / kOptimizerFile)) {
    optimizer_ =
        std::make_unique<SafetensorsFile>((path / kOptimizerFile).string());
    moments_ = std::move(listed);
  }
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
  for (const auto& [name, entry] : weights_->entries()) {
    out.emplace_back(name, entry.shape);
  }
  return out;
}

void CheckpointReader::Read(const std::string& name, const std::string& part,
                            const std::vector<int64_t>& shape,
                            float* out) const {
  if (sharded_ != nullptr) {
    const std::vector<int64_t>* stored = sharded_->ShapeOf(name);
    const bool known =
        part == "weights" ||
        std::find(moments_.begin(), moments_.end(), part) != moments_.end();
    if (stored == nullptr || !known) {
      throw std::invalid_argument("checkpoint " + path_ + ": no " + part +
                                  " for parameter " + name +
                                  " (the checkpoint is of another model?)");
    }
    if (*stored != shape) {
      throw std::invalid_argument("checkpoint " + path_ + ": " + name + " (" +
                                  part + ") has shape " + ShapeText(*stored) +
                                  ", the model's " + ShapeText(shape));
    }
    sharded_->Read(name, part, out);
    return;
  }
  const bool weights = part == "weights";
  const SafetensorsFile* file = weights ? weights_.get() : optimizer_.get();
  const std::string key = weights ? name : part + "/" + name;
  const SafetensorsFile::Entry* entry =
      file == nullptr ? nullptr : file->Find(key);
  if (entry == nullptr) {
    throw std::invalid_argument("checkpoint " + path_ + ": no " + part +
                                " for parameter " + name +
                                " (the checkpoint is of another model?)");
  }
  if (entry->shape != shape) {
    throw std::invalid_argument(
        "checkpoint " + path_ + ": " + name + " (" + part + ") has shape " +
        ShapeText(entry->shape) + ", the model's " + ShapeText(shape));
  }
  file->Read(*entry, out);
}

}  // namespace lohan::torch_plugin
