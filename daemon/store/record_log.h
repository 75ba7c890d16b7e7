#ifndef LOHAN_DAEMON_STORE_RECORD_LOG_H_
#define LOHAN_DAEMON_STORE_RECORD_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wire/unique_fd.h"

namespace lohan {

// An append-only file of framed records: each is
//   [u32 payload length][u32 masked CRC32C of length+payload][payload]
// (little-endian).
// A record is durable once Sync() returns after its Append(). Read stops at
// the first record that is not intact; whether what follows it is a torn
// append (a crash mid-append: only records appended since the last sync)
// or damage is for the owner to judge from Scan, which knows nothing of
// what the payloads mean.
//
// Not thread-safe: the owner serializes Append/Sync.
class RecordLog {
 public:
  struct Contents {
    std::vector<std::string> records;
    uint64_t valid_bytes = 0;  // Length of the intact prefix.
    bool torn_tail = false;    // Bytes after the intact prefix were ignored.
  };
  // Reads the intact records of the log at `path`; a missing file is empty.
  static absl::StatusOr<Contents> Read(const std::string& path);

  // The log at `path` record by record, and past the first record that is
  // not intact: what it held and the intact records found after it.
  struct Scan {
    bool exists = false;
    uint64_t file_bytes = 0;
    Contents prefix;  // The intact prefix (prefix.torn_tail: bytes follow).
    // When bytes follow the prefix: the first of them, described ("a
    // record of 120 bytes whose checksum does not match"), and whether
    // they are certainly no torn append: a length past the end whose bytes
    // up to the end are the record whole (a damaged length field).
    std::string bad;
    bool bad_is_whole = false;
    struct Found {
      uint64_t offset = 0;
      std::string payload;
    };
    std::vector<Found> after;  // Intact records after the first bad byte.
  };
  static absl::StatusOr<Scan> ScanFile(const std::string& path);

  // Atomically replaces the log at `path` by one holding `records`: writes
  // `<path>.tmp`, fsyncs it, renames it over `path`, fsyncs the directory.
  // Returns the new log, open for appending. An error means the old log is
  // still in place (and no <path>.tmp is left). If only the directory fsync
  // fails, the new log is returned and each Sync() retries that fsync
  // first, failing (without breaking the log) until it succeeds.
  static absl::StatusOr<std::unique_ptr<RecordLog>> Rewrite(
      const std::string& path, const std::vector<std::string>& records);

  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  // Appends one record (not yet durable). On failure nothing is considered
  // appended; the next Append overwrites any partial bytes.
  absl::Status Append(absl::string_view payload);
  // fdatasync. After a failed sync the log refuses all further appends and
  // syncs (the kernel may have dropped the dirty pages: we can no longer
  // know what is on disk).
  absl::Status Sync();

  uint64_t size() const { return end_; }

  // The bytes a record of `payload_bytes` takes in the file (its frame
  // header included).
  static uint64_t FramedBytes(uint64_t payload_bytes) {
    return kHeaderBytes + payload_bytes;
  }
  static constexpr uint64_t kHeaderBytes = 8;

 private:
  RecordLog(std::string path, UniqueFd fd, uint64_t end);
  static std::string Frame(absl::string_view payload);
  absl::Status SyncDirectory();

  const std::string path_;
  const UniqueFd fd_;
  uint64_t end_;
  absl::Status broken_;
  bool directory_unsynced_ = false;  // after Rewrite's rename
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_RECORD_LOG_H_
