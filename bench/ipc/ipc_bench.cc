// Data-plane micro-benchmarks, each beside its baseline in the same run:
//  1. round-trip latency between two processes: a request on one ring and a
//     reply on another (with the futex doorbell, and busy-polling), beside
//     eventfd and pipe ping-pong;
//  2. copy throughput into a SharedArena (memfd, MAP_SHARED, mlocked) beside
//     memcpy between two private buffers;
//  3. requests per second through the client's DataPlane (client/
//     data_plane.h: tickets, one drainer, futex doorbells) against an echo
//     server in another process that serves the rings the way lohand's job
//     session does, with N requests in flight (a sliding window: submit,
//     and once N are out wait for the oldest) beside one at a time (Call).
//
//   bazel run //bench/ipc:ipc_bench -- [--round_trips=N]
//       [--copy_mib=M] [--reps=R] [--requests=N]

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/data_plane.h"
#include "daemon/pool/shared_arena.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"
#include "wire/unique_fd.h"

namespace lohan {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int round_trips = 100000;
  int copy_mib = 64;
  int reps = 15;
  int requests = 200000;
};

struct Latency {
  double p50_us = 0, p99_us = 0, mean_us = 0;
};

Latency Summarise(std::vector<double> samples_ns) {
  std::sort(samples_ns.begin(), samples_ns.end());
  Latency result;
  if (samples_ns.empty()) return result;
  double sum = 0;
  for (double s : samples_ns) sum += s;
  result.mean_us = sum / samples_ns.size() / 1000;
  result.p50_us = samples_ns[samples_ns.size() / 2] / 1000;
  result.p99_us = samples_ns[samples_ns.size() * 99 / 100] / 1000;
  return result;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ipc_bench: %s\n", what.c_str());
  std::exit(1);
}

// Forks `echo` (the server side), runs `ping` count times in the parent,
// timing each call. `echo` must answer count + warmup pings then return.
Latency PingPong(int count, const std::function<void(int)>& echo,
                 const std::function<void()>& ping) {
  constexpr int kWarmup = 1000;
  const pid_t child = fork();
  if (child < 0) Die("fork failed");
  if (child == 0) {
    echo(count + kWarmup);
    _exit(0);
  }
  for (int i = 0; i < kWarmup; ++i) ping();
  std::vector<double> samples(count);
  for (int i = 0; i < count; ++i) {
    const auto start = Clock::now();
    ping();
    samples[i] =
        std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("echo side failed");
  return Summarise(std::move(samples));
}

// MAP_SHARED anonymous memory for two rings, shared across fork.
class RingPair {
 public:
  RingPair() {
    ring_bytes_ = RingBytes(64, kRingEntryBytes);
    bytes_ = 2 * ((ring_bytes_ + 4095) & ~size_t{4095});
    void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) Die("mmap");
    base_ = static_cast<uint8_t*>(base);
    if (!FormatRing(request(), ring_bytes_, 64, kRingEntryBytes).ok() ||
        !FormatRing(reply(), ring_bytes_, 64, kRingEntryBytes).ok()) {
      Die("FormatRing");
    }
  }
  ~RingPair() { munmap(base_, bytes_); }
  RingPair(const RingPair&) = delete;
  RingPair& operator=(const RingPair&) = delete;
  void* request() { return base_; }
  void* reply() { return base_ + bytes_ / 2; }
  size_t ring_bytes() const { return ring_bytes_; }

 private:
  uint8_t* base_;
  size_t bytes_;
  size_t ring_bytes_;
};

// Pops one entry; sleeps on the doorbell if `doorbell`, else spins.
void Pop(RingConsumer& consumer, SubmissionEntry* entry, bool doorbell) {
  while (true) {
    absl::StatusOr<bool> popped = consumer.TryPop(entry);
    if (!popped.ok()) Die(popped.status().ToString());
    if (*popped) return;
    if (doorbell) {
      absl::Status waited = consumer.WaitForEntries(absl::Seconds(30));
      if (!waited.ok()) Die(waited.ToString());
    }
  }
}

