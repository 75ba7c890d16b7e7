// The C ABI of the model cut (include/lohan/lohan_model_cut.h): only
// translation into CutModel.
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/c_abi_handles.h"
#include "client/include/lohan/lohan_model_cut.h"
#include "client/model_cut.h"
#include "client/proto_json.h"
#include "proto/model_cut.pb.h"

struct lohan_model_cut {
  lohan::v1::ModelCut cut;
  std::string json;
  std::string spec_json;
};

namespace {

using lohan::c_abi::InvalidArgument;
using lohan::c_abi::Report;

const lohan::v1::CutLayer* LayerOf(const lohan_model_cut* cut, uint32_t layer) {
  if (cut == nullptr ||
      layer >= static_cast<uint32_t>(cut->cut.layers_size())) {
    return nullptr;
  }
  return &cut->cut.layers(static_cast<int>(layer));
}

absl::StatusOr<std::unique_ptr<lohan_model_cut>> Cut(const char* json) {
  lohan::v1::ModelDescription description;
  absl::Status parsed = lohan::FromJson(json, "ModelDescription", &description);
  if (!parsed.ok()) return parsed;
  absl::StatusOr<lohan::v1::ModelCut> cut = lohan::CutModel(description);
  if (!cut.ok()) return cut.status();
  auto handle = std::make_unique<lohan_model_cut>();
  handle->cut = *std::move(cut);
  absl::StatusOr<std::string> text =
      lohan::ToJson(handle->cut, /*proto_names=*/true);
  if (!text.ok()) return text.status();
  handle->json = *std::move(text);
  text = lohan::ToJson(handle->cut.spec(), /*proto_names=*/true);
  if (!text.ok()) return text.status();
  handle->spec_json = *std::move(text);
  return handle;
}

}  // namespace

extern "C" {

int lohan_model_cut_create(const char* description_json,
                           lohan_model_cut** out) {
  if (description_json == nullptr || out == nullptr) {
    return InvalidArgument(
        "lohan_model_cut_create: description_json and out are required");
  }
  absl::StatusOr<std::unique_ptr<lohan_model_cut>> cut = Cut(description_json);
  if (!cut.ok()) return Report(cut.status());
  *out = cut->release();
  return Report(absl::OkStatus());
}

void lohan_model_cut_destroy(lohan_model_cut* cut) { delete cut; }

const char* lohan_model_cut_json(const lohan_model_cut* cut) {
  return cut == nullptr ? "" : cut->json.c_str();
}

const char* lohan_model_cut_spec_json(const lohan_model_cut* cut) {
  return cut == nullptr ? "" : cut->spec_json.c_str();
}

uint32_t lohan_model_cut_layers(const lohan_model_cut* cut) {
  return cut == nullptr ? 0 : static_cast<uint32_t>(cut->cut.layers_size());
}

int32_t lohan_model_cut_layer_block(const lohan_model_cut* cut,
                                    uint32_t layer) {
  const lohan::v1::CutLayer* found = LayerOf(cut, layer);
  return found == nullptr ? -1 : found->block();
}

uint32_t lohan_model_cut_layer_size(const lohan_model_cut* cut,
                                    uint32_t layer) {
  const lohan::v1::CutLayer* found = LayerOf(cut, layer);
  return found == nullptr ? 0 : static_cast<uint32_t>(found->parameters_size());
}

int lohan_model_cut_layer_parameter(const lohan_model_cut* cut, uint32_t layer,
                                    uint32_t position, uint32_t* parameter,
                                    uint64_t* offset) {
  if (parameter == nullptr || offset == nullptr) {
    return InvalidArgument(
        "lohan_model_cut_layer_parameter: parameter and offset are required");
  }
  const lohan::v1::CutLayer* found = LayerOf(cut, layer);
  if (found == nullptr ||
      position >= static_cast<uint32_t>(found->parameters_size())) {
    return Report(absl::OutOfRangeError(
        absl::StrCat("lohan_model_cut_layer_parameter: no parameter ", position,
                     " in layer ", layer)));
  }
  *parameter = found->parameters(static_cast<int>(position));
  *offset = found->offsets(static_cast<int>(position));
  return Report(absl::OkStatus());
}

}  // extern "C"
