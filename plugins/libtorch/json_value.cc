#include "plugins/libtorch/json_value.h"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace lohan::torch_plugin {

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& what)
      : text_(text), what_(what) {}

  JsonValue Document() {
    JsonValue value = Value(0);
    SkipSpace();
    if (at_ != text_.size()) Fail("trailing characters");
    return value;
  }

 private:
  [[noreturn]] void Fail(const std::string& why) const {
    throw std::invalid_argument(what_ + ": not valid JSON at byte " +
                                std::to_string(at_) + ": " + why);
  }

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
    if (depth > 64) Fail("nested too deeply");
    SkipSpace();
    if (at_ >= text_.size()) Fail("unexpected end");
    JsonValue value;
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
      } while (Take(','));
      Expect('}');
    } else if (c == '[') {
      ++at_;
      value.kind_ = JsonValue::Kind::kArray;
      if (Take(']')) return value;
      do {
        value.items_.push_back(Value(depth + 1));
      } while (Take(','));
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
    if (at_ >= text_.size() || text_[at_] != '"') Fail("expected a string");
    ++at_;
    std::string out;
    while (true) {
      if (at_ >= text_.size()) Fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) Fail("unterminated escape");
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
          if (at_ + 4 > text_.size()) Fail("short \\u escape");
          const unsigned code = std::stoul(text_.substr(at_, 4), nullptr, 16);
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
};

JsonValue JsonValue::Parse(const std::string& text, const std::string& what) {
  return JsonParser(text, what).Document();
}

const JsonValue* JsonValue::Find(const std::string& key) const {
  for (const auto& [name, value] : members_) {
    if (name == key) return &value;
  }
  return nullptr;
}

uint64_t JsonValue::AsUint64(const std::string& what) const {
  if (kind_ != Kind::kNumber || text_.empty() ||
      text_.find_first_not_of("0123456789") != std::string::npos ||
      text_.size() > 20) {
    throw std::invalid_argument(what + ": expected a non-negative integer");
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
    } else if (c < 0x20 || c >= 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace lohan::torch_plugin
