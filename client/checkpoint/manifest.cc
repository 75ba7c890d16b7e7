#include "client/checkpoint/manifest.h"

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/checkpoint/safetensors.h"

namespace lohan::checkpoint {
namespace fs = std::filesystem;
namespace {

absl::Status Problem(const fs::path& directory, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat("checkpoint ", directory.string(), what));
}

// One manifest entry: the file, its size, its save id and, with `crc`, its
// CRC-32.
absl::Status CheckFile(const fs::path& directory, const std::string& name,
                       const JsonValue& entry, const std::string& save_id,
                       bool crc) {
  const fs::path file = directory / name;
  std::error_code missing;
  const uint64_t size = fs::file_size(file, missing);
  if (missing) {
    return Problem(directory,
                   absl::StrCat(" is incomplete: ", kMetaFile, " lists ", name,
                                ", which is missing"));
  }
  const JsonValue* bytes = entry.Find("bytes");
  const JsonValue* crc32 = entry.Find("crc32");
  if (bytes == nullptr || crc32 == nullptr) {
    return Problem(directory, absl::StrCat(": ", kMetaFile, "'s entry for ",
                                           name, " lacks bytes or crc32"));
  }
  const std::string where = directory.string() + "/" + kMetaFile;
  absl::StatusOr<uint64_t> listed = bytes->AsUint64(where);
  if (!listed.ok()) return listed.status();
  if (size != *listed) {
    return Problem(directory,
                   absl::StrCat(" is torn: ", name, " has ", size, " bytes, ",
                                kMetaFile, " says ", *listed));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
      SafetensorsFile::Open(file.string());
  std::string found = "(none)";
  if (opened.ok()) {
    const auto id = (*opened)->metadata().find(kSaveIdKey);
    if (id != (*opened)->metadata().end()) found = id->second;
  }
  if (found != save_id) {
    return Problem(directory,
                   absl::StrCat(" is mixed: ", name, " comes from save ", found,
                                ", ", kMetaFile, " from save ", save_id,
                                "; it was assembled from two saves, load "
                                "neither part without the other"));
  }
  if (!crc) return absl::OkStatus();
  absl::StatusOr<uint64_t> want = crc32->AsUint64(where);
  if (!want.ok()) return want.status();
  absl::StatusOr<FileDigest> digest = DigestFile(file.string());
  if (!digest.ok()) return digest.status();
  if (digest->crc32 != *want) {
    return Problem(directory,
                   absl::StrFormat(": %s is damaged (CRC-32 %08x, %s says "
                                   "%08x)",
                                   name, digest->crc32, kMetaFile, *want));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShardFileName(uint32_t rank, uint32_t world) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", rank, world);
}

bool IsLohanFile(const std::string& name) {
  static const std::regex shard(R"(shard-\d{5}-of-\d{5}\.safetensors)");
  return name == kWeightsFile || name == kOptimizerFile || name == kMetaFile ||
         std::regex_match(name, shard) ||
         (name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0);
}

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint: cannot read ", path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<JsonValue> ReadMeta(const fs::path& directory) {
  const fs::path file = directory / kMetaFile;
  absl::StatusOr<std::string> text = ReadText(file);
  if (!text.ok()) return text.status();
  absl::StatusOr<JsonValue> meta = JsonValue::Parse(*text, file.string());
  if (meta.ok() && !meta->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: ", file.string(), " is not a JSON object"));
  }
  return meta;
}

absl::Status CheckManifest(const fs::path& directory, const JsonValue& meta,
                           bool crc) {
  const JsonValue* save_id = meta.Find("save_id");
  if (save_id == nullptr) return absl::OkStatus();  // before manifests
  const JsonValue* files = meta.Find("files");
  if (files == nullptr) return absl::OkStatus();
  for (const auto& [name, entry] : files->members()) {
    if (absl::Status checked =
            CheckFile(directory, name, entry, save_id->text(), crc);
        !checked.ok()) {
      return checked;
    }
  }
  return absl::OkStatus();
}

absl::Status MissingCheckpoint(const fs::path& directory, const fs::path& what,
                               bool hugging_face) {
  const std::string old_prefix =
      "." + directory.filename().string() + ".lohan-old-";
  std::error_code ignored;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(directory.parent_path(), ignored)) {
    if (entry.path().filename().string().rfind(old_prefix, 0) == 0) {
      return absl::NotFoundError(absl::StrCat(
          what.string(), " does not exist: a save into ", directory.string(),
          " was interrupted between its two renames; the previous "
          "checkpoint is whole in ",
          entry.path().string(), " (rename it to ",
          directory.filename().string(), ")"));
    }
  }
  return absl::NotFoundError(absl::StrCat(
      what.string(),
      " does not exist: not a lohan checkpoint (engine.save(dir) writes one)",
      hugging_face ? " nor a Hugging Face checkpoint directory (which holds "
                     "model.safetensors or model.safetensors.index.json)"
                   : ""));
}

absl::Status VerifyCheckpoint(const std::string& directory) {
  const fs::path path(directory);
  if (!fs::exists(path / kMetaFile)) {
    return MissingCheckpoint(path, path / kMetaFile, /*hugging_face=*/false);
  }
  absl::StatusOr<JsonValue> meta = ReadMeta(path);
  if (!meta.ok()) return meta.status();
  return CheckManifest(path, *meta, /*crc=*/true);
}

}  // namespace lohan::checkpoint
