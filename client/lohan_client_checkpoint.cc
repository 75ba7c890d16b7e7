// The C ABI of checkpoints (include/lohan/lohan_checkpoint.h): only
// translation into client/checkpoint and, for a layer read from the job,
// the model's channel.
#include <algorithm>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/c_abi_handles.h"
#include "client/checkpoint/checkpoint_reader.h"
#include "client/checkpoint/checkpoint_restore.h"
#include "client/checkpoint/checkpoint_save.h"
#include "client/checkpoint/json_value.h"
#include "client/checkpoint/manifest.h"
#include "client/include/lohan/lohan_checkpoint.h"
#include "client/proto_json.h"
#include "proto/checkpoint.pb.h"
#include "wire/ring_entry.h"

struct lohan_checkpoint {
  std::unique_ptr<lohan::checkpoint::CheckpointReader> reader;
};

struct lohan_checkpoint_save {
  std::unique_ptr<lohan::checkpoint::CheckpointSave> save;
  std::string staging;
};

namespace {

using lohan::c_abi::CopyOut;
using lohan::c_abi::InvalidArgument;
using lohan::c_abi::Report;
using lohan::checkpoint::CheckpointSave;
using lohan::checkpoint::FileEntry;
using lohan::checkpoint::JsonValue;

int ReturnSave(std::unique_ptr<CheckpointSave> save,
               lohan_checkpoint_save** out) {
  std::string staging = save->staging().string();
  *out = new (std::nothrow) lohan_checkpoint_save{std::move(save), staging};
  if (*out == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  return Report(absl::OkStatus());
}

absl::StatusOr<std::vector<FileEntry>> FilesFromJson(const char* json) {
  std::vector<FileEntry> files;
  if (json == nullptr) return files;
  absl::StatusOr<JsonValue> value = JsonValue::Parse(json, "files_json");
  if (!value.ok()) return value.status();
  if (!value->is_object() || value->members().empty()) {
    return absl::InvalidArgumentError(
        "files_json must be a JSON object of the save's files");
  }
  for (const auto& [name, entry] : value->members()) {
    const JsonValue* bytes = entry.Find("bytes");
    const JsonValue* crc = entry.Find("crc32");
    if (bytes == nullptr || crc == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("files_json: ", name, " lacks bytes or crc32"));
    }
    absl::StatusOr<uint64_t> size = bytes->AsUint64("files_json " + name);
    absl::StatusOr<uint64_t> sum = crc->AsUint64("files_json " + name);
    if (!size.ok()) return size.status();
    if (!sum.ok()) return sum.status();
    files.emplace_back(name, lohan::checkpoint::FileDigest{
                                 *size, static_cast<uint32_t>(*sum)});
  }
  return files;
}

std::string FilesToJson(const std::vector<FileEntry>& files) {
  std::vector<std::pair<std::string, JsonValue>> members;
  for (const auto& [name, digest] : files) {
    members.emplace_back(
        name, JsonValue::Object({{"bytes", JsonValue::Number(digest.bytes)},
                                 {"crc32", JsonValue::Number(digest.crc32)}}));
  }
  return JsonValue::Object(std::move(members)).Dump();
}

// A moment's ring part by its checkpoint name; nullopt for "weights".
absl::StatusOr<std::optional<lohan::RingStatePart>> StatePartOf(
    const std::string& part) {
  if (part == "weights") return std::nullopt;
  if (part == "exp_avg") return lohan::RingStatePart::kExpAvg;
  if (part == "exp_avg_sq") return lohan::RingStatePart::kExpAvgSq;
  if (part == "max_exp_avg_sq") return lohan::RingStatePart::kMaxExpAvgSq;
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint: unknown part \"", part,
                   "\" (weights, exp_avg, exp_avg_sq, max_exp_avg_sq)"));
}

// INIT_WEIGHTS / INIT_STATE of `part` from the staging buffer, or with
// `read` READ_WEIGHTS / READ_STATE into it.
absl::Status MovePart(lohan::ModelChannel& channel, uint32_t layer,
                      const std::string& part, bool read) {
  absl::StatusOr<std::optional<lohan::RingStatePart>> state = StatePartOf(part);
  if (!state.ok()) return state.status();
  if (!state->has_value()) {
    return read ? channel.ReadWeights(layer) : channel.InitWeights(layer);
  }
  return read ? channel.ReadState(layer, **state)
              : channel.InitState(layer, **state);
}

