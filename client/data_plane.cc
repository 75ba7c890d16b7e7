#include "client/data_plane.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/plane_closing.h"
#include "wire/attach_protocol.h"
#include "wire/errno_status.h"
#include "wire/fd_passing.h"

namespace lohan {
namespace {

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout >= absl::InfiniteDuration()
             ? absl::InfiniteFuture()
             : absl::Now() + std::max(timeout, absl::ZeroDuration());
}

absl::Status SubmitterStopped() {
  return absl::CancelledError(
      "the data plane closed before this request was submitted (it had been "
      "handed to the data plane's submitter, e.g. by a CUDA copy's "
      "callback)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Open(
    const std::string& data_socket_path, const std::string& job_id) {
  if (job_id.empty() || job_id.size() > kMaxAttachJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id must be 1 to ", kMaxAttachJobIdBytes, " characters"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (data_socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data socket path '", data_socket_path, "' is too long"));
  }
  std::memcpy(address.sun_path, data_socket_path.c_str(),
              data_socket_path.size() + 1);
  UniqueFd connection(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!connection) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (connect(connection.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no lohand data plane at ", data_socket_path, ": ",
                     ErrnoToStatus(errno, "connect").message()));
  }
  if (absl::Status sent =
          SendWithFds(connection.get(), EncodeAttachRequest(job_id), {});
      !sent.ok()) {
    return sent;
  }
  absl::StatusOr<FdMessage> reply =
      ReceiveWithFds(connection.get(), kMaxAttachReplyBytes, 0);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<AttachReply> decoded = DecodeAttachReply(reply->payload);
  if (!decoded.ok()) return decoded.status();
  if (!decoded->daemon_status.ok()) return decoded->daemon_status;

  absl::StatusOr<FdMessage> granted =
      ReceiveWithFds(connection.get(), kArenaGrantBytes, 1);
  if (!granted.ok()) return granted.status();
  absl::StatusOr<ArenaGrant> grant = DecodeArenaGrant(granted->payload);
  if (!grant.ok()) return grant.status();
  void* mapped = mmap(nullptr, grant->arena_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, granted->fds[0].get(), 0);
  if (mapped == MAP_FAILED) {
    return ErrnoToStatus(errno,
                         absl::StrCat("mapping the arena of job ", job_id));
  }
  return Adopt(std::move(connection), static_cast<uint8_t*>(mapped), *grant);
}

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Adopt(
    UniqueFd connection, uint8_t* mapping, const ArenaGrant& grant) {
  absl::StatusOr<RingProducer> submissions =
      RingProducer::Attach(mapping + grant.submission_offset,
                           grant.submission_bytes, kRingEntryBytes);
  absl::StatusOr<RingConsumer> completions =
      RingConsumer::Attach(mapping + grant.completion_offset,
                           grant.completion_bytes, kRingEntryBytes);
  if (!submissions.ok() || !completions.ok()) {
    munmap(mapping, grant.arena_bytes);
    return !submissions.ok() ? submissions.status() : completions.status();
  }
  UniqueFd handoff_event(eventfd(0, EFD_CLOEXEC));
  if (!handoff_event) {
    munmap(mapping, grant.arena_bytes);
    return ErrnoToStatus(errno, "eventfd for the data plane's submitter");
  }
  return std::unique_ptr<DataPlane>(new DataPlane(
      std::move(connection), mapping, grant, *std::move(submissions),
      *std::move(completions), std::move(handoff_event)));
}

DataPlane::DataPlane(UniqueFd connection, uint8_t* base, ArenaGrant grant,
                     RingProducer submissions, RingConsumer completions,
                     UniqueFd handoff_event)
    : connection_(std::move(connection)),
      base_(base),
      grant_(grant),
      max_in_flight_(std::min(submissions.geometry().capacity,
                              completions.geometry().capacity)),
      submissions_(std::move(submissions)),
      completions_(std::move(completions)),
      handoff_event_(std::move(handoff_event)),
      submitter_([this] { SubmitterLoop(); }) {}

DataPlane::~DataPlane() {
  StopSubmitter();
  munmap(base_, grant_.arena_bytes);
  connection_.reset();
}

// -------------------------------------------------------------- submitter

