#include "client/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/checkpoint/dtype.h"
#include "client/checkpoint/json_value.h"
#include "wire/errno_status.h"

namespace lohan::checkpoint {
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

// Safetensors is little-endian, as every host lohan runs on.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);

constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// The most bytes a read of converted elements holds at once.
constexpr uint64_t kPieceBytes = 1u << 20;

// DATA_LOSS: the header of `path` is damaged (`why`).
absl::Status Damaged(const std::string& path, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(
      "checkpoint: ", path, " is not a safetensors file (", why, ")"));
}

// All `bytes` at `offset`, or DATA_LOSS where the file ends first.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, void* out,
                    size_t bytes) {
  auto* at = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, at, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoToStatus(errno, "checkpoint: reading " + path);
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: ", path, " ends before a tensor's data"));
    }
    at += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

std::string HeaderOf(
    const std::vector<TensorDecl>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string header = "{\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (i > 0) header += ",";
    header +=
        JsonQuoted(metadata[i].first) + ":" + JsonQuoted(metadata[i].second);
  }
  header += "}";
  uint64_t offset = 0;
  for (const TensorDecl& tensor : tensors) {
    const uint64_t bytes = 4 * Elements(tensor.shape);
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
  return header;
}

}  // namespace

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t count = 1;
  for (int64_t size : shape) count *= static_cast<uint64_t>(size);
  return count;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? ", " : "", shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

uint32_t Crc32(uint32_t crc, const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = CrcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i)
    crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

SafetensorsWriter::SafetensorsWriter(std::string path,
                                     std::vector<TensorDecl> tensors,
                                     UniqueFd fd)
    : path_(std::move(path)),
      tensors_(std::move(tensors)),
      fd_(std::move(fd)) {}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorDecl> tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return ErrnoToStatus(errno, "checkpoint: creating " + path);
  const std::string header = HeaderOf(tensors, metadata);
  std::unique_ptr<SafetensorsWriter> writer(
      new SafetensorsWriter(path, std::move(tensors), std::move(fd)));
  const uint64_t length = header.size();
  if (absl::Status put = writer->Put(&length, 8); !put.ok()) return put;
  if (absl::Status put = writer->Put(header.data(), header.size()); !put.ok()) {
    return put;
  }
  return writer;
}

absl::Status SafetensorsWriter::Put(const void* data, size_t bytes) {
  const auto* at = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    const ssize_t put = ::write(fd_.get(), at, left);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return ErrnoToStatus(errno, "checkpoint: writing " + path_);
    at += put;
    left -= static_cast<size_t>(put);
  }
  digest_.bytes += bytes;
  digest_.crc32 = Crc32(digest_.crc32, data, bytes);
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Write(const std::string& name,
                                      const float* data, uint64_t elements) {
  if (next_ >= tensors_.size() || tensors_[next_].name != name ||
      Elements(tensors_[next_].shape) != elements) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: ", name, " (", elements,
                     " elements) written out of its declared order or size "
                     "in ",
                     path_));
  }
  if (absl::Status put = Put(data, 4 * elements); !put.ok()) return put;
  ++next_;
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> SafetensorsWriter::Close() {
  if (next_ != tensors_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: ", tensors_.size() - next_,
                     " declared tensors were not written to ", path_));
  }
  if (::fsync(fd_.get()) != 0) {
    return ErrnoToStatus(errno, "checkpoint: syncing " + path_);
  }
  if (::close(fd_.release()) != 0) {
    return ErrnoToStatus(errno, "checkpoint: closing " + path_);
  }
  return digest_;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoToStatus(errno, "checkpoint: opening " + path);
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    return ErrnoToStatus(errno, "checkpoint: " + path);
  }
  std::unique_ptr<SafetensorsFile> file(
      new SafetensorsFile(path, std::move(fd)));
  if (absl::Status parsed =
          file->ParseHeader(static_cast<uint64_t>(info.st_size));
      !parsed.ok()) {
    return parsed;
  }
  return file;
}

