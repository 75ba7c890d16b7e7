// The data plane through a real daemon: a process attached to its job gets
// the job's shared-memory arena over the data socket; nobody else does; the
// arena goes back to the pool when the process closes it or dies.
#include "client/data_plane.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"
#include "wire/attach_protocol.h"
#include "wire/fd_passing.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kArenaBytes = 8 << 20;

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    EXPECT_EQ(client_->hello().data_socket_path(), daemon_->socket() + ".data");
    job_id_ = CreateJob("with-arena", kArenaBytes);
  }

  std::string CreateJob(const std::string& name, uint64_t pool_bytes) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_host_pool_bytes(pool_bytes);
    auto job = client_->CreateJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  RunResult CClient(const std::vector<std::string>& args,
                    const std::vector<std::string>& prefix = {},
                    const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = prefix;
    argv.push_back(binary_);
    argv.push_back(daemon_->socket());
    for (const std::string& arg : args) argv.push_back(arg);
    return RunCommand(argv, env);
  }

  v1::PoolStatus Pool() {
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? status->pool() : v1::PoolStatus();
  }

  // The daemon frees an arena when it sees the connection close: shortly
  // after, not at once.
  bool PoolDrains() {
    for (int i = 0; i < 3000; ++i) {
      if (Pool().used_bytes() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Attaches the job, opens its plane and registers a one-layer model with
  // an activation area; the registration's answer in *registered.
  std::unique_ptr<DataPlane> OpenWithModel(
      v1::RegisterModelResponse* registered) {
    EXPECT_TRUE(client_->AttachJob(job_id_).ok());
    auto plane = DataPlane::Open(client_->hello().data_socket_path(), job_id_);
    EXPECT_TRUE(plane.ok()) << plane.status();
    if (!plane.ok()) return nullptr;
    v1::RegisterModelRequest request;
    request.set_job_id(job_id_);
    request.mutable_model()->add_layer_elements(256);
    request.mutable_model()->set_dtype(v1::DTYPE_FP32);
    request.mutable_model()->mutable_adam()->set_lr(1e-3);
    request.mutable_model()->mutable_adam()->set_beta1(0.9);
    request.mutable_model()->mutable_adam()->set_beta2(0.999);
    request.mutable_model()->set_activation_bytes(64 << 10);
    auto answer = client_->RegisterModel(request);
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (!answer.ok()) return nullptr;
    *registered = *answer;
    (*plane)->SetErrorText(answer->error_text_offset(),
                           answer->error_text_bytes());
    return *std::move(plane);
  }

  // SIGSTOPs the daemon and waits until it is stopped ("T" in
  // /proc/PID/stat): SIGSTOP takes effect asynchronously.
  bool FreezeDaemon() {
    if (kill(daemon_->pid(), SIGSTOP) != 0) return false;
    for (int i = 0; i < 2000; ++i) {
      std::ifstream stat("/proc/" + std::to_string(daemon_->pid()) + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() &&
          line[paren + 2] == 'T') {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // What a CUDA copy's callback does: hands a reserved ticket's entry to
  // the plane's submitter.
  static absl::StatusOr<DataPlane::Ticket> ReserveAndDeliver(
      DataPlane& plane, const SubmissionEntry& entry,
      absl::Status copied = absl::OkStatus(), bool submit = true) {
    auto ticket = plane.Reserve();
    if (!ticket.ok()) return ticket.status();
    auto handoff = std::make_unique<DataPlane::HandOff>();
    handoff->ticket = *ticket;
    handoff->submit = submit;
    handoff->entry = entry;
    plane.Deliver(std::move(handoff), std::move(copied));
    return *ticket;
  }

  // Waits until `plane` has as many requests in flight as the rings hold.
  static bool RingsFull(DataPlane& plane) {
    for (int i = 0; i < 10000; ++i) {
      if (plane.in_flight() == plane.max_in_flight()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
  std::string job_id_;
  std::string binary_ = Runfile("tests/c_client/lohan_c_client");
};

TEST_F(DataPlaneTest, AttachedProcessGetsTheArenaThenGivesItBack) {
  RunResult result = CClient({"arena", job_id_});
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_THAT(result.out, HasSubstr("arena: 8388608 bytes"));
  EXPECT_TRUE(PoolDrains()) << daemon_->Log();
  EXPECT_EQ(Pool().capacity_bytes(), 64u << 20);
  // Again: the arena can be had as often as the job is attached.
  EXPECT_EQ(CClient({"arena", job_id_}).exit_code, 0);
}

TEST_F(DataPlaneTest, DeadClientsArenaIsFreedAndTheJobReattaches) {
  auto holder = BackgroundProcess::Start(
      {binary_, daemon_->socket(), "arena-hold", job_id_});
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_THAT((*holder)->first_line(), HasSubstr("arena: 8388608 bytes"));
  v1::PoolStatus pool = Pool();
  EXPECT_EQ(pool.used_bytes(), kArenaBytes);
  ASSERT_EQ(pool.arenas_size(), 1);
  EXPECT_EQ(pool.arenas(0).job_id(), job_id_);
  // While it holds the job, nobody else gets the arena.
  RunResult second = CClient({"arena", job_id_});
  EXPECT_EQ(second.exit_code, 9) << second.out;  // FAILED_PRECONDITION
  EXPECT_THAT(second.out, HasSubstr("is attached by process"));

  EXPECT_EQ((*holder)->Stop(SIGKILL), 128 + SIGKILL);
  EXPECT_TRUE(PoolDrains()) << daemon_->Log();
  EXPECT_THAT(daemon_->Log(),
              HasSubstr("data plane closed for job " + job_id_));
  RunResult again = CClient({"arena", job_id_});
  EXPECT_EQ(again.exit_code, 0) << again.out;
}

TEST_F(DataPlaneTest, ProcessThatDidNotAttachIsRefused) {
  RunResult result = CClient({"arena-only", job_id_});
  EXPECT_EQ(result.exit_code, 9) << result.out;
  EXPECT_THAT(result.out, HasSubstr("attach it (AttachJob) from this process"));
  EXPECT_EQ(Pool().used_bytes(), 0u);
}

TEST_F(DataPlaneTest, AnotherUidCannotObtainTheArena) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as nobody";
  const std::string bin = dir_.path() + "/bin";
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  ASSERT_EQ(RunCommand(
                {"/bin/cp", binary_, Runfile("client/liblohan_client.so"), bin})
                .exit_code,
            0);
  binary_ = bin + "/lohan_c_client";
  const std::vector<std::string> as_nobody = {
      "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  const std::vector<std::string> env = {"LD_LIBRARY_PATH=" + bin};
  // Neither through the front door (attach) nor around it.
  for (const char* command : {"arena", "arena-only"}) {
    RunResult result = CClient({command, job_id_}, as_nobody, env);
    EXPECT_EQ(result.exit_code, 5) << command << ": " << result.out;
    EXPECT_THAT(result.out, HasSubstr("no job '" + job_id_ + "' of yours"));
  }
  // Not even while root's process holds the arena open.
  auto holder = BackgroundProcess::Start(
      {binary_, daemon_->socket(), "arena-hold", job_id_}, env);
  ASSERT_TRUE(holder.ok()) << holder.status();
  RunResult result = CClient({"arena-only", job_id_}, as_nobody, env);
  EXPECT_EQ(result.exit_code, 5) << result.out;
  EXPECT_EQ(Pool().used_bytes(), kArenaBytes);
}

TEST_F(DataPlaneTest, JobWithoutPoolBytesGetsAClearError) {
  const std::string tiny = CreateJob("no-pool", 0);
  RunResult result = CClient({"arena", tiny});
  EXPECT_EQ(result.exit_code, 8) << result.out;  // RESOURCE_EXHAUSTED
  EXPECT_THAT(result.out, HasSubstr("needs at least"));
}

TEST_F(DataPlaneTest, MalformedAndSilentPeersHurtNobody) {
  auto connect_data = [&]() {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s.data",
                  daemon_->socket().c_str());
    EXPECT_EQ(
        connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  };
  // A silent peer stays connected while others are served.
  int silent = connect_data();
  // A peer sending a well-framed but wrong request gets INVALID_ARGUMENT.
  int wrong = connect_data();
  std::vector<uint8_t> request = EncodeAttachRequest(job_id_);
  request[0] ^= 0xff;
  ASSERT_TRUE(SendWithFds(wrong, request, {}).ok());
  auto reply = ReceiveWithFds(wrong, kMaxAttachReplyBytes, 0);
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto decoded = DecodeAttachReply(reply->payload);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->daemon_status.code(), absl::StatusCode::kInvalidArgument);
  close(wrong);
  // A peer sending raw junk is dropped.
  int junk = connect_data();
  std::string bytes(4096, '\x5a');
  EXPECT_GT(write(junk, bytes.data(), bytes.size()), 0);
  close(junk);

  RunResult result = CClient({"arena", job_id_});
  EXPECT_EQ(result.exit_code, 0) << result.out << daemon_->Log();
  close(silent);
  EXPECT_TRUE(PoolDrains());
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->Log();
  struct stat info {};
  EXPECT_NE(stat((daemon_->socket() + ".data").c_str(), &info), 0);
}

TEST_F(DataPlaneTest, DaemonStopsCleanlyWithAnArenaHeld) {
  auto holder = BackgroundProcess::Start(
      {binary_, daemon_->socket(), "arena-hold", job_id_});
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->Log();
  EXPECT_THAT(daemon_->Log(), HasSubstr("data plane closed for job"));
}

TEST_F(DataPlaneTest, DaemonKilledWhileRequestsWaitFailsThemInsteadOfHanging) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  SubmissionEntry put{};
  put.op = static_cast<uint16_t>(RingOp::kActPut);
  put.activation_id = 1;
  put.slot_offset = registered.activation_offset();
  put.length = 4096;
  ASSERT_TRUE(plane->Call(put, absl::Seconds(30)).ok());

  // The daemon freezes with requests in flight and waiters on them...
  ASSERT_TRUE(FreezeDaemon()) << "lohand did not stop";
  SubmissionEntry get = put;
  get.op = static_cast<uint16_t>(RingOp::kActGet);
  std::vector<DataPlane::Ticket> tickets;
  for (int i = 0; i < 3; ++i) {
    auto ticket = plane->Submit(get, absl::Seconds(30));
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  std::vector<absl::Status> results(tickets.size());
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < tickets.size(); ++i) {
    waiters.emplace_back([&, i] {
      results[i] = plane->Wait(tickets[i], absl::InfiniteDuration()).status();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // ...and dies.
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon_->Stop(SIGKILL), 128 + SIGKILL);
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - killed,
            std::chrono::seconds(10));
  for (const absl::Status& result : results) {
    EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
    EXPECT_THAT(result.message(), HasSubstr("lohand closed"));
  }
  auto after = plane->Submit(get, absl::Seconds(30));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
}

// lohand stopping (SIGTERM) tells the process why its plane closed: its
// next request fails UNAVAILABLE saying lohand is stopping, not that it
// was lost.
TEST_F(DataPlaneTest, LohandStoppingIsToldToTheClient) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  SubmissionEntry committed{};
  committed.op = static_cast<uint16_t>(RingOp::kIterCommitted);
  ASSERT_TRUE(plane->Call(committed, absl::Seconds(30)).ok());
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << daemon_->Log();
  const absl::Status after = plane->Call(committed, absl::Seconds(30)).status();
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_THAT(after.message(), HasSubstr("lohand is stopping"));
  EXPECT_THAT(after.message(), HasSubstr("the job keeps iteration 0"));
}

// A drain by the job's owner (here root) is told the same way: ABORTED,
// naming who stopped it.
TEST_F(DataPlaneTest, ADrainIsToldToTheClient) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  auto outcome = client_->StopJob(job_id_, /*drain=*/true);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_THAT(*outcome, HasSubstr("drained between iterations at 0"));
  ASSERT_TRUE(PoolDrains()) << daemon_->Log();  // the plane is closed
  SubmissionEntry committed{};
  committed.op = static_cast<uint16_t>(RingOp::kIterCommitted);
  const absl::Status after = plane->Call(committed, absl::Seconds(30)).status();
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(after.message(),
              HasSubstr("`lohanctl drain` by uid " + std::to_string(getuid())));
  EXPECT_THAT(after.message(), HasSubstr("the job keeps iteration 0"));
}

// The CUDA callback's path without CUDA: many threads deliver hand-offs at
// once, several times more than the rings hold, each thread an activation's
// PUT, GET and FREE in that order (the daemon refuses a GET or FREE of an
// activation it was not given first, so a reordering shows). Every ticket
// gets the daemon's answer, once.
TEST_F(DataPlaneTest, HandOffsFromManyThreadsAreSubmittedInOrderUnderPressure) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  constexpr int kThreads = 8;
  constexpr int kActivationsEach = 160;  // 3840 requests; the rings hold 1024
  ASSERT_GT(kThreads * kActivationsEach * 3, 3 * plane->max_in_flight());
  std::vector<std::vector<DataPlane::Ticket>> tickets(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kActivationsEach; ++i) {
        SubmissionEntry entry{};
        entry.activation_id = 1 + t * kActivationsEach + i;
        entry.slot_offset = registered.activation_offset() + 256 * (t % 8);
        entry.length = 256;
        for (RingOp op : {RingOp::kActPut, RingOp::kActGet, RingOp::kActFree}) {
          entry.op = static_cast<uint16_t>(op);
          if (op == RingOp::kActFree) entry.slot_offset = entry.length = 0;
          auto ticket = ReserveAndDeliver(*plane, entry);
          if (!ticket.ok()) {
            ++refused;
            continue;
          }
          tickets[t].push_back(*ticket);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(refused.load(), 0);
  std::set<DataPlane::Ticket> seen;
  for (const auto& mine : tickets) {
    for (DataPlane::Ticket ticket : mine) {
      EXPECT_TRUE(seen.insert(ticket).second) << "ticket " << ticket;
      auto completion = plane->Wait(ticket, absl::Seconds(60));
      ASSERT_TRUE(completion.ok()) << completion.status() << daemon_->Log();
      EXPECT_EQ(completion->request_id, ticket);
      EXPECT_EQ(plane->Wait(ticket, absl::ZeroDuration()).status().code(),
                absl::StatusCode::kNotFound);
    }
  }
  EXPECT_EQ(seen.size(), size_t{kThreads} * kActivationsEach * 3);
  EXPECT_EQ(plane->in_flight(), 0u);
  EXPECT_EQ(plane->outstanding(), 0u);

  // A failed copy fails its ticket with the copy's error, sending nothing;
  // a released one frees its ticket.
  SubmissionEntry get{};
  get.op = static_cast<uint16_t>(RingOp::kActGet);
  get.activation_id = 1;
  auto failed = ReserveAndDeliver(*plane, get, absl::InternalError("copy"));
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(plane->Wait(*failed, absl::Seconds(30)).status(),
            absl::InternalError("copy"));
  auto released = ReserveAndDeliver(*plane, get, absl::OkStatus(), false);
  ASSERT_TRUE(released.ok());
  ASSERT_TRUE(plane->WaitForReserved(absl::Seconds(30)).ok());
  EXPECT_EQ(plane->Wait(*released, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);  // released: no result to wait for
  EXPECT_EQ(plane->outstanding(), 0u);
}

// The daemon stops reading; hand-offs beyond what the rings hold queue in
// the submitter. Stopping it does not hang: the queued ones fail with
// CANCELLED, those in flight still get an answer (here: the daemon's
// death).
TEST_F(DataPlaneTest, StoppingTheSubmitterFailsQueuedHandOffsInsteadOfHanging) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(FreezeDaemon()) << "lohand did not stop";
  const size_t kHandOffs = plane->max_in_flight() + 500;
  std::vector<DataPlane::Ticket> tickets;
  for (size_t i = 0; i < kHandOffs; ++i) {
    SubmissionEntry put{};
    put.op = static_cast<uint16_t>(RingOp::kActPut);
    put.activation_id = 1 + i;
    put.slot_offset = registered.activation_offset();
    put.length = 256;
    auto ticket = ReserveAndDeliver(*plane, put);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    tickets.push_back(*ticket);
  }
  ASSERT_TRUE(RingsFull(*plane));
  const auto stopping = std::chrono::steady_clock::now();
  plane->StopSubmitter();
  EXPECT_LT(std::chrono::steady_clock::now() - stopping,
            std::chrono::seconds(5));
  size_t cancelled = 0;
  std::vector<DataPlane::Ticket> in_flight;
  for (DataPlane::Ticket ticket : tickets) {
    absl::Status result = plane->Wait(ticket, absl::ZeroDuration()).status();
    if (absl::IsCancelled(result)) {
      EXPECT_THAT(result.message(), HasSubstr("before this request was"));
      ++cancelled;
    } else {
      EXPECT_TRUE(absl::IsDeadlineExceeded(result)) << result;
      in_flight.push_back(ticket);
    }
  }
  EXPECT_EQ(cancelled, kHandOffs - plane->max_in_flight());
  EXPECT_EQ(in_flight.size(), plane->max_in_flight());
  EXPECT_EQ(daemon_->Stop(SIGKILL), 128 + SIGKILL);
  for (DataPlane::Ticket ticket : in_flight) {
    EXPECT_EQ(plane->Wait(ticket, absl::Seconds(30)).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

// Destroying the plane with hand-offs queued behind full rings returns.
TEST_F(DataPlaneTest, DestroyingThePlaneWithHandOffsQueuedDoesNotHang) {
  v1::RegisterModelResponse registered;
  std::unique_ptr<DataPlane> plane = OpenWithModel(&registered);
  ASSERT_NE(plane, nullptr);
  ASSERT_TRUE(FreezeDaemon()) << "lohand did not stop";
  for (size_t i = 0; i < plane->max_in_flight() + 200; ++i) {
    SubmissionEntry put{};
    put.op = static_cast<uint16_t>(RingOp::kActPut);
    put.activation_id = 1 + i;
    put.slot_offset = registered.activation_offset();
    put.length = 256;
    ASSERT_TRUE(ReserveAndDeliver(*plane, put).ok());
  }
  ASSERT_TRUE(RingsFull(*plane));
  const auto destroying = std::chrono::steady_clock::now();
  plane.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - destroying,
            std::chrono::seconds(5));
  EXPECT_EQ(daemon_->Stop(SIGKILL), 128 + SIGKILL);
}

}  // namespace
}  // namespace lohan::testing
