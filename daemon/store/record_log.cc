#include "daemon/store/record_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/store/crc32c.h"
#include "wire/errno_status.h"

namespace lohan {
namespace {

constexpr size_t kHeader = RecordLog::kHeaderBytes;
constexpr uint32_t kMaxRecord = 256u << 20;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

absl::Status WriteAll(int fd, const std::string& data, uint64_t offset,
                      const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The CRC covers the length too and is masked (as LevelDB does), so a run
// of zero bytes (a file extended but never written) is not a valid record.
uint32_t FrameCrc(uint32_t length, const char* payload) {
  std::string len;
  PutU32(len, length);
  uint32_t crc = Crc32cExtend(Crc32c(len.data(), 4), payload, length);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

std::string RecordLog::Frame(absl::string_view payload) {
  std::string out;
  out.reserve(kHeader + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU32(out, FrameCrc(static_cast<uint32_t>(payload.size()), payload.data()));
  out.append(payload.data(), payload.size());
  return out;
}

namespace {

absl::StatusOr<std::optional<std::string>> ReadWholeFile(
    const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::string>();
    return ErrnoToStatus(errno, absl::StrCat("open ", path));
  }
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return std::optional<std::string>(std::move(data));
}

// The intact record at `pos` of `data`: its payload length, or nullopt.
std::optional<uint32_t> IntactAt(const std::string& data, size_t pos) {
  if (data.size() - pos < kHeader) return std::nullopt;
  const uint32_t length = GetU32(data.data() + pos);
  const uint32_t crc = GetU32(data.data() + pos + 4);
  if (length > kMaxRecord || data.size() - pos - kHeader < length) {
    return std::nullopt;
  }
  if (FrameCrc(length, data.data() + pos + kHeader) != crc) return std::nullopt;
  return length;
}

}  // namespace

absl::StatusOr<RecordLog::Scan> RecordLog::ScanFile(const std::string& path) {
  absl::StatusOr<std::optional<std::string>> read = ReadWholeFile(path);
  if (!read.ok()) return read.status();
  Scan scan;
  if (!read->has_value()) return scan;
  const std::string& data = **read;
  scan.exists = true;
  scan.file_bytes = data.size();
  size_t pos = 0;
  while (std::optional<uint32_t> length = IntactAt(data, pos)) {
    scan.prefix.records.emplace_back(data.data() + pos + kHeader, *length);
    pos += kHeader + *length;
  }
  scan.prefix.valid_bytes = pos;
  scan.prefix.torn_tail = pos != data.size();
  if (!scan.prefix.torn_tail) return scan;

  const size_t left = data.size() - pos;
  if (left < kHeader) {
    scan.bad = absl::StrCat(left, " bytes, less than a record header");
  } else {
    const uint32_t length = GetU32(data.data() + pos);
    const uint32_t crc = GetU32(data.data() + pos + 4);
    if (length > kMaxRecord) {
      scan.bad = absl::StrCat("a record length of ", length,
                              " bytes, over the limit of ", kMaxRecord);
    } else if (left - kHeader < length) {
      scan.bad = absl::StrCat("a record of ", length, " bytes with only ",
                              left - kHeader, " left in the file");
      // The bytes to the end are a whole record under their true length:
      // the length field was changed, not the append cut short.
      const uint32_t present = static_cast<uint32_t>(left - kHeader);
      scan.bad_is_whole = FrameCrc(present, data.data() + pos + kHeader) == crc;
    } else {
      // In the file whole or cut and zero-filled, as a crash leaves it:
      // only a sync mark after it tells (catalog_recovery.h).
      scan.bad = absl::StrCat("a record of ", length,
                              " bytes whose checksum does not match");
    }
  }
  // Intact records further on, found byte by byte, then record by record.
  for (size_t at = pos + 1; at + kHeader <= data.size();) {
    std::optional<uint32_t> length = IntactAt(data, at);
    if (!length.has_value()) {
      ++at;
      continue;
    }
    scan.after.push_back(
        Scan::Found{at, std::string(data.data() + at + kHeader, *length)});
    at += kHeader + *length;
  }
  return scan;
}

absl::StatusOr<RecordLog::Contents> RecordLog::Read(const std::string& path) {
  absl::StatusOr<Scan> scan = ScanFile(path);
  if (!scan.ok()) return scan.status();
  return std::move(scan->prefix);
}

absl::StatusOr<std::unique_ptr<RecordLog>> RecordLog::Rewrite(
    const std::string& path, const std::vector<std::string>& records) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(
      ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  // A partial snapshot (a full disk, most likely) must not stay behind.
  auto failed = [&tmp](absl::Status error) {
    (void)::unlink(tmp.c_str());
    return error;
  };
  size_t bytes = 0;
  for (const std::string& r : records) bytes += kHeader + r.size();
  std::string data;
  data.reserve(bytes);
  for (const std::string& r : records) data += Frame(r);
  absl::Status s = WriteAll(fd.get(), data, 0, tmp);
  if (!s.ok()) return failed(s);
  if (::fsync(fd.get()) != 0) {
    return failed(ErrnoToStatus(errno, absl::StrCat("fsync ", tmp)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return failed(
        ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " to ", path)));
  }
  // The new file is in place (the old one is gone), so the caller goes on
  // with it whatever happens next. Until the directory is synced the
  // rename may not survive a crash: Sync() retries that first, so nothing
  // appended here counts as durable before it has.
  auto log = std::unique_ptr<RecordLog>(
      new RecordLog(path, std::move(fd), data.size()));
  log->directory_unsynced_ = true;
  (void)log->SyncDirectory();
  return log;
}

absl::Status RecordLog::SyncDirectory() {
  const std::string dir = DirName(path_);
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid() || ::fsync(dir_fd.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync directory ", dir));
  }
  directory_unsynced_ = false;
  return absl::OkStatus();
}

RecordLog::RecordLog(std::string path, UniqueFd fd, uint64_t end)
    : path_(std::move(path)), fd_(std::move(fd)), end_(end) {}

absl::Status RecordLog::Append(absl::string_view payload) {
  if (!broken_.ok()) return broken_;
  if (payload.size() > kMaxRecord) {
    return absl::InvalidArgumentError(absl::StrCat(
        "catalog record of ", payload.size(), " bytes is too big"));
  }
  absl::Status s = WriteAll(fd_.get(), Frame(payload), end_, path_);
  if (!s.ok()) {
    // Drop the partial record so a later append does not follow garbage.
    if (::ftruncate(fd_.get(), static_cast<off_t>(end_)) != 0) broken_ = s;
    return s;
  }
  end_ += kHeader + payload.size();
  return absl::OkStatus();
}

absl::Status RecordLog::Sync() {
  if (!broken_.ok()) return broken_;
  if (directory_unsynced_) {
    if (absl::Status synced = SyncDirectory(); !synced.ok()) return synced;
  }
  if (::fdatasync(fd_.get()) != 0) {
    broken_ = ErrnoToStatus(errno, absl::StrCat("fdatasync ", path_));
    return broken_;
  }
  return absl::OkStatus();
}

}  // namespace lohan
