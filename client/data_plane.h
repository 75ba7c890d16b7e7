#ifndef LOHAN_CLIENT_DATA_PLANE_H_
#define LOHAN_CLIENT_DATA_PLANE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/arena_grant.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"
#include "wire/unique_fd.h"

namespace lohan {

// The client's end of a job's data plane: the job's shared-memory arena,
// mapped into this process, the connection whose life bounds it (the daemon
// frees the arena when the connection closes), and the requests this
// process has in flight on the arena's two rings.
//
// Requests are asynchronous: Submit puts an entry on the submission ring and
// returns a ticket (the entry's request id); Wait(ticket) returns that
// request's completion, or its error with the daemon's text; Poll(ticket)
// says whether it is done. Completions may come in any order; the result of
// a request that completed while nobody waited for it is kept until its
// ticket is waited for, once. Call is Submit + Wait.
//
// Thread-safe: any number of threads may submit, wait and poll at once (a
// CUDA host-function thread among them). The completion ring has one reader
// at a time: the thread that finds nobody draining drains (for a bounded
// slice), the others sleep on a condition variable until it hands over; the
// drainer itself sleeps on the ring's futex doorbell. Nothing spins.
//
// The daemon going away (crash, restart, closing the session) is noticed
// within kLivenessInterval by whoever drains (the connection hangs up):
// every request in flight then fails with UNAVAILABLE, as does everything
// after. A corrupt completion ring (DATA_LOSS) does the same.
//
// Bounds: at most max_in_flight() requests are submitted and not yet drained
// (the smaller ring's capacity, so neither ring can fill up and deadlock the
// daemon against us; Submit waits, draining, for room), and at most
// kMaxOutstandingTickets tickets are issued and not yet waited for
// (RESOURCE_EXHAUSTED beyond: wait for some).
class DataPlane {
 public:
  using Ticket = uint64_t;  // the request id; 0 is never a ticket
  static constexpr size_t kMaxOutstandingTickets = size_t{1} << 16;
  static constexpr absl::Duration kLivenessInterval = absl::Milliseconds(100);

  // Connects to `data_socket_path` (HelloResponse.data_socket_path) and asks
  // for `job_id`'s arena. The daemon's refusal comes back as its status
  // (e.g. NOT_FOUND for another user's job, FAILED_PRECONDITION when
  // this process has not attached the job); UNAVAILABLE when no daemon
  // answers there.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Open(
      const std::string& data_socket_path, const std::string& job_id);

