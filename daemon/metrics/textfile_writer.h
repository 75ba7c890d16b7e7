#ifndef LOHAN_DAEMON_METRICS_TEXTFILE_WRITER_H_
#define LOHAN_DAEMON_METRICS_TEXTFILE_WRITER_H_

// Keeps a file of Prometheus metrics for node_exporter's textfile collector
// up to date: rewritten atomically every interval from a thread this object
// owns. The collector may read the file at any moment: it sees the whole
// old text or the whole new one, never a part.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lohan {

class TextfileWriter {
 public:
  struct Options {
    // The file ([metrics] textfile); its directory must exist.
    std::string path;
    absl::Duration interval = absl::Seconds(15);
    // The text to write, called on the writer's thread (and on Start's
    // caller's for the first write). Must be thread-safe against the
    // daemon's other threads; must not block for long.
    std::function<std::string()> render;
  };

  // Writes the file once now (a failure, e.g. a missing or read-only
  // directory, is returned and nothing runs), then starts the thread that
  // rewrites it every `interval`. A later write that fails is logged (once
  // until one succeeds again) and retried at the next interval.
  static absl::StatusOr<std::unique_ptr<TextfileWriter>> Start(Options options);

  TextfileWriter(const TextfileWriter&) = delete;
  TextfileWriter& operator=(const TextfileWriter&) = delete;
  // Stop().
  ~TextfileWriter();

  // Wakes the thread at once (whatever is left of its interval), joins it
  // and removes the file: a stopped lohand exports no numbers that look
  // current. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Writes `text` to `path` atomically: a temporary file `path`.tmp beside
  // it (mode 0644, never through a symlink), fsynced, renamed over `path`.
  // The temporary name does not end in ".prom": the collector skips it.
  static absl::Status WriteAtomically(const std::string& path,
                                      absl::string_view text);

 private:
  explicit TextfileWriter(Options options);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // One write; logs a failure unless the last write failed too, and a
  // success after failures.
  void WriteOnce();

  const Options options_;
  // Only the writer's thread after Start.
  bool failing_ = false;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  bool stopped_ = false;  // Stop's caller only
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_METRICS_TEXTFILE_WRITER_H_