void Push(RingProducer& producer, const SubmissionEntry& entry) {
  absl::StatusOr<bool> pushed = producer.TryPush(&entry);
  if (!pushed.ok() || !*pushed) Die("push failed");  // never full: ping-pong
}

Latency RingRoundTrip(int count, bool doorbell) {
  RingPair rings;
  auto echo = [&](int n) {
    auto requests =
        RingConsumer::Attach(rings.request(), rings.ring_bytes(), 64);
    auto replies = RingProducer::Attach(rings.reply(), rings.ring_bytes(), 64);
    if (!requests.ok() || !replies.ok()) _exit(2);
    SubmissionEntry entry;
    for (int i = 0; i < n; ++i) {
      Pop(*requests, &entry, doorbell);
      Push(*replies, entry);
    }
  };
  auto requests = RingProducer::Attach(rings.request(), rings.ring_bytes(), 64);
  auto replies = RingConsumer::Attach(rings.reply(), rings.ring_bytes(), 64);
  if (!requests.ok() || !replies.ok()) Die("attach");
  uint64_t id = 0;
  auto ping = [&] {
    SubmissionEntry entry{};
    entry.request_id = ++id;
    Push(*requests, entry);
    Pop(*replies, &entry, doorbell);
    if (entry.request_id != id) Die("reply out of order");
  };
  return PingPong(count, echo, ping);
}

Latency EventfdRoundTrip(int count) {
  UniqueFd to_server(eventfd(0, EFD_CLOEXEC)),
      to_client(eventfd(0, EFD_CLOEXEC));
  auto echo = [&](int n) {
    uint64_t value;
    for (int i = 0; i < n; ++i) {
      if (read(to_server.get(), &value, 8) != 8) _exit(2);
      if (write(to_client.get(), &value, 8) != 8) _exit(3);
    }
  };
  auto ping = [&] {
    uint64_t value = 1;
    if (write(to_server.get(), &value, 8) != 8) Die("eventfd write");
    if (read(to_client.get(), &value, 8) != 8) Die("eventfd read");
  };
  return PingPong(count, echo, ping);
}

Latency PipeRoundTrip(int count) {
  int a[2], b[2];
  if (pipe2(a, O_CLOEXEC) != 0 || pipe2(b, O_CLOEXEC) != 0) Die("pipe");
  UniqueFd a_read(a[0]), a_write(a[1]), b_read(b[0]), b_write(b[1]);
  auto echo = [&](int n) {
    char byte;
    for (int i = 0; i < n; ++i) {
      if (read(a_read.get(), &byte, 1) != 1) _exit(2);
      if (write(b_write.get(), &byte, 1) != 1) _exit(3);
    }
  };
  auto ping = [&] {
    char byte = 'x';
    if (write(a_write.get(), &byte, 1) != 1) Die("pipe write");
    if (read(b_read.get(), &byte, 1) != 1) Die("pipe read");
  };
  return PingPong(count, echo, ping);
}

