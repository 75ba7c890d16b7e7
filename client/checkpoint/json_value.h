#ifndef LOHAN_CLIENT_CHECKPOINT_JSON_VALUE_H_
#define LOHAN_CLIENT_CHECKPOINT_JSON_VALUE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lohan::checkpoint {

// A parsed JSON document, enough for checkpoints' lohan.json and
// safetensors headers. Numbers keep their text, so 64-bit integers (byte
// offsets, CRCs) are read exactly and written back as they were. Objects
// keep their members' order.
class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // INVALID_ARGUMENT (naming `what` and the byte offset) for anything that
  // is not one complete JSON value.
  static absl::StatusOr<JsonValue> Parse(const std::string& text,
                                         const std::string& what);
  static JsonValue String(std::string text);
  static JsonValue Number(uint64_t value);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<std::pair<std::string, JsonValue>> m);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  // The member `key` of an object; nullptr when absent or not an object.
  const JsonValue* Find(const std::string& key) const;
  const std::vector<std::pair<std::string, JsonValue>>& members() const {
    return members_;
  }
  std::vector<std::pair<std::string, JsonValue>>& mutable_members() {
    return members_;
  }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::string& text() const { return text_; }  // string or number
  bool boolean() const { return boolean_; }
  // A non-negative integer number; INVALID_ARGUMENT naming `what` otherwise.
  absl::StatusOr<uint64_t> AsUint64(const std::string& what) const;
  // The document as Python's json.dumps(value, indent=1) writes it.
  std::string Dump() const;

 private:
  friend class JsonParser;
  void DumpTo(int depth, std::string* out) const;

  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// `text` (UTF-8) as a JSON string literal: quotes, backslashes and control
// characters escaped, other bytes as they are (JSON text is UTF-8).
std::string JsonQuoted(const std::string& text);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_JSON_VALUE_H_
