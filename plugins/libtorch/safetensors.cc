#include "plugins/libtorch/safetensors.h"

#include <unistd.h>

#include <array>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "plugins/libtorch/json_value.h"

namespace lohan::torch_plugin {
namespace {

std::array<uint32_t, 256> CrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return count;
}

// Safetensors is little-endian, as every host lohan runs on.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = CrcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i)
    crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

SafetensorsWriter::SafetensorsWriter(
    const std::string& path, std::vector<TensorDecl> tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  std::string header = "{\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (i > 0) header += ",";
    header +=
        JsonQuoted(metadata[i].first) + ":" + JsonQuoted(metadata[i].second);
  }
  header += "}";
  uint64_t offset = 0;
  for (const TensorDecl& tensor : tensors_) {
    const uint64_t bytes = 4 * static_cast<uint64_t>(Elements(tensor.shape));
    header += "," + JsonQuoted(tensor.name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      if (d > 0) header += ",";
      header += std::to_string(tensor.shape[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw std::runtime_error("checkpoint: cannot create " + path_ + ": " +
                             std::strerror(errno));
  }
  uint64_t length = header.size();
  Put(&length, 8);
  Put(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SafetensorsWriter::Put(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes) {
    throw std::runtime_error("checkpoint: writing " + path_ + ": " +
                             std::strerror(errno));
  }
  digest_.bytes += bytes;
  digest_.crc32 = Crc32(digest_.crc32, data, bytes);
}

void SafetensorsWriter::Write(const std::string& name, const float* data,
                              int64_t numel) {
  if (next_ >= tensors_.size() || tensors_[next_].name != name ||
      Elements(tensors_[next_].shape) != numel) {
    throw std::logic_error("checkpoint: " + name + " (" +
                           std::to_string(numel) +
                           " elements) written out of its declared order "
                           "or size in " +
                           path_);
  }
  Put(data, 4 * static_cast<size_t>(numel));
  ++next_;
}

FileDigest SafetensorsWriter::Close() {
  if (next_ != tensors_.size()) {
    throw std::logic_error(
        "checkpoint: " + std::to_string(tensors_.size() - next_) +
        " declared tensors were not written to " + path_);
  }
  const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (!ok || closed != 0) {
    throw std::runtime_error("checkpoint: syncing " + path_ + ": " +
                             std::strerror(errno));
  }
  return digest_;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("checkpoint: cannot open " + path);
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t length = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&length), 8) ||
      length > size - 8 || length > (100u << 20)) {
    throw std::invalid_argument("checkpoint: " + path +
                                " is not a safetensors file (bad header "
                                "length)");
  }
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  const JsonValue root = JsonValue::Parse(header, path + " header");
  if (!root.is_object()) {
    throw std::invalid_argument("checkpoint: " + path +
                                ": the header is not a JSON object");
  }
  const uint64_t data_start = 8 + length;
  for (const auto& [name, value] : root.members()) {
    if (name == "__metadata__") {
      for (const auto& [key, text] : value.members())
        metadata_[key] = text.text();
      continue;
    }
    const std::string what = path + ": tensor " + name;
    const JsonValue* dtype = value.Find("dtype");
    const JsonValue* shape = value.Find("shape");
    const JsonValue* offsets = value.Find("data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr ||
        offsets->items().size() != 2) {
      throw std::invalid_argument("checkpoint: " + what +
                                  " lacks dtype, shape or data_offsets");
    }
    if (dtype->text() != "F32") {
      throw std::invalid_argument("checkpoint: " + what + " is " +
                                  dtype->text() +
                                  "; lohan checkpoints are "
                                  "F32");
    }
    Entry entry;
    for (const JsonValue& d : shape->items()) {
      entry.shape.push_back(static_cast<int64_t>(d.AsUint64(what)));
    }
    entry.begin = data_start + offsets->items()[0].AsUint64(what);
    entry.end = data_start + offsets->items()[1].AsUint64(what);
    if (entry.end < entry.begin || entry.end > size ||
        entry.end - entry.begin !=
            4 * static_cast<uint64_t>(Elements(entry.shape))) {
      throw std::invalid_argument("checkpoint: " + what +
                                  " has data_offsets outside the file or not "
                                  "of its shape (a torn file?)");
    }
    entries_[name] = std::move(entry);
  }
}

const SafetensorsFile::Entry* SafetensorsFile::Find(
    const std::string& name) const {
  const auto found = entries_.find(name);
  return found == entries_.end() ? nullptr : &found->second;
}

void SafetensorsFile::Read(const Entry& entry, float* out) const {
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(entry.begin));
  if (!in.read(reinterpret_cast<char*>(out),
               static_cast<std::streamsize>(entry.end - entry.begin))) {
    throw std::invalid_argument("checkpoint: " + path_ +
                                " ends before a tensor's data");
  }
}

void SafetensorsFile::ReadRange(const Entry& entry, uint64_t first,
                                uint64_t count, float* out) const {
  const uint64_t elements = (entry.end - entry.begin) / 4;
  if (first > elements || count > elements - first) {
    throw std::out_of_range(
        "checkpoint: " + path_ + ": elements " + std::to_string(first) + " + " +
        std::to_string(count) + " of a tensor of " + std::to_string(elements));
  }
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(entry.begin + 4 * first));
  if (!in.read(reinterpret_cast<char*>(out),
               static_cast<std::streamsize>(4 * count))) {
    throw std::invalid_argument("checkpoint: " + path_ +
                                " ends before a tensor's data");
  }
}

FileDigest DigestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("checkpoint: cannot open " + path);
  FileDigest digest;
  std::vector<char> chunk(16 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    digest.crc32 = Crc32(digest.crc32, chunk.data(), got);
    digest.bytes += got;
  }
  return digest;
}

}  // namespace lohan::torch_plugin