double MedianGBps(std::vector<double> gbps) {
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

double CopyGBps(uint8_t* to, const uint8_t* from, size_t bytes) {
  const auto start = Clock::now();
  std::memcpy(to, from, bytes);
  // Keep the copy observable.
  asm volatile("" : : "r"(to) : "memory");
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  return bytes / seconds / 1e9;
}

// One job's rings as lohand lays them out (1024 entries each) in a memfd
// arena; the child process serves them like JobSession::Serve (pop, or
// sleep on the doorbell; answer each entry with a completion of the same
// request id), the parent drives a DataPlane over them. Returns requests
// per second with `depth` requests kept in flight (1: Call, one at a time).
double DataPlaneRequestsPerSecond(int requests, int depth) {
  constexpr uint32_t kCapacity = 1024;
  constexpr uint64_t kArena = 1 << 20;
  constexpr int kWarmup = 2000;
  UniqueFd memory(memfd_create("ipc-bench-plane", MFD_CLOEXEC));
  if (!memory || ftruncate(memory.get(), kArena) != 0) Die("memfd");
  ArenaGrant grant;
  grant.arena_bytes = kArena;
  grant.submission_offset = 0;
  grant.submission_bytes = RingBytes(kCapacity, kRingEntryBytes);
  grant.completion_offset = kArena / 2;
  grant.completion_bytes = grant.submission_bytes;
  auto map = [&] {
    void* mapped = mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_SHARED,
                        memory.get(), 0);
    if (mapped == MAP_FAILED) Die("mmap");
    return static_cast<uint8_t*>(mapped);
  };
  uint8_t* server_view = map();
  if (!FormatRing(server_view + grant.submission_offset, grant.submission_bytes,
                  kCapacity, kRingEntryBytes)
           .ok() ||
      !FormatRing(server_view + grant.completion_offset, grant.completion_bytes,
                  kCapacity, kRingEntryBytes)
           .ok()) {
    Die("FormatRing");
  }
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    Die("socketpair");
  }
  const pid_t child = fork();
  if (child < 0) Die("fork failed");
  if (child == 0) {
    close(ends[1]);
    auto submissions =
        RingConsumer::Attach(server_view + grant.submission_offset,
                             grant.submission_bytes, kRingEntryBytes);
    auto completions =
        RingProducer::Attach(server_view + grant.completion_offset,
                             grant.completion_bytes, kRingEntryBytes);
    if (!submissions.ok() || !completions.ok()) _exit(2);
    SubmissionEntry entry;
    for (int served = 0; served < requests + kWarmup;) {
      absl::StatusOr<bool> popped = submissions->TryPop(&entry);
      if (!popped.ok()) _exit(3);
      if (!*popped) {
        (void)submissions->WaitForEntries(absl::Milliseconds(100));
        continue;
      }
      CompletionEntry completion{};
      completion.request_id = entry.request_id;
      completion.detail = entry.activation_id;
      while (true) {
        absl::StatusOr<bool> pushed = completions->TryPush(&completion);
        if (!pushed.ok()) _exit(4);
        if (*pushed) break;
        (void)completions->WaitForSpace(absl::Milliseconds(100));
      }
      ++served;
    }
    _exit(0);
  }
  close(ends[0]);
  munmap(server_view, kArena);
  auto plane = DataPlane::Adopt(UniqueFd(ends[1]), map(), grant);
  if (!plane.ok()) Die(plane.status().ToString());
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(RingOp::kActFree);
  std::deque<std::pair<DataPlane::Ticket, uint64_t>> window;
  auto finish_oldest = [&] {
    absl::StatusOr<CompletionEntry> done =
        (*plane)->Wait(window.front().first, absl::Seconds(30));
    if (!done.ok() || done->detail != window.front().second) {
      Die("bad completion");
    }
    window.pop_front();
  };
  auto run = [&](int count) {
    for (int i = 0; i < count; ++i) {
      entry.activation_id = i;
      if (depth == 1) {
        absl::StatusOr<CompletionEntry> done =
            (*plane)->Call(entry, absl::Seconds(30));
        if (!done.ok() || done->detail != uint64_t(i)) Die("bad call");
        continue;
      }
      absl::StatusOr<DataPlane::Ticket> ticket =
          (*plane)->Submit(entry, absl::Seconds(30));
      if (!ticket.ok()) Die(ticket.status().ToString());
      window.emplace_back(*ticket, i);
      if (static_cast<int>(window.size()) >= depth) finish_oldest();
    }
    while (!window.empty()) finish_oldest();
  };
  run(kWarmup);
  const auto start = Clock::now();
  run(requests);
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("echo side failed");
  return requests / seconds;
}

