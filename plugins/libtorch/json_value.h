#ifndef LOHAN_PLUGINS_LIBTORCH_JSON_VALUE_H_
#define LOHAN_PLUGINS_LIBTORCH_JSON_VALUE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lohan::torch_plugin {

// A parsed JSON document, enough for checkpoints' lohan.json and
// safetensors headers. Numbers keep their text, so 64-bit integers (byte
// offsets, CRCs) are read exactly. Objects keep their members' order.
class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Throws std::invalid_argument (naming `what` and the byte offset) for
  // anything that is not one complete JSON value.
  static JsonValue Parse(const std::string& text, const std::string& what);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  // The member `key` of an object; nullptr when absent or not an object.
  const JsonValue* Find(const std::string& key) const;
  const std::vector<std::pair<std::string, JsonValue>>& members() const {
    return members_;
  }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::string& text() const { return text_; }  // string or number
  bool boolean() const { return boolean_; }
  // A non-negative integer number; throws std::invalid_argument otherwise.
  uint64_t AsUint64(const std::string& what) const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// `text` as a JSON string literal, escaped as Python's json.dumps does.
std::string JsonQuoted(const std::string& text);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_JSON_VALUE_H_
