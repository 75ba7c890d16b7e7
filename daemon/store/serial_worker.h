#ifndef LOHAN_DAEMON_STORE_SERIAL_WORKER_H_
#define LOHAN_DAEMON_STORE_SERIAL_WORKER_H_

#include <deque>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace lohan {

// Runs posted tasks one at a time, in the order posted, on a thread of its
// own. The SSD array checks each read extent's CRC32C on one of these per
// device, so a device's completion thread goes straight back to refilling
// its queue instead of reading a megabyte it just received.
// Thread-safe. The destructor runs every task posted before it and joins.
class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // REQUIRES: not called once the destructor has begun.
  void Post(absl::AnyInvocable<void() &&> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: started once the rest is constructed.
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_SERIAL_WORKER_H_
