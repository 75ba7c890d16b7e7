#include "plugins/libtorch/checkpoint.h"

#include <stdexcept>

#include "plugins/libtorch/handles.h"
#include "plugins/libtorch/lohan_error.h"
#include "plugins/libtorch/model_spec_json.h"

namespace lohan::torch_plugin {
namespace {

std::string NumbersJson(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i > 0 ? "," : "") + std::to_string(values[i]);
  }
  return out + "]";
}

// A CheckpointLayer (proto/checkpoint.proto) in protobuf JSON.
std::string LayerJson(const CheckpointLayer& layer) {
  std::string out =
      "{\"elements\":" + std::to_string(layer.elements) + ",\"tensors\":[";
  for (size_t i = 0; i < layer.names.size(); ++i) {
    out += std::string(i > 0 ? "," : "") +
           "{\"name\":" + JsonQuoted(layer.names[i]) +
           ",\"shape\":" + NumbersJson(layer.shapes[i]) +
           ",\"offset\":" + std::to_string(layer.offsets[i]) + "}";
  }
  return out + "]}";
}

// A CheckpointContents (proto/checkpoint.proto) in protobuf JSON.
std::string ContentsJson(const std::vector<CheckpointLayer>& layers,
                         const std::vector<std::string>& parts,
                         const std::string& job_name, uint64_t iteration) {
  std::string out = "{\"job_name\":" + JsonQuoted(job_name) +
                    ",\"iteration\":" + std::to_string(iteration) +
                    ",\"parts\":[";
  for (size_t p = 0; p < parts.size(); ++p) {
    out += (p > 0 ? "," : "") + JsonQuoted(parts[p]);
  }
  out += "],\"layers\":[";
  for (size_t l = 0; l < layers.size(); ++l) {
    out += (l > 0 ? "," : "") + LayerJson(layers[l]);
  }
  return out + "]}";
}

// What a failed checkpoint read says, as std::invalid_argument.
[[noreturn]] void ThrowRefusal() {
  throw std::invalid_argument(lohan_last_error());
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& directory) {
  lohan_checkpoint* opened = nullptr;
  if (lohan_checkpoint_open(directory.c_str(), LOHAN_CHECKPOINT_VERIFY,
                            &opened) != LOHAN_OK) {
    ThrowRefusal();
  }
  handle_.reset(opened);
  iteration_ = lohan_checkpoint_iteration(opened);
  for (const char* part : {"exp_avg", "exp_avg_sq"}) {
    if (lohan_checkpoint_has_part(opened, part)) moments_.push_back(part);
  }
}

void CheckpointReader::Read(const std::string& name, const std::string& part,
                            const std::vector<int64_t>& shape,
                            float* out) const {
  uint64_t elements = 1;
  for (int64_t size : shape) elements *= static_cast<uint64_t>(size);
  if (lohan_checkpoint_read(handle_.get(), name.c_str(), part.c_str(), out,
                            elements) != LOHAN_OK) {
    ThrowRefusal();
  }
}

void CheckpointReader::Restore(lohan_model* model, const CheckpointLayer& layer,
                               uint32_t index,
                               const std::vector<std::string>& parts) const {
  std::string request = "{\"layer\":" + LayerJson(layer) +
                        ",\"index\":" + std::to_string(index) + ",\"parts\":[";
  for (size_t p = 0; p < parts.size(); ++p) {
    request += (p > 0 ? "," : "") + JsonQuoted(parts[p]);
  }
  request += "]}";
  const int status =
      lohan_checkpoint_restore_layer(handle_.get(), model, request.c_str());
  if (status == LOHAN_NOT_FOUND || status == LOHAN_INVALID_ARGUMENT) {
    ThrowRefusal();
  }
  ThrowIfFailed(status);
}

void WriteCheckpoint(const std::string& directory, lohan_model* model,
                     const std::vector<CheckpointLayer>& layers,
                     const std::vector<std::string>& parts,
                     const std::string& job_name, uint64_t iteration,
                     const std::string& meta_json) {
  lohan_checkpoint_save* begun = nullptr;
  ThrowIfFailed(lohan_checkpoint_save_begin(directory.c_str(), &begun));
  const std::unique_ptr<lohan_checkpoint_save, void (*)(lohan_checkpoint_save*)>
      save(begun, lohan_checkpoint_save_destroy);
  ThrowIfFailed(lohan_checkpoint_save_open(
      save.get(), ContentsJson(layers, parts, job_name, iteration).c_str()));
  for (uint32_t l = 0; l < layers.size(); ++l) {
    ThrowIfFailed(lohan_checkpoint_save_layer(save.get(), model, l));
  }
  char* files = nullptr;
  ThrowIfFailed(lohan_checkpoint_save_close_files(save.get(), &files));
  lohan_string_free(files);
  ThrowIfFailed(
      lohan_checkpoint_save_commit(save.get(), meta_json.c_str(), nullptr));
}

}  // namespace lohan::torch_plugin