void PrintLatency(const char* name, const Latency& l) {
  std::printf("  %-26s p50 %8.2f us   p99 %8.2f us   mean %8.2f us\n", name,
              l.p50_us, l.p99_us, l.mean_us);
}

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name, int* out) {
      const std::string prefix = absl::StrCat("--", name, "=");
      if (arg.rfind(prefix, 0) != 0) return false;
      if (!absl::SimpleAtoi(arg.substr(prefix.size()), out) || *out <= 0) {
        Die(absl::StrCat("bad ", arg));
      }
      return true;
    };
    if (!value("round_trips", &flags.round_trips) &&
        !value("copy_mib", &flags.copy_mib) && !value("reps", &flags.reps) &&
        !value("requests", &flags.requests)) {
      Die(absl::StrCat("unknown flag ", arg));
    }
  }

  utsname host{};
  uname(&host);
  std::printf(
      "ipc_bench: %s %s, %ld CPUs online, round_trips=%d copy_mib=%d "
      "reps=%d requests=%d\n",
      host.nodename, host.release, sysconf(_SC_NPROCESSORS_ONLN),
      flags.round_trips, flags.copy_mib, flags.reps, flags.requests);

  std::printf("\nround trip between two processes (64-byte message):\n");
  const Latency ring = RingRoundTrip(flags.round_trips, /*doorbell=*/true);
  const Latency spin = RingRoundTrip(flags.round_trips, /*doorbell=*/false);
  const Latency efd = EventfdRoundTrip(flags.round_trips);
  const Latency pipe = PipeRoundTrip(flags.round_trips);
  PrintLatency("ring + futex doorbell", ring);
  PrintLatency("ring, busy-poll", spin);
  PrintLatency("eventfd ping-pong", efd);
  PrintLatency("pipe ping-pong", pipe);
  std::printf(
      "  ratio p50: ring/eventfd %.2f, ring/pipe %.2f, "
      "busy-poll/eventfd %.2f\n",
      ring.p50_us / efd.p50_us, ring.p50_us / pipe.p50_us,
      spin.p50_us / efd.p50_us);
  std::printf("  ratio p99: ring/eventfd %.2f, ring/pipe %.2f\n",
              ring.p99_us / efd.p99_us, ring.p99_us / pipe.p99_us);

  const size_t bytes = size_t{static_cast<size_t>(flags.copy_mib)} << 20;
  SharedArena::Options options;
  options.name = "ipc-bench";
  options.bytes = bytes;
  auto arena = SharedArena::Create(options);
  if (!arena.ok()) Die(arena.status().ToString());
  std::vector<uint8_t> source(bytes, 1), private_target(bytes, 2);
  std::memset((*arena)->base(), 3, bytes);
  std::vector<double> to_arena, from_arena, to_private;
  for (int rep = 0; rep < flags.reps; ++rep) {  // interleaved
    to_arena.push_back(CopyGBps((*arena)->base(), source.data(), bytes));
    to_private.push_back(CopyGBps(private_target.data(), source.data(), bytes));
    from_arena.push_back(
        CopyGBps(private_target.data(), (*arena)->base(), bytes));
  }
  const double arena_in = MedianGBps(to_arena);
  const double arena_out = MedianGBps(from_arena);
  const double plain = MedianGBps(to_private);
  std::printf("\nmemcpy of %d MiB, median of %d (arena: %s, %s):\n",
              flags.copy_mib, flags.reps,
              (*arena)->huge_pages() ? "huge pages" : "4 KiB pages",
              (*arena)->locked() ? "mlocked" : "not locked");
  std::printf("  private -> arena            %8.2f GB/s\n", arena_in);
  std::printf("  arena -> private            %8.2f GB/s\n", arena_out);
  std::printf("  private -> private          %8.2f GB/s\n", plain);
  std::printf(
      "  ratio: into arena / private %.2f, out of arena / private "
      "%.2f\n",
      arena_in / plain, arena_out / plain);

  std::printf(
      "\nrequests through DataPlane to an echo server in another process "
      "(%d requests):\n",
      flags.requests);
  const double serial = DataPlaneRequestsPerSecond(flags.requests, 1);
  std::printf("  %-26s %12.0f requests/s\n", "one at a time (Call)", serial);
  for (int depth : {8, 64, 512}) {
    const double rate = DataPlaneRequestsPerSecond(flags.requests, depth);
    std::printf("  %-26s %12.0f requests/s   %.2fx one at a time\n",
                absl::StrCat(depth, " in flight").c_str(), rate, rate / serial);
  }
  return 0;
}

}  // namespace
}  // namespace lohan

int main(int argc, char** argv) { return lohan::Main(argc, argv); }
