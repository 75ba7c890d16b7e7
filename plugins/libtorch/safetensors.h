#ifndef LOHAN_PLUGINS_LIBTORCH_SAFETENSORS_H_
#define LOHAN_PLUGINS_LIBTORCH_SAFETENSORS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lohan::torch_plugin {

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

// Writes one safetensors file of fp32 tensors declared up front: an 8-byte
// little-endian header length, the JSON header (`__metadata__` first, then
// every tensor's dtype "F32", shape and data_offsets, padded with spaces
// so the data starts 8-aligned), then the tensors' data, which Write()
// takes in declaration order. Errors: std::runtime_error naming the file.
class SafetensorsWriter {
 public:
  SafetensorsWriter(
      const std::string& path, std::vector<TensorDecl> tensors,
      const std::vector<std::pair<std::string, std::string>>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor's data; `name` and its element count must be
  // the declaration's.
  void Write(const std::string& name, const float* data, int64_t numel);
  // Flushes and fsyncs the file; throws unless every tensor was written.
  FileDigest Close();

 private:
  void Put(const void* data, size_t bytes);

  std::string path_;
  std::vector<TensorDecl> tensors_;
  std::FILE* file_ = nullptr;
  size_t next_ = 0;
  FileDigest digest_;
};

// A safetensors file's header, read and checked (fp32 tensors, offsets
// within the file), and its tensors read by name. Errors:
// std::invalid_argument naming the file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  struct Entry {
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // from the start of the file
    uint64_t end = 0;
  };
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // nullptr when the file has no tensor `name`.
  const Entry* Find(const std::string& name) const;
  // The tensor's elements into `out` (its element count of floats).
  void Read(const Entry& entry, float* out) const;
  // `count` of its elements from element `first` on (of the flat tensor)
  // into `out`; std::out_of_range past its end.
  void ReadRange(const Entry& entry, uint64_t first, uint64_t count,
                 float* out) const;
  // Every tensor, by name.
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
};

// The CRC-32 and size of a whole file; std::invalid_argument when it cannot
// be read.
FileDigest DigestFile(const std::string& path);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_SAFETENSORS_H_