absl::Status Restore(const lohan::checkpoint::CheckpointReader& reader,
                     lohan::ModelChannel& channel,
                     const lohan::v1::CheckpointRestore& request) {
  const uint32_t world = std::max<uint32_t>(request.world_size(), 1);
  if (world > 1 && request.rank() >= world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: rank ", request.rank(), " of world size ", world));
  }
  const uint64_t elements =
      lohan::checkpoint::ShardElements(request.layer().elements(), world);
  if (4 * elements > channel.staging_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: layer ", request.index(), "'s ", elements,
        " elements exceed the job's staging buffer of ",
        channel.staging_bytes(), " bytes (another model's layer?)"));
  }
  for (const std::string& part : request.parts()) {
    if (absl::Status staged = lohan::checkpoint::StageLayer(
            reader, request.layer(), part, request.rank(), world,
            channel.staging(), elements);
        !staged.ok()) {
      return staged;
    }
    if (absl::Status initialized =
            MovePart(channel, request.index(), part, /*read=*/false);
        !initialized.ok()) {
      return initialized;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int lohan_checkpoint_open(const char* path, uint32_t flags,
                          lohan_checkpoint** out) {
  if (path == nullptr || out == nullptr) {
    return InvalidArgument("path and out must not be NULL");
  }
  absl::StatusOr<std::unique_ptr<lohan::checkpoint::CheckpointReader>> reader =
      lohan::checkpoint::CheckpointReader::Open(
          path, (flags & LOHAN_CHECKPOINT_VERIFY) != 0);
  if (!reader.ok()) return Report(reader.status());
  *out = new (std::nothrow) lohan_checkpoint{*std::move(reader)};
  if (*out == nullptr) {
    return Report(absl::ResourceExhaustedError("out of memory"));
  }
  return Report(absl::OkStatus());
}

void lohan_checkpoint_destroy(lohan_checkpoint* checkpoint) {
  delete checkpoint;
}

const char* lohan_checkpoint_meta_json(const lohan_checkpoint* checkpoint) {
  return checkpoint == nullptr ? "" : checkpoint->reader->meta_json().c_str();
}

uint64_t lohan_checkpoint_iteration(const lohan_checkpoint* checkpoint) {
  return checkpoint == nullptr ? 0 : checkpoint->reader->iteration();
}

int lohan_checkpoint_has_part(const lohan_checkpoint* checkpoint,
                              const char* part) {
  if (checkpoint == nullptr || part == nullptr) return 0;
  for (const std::string& moment : checkpoint->reader->moments()) {
    if (moment == part) return 1;
  }
  return 0;
}

int lohan_checkpoint_parameters_json(const lohan_checkpoint* checkpoint,
                                     char** json_out) {
  if (checkpoint == nullptr || json_out == nullptr) {
    return InvalidArgument("checkpoint and json_out must not be NULL");
  }
  std::vector<JsonValue> items;
  for (const auto& [name, shape] : checkpoint->reader->Parameters()) {
    std::vector<JsonValue> dims;
    for (int64_t size : shape) {
      dims.push_back(JsonValue::Number(static_cast<uint64_t>(size)));
    }
    items.push_back(JsonValue::Object(
        {{"name", JsonValue::String(name)},
         {"shape", JsonValue::Array(std::move(dims))},
         {"dtype",
          JsonValue::String(checkpoint->reader->Dtype(name, "weights"))}}));
  }
  return CopyOut(JsonValue::Array(std::move(items)).Dump(), json_out);
}

int lohan_checkpoint_shape(const lohan_checkpoint* checkpoint, const char* name,
                           const char* part, int64_t* dims, size_t capacity,
                           size_t* ndims_out) {
  if (checkpoint == nullptr || name == nullptr || part == nullptr ||
      ndims_out == nullptr || (dims == nullptr && capacity > 0)) {
    return InvalidArgument(
        "checkpoint, name, part and ndims_out must not be "
        "NULL (dims only with capacity 0)");
  }
  const std::vector<int64_t>* shape = checkpoint->reader->Shape(name, part);
  if (shape == nullptr) {
    return Report(absl::NotFoundError(
        absl::StrCat("checkpoint ", checkpoint->reader->path(), ": no ", part,
                     " for parameter ", name)));
  }
  *ndims_out = shape->size();
  if (shape->size() > capacity) {
    return Report(absl::OutOfRangeError(absl::StrCat(
        name, " has ", shape->size(), " dimensions, room for ", capacity)));
  }
  for (size_t d = 0; d < shape->size(); ++d) dims[d] = (*shape)[d];
  return Report(absl::OkStatus());
}

int lohan_checkpoint_read(const lohan_checkpoint* checkpoint, const char* name,
                          const char* part, float* out, uint64_t elements) {
  if (checkpoint == nullptr || name == nullptr || part == nullptr ||
      (out == nullptr && elements > 0)) {
    return InvalidArgument("checkpoint, name, part and out must not be NULL");
  }
  return Report(checkpoint->reader->Read(name, part, out, elements));
}

int lohan_checkpoint_restore_layer(const lohan_checkpoint* checkpoint,
                                   lohan_model* model,
                                   const char* request_json) {
  if (checkpoint == nullptr || model == nullptr || request_json == nullptr) {
    return InvalidArgument(
        "checkpoint, model and request_json must not be NULL");
  }
  lohan::v1::CheckpointRestore request;
  if (absl::Status parsed =
          lohan::FromJson(request_json, "CheckpointRestore", &request);
      !parsed.ok()) {
    return Report(parsed);
  }
  return Report(Restore(*checkpoint->reader, *model->channel, request));
}

int lohan_checkpoint_verify(const char* directory) {
  if (directory == nullptr) return InvalidArgument("directory is NULL");
  return Report(lohan::checkpoint::VerifyCheckpoint(directory));
}

int lohan_checkpoint_save_begin(const char* directory,
                                lohan_checkpoint_save** out) {
  if (directory == nullptr || out == nullptr) {
    return InvalidArgument("directory and out must not be NULL");
  }
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save =
      CheckpointSave::Begin(directory);
  if (!save.ok()) return Report(save.status());
  return ReturnSave(*std::move(save), out);
}

int lohan_checkpoint_save_join(const char* staging, const char* save_id,
                               lohan_checkpoint_save** out) {
  if (staging == nullptr || save_id == nullptr || out == nullptr) {
    return InvalidArgument("staging, save_id and out must not be NULL");
  }
  return ReturnSave(CheckpointSave::Join(staging, save_id), out);
}

void lohan_checkpoint_save_destroy(lohan_checkpoint_save* save) { delete save; }

const char* lohan_checkpoint_save_staging(const lohan_checkpoint_save* save) {
  return save == nullptr ? "" : save->staging.c_str();
}

const char* lohan_checkpoint_save_id(const lohan_checkpoint_save* save) {
  return save == nullptr ? "" : save->save->save_id().c_str();
}

int lohan_checkpoint_save_open(lohan_checkpoint_save* save,
                               const char* contents_json) {
  if (save == nullptr || contents_json == nullptr) {
    return InvalidArgument("save and contents_json must not be NULL");
  }
  lohan::v1::CheckpointContents contents;
  if (absl::Status parsed =
          lohan::FromJson(contents_json, "CheckpointContents", &contents);
      !parsed.ok()) {
    return Report(parsed);
  }
  return Report(save->save->Open(contents));
}

uint64_t lohan_checkpoint_save_layer_elements(const lohan_checkpoint_save* save,
                                              uint32_t layer) {
  if (save == nullptr || save->save->writer() == nullptr ||
      layer >= static_cast<uint32_t>(
                   save->save->writer()->contents().layers_size())) {
    return 0;
  }
  return save->save->writer()->ElementsOf(layer);
}

int lohan_checkpoint_save_write(lohan_checkpoint_save* save, uint32_t layer,
                                const char* part, const float* data,
                                uint64_t elements) {
  if (save == nullptr || part == nullptr || data == nullptr) {
    return InvalidArgument("save, part and data must not be NULL");
  }
  if (save->save->writer() == nullptr) {
    return Report(absl::FailedPreconditionError(
        "checkpoint: open the save with its contents first"));
  }
  return Report(save->save->writer()->Write(layer, part, data, elements));
}

int lohan_checkpoint_save_layer(lohan_checkpoint_save* save, lohan_model* model,
                                uint32_t layer) {
  if (save == nullptr || model == nullptr) {
    return InvalidArgument("save and model must not be NULL");
  }
  lohan::checkpoint::CheckpointWriter* writer = save->save->writer();
  if (writer == nullptr) {
    return Report(absl::FailedPreconditionError(
        "checkpoint: open the save with its contents first"));
  }
  if (layer >= static_cast<uint32_t>(writer->contents().layers_size())) {
    return Report(
        absl::OutOfRangeError(absl::StrCat("checkpoint: layer ", layer, " of ",
                                           writer->contents().layers_size())));
  }
  lohan::ModelChannel& channel = *model->channel;
  const uint64_t elements = writer->ElementsOf(layer);
  if (4 * elements > channel.staging_bytes()) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: layer ", layer, "'s ", elements,
        " elements exceed the job's staging buffer of ",
        channel.staging_bytes(), " bytes (contents of another model?)")));
  }
  for (const std::string& part : writer->contents().parts()) {
    if (absl::Status read = MovePart(channel, layer, part, /*read=*/true);
        !read.ok()) {
      return Report(read);
    }
    if (absl::Status written =
            writer->Write(layer, part, channel.staging(), elements);
        !written.ok()) {
      return Report(written);
    }
  }
  return Report(absl::OkStatus());
}

int lohan_checkpoint_save_close_files(lohan_checkpoint_save* save,
                                      char** files_json_out) {
  if (save == nullptr || files_json_out == nullptr) {
    return InvalidArgument("save and files_json_out must not be NULL");
  }
  absl::StatusOr<std::vector<FileEntry>> files = save->save->CloseFiles();
  if (!files.ok()) return Report(files.status());
  return CopyOut(FilesToJson(*files), files_json_out);
}

int lohan_checkpoint_save_commit(lohan_checkpoint_save* save,
                                 const char* meta_json,
                                 const char* files_json) {
  if (save == nullptr || meta_json == nullptr) {
    return InvalidArgument("save and meta_json must not be NULL");
  }
  absl::StatusOr<std::vector<FileEntry>> files = FilesFromJson(files_json);
  if (!files.ok()) return Report(files.status());
  return Report(save->save->Commit(meta_json, *std::move(files)));
}