absl::Status SafetensorsFile::ParseHeader(uint64_t size) {
  uint64_t length = 0;
  if (size < 8 || !ReadAt(fd_.get(), path_, 0, &length, 8).ok() ||
      length > size - 8 || length > kMaxHeaderBytes) {
    return Damaged(path_, "bad header length");
  }
  std::string header(length, '\0');
  if (absl::Status read = ReadAt(fd_.get(), path_, 8, header.data(), length);
      !read.ok()) {
    return read;
  }
  absl::StatusOr<JsonValue> root = JsonValue::Parse(header, "the header");
  if (!root.ok()) return Damaged(path_, root.status().message());
  if (!root->is_object()) return Damaged(path_, "the header is no object");
  for (const auto& [name, value] : root->members()) {
    if (name == "__metadata__") {
      for (const auto& [key, text] : value.members())
        metadata_[key] = text.text();
      continue;
    }
    if (absl::Status added = AddEntry(name, value, 8 + length, size);
        !added.ok()) {
      return added;
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFile::AddEntry(const std::string& name,
                                       const JsonValue& value,
                                       uint64_t data_start, uint64_t size) {
  const std::string what = path_ + ": tensor " + name;
  const JsonValue* dtype = value.Find("dtype");
  const JsonValue* shape = value.Find("shape");
  const JsonValue* offsets = value.Find("data_offsets");
  if (dtype == nullptr || shape == nullptr || offsets == nullptr ||
      offsets->items().size() != 2) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint: ", what, " lacks dtype, shape or data_offsets"));
  }
  Entry entry{name, dtype->text(), {}, 0, 0};
  uint64_t bits = DtypeBits(entry.dtype);
  for (const JsonValue& d : shape->items()) {
    absl::StatusOr<uint64_t> dim = d.AsUint64(what);
    if (!dim.ok() || *dim > uint64_t{INT64_MAX} ||
        __builtin_mul_overflow(bits, *dim, &bits)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: ", what, " has a damaged shape"));
    }
    entry.shape.push_back(static_cast<int64_t>(*dim));
  }
  absl::StatusOr<uint64_t> first = offsets->items()[0].AsUint64(what);
  absl::StatusOr<uint64_t> last = offsets->items()[1].AsUint64(what);
  if (!first.ok() || !last.ok() || *last < *first ||
      (DtypeBits(entry.dtype) != 0 && *last - *first != (bits + 7) / 8)) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint: ", what, " has data_offsets not of its shape ",
        ShapeText(entry.shape), " and dtype ", entry.dtype,
        " (a damaged header)"));
  }
  if (*last > size - data_start) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: ", path_, " is cut short: it ends at byte ",
                     size, ", before tensor ", name, "'s data (to byte ",
                     data_start + *last, ")"));
  }
  entry.begin = data_start + *first;
  entry.end = data_start + *last;
  order_.push_back(name);
  entries_[name] = std::move(entry);
  return absl::OkStatus();
}

const SafetensorsFile::Entry* SafetensorsFile::Find(
    const std::string& name) const {
  const auto found = entries_.find(name);
  return found == entries_.end() ? nullptr : &found->second;
}

absl::Status SafetensorsFile::ReadRange(const Entry& entry, uint64_t first,
                                        uint64_t count, float* out) const {
  const uint64_t elements = Elements(entry.shape);
  if (first > elements || count > elements - first) {
    return absl::OutOfRangeError(
        absl::StrCat("checkpoint: ", path_, ": elements ", first, " + ", count,
                     " of a tensor of ", elements));
  }
  if (!ReadsAsFloat(entry.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: ", path_, ": tensor ", entry.name, " is ",
                     entry.dtype, "; lohan reads F32, BF16 and F16 tensors"));
  }
  const uint64_t size = DtypeBits(entry.dtype) / 8;
  if (size == 4) {  // no conversion: straight into `out`
    return ReadAt(fd_.get(), path_, entry.begin + 4 * first, out, 4 * count);
  }
  std::vector<unsigned char> piece(std::min(count, kPieceBytes / size) * size);
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, kPieceBytes / size);
    if (absl::Status read =
            ReadAt(fd_.get(), path_, entry.begin + size * (first + done),
                   piece.data(), size * n);
        !read.ok()) {
      return read;
    }
    ConvertToFloat(entry.dtype, piece.data(), n, out + done);
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoToStatus(errno, "checkpoint: opening " + path);
  FileDigest digest;
  std::vector<char> chunk(16 << 20);
  while (true) {
    const ssize_t got = ::read(fd.get(), chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoToStatus(errno, "checkpoint: reading " + path);
    if (got == 0) return digest;
    digest.crc32 = Crc32(digest.crc32, chunk.data(), static_cast<size_t>(got));
    digest.bytes += static_cast<uint64_t>(got);
  }
}

}  // namespace lohan::checkpoint