void DataPlane::Deliver(std::unique_ptr<HandOff> handoff, absl::Status status) {
  HandOff* node = handoff.release();
  node->status = std::move(status);
  HandOff* head = handoffs_.load(std::memory_order_relaxed);
  do {
    node->next = head;
  } while (!handoffs_.compare_exchange_weak(
      head, node, std::memory_order_release, std::memory_order_relaxed));
  // Never blocks: the counter cannot get near its limit (2^64 - 2).
  const uint64_t one = 1;
  (void)!write(handoff_event_.get(), &one, sizeof(one));
}

std::unique_ptr<DataPlane::HandOff> DataPlane::TakeHandOffs() {
  HandOff* newest = handoffs_.exchange(nullptr, std::memory_order_acquire);
  HandOff* oldest = nullptr;
  while (newest != nullptr) {  // reverse: oldest first
    HandOff* next = newest->next;
    newest->next = oldest;
    oldest = newest;
    newest = next;
  }
  return std::unique_ptr<HandOff>(oldest);
}

void DataPlane::Carry(HandOff& handoff) {
  if (!handoff.submit) {
    Cancel(handoff.ticket);
  } else if (!handoff.status.ok()) {
    FailReserved(handoff.ticket, std::move(handoff.status));
  } else if (stopping_.load(std::memory_order_acquire)) {
    FailReserved(handoff.ticket, SubmitterStopped());
  } else {
    {
      absl::MutexLock lock(&mu_);
      auto it = requests_.find(handoff.ticket);
      if (it == requests_.end() || it->second.state != State::kReserved) {
        return;  // not a reserved ticket: nothing to submit it as
      }
    }
    // A failure is the ticket's result (SubmitAs records it).
    (void)SubmitAs(handoff.ticket, handoff.entry, kHandOffTimeout, &stopping_);
  }
}

void DataPlane::SubmitterLoop() {
  while (true) {
    uint64_t count = 0;
    const ssize_t got = read(handoff_event_.get(), &count, sizeof(count));
    if (got < 0 && errno != EINTR) {
      // Cannot happen on a valid eventfd; do not spin on it.
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::unique_ptr<HandOff> handoff = TakeHandOffs();
    while (handoff != nullptr) {
      Carry(*handoff);
      handoff.reset(std::exchange(handoff->next, nullptr));
    }
    if (stopping_.load(std::memory_order_acquire)) return;
  }
}

void DataPlane::StopSubmitter() {
  if (!submitter_.joinable()) return;
  stopping_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)!write(handoff_event_.get(), &one, sizeof(one));
  {
    // Wakes a submitter waiting for room on progress_: it holds mu_ from
    // its check of stopping_ until it sleeps, so it cannot miss this.
    absl::MutexLock lock(&mu_);
    progress_.SignalAll();
  }
  submitter_.join();
  // Nothing should be left (deliveries end before the stop), but fail
  // whatever is rather than leave its waiter hanging.
  std::unique_ptr<HandOff> handoff = TakeHandOffs();
  while (handoff != nullptr) {
    Carry(*handoff);
    handoff.reset(std::exchange(handoff->next, nullptr));
  }
}

void DataPlane::SetErrorText(uint64_t offset, uint64_t bytes) {
  if (offset <= grant_.arena_bytes && bytes <= grant_.arena_bytes - offset &&
      bytes > sizeof(uint64_t) && offset % alignof(uint64_t) == 0) {
    absl::MutexLock lock(&mu_);
    error_text_ = {offset, bytes};
  }
}

size_t DataPlane::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

size_t DataPlane::outstanding() const {
  absl::MutexLock lock(&mu_);
  return requests_.size();
}

// ------------------------------------------------------------- submitting

absl::StatusOr<DataPlane::Ticket> DataPlane::Submit(SubmissionEntry entry,
                                                    absl::Duration timeout) {
  return SubmitAs(0, entry, timeout);
}

absl::StatusOr<DataPlane::Ticket> DataPlane::Reserve(uint64_t offset,
                                                     uint64_t length,
                                                     absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&mu_);
  while (Ticket user = UsingLocked(offset, offset + length)) {
    if (!gone_.ok()) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", user, " still uses arena bytes [", offset,
                       ", ", offset + length, ")"));
    }
    WaitForLocked(user, deadline);
  }
  if (!gone_.ok()) return gone_;
  if (requests_.size() >= kMaxOutstandingTickets) {
    return absl::ResourceExhaustedError(absl::StrCat(
        requests_.size(), " tickets have not been waited for; wait for them"));
  }
  const Ticket ticket = next_ticket_++;
  Request& request = requests_[ticket];
  request.state = State::kReserved;
  request.begin = offset;
  request.end = offset + length;
  ++reserved_;
  return ticket;
}