  // Takes over `mapping` (grant.arena_bytes of mmap'ed memory laid out as
  // `grant` says, its rings formatted) and `connection`, whose hang-up means
  // the daemon is gone. Open uses it; so do tests and benchmarks that play
  // the daemon. The mapping is munmap'ed by the destructor, also on failure.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Adopt(
      UniqueFd connection, uint8_t* mapping, const ArenaGrant& grant);

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;
  // Unmaps the arena and closes the connection.
  // REQUIRES: no thread is inside a method of this object.
  ~DataPlane();

  // Where the daemon writes the text of failed requests
  // (RegisterModelResponse.error_text_offset/bytes); ignored when outside
  // the arena.
  void SetErrorText(uint64_t offset, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Puts `entry` on the submission ring with a new ticket as its request id
  // (whatever entry.request_id was). Waits up to `timeout` for room (see
  // Bounds above); DEADLINE_EXCEEDED when there was none, UNAVAILABLE once
  // the daemon is gone.
  absl::StatusOr<Ticket> Submit(SubmissionEntry entry, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(submit_mu_, mu_);

  // A ticket whose entry is submitted later, by SubmitReserved (e.g. from a
  // CUDA host function once a copy is done), or never (Cancel). It can be
  // waited for and polled at once: it completes when its request does.
  // [offset, offset + length): the arena bytes its request will use. First
  // waits (up to `timeout`) until no other pending request uses them (see
  // WaitForRange), then counts them as in use: the caller may fill them
  // (e.g. copy a gradient in) before submitting.
  absl::StatusOr<Ticket> Reserve(uint64_t offset = 0, uint64_t length = 0,
                                 absl::Duration timeout = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);
  // Submits the reserved ticket's entry. On failure the failure is also the
  // ticket's result, so whoever waits for it learns of it.
  absl::Status SubmitReserved(Ticket ticket, SubmissionEntry entry,
                              absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(submit_mu_, mu_);
  // Forgets a reserved ticket that was never handed to anyone.
  void Cancel(Ticket ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a reserved ticket, never submitted, with `error` as its result
  // (e.g. the copy that was to fill its buffer failed): whoever waits for it
  // learns why, and its arena bytes are free again.
  void FailReserved(Ticket ticket, absl::Status error) ABSL_LOCKS_EXCLUDED(mu_);

  // The completion of `ticket`'s request, or its error (the daemon's code
  // and text), waiting up to `timeout`. Consumes the ticket, except on
  // DEADLINE_EXCEEDED (still in flight: wait again). INVALID_ARGUMENT for a
  // ticket never issued, NOT_FOUND for one already waited for.
  absl::StatusOr<CompletionEntry> Wait(Ticket ticket, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ticket`'s request is done (its result is then waiting for
  // Wait); reads whatever completions are there, never blocks on the ring.
  // Same errors as Wait for a bad ticket.
  absl::StatusOr<bool> Poll(Ticket ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops `ticket`'s result, now or when it arrives (a waiter gave up).
  void Abandon(Ticket ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no reserved ticket is left unsubmitted (so an entry
  // submitted next cannot overtake them), up to `timeout`.
  absl::Status WaitForReserved(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no request that is reserved or in flight (not yet
  // completed) uses arena bytes in [offset, offset + length) (its entry's
  // slot_offset/length), up to `timeout`: before rewriting a buffer a
  // request may still read (e.g. a gradient buffer shared by several
  // layers), or reading one a request may still fill.
  absl::Status WaitForRange(uint64_t offset, uint64_t length,
                            absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Submit, then Wait; on a timeout the request is abandoned.
  absl::StatusOr<CompletionEntry> Call(SubmissionEntry entry,
                                       absl::Duration timeout);

  uint8_t* arena() const { return base_; }
  uint64_t arena_bytes() const { return grant_.arena_bytes; }
  const ArenaGrant& grant() const { return grant_; }
  size_t max_in_flight() const { return max_in_flight_; }
  // Requests submitted and not yet drained; tickets not yet waited for.
  size_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t outstanding() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kReserved, kSubmitted, kDone };
  struct Request {
    State state = State::kSubmitted;
    bool abandoned = false;
    uint64_t begin = 0, end = 0;             // the arena bytes it uses
    absl::StatusOr<CompletionEntry> result;  // when kDone
  };
  struct ErrorText {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };

  DataPlane(UniqueFd connection, uint8_t* base, ArenaGrant grant,
            RingProducer submissions, RingConsumer completions);

  void FailReservedLocked(Ticket ticket, absl::Status error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step of waiting for `ticket` to move on: for a reserved one, on
  // progress_ (its submitter, Cancel or FailReserved signals it); else
  // ProgressLocked.
  void WaitForLocked(Ticket ticket, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (draining when nobody else does) until a request may be
  // submitted; then registers `reserved` (or a new ticket) as in flight.
  absl::StatusOr<Ticket> AdmitLocked(Ticket reserved, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_, mu_);
  absl::Status PushLocked(const SubmissionEntry& entry, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  absl::StatusOr<Ticket> SubmitAs(Ticket reserved, SubmissionEntry entry,
                                  absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(submit_mu_, mu_);
  // One step towards `deadline`: drains one slice if nobody is draining and
  // something is in flight, else sleeps until the drainer's next batch or a
  // submission (or the deadline).
  void ProgressLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // As the only drainer: reads every completion there, waiting up to
  // kLivenessInterval (and `deadline`) for one; checks the daemon is still
  // there when none came. Releases mu_ meanwhile.
  void DrainLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordLocked(const CompletionEntry& completion, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailInFlightLocked(const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first pending request (reserved or in flight) using bytes of
  // [begin, end), or 0.
  Ticket UsingLocked(uint64_t begin, uint64_t end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BadTicketLocked(Ticket ticket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK, or the completion's error with the daemon's text (read now: a later
  // failure may reuse its record).
  absl::Status StatusOf(const CompletionEntry& completion,
                        const ErrorText& text) const;
  // True when the daemon has hung up the connection.
  bool PeerGone() const;

  // Constant after construction.
  UniqueFd connection_;
  uint8_t* const base_;
  const ArenaGrant grant_;
  const size_t max_in_flight_;

  // Taken before mu_ when both are held.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  RingProducer submissions_ ABSL_GUARDED_BY(submit_mu_);

  mutable absl::Mutex mu_;
  // Signalled after every drained batch, submission and consumed result.
  absl::CondVar progress_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // Used only by the drainer (the thread that set draining_), without mu_.
  RingConsumer completions_;
  ErrorText error_text_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<Ticket, Request> requests_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  // Set once the daemon is gone or the completion ring is broken.
  absl::Status gone_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_DATA_PLANE_H_
