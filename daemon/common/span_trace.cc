#include "daemon/common/span_trace.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lohan {
namespace {

struct CloseFile {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// The trace file of this process, opened at first use; closed (flushed)
// at exit, after lohand has joined the threads that record.
class SpanWriter {
 public:
  SpanWriter() {
    const char* prefix = std::getenv("LOHAN_TRACE");
    if (prefix == nullptr || *prefix == '\0') return;
    const std::string path =
        std::string(prefix) + "." + std::to_string(::getpid());
    // A new file only, never through a link: lohand runs as root, and the
    // prefix may be in a directory other users write to.
    const int fd =
        ::open(path.c_str(),
               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) file_.reset(::fdopen(fd, "w"));
    if (file_ == nullptr) {
      const int error = errno;
      if (fd >= 0) ::close(fd);
      std::fprintf(stderr,
                   "LOHAN_TRACE: cannot create %s (%s): no spans are recorded; "
                   "give a prefix in a directory lohand can write to, whose "
                   "file does not exist yet\n",
                   path.c_str(), std::strerror(error));
      return;
    }
    std::setvbuf(file_.get(), nullptr, _IOFBF, 1 << 20);
    on_.store(true, std::memory_order_relaxed);
  }

  bool on() const { return on_.load(std::memory_order_relaxed); }

  void Write(const char* name, double start, double end, int64_t a, int64_t b,
             int64_t c) {
    const long thread = ::syscall(SYS_gettid);
    absl::MutexLock lock(&mu_);
    std::fprintf(file_.get(),
                 "%s %.6f %.6f %ld %" PRId64 " %" PRId64 " %" PRId64 "\n", name,
                 start, end, thread, a, b, c);
  }

  void Flush() {
    absl::MutexLock lock(&mu_);
    std::fflush(file_.get());
  }

 private:
  std::atomic<bool> on_{false};
  absl::Mutex mu_;
  std::unique_ptr<std::FILE, CloseFile> file_ ABSL_GUARDED_BY(mu_);
};

SpanWriter& Writer() {
  static SpanWriter writer;
  return writer;
}

}  // namespace

double SpanClock() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SpanTraceOn() { return Writer().on(); }

void RecordSpan(const char* name, double start, double end, int64_t a,
                int64_t b, int64_t c) {
  SpanWriter& writer = Writer();
  if (writer.on()) writer.Write(name, start, end, a, b, c);
}

void FlushSpans() {
  SpanWriter& writer = Writer();
  if (writer.on()) writer.Flush();
}

}  // namespace lohan
