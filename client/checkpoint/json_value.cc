#include "client/checkpoint/json_value.h"

#include <cstdio>
#include <string>

namespace lohan::checkpoint {

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& what)
      : text_(text), what_(what) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue value = Value(0);
    SkipSpace();
    if (error_.empty() && at_ != text_.size()) Fail("trailing characters");
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    return value;
  }

 private:
  // The first failure is kept and ends the parse: every step below checks
  // failed() before it reads on.
  void Fail(const std::string& why) {
    if (error_.empty()) {
      error_ = what_ + ": not valid JSON at byte " + std::to_string(at_) +
               ": " + why;
    }
    at_ = text_.size();
  }
  bool failed() const { return !error_.empty(); }

  void SkipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' ||
                                  text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }

  bool Take(char c) {
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  void Expect(char c) {
    if (!Take(c)) Fail(std::string("expected '") + c + "'");
  }

  bool Word(const char* word) {
    const std::string w(word);
    if (text_.compare(at_, w.size(), w) != 0) return false;
    at_ += w.size();
    return true;
  }

  JsonValue Value(int depth) {
    JsonValue value;
    if (depth > 64) Fail("nested too deeply");
    SkipSpace();
    if (at_ >= text_.size()) Fail("unexpected end");
    if (failed()) return value;
    const char c = text_[at_];
    if (c == '{') {
      ++at_;
      value.kind_ = JsonValue::Kind::kObject;
      if (Take('}')) return value;
      do {
        SkipSpace();
        std::string key = String();
        Expect(':');
        value.members_.emplace_back(std::move(key), Value(depth + 1));
      } while (!failed() && Take(','));
      Expect('}');
    } else if (c == '[') {
      ++at_;
      value.kind_ = JsonValue::Kind::kArray;
      if (Take(']')) return value;
      do {
        value.items_.push_back(Value(depth + 1));
      } while (!failed() && Take(','));
      Expect(']');
    } else if (c == '"') {
      value.kind_ = JsonValue::Kind::kString;
      value.text_ = String();
    } else if (Word("true") || Word("false")) {
      value.kind_ = JsonValue::Kind::kBool;
      value.boolean_ = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';
    } else if (Word("null")) {
      value.kind_ = JsonValue::Kind::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t begin = at_;
      while (at_ < text_.size() &&
             std::string("+-.eE0123456789").find(text_[at_]) !=
                 std::string::npos) {
        ++at_;
      }
      value.kind_ = JsonValue::Kind::kNumber;
      value.text_ = text_.substr(begin, at_ - begin);
    } else {
      Fail(std::string("unexpected '") + c + "'");
    }
    return value;
  }

  // A string literal at at_; \uXXXX escapes as UTF-8 (no surrogate pairs:
  // names in checkpoints are ASCII).
  std::string String() {
    std::string out;
    if (at_ >= text_.size() || text_[at_] != '"') {
      Fail("expected a string");
      return out;
    }
    ++at_;
    while (true) {
      if (at_ >= text_.size()) {
        Fail("unterminated string");
        return out;
      }
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) {
        Fail("unterminated escape");
        return out;
      }
      const char e = text_[at_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          const std::string hex = text_.substr(at_, 4);
          if (hex.size() != 4 ||
              hex.find_first_not_of("0123456789abcdefABCDEF") !=
                  std::string::npos) {
            Fail("bad \\u escape");
            return out;
          }
          const unsigned code = std::stoul(hex, nullptr, 16);
          at_ += 4;
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default:
          out += e;  // '"', '\\', '/'
      }
    }
  }

  const std::string& text_;
  const std::string& what_;
  size_t at_ = 0;
  std::string error_;
};

absl::StatusOr<JsonValue> JsonValue::Parse(const std::string& text,
                                           const std::string& what) {
  return JsonParser(text, what).Document();
}

JsonValue JsonValue::String(std::string text) {
  JsonValue value;
  value.kind_ = Kind::kString;
  value.text_ = std::move(text);
  return value;
}

JsonValue JsonValue::Number(uint64_t number) {
  JsonValue value;
  value.kind_ = Kind::kNumber;
  value.text_ = std::to_string(number);
  return value;
}

JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue value;
  value.kind_ = Kind::kArray;
  value.items_ = std::move(items);
  return value;
}

JsonValue JsonValue::Object(
    std::vector<std::pair<std::string, JsonValue>> members) {
  JsonValue value;
  value.kind_ = Kind::kObject;
  value.members_ = std::move(members);
  return value;
}

std::string JsonValue::Dump() const {
  std::string out;
  DumpTo(0, &out);
  return out;
}

void JsonValue::DumpTo(int depth, std::string* out) const {
  const std::string inner = "\n" + std::string(depth + 1, ' ');
  switch (kind_) {
    case Kind::kNull:
      *out += "null";
      return;
    case Kind::kBool:
      *out += boolean_ ? "true" : "false";
      return;
    case Kind::kNumber:
      *out += text_;
      return;
    case Kind::kString:
      *out += JsonQuoted(text_);
      return;
    case Kind::kArray:
      if (items_.empty()) {
        *out += "[]";
        return;
      }
      *out += "[";
      for (size_t i = 0; i < items_.size(); ++i) {
        *out += (i > 0 ? "," : "") + inner;
        items_[i].DumpTo(depth + 1, out);
      }
      *out += "\n" + std::string(depth, ' ') + "]";
      return;
    case Kind::kObject:
      if (members_.empty()) {
        *out += "{}";
        return;
      }
      *out += "{";
      for (size_t i = 0; i < members_.size(); ++i) {
        *out +=
            (i > 0 ? "," : "") + inner + JsonQuoted(members_[i].first) + ": ";
        members_[i].second.DumpTo(depth + 1, out);
      }
      *out += "\n" + std::string(depth, ' ') + "}";
      return;
  }
}

const JsonValue* JsonValue::Find(const std::string& key) const {
  for (const auto& [name, value] : members_) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::StatusOr<uint64_t> JsonValue::AsUint64(const std::string& what) const {
  if (kind_ != Kind::kNumber || text_.empty() ||
      text_.find_first_not_of("0123456789") != std::string::npos ||
      text_.size() > 19) {
    return absl::InvalidArgumentError(
        what + ": expected a non-negative integer, found " +
        (kind_ == Kind::kNumber ? text_ : std::string("a non-number")));
  }
  return std::stoull(text_);
}

std::string JsonQuoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace lohan::checkpoint
