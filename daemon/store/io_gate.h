#ifndef LOHAN_DAEMON_STORE_IO_GATE_H_
#define LOHAN_DAEMON_STORE_IO_GATE_H_

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"

namespace lohan {

// Who moves bytes on the SSDs when: the store enters the gate before each
// part of a version it writes or reads (StoreOptions::gate_unit_bytes) and
// leaves it when that part's I/O is done: the pass is destroyed on the
// thread that completes the part's last request, not the one that entered. The
// daemon shares the array among jobs through it (daemon/sched/fair_gates.h);
// the store knows nothing of jobs' weights.
// Implementations must be thread-safe and must not call into the store.
class IoGate {
 public:
  class Pass {
   public:
    virtual ~Pass() = default;
  };
  enum class Direction { kRead, kWrite };
  // Marks the transfers its thread makes while it lives as ones a client's
  // device waits for (a weight fetch, an activation coming back): a gate
  // may serve them before the same job's other transfers.
  class UrgentScope {
   public:
    UrgentScope() : outer_(urgent_) { urgent_ = true; }
    ~UrgentScope() { urgent_ = outer_; }
    UrgentScope(const UrgentScope&) = delete;
    UrgentScope& operator=(const UrgentScope&) = delete;
    static bool Active() { return urgent_; }

   private:
    static inline thread_local bool urgent_ = false;
    const bool outer_;
  };
  virtual ~IoGate() = default;
  // Waits until `job` may move `bytes` in `direction`; held (not
  // destroyed) for the transfer. Pass destructors must not block and may
  // run on any thread.
  virtual std::unique_ptr<Pass> Enter(absl::string_view job, uint64_t bytes,
                                      Direction direction) = 0;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_IO_GATE_H_