absl::Status DataPlane::SubmitReserved(Ticket ticket, SubmissionEntry entry,
                                       absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(ticket);
    if (it == requests_.end() || it->second.state != State::kReserved) {
      return absl::InvalidArgumentError(
          absl::StrCat("ticket ", ticket, " is not a reserved ticket"));
    }
  }
  return SubmitAs(ticket, entry, timeout).status();
}

void DataPlane::Cancel(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end() || it->second.state != State::kReserved) return;
  requests_.erase(it);
  --reserved_;
  progress_.SignalAll();
}

void DataPlane::FailReserved(Ticket ticket, absl::Status error) {
  absl::MutexLock lock(&mu_);
  FailReservedLocked(ticket, std::move(error));
}

void DataPlane::FailReservedLocked(Ticket ticket, absl::Status error) {
  auto it = requests_.find(ticket);
  if (it == requests_.end() || it->second.state != State::kReserved) return;
  --reserved_;
  if (it->second.abandoned) {
    requests_.erase(it);
  } else {
    it->second.state = State::kDone;
    it->second.result = std::move(error);
  }
  progress_.SignalAll();
}

absl::StatusOr<DataPlane::Ticket> DataPlane::AdmitLocked(
    Ticket reserved, absl::Time deadline, const std::atomic<bool>* cancel) {
  if (reserved == 0 && requests_.size() >= kMaxOutstandingTickets) {
    return absl::ResourceExhaustedError(absl::StrCat(
        requests_.size(), " tickets have not been waited for; wait for them"));
  }
  while (true) {
    if (!gone_.ok()) return gone_;
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return SubmitterStopped();
    }
    if (in_flight_ < max_in_flight_) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(in_flight_,
                       " requests in flight (the most the rings hold) and "
                       "none completed in time"));
    }
    ProgressLocked(deadline);
  }
  Ticket ticket = reserved;
  if (ticket == 0) {
    ticket = next_ticket_++;
    requests_[ticket].state = State::kSubmitted;
  } else {
    requests_[ticket].state = State::kSubmitted;
    --reserved_;
  }
  ++in_flight_;
  return ticket;
}

absl::Status DataPlane::PushLocked(const SubmissionEntry& entry,
                                   absl::Time deadline,
                                   const std::atomic<bool>* cancel) {
  while (true) {
    absl::StatusOr<bool> pushed = submissions_.TryPush(&entry);
    if (!pushed.ok()) return pushed.status();
    if (*pushed) return absl::OkStatus();
    // Cannot happen with a well-behaved daemon (we never have more in
    // flight than the ring holds), but a stuck one must not hang us.
    if (PeerGone()) return ClosedStatus();
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return SubmitterStopped();
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "the submission ring stayed full: the daemon is not reading it");
    }
    absl::Status waited =
        submissions_.WaitForSpace(std::min(left, kLivenessInterval));
    if (!waited.ok() && !absl::IsDeadlineExceeded(waited)) return waited;
  }
}

absl::StatusOr<DataPlane::Ticket> DataPlane::SubmitAs(
    Ticket reserved, SubmissionEntry entry, absl::Duration timeout,
    const std::atomic<bool>* cancel) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock submit_lock(&submit_mu_);
  Ticket ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Ticket> admitted = AdmitLocked(reserved, deadline, cancel);
    if (!admitted.ok()) {
      // The failure is the reserved ticket's result.
      if (reserved != 0) FailReservedLocked(reserved, admitted.status());
      return admitted.status();
    }
    ticket = *admitted;
    Request& request = requests_[ticket];
    request.begin = entry.slot_offset;
    request.end = entry.slot_offset + entry.length;
  }
  entry.request_id = ticket;
  absl::Status pushed = PushLocked(entry, deadline, cancel);
  absl::MutexLock lock(&mu_);
  if (!pushed.ok()) {
    // It never reached the daemon.
    auto it = requests_.find(ticket);
    if (it != requests_.end()) {
      if (it->second.state == State::kSubmitted) --in_flight_;
      if (reserved == 0 || it->second.abandoned) {
        requests_.erase(it);
      } else if (it->second.state == State::kSubmitted) {
        it->second.state = State::kDone;
        it->second.result = pushed;
      }
    }
    progress_.SignalAll();
    return pushed;
  }
  progress_.SignalAll();
  return ticket;
}

// ---------------------------------------------------------------- draining

