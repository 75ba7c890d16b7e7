#ifndef LOHAN_CLIENT_CHECKPOINT_SAFETENSORS_H_
#define LOHAN_CLIENT_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint/json_value.h"
#include "wire/unique_fd.h"

namespace lohan::checkpoint {

// CRC-32 (zlib's polynomial), continued from `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const void* data, size_t bytes);

// A tensor of a safetensors file: its name and shape (fp32 only here).
struct TensorDecl {
  std::string name;
  std::vector<int64_t> shape;
};

// What a written file's manifest entry records.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

uint64_t Elements(const std::vector<int64_t>& shape);
// A shape as Python prints a tuple: (2, 3), (4,), ().
std::string ShapeText(const std::vector<int64_t>& shape);

// Writes one safetensors file of fp32 tensors declared up front: an 8-byte
// little-endian header length, the JSON header (`__metadata__` first, then
// every tensor's dtype "F32", shape and data_offsets, padded with spaces
// so the data starts 8-aligned), then the tensors' data, which Write()
// takes in declaration order. Errors name the file.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorDecl> tensors,
      const std::vector<std::pair<std::string, std::string>>& metadata);

  // The next declared tensor's data; `name` and its element count must be
  // the declaration's (FAILED_PRECONDITION otherwise).
  absl::Status Write(const std::string& name, const float* data,
                     uint64_t elements);
  // Flushes and fsyncs the file; FAILED_PRECONDITION unless every tensor
  // was written.
  absl::StatusOr<FileDigest> Close();

 private:
  SafetensorsWriter(std::string path, std::vector<TensorDecl> tensors,
                    UniqueFd fd);
  absl::Status Put(const void* data, size_t bytes);

  std::string path_;
  std::vector<TensorDecl> tensors_;
  UniqueFd fd_;
  size_t next_ = 0;
  FileDigest digest_;
};

// A safetensors file's header, read and checked, and its tensors read by
// name as fp32. Opening reads only the header: DATA_LOSS naming the file for
// a damaged one (a length past the file's end, no JSON object, an entry
// without dtype, shape or data_offsets) and naming the tensor too for one
// whose data lies past the file's end (a file cut short) or is not of its
// shape and dtype. Tensors of any dtype pass the open; F32, BF16 and F16
// ones are read (converted exactly), others are refused when read. Errors
// name the file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  struct Entry {
    std::string name;
    std::string dtype;  // as the header spells it: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // from the start of the file
    uint64_t end = 0;
  };
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // nullptr when the file has no tensor `name`.
  const Entry* Find(const std::string& name) const;
  // `count` of its elements from element `first` on (of the flat tensor)
  // into `out` as fp32, read in pieces of at most 1 MiB (no buffer beyond
  // `out` holds more); OUT_OF_RANGE past its end, INVALID_ARGUMENT naming
  // the file, the tensor and its dtype for one not F32, BF16 or F16.
  absl::Status ReadRange(const Entry& entry, uint64_t first, uint64_t count,
                         float* out) const;
  // Every tensor, by name, and the order the header declares them in.
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::vector<std::string>& order() const { return order_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile(std::string path, UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}
  absl::Status ParseHeader(uint64_t file_size);
  absl::Status AddEntry(const std::string& name, const JsonValue& value,
                        uint64_t data_start, uint64_t file_size);

  std::string path_;
  UniqueFd fd_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

// The CRC-32 and size of a whole file.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace lohan::checkpoint

#endif  // LOHAN_CLIENT_CHECKPOINT_SAFETENSORS_H_
