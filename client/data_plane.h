#ifndef LOHAN_CLIENT_DATA_PLANE_H_
#define LOHAN_CLIENT_DATA_PLANE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

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
// CUDA host function only Delivers, below: it must not lock or wait). The
// completion ring has one reader at a time: the thread that finds nobody
// draining drains (for a bounded slice), the others sleep on a condition
// variable until it hands over; the drainer itself sleeps on the ring's futex
// doorbell. Nothing spins.
//
// The daemon going away (crash, restart, closing the session) is noticed
// within kLivenessInterval by whoever drains (the connection hangs up),
// after every completion the daemon wrote before it is read: every request
// in flight then fails, as does everything after, with why it closed
// (client/plane_closing.h): ABORTED when lohand closed the plane for
// another user's share or its owner or root stopped it, UNAVAILABLE when
// lohand is stopping or was lost without a word. A corrupt completion ring
// (DATA_LOSS) does the same.
//
// The submitter: a thread the plane owns (started by the constructor,
// stopped and joined by StopSubmitter or the destructor) that submits the
// entries Deliver hands it, for callers that must not lock or wait (a CUDA
// stream callback). Deliver pushes onto a lock-free list and writes an
// eventfd: it never locks, waits or allocates; its room (the HandOff) was
// allocated by the caller up front, with the ticket, so it cannot be full.
// The submitter takes hand-offs in the order they were delivered (FIFO), so
// what one thread (one stream) delivers is submitted in that order.
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

  // What a caller that must not wait (a CUDA stream callback) hands the
  // submitter: made, with its reserved ticket, before the work that ends in
  // Deliver is started (so the hand-off itself needs no room).
  struct HandOff {
    Ticket ticket = 0;  // a reserved ticket (Reserve)
    // True: submit `entry` under the ticket (SubmitReserved) when the
    // delivered status is OK, else fail the ticket with it (FailReserved).
    // False: only release the ticket's arena bytes (Cancel), whatever the
    // status.
    bool submit = false;
    SubmissionEntry entry{};
    // Set by Deliver and the submitter's list; not the caller's.
    absl::Status status;
    HandOff* next = nullptr;
  };
  // How long the submitter waits for room in flight for one hand-off.
  static constexpr absl::Duration kHandOffTimeout = absl::Hours(24);

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;
  // Stops the submitter (StopSubmitter), unmaps the arena and closes the
  // connection. REQUIRES: no thread is inside a method of this object.
  ~DataPlane();

  // Hands `handoff` (its ticket reserved and not yet submitted, failed or
  // cancelled) with `status` to the submitter thread, which does what
  // HandOff says; a failure there (no room in time, the daemon gone, the
  // submitter stopped: CANCELLED) becomes the ticket's result, so whoever
  // waits for it learns of it. Never locks, waits or allocates: safe from a
  // CUDA host function. Any number of threads may deliver at once.
  // REQUIRES: StopSubmitter has not been called (deliveries end first).
  void Deliver(std::unique_ptr<HandOff> handoff, absl::Status status);
  // Stops the submitter and joins it, within about kLivenessInterval: the
  // hand-off it is submitting and every one still queued fail with
  // CANCELLED (released ones are released). Idempotent; the destructor
  // calls it. REQUIRES: not called concurrently with itself or Deliver.
  void StopSubmitter() ABSL_LOCKS_EXCLUDED(submit_mu_, mu_);

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
            RingProducer submissions, RingConsumer completions,
            UniqueFd handoff_event);

  // The submitter thread: takes what Deliver queued, in order, until
  // stopping_.
  void SubmitterLoop();
  // Does what `handoff` says (fails it with CANCELLED when stopping_).
  void Carry(HandOff& handoff);
  // The queued hand-offs, oldest first; the queue is empty afterwards.
  std::unique_ptr<HandOff> TakeHandOffs();

  void FailReservedLocked(Ticket ticket, absl::Status error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step of waiting for `ticket` to move on: for a reserved one, on
  // progress_ (its submitter, Cancel or FailReserved signals it); else
  // ProgressLocked.
  void WaitForLocked(Ticket ticket, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (draining when nobody else does) until a request may be
  // submitted; then registers `reserved` (or a new ticket) as in flight.
  // A set `*cancel` (when given) ends the wait with CANCELLED.
  absl::StatusOr<Ticket> AdmitLocked(Ticket reserved, absl::Time deadline,
                                     const std::atomic<bool>* cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_, mu_);
  absl::Status PushLocked(const SubmissionEntry& entry, absl::Time deadline,
                          const std::atomic<bool>* cancel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  absl::StatusOr<Ticket> SubmitAs(Ticket reserved, SubmissionEntry entry,
                                  absl::Duration timeout,
                                  const std::atomic<bool>* cancel = nullptr)
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
  // Why the daemon hung up (ClosedStatusFrom, read once).
  // REQUIRES: PeerGone() was true.
  absl::Status ClosedStatus() const ABSL_LOCKS_EXCLUDED(closed_mu_);

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
  // Why the daemon hung up, once read from the connection (the drainer
  // and a submitter may both find it gone).
  mutable absl::Mutex closed_mu_;
  mutable std::optional<absl::Status> closed_ ABSL_GUARDED_BY(closed_mu_);

  // The submitter's queue: a lock-free stack Deliver pushes on (newest
  // first) and the submitter empties at once; the eventfd counts pushes.
  std::atomic<HandOff*> handoffs_{nullptr};
  UniqueFd handoff_event_;
  std::atomic<bool> stopping_{false};
  std::thread submitter_;  // last: started once the rest is built
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_DATA_PLANE_H_