void DataPlane::WaitForLocked(Ticket ticket, absl::Time deadline) {
  auto it = requests_.find(ticket);
  if (it != requests_.end() && it->second.state == State::kReserved) {
    // Only SubmitReserved, Cancel or FailReserved moves it on, and they
    // signal progress_: draining would sleep on the completion ring instead
    // and notice only at its next wake-up.
    progress_.WaitWithDeadline(&mu_, deadline);
    return;
  }
  ProgressLocked(deadline);
}

void DataPlane::ProgressLocked(absl::Time deadline) {
  if (!draining_ && in_flight_ > 0) {
    DrainLocked(deadline);
    return;
  }
  progress_.WaitWithDeadline(&mu_, deadline);
}

void DataPlane::DrainLocked(absl::Time deadline) {
  draining_ = true;
  const ErrorText text = error_text_;
  mu_.Unlock();
  std::vector<std::pair<CompletionEntry, absl::Status>> batch;
  absl::Status failure;
  auto pop_all = [&] {
    CompletionEntry completion;
    while (failure.ok()) {
      absl::StatusOr<bool> popped = completions_.TryPop(&completion);
      if (!popped.ok()) {
        failure = popped.status();
        return;
      }
      if (!*popped) return;
      // The text now: a later failure may reuse its record.
      batch.emplace_back(completion, StatusOf(completion, text));
    }
  };
  pop_all();
  if (batch.empty() && failure.ok()) {
    const absl::Duration left =
        std::min(deadline - absl::Now(), kLivenessInterval);
    if (left > absl::ZeroDuration()) {
      absl::Status waited = completions_.WaitForEntries(left);
      if (!waited.ok() && !absl::IsDeadlineExceeded(waited)) {
        failure = waited;
      } else {
        pop_all();
      }
    }
    if (batch.empty() && failure.ok() && PeerGone()) {
      pop_all();  // whatever it completed before it went
      if (failure.ok()) failure = ClosedStatus();
    }
  }
  mu_.Lock();
  for (auto& [completion, status] : batch) {
    RecordLocked(completion, std::move(status));
  }
  if (!failure.ok()) FailInFlightLocked(failure);
  draining_ = false;
  progress_.SignalAll();
}

void DataPlane::RecordLocked(const CompletionEntry& completion,
                             absl::Status status) {
  auto it = requests_.find(completion.request_id);
  // A completion for nothing we have in flight: a confused daemon. Ignored;
  // the request it should have answered still times out or is answered.
  if (it == requests_.end() || it->second.state != State::kSubmitted) return;
  --in_flight_;
  if (it->second.abandoned) {
    requests_.erase(it);
    return;
  }
  it->second.state = State::kDone;
  if (status.ok()) {
    it->second.result = completion;
  } else {
    it->second.result = std::move(status);
  }
}

void DataPlane::FailInFlightLocked(const absl::Status& why) {
  if (gone_.ok()) gone_ = why;
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& request = it->second;
    if (request.state == State::kSubmitted) {
      if (request.abandoned) {
        requests_.erase(it++);
        continue;
      }
      request.state = State::kDone;
      request.result = why;
    }
    ++it;
  }
  in_flight_ = 0;
}

absl::Status DataPlane::StatusOf(const CompletionEntry& completion,
                                 const ErrorText& text) const {
  if (completion.status_code == 0) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(
      completion.status_code <= 16 ? completion.status_code : 2);
  if (text.bytes == 0) return absl::Status(code, "(no text)");
  // Reads the record at `at` (bytes into the area), `bytes` long; false
  // unless it holds this completion's text, untorn.
  auto read = [&](uint64_t at, uint64_t bytes, std::string* out) {
    uint8_t* record = base_ + text.offset + at;
    std::atomic_ref<uint64_t> sequence(*reinterpret_cast<uint64_t*>(record));
    if (sequence.load(std::memory_order_acquire) != completion.detail) {
      return false;
    }
    const char* message =
        reinterpret_cast<const char*>(record + sizeof(uint64_t));
    std::string copy(message, strnlen(message, bytes - sizeof(uint64_t)));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (sequence.load(std::memory_order_relaxed) != completion.detail) {
      return false;
    }
    *out = std::move(copy);
    return true;
  };
  const uint64_t records =
      std::max<uint64_t>(1, text.bytes / kErrorTextRecordBytes);
  std::string message;
  if (records > 1 && completion.detail >= 1 &&
      read((completion.detail - 1) % records * kErrorTextRecordBytes,
           kErrorTextRecordBytes, &message)) {
    return absl::Status(code, message);
  }
  // One record over the whole area: a daemon from before records.
  if (read(0, text.bytes, &message)) return absl::Status(code, message);
  return absl::Status(
      code, absl::StrCat("(the daemon's text for this failure was overwritten: "
                         "more than ",
                         records,
                         " requests failed before it was read; the status "
                         "code stands)"));
}

