#ifndef LOHAN_CLIENT_PROTO_JSON_H_
#define LOHAN_CLIENT_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

// `json` (protobuf JSON: the proto's names, snake_case or lowerCamelCase)
// into `message`; INVALID_ARGUMENT with the parser's words, naming `what`.
absl::Status FromJson(const char* json, absl::string_view what,
                      google::protobuf::Message* message);

// `message` as protobuf JSON with every field, named lowerCamelCase or,
// with `proto_names`, as the proto spells them.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool proto_names);

}  // namespace lohan

#endif  // LOHAN_CLIENT_PROTO_JSON_H_
