#include "daemon/metrics/textfile_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "wire/errno_status.h"
#include "wire/unique_fd.h"

namespace lohan {

absl::Status TextfileWriter::WriteAtomically(const std::string& path,
                                             absl::string_view text) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  // One left by a write that died: made again, never written through (a
  // symlink there is replaced, not followed).
  if (unlink(temporary.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("removing ", temporary));
  }
  UniqueFd fd(open(temporary.c_str(),
                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", temporary));
  }
  absl::Status status = absl::OkStatus();
  // node_exporter reads it as its own (unprivileged) user, whatever
  // lohand's umask.
  if (fchmod(fd.get(), 0644) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("chmod of ", temporary));
  }
  while (status.ok() && !text.empty()) {
    const ssize_t written = write(fd.get(), text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      status = ErrnoToStatus(written < 0 ? errno : EIO,
                             absl::StrCat("writing ", temporary));
      break;
    }
    text.remove_prefix(static_cast<size_t>(written));
  }
  if (status.ok() && fsync(fd.get()) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("fsync of ", temporary));
  }
  if (status.ok() && close(fd.release()) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("closing ", temporary));
  }
  if (status.ok() && rename(temporary.c_str(), path.c_str()) != 0) {
    status = ErrnoToStatus(errno,
                           absl::StrCat("renaming ", temporary, " to ", path));
  }
  if (!status.ok()) unlink(temporary.c_str());
  return status;
}

absl::StatusOr<std::unique_ptr<TextfileWriter>> TextfileWriter::Start(
    Options options) {
  if (absl::Status first =
          WriteAtomically(options.path, options.render ? options.render() : "");
      !first.ok()) {
    return first;
  }
  std::unique_ptr<TextfileWriter> writer(
      new TextfileWriter(std::move(options)));
  writer->thread_ = std::thread([w = writer.get()] { w->Run(); });
  return writer;
}

TextfileWriter::TextfileWriter(Options options)
    : options_(std::move(options)) {}

TextfileWriter::~TextfileWriter() { Stop(); }

void TextfileWriter::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (unlink(options_.path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("metrics: removing {}: {}", options_.path,
                 std::string(ErrnoToStatus(errno, "unlink").message()));
  }
}

void TextfileWriter::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.interval);
      if (stopping_) return;
    }
    WriteOnce();
  }
}

void TextfileWriter::WriteOnce() {
  const absl::Status status =
      WriteAtomically(options_.path, options_.render ? options_.render() : "");
  if (!status.ok() && !failing_) {
    spdlog::warn(
        "metrics: writing {} failed (retried every {}, logged again once it "
        "works): {}",
        options_.path, absl::FormatDuration(options_.interval),
        std::string(status.message()));
  } else if (status.ok() && failing_) {
    spdlog::info("metrics: {} written again", options_.path);
  }
  failing_ = !status.ok();
}

}  // namespace lohan