bool DataPlane::PeerGone() const {
  if (!connection_) return false;  // nothing to watch (a test's plane)
  pollfd watched{connection_.get(), POLLIN | POLLRDHUP, 0};
  if (poll(&watched, 1, 0) <= 0) return false;
  if ((watched.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0) {
    return true;
  }
  if ((watched.revents & POLLIN) != 0) {
    char byte;
    return recv(connection_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

absl::Status DataPlane::ClosedStatus() const {
  absl::MutexLock lock(&closed_mu_);
  if (!closed_.has_value()) closed_ = ClosedStatusFrom(connection_.get());
  return *closed_;
}

// ----------------------------------------------------------------- waiting

absl::Status DataPlane::BadTicketLocked(Ticket ticket) const {
  if (ticket == 0 || ticket >= next_ticket_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ticket ", ticket, " was never issued by this data plane"));
  }
  return absl::NotFoundError(
      absl::StrCat("ticket ", ticket,
                   " was already waited for (a ticket's result is delivered "
                   "once) or abandoned"));
}

absl::StatusOr<CompletionEntry> DataPlane::Wait(Ticket ticket,
                                                absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = requests_.find(ticket);
    if (it == requests_.end() || it->second.abandoned) {
      return BadTicketLocked(ticket);
    }
    if (it->second.state == State::kDone) {
      absl::StatusOr<CompletionEntry> result = std::move(it->second.result);
      requests_.erase(it);
      return result;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "request ", ticket, " has not completed in ",
          absl::FormatDuration(timeout), "; it is still ",
          it->second.state == State::kReserved ? "waiting to be submitted"
                                               : "in flight",
          " (wait again)"));
    }
    WaitForLocked(ticket, deadline);
  }
}

absl::StatusOr<bool> DataPlane::Poll(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end() || it->second.abandoned) {
    return BadTicketLocked(ticket);
  }
  if (it->second.state == State::kDone) return true;
  if (it->second.state == State::kSubmitted && !draining_) {
    DrainLocked(absl::Now());  // reads what is there, does not wait
    it = requests_.find(ticket);
    if (it == requests_.end()) return BadTicketLocked(ticket);
  }
  return it->second.state == State::kDone;
}

void DataPlane::Abandon(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end()) return;
  if (it->second.state == State::kDone) {
    requests_.erase(it);
  } else {
    it->second.abandoned = true;
  }
}

absl::Status DataPlane::WaitForReserved(absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&mu_);
  while (reserved_ > 0) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(reserved_,
                       " requests are still waiting to be submitted (e.g. "
                       "their device copies have not finished)"));
    }
    // Drain meanwhile: a reserved ticket's submission may be waiting for
    // room in flight.
    ProgressLocked(deadline);
  }
  return absl::OkStatus();
}

DataPlane::Ticket DataPlane::UsingLocked(uint64_t begin, uint64_t end) const {
  if (begin >= end) return 0;
  for (const auto& [ticket, request] : requests_) {
    if (request.state != State::kDone && request.begin < end &&
        begin < request.end) {
      return ticket;
    }
  }
  return 0;
}

absl::Status DataPlane::WaitForRange(uint64_t offset, uint64_t length,
                                     absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&mu_);
  while (Ticket user = UsingLocked(offset, offset + length)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", user, " still uses arena bytes [", offset,
                       ", ", offset + length, ")"));
    }
    WaitForLocked(user, deadline);
  }
  return absl::OkStatus();
}

absl::StatusOr<CompletionEntry> DataPlane::Call(SubmissionEntry entry,
                                                absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::StatusOr<Ticket> ticket = Submit(entry, timeout);
  if (!ticket.ok()) return ticket.status();
  absl::StatusOr<CompletionEntry> completion =
      Wait(*ticket, deadline - absl::Now());
  if (!completion.ok() && absl::IsDeadlineExceeded(completion.status())) {
    Abandon(*ticket);  // no-op when it was the daemon's own answer
  }
  return completion;
}

}  // namespace lohan
