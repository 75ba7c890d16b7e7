#include "client/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"

namespace lohan {

absl::Status FromJson(const char* json, absl::string_view what,
                      google::protobuf::Message* message) {
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(json, message);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is not a ", message->GetDescriptor()->name(), ": ",
      absl::string_view(parsed.message().data(), parsed.message().size())));
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool proto_names) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = proto_names;
  print.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, print)
           .ok()) {
    return absl::InternalError(absl::StrCat(
        "cannot render a ", message.GetDescriptor()->name(), " as JSON"));
  }
  return json;
}

}  // namespace lohan
