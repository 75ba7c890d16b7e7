#ifndef LOHAN_CLIENT_CHECKPOINT_MANIFEST_H_
#define LOHAN_CLIENT_CHECKPOINT_MANIFEST_H_

// A checkpoint directory's files and the manifest in its lohan.json that
// makes them one checkpoint (the format is described in README.md).

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/json_value.h"

namespace lohan::checkpoint {

inline constexpr char kWeightsFile[] = "model.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kMetaFile[] = "lohan.json";
// Each safetensors file's metadata key for the save it belongs to.
inline constexpr char kSaveIdKey[] = "lohan_save_id";

// Rank r of W's file of a sharded checkpoint: shard-<r>-of-<W>.safetensors,
// five digits each.
std::string ShardFileName(uint32_t rank, uint32_t world);
// Whether a directory entry is one a save writes (either format's, or a
// partial file): a save replaces these and keeps everything else.
bool IsLohanFile(const std::string& name);

absl::StatusOr<std::string> ReadText(const std::filesystem::path& path);
// lohan.json of `directory`, parsed; INVALID_ARGUMENT unless an object.
absl::StatusOr<JsonValue> ReadMeta(const std::filesystem::path& directory);

// DATA_LOSS unless every file lohan.json's manifest (`meta`) lists is there,
// of its size and from the same save (with `crc`, also of its CRC-32: a read
// of every byte), saying which file is missing, torn, mixed or damaged. A
// checkpoint written before manifests existed (no save_id) passes.
absl::Status CheckManifest(const std::filesystem::path& directory,
                           const JsonValue& meta, bool crc);

// NOT_FOUND: `what` (a file of `directory`) does not exist; where an
// interrupted two-rename switch set the previous checkpoint aside, says
// where it is and how to put it back; else that this is no lohan checkpoint
// (with `hugging_face`, nor a Hugging Face checkpoint directory, saying
// which files one holds).
absl::Status MissingCheckpoint(const std::filesystem::path& directory,
                               const std::filesystem::path& what,
                               bool hugging_face);

// Reads every file of the checkpoint in `directory` against its manifest
// (sizes, save id, CRC-32).
absl::Status VerifyCheckpoint(const std::string& directory);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_MANIFEST_H_
