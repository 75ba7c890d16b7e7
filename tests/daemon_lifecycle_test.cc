// lohand as a process: start, serve, stop on signals, restart over a stale
// socket, refuse a second daemon, keep jobs across restarts.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

absl::StatusOr<std::unique_ptr<ControlClient>> Connect(
    const std::string& socket) {
  return ControlClient::Connect({.socket_path = socket});
}

TEST(DaemonLifecycle, ServesThenStopsCleanlyOnSigterm) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Connect((*daemon)->socket());
  ASSERT_TRUE(client.ok()) << client.status();
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->daemon_pid(), (*daemon)->pid());
  EXPECT_EQ(status->config().socket_path(), (*daemon)->socket());
  client->reset();

  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
  EXPECT_FALSE(Exists(dir.path() + "/lohand.sock"));
  EXPECT_THAT((*daemon)->Log(), HasSubstr("shutting down"));
  EXPECT_THAT((*daemon)->Log(), HasSubstr("lohand stopped"));
}

TEST(DaemonLifecycle, SigintWithAnIdleClientConnected) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // A client that stays connected must not hold the daemon up.
  auto client = Connect((*daemon)->socket());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*daemon)->Stop(SIGINT), 0) << (*daemon)->Log();
  EXPECT_FALSE(Exists(dir.path() + "/lohand.sock"));
  // The client sees the daemon gone, with a message naming the socket.
  auto jobs = (*client)->ListJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(jobs.status().message()),
              HasSubstr(dir.path() + "/lohand.sock"));
}

TEST(DaemonLifecycle, RestartsOverStaleSocketFromKilledDaemon) {
  PublicTempDir dir;
  auto first = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->Stop(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(Exists(dir.path() + "/lohand.sock")) << "no stale socket left";

  auto second = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT((*second)->Log(), HasSubstr("replacing stale socket"));
  EXPECT_TRUE(Connect((*second)->socket()).ok());
}

TEST(DaemonLifecycle, SecondDaemonOnLiveSocketIsRefused) {
  PublicTempDir dir;
  auto first = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<std::string> argv = DaemonProcess::Command(dir.path());
  RunResult second = RunCommand(argv);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("is held by a running lohand (pid " +
                                    std::to_string((*first)->pid()) + ")"));
  // The first daemon is untouched.
  EXPECT_TRUE(Connect((*first)->socket()).ok());
}

TEST(DaemonLifecycle, SecondDaemonOnTheSameStateIsRefused) {
  PublicTempDir dir;
  auto first = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  // Another socket, but the same state directory (and so the same store).
  std::vector<std::string> argv = DaemonProcess::Command(dir.path());
  argv.push_back("--socket=" + dir.path() + "/other.sock");
  RunResult second = RunCommand(argv);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("opening the SSD store"));
  EXPECT_TRUE(Connect((*first)->socket()).ok());
  EXPECT_FALSE(Exists(dir.path() + "/other.sock"));
}

TEST(DaemonLifecycle, SecondDaemonOnTheSameSsdIsRefused) {
  // Its own socket and state, but the first one's SSD file: it would
  // overwrite the first daemon's tensors.
  PublicTempDir dir;
  auto first = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<std::string> argv = DaemonProcess::Command(dir.path());
  argv.push_back("--socket=" + dir.path() + "/other.sock");
  argv.push_back("--state-dir=" + dir.path() + "/other-state");
  RunResult second = RunCommand(argv);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("is in use by another lohand store"));
  EXPECT_TRUE(Connect((*first)->socket()).ok());
}

TEST(DaemonLifecycle, CheckConfigSeesWhatTheStartWouldRefuse) {
  PublicTempDir dir;
  auto first = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<std::string> check = DaemonProcess::Command(dir.path());
  check.push_back("--check-config");
  // A running daemon on that socket and state.
  RunResult busy = RunCommand(check);
  EXPECT_EQ(busy.exit_code, 1) << busy.out;
  EXPECT_THAT(busy.err, HasSubstr("is held by a running lohand"));
  {
    auto client = Connect((*first)->socket());
    ASSERT_TRUE(client.ok());
    v1::JobSpec spec;
    spec.set_name("gpt");
    ASSERT_TRUE((*client)->CreateJob(spec).ok());
  }
  (*first)->Stop(SIGTERM);  // its catalog stays, made for one SSD
  RunResult fine = RunCommand(check);
  EXPECT_EQ(fine.exit_code, 0) << fine.err;
  // A second SSD path, as an admin might add to the config.
  std::vector<std::string> more = check;
  ASSERT_EQ(mkdir((dir.path() + "/ssd-more").c_str(), 0755), 0);
  more.push_back("--ssd-path=" + dir.path() + "/ssd-more");
  RunResult added = RunCommand(more);
  EXPECT_EQ(added.exit_code, 1) << added.out;
  EXPECT_THAT(added.err, HasSubstr("was made for ssd_paths"));
}

TEST(DaemonLifecycle, ABadFlagIsBlamedOnTheCommandLine) {
  PublicTempDir dir;
  std::vector<std::string> argv = DaemonProcess::Command(dir.path());
  argv.push_back("--ssd-capacity=0");
  argv.push_back("--check-config");
  RunResult result = RunCommand(argv);
  EXPECT_EQ(result.exit_code, 1) << result.out;
  EXPECT_THAT(result.err, HasSubstr("the command line's options: key "
                                    "'store.capacity_per_ssd'"));
}

TEST(DaemonLifecycle, JobsSurviveRestartDetached) {
  PublicTempDir dir;
  std::string job_id;
  {
    auto daemon = DaemonProcess::Start(dir.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto client = Connect((*daemon)->socket());
    ASSERT_TRUE(client.ok());
    v1::JobSpec spec;
    spec.set_name("long-run");
    spec.set_host_pool_bytes(1 << 20);
    auto job = (*client)->CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id = job->id();
    ASSERT_TRUE((*client)->AttachJob(job_id).ok());
    EXPECT_EQ((*daemon)->Stop(SIGTERM), 0);
  }
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Connect((*daemon)->socket());
  ASSERT_TRUE(client.ok());
  auto jobs = (*client)->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].id(), job_id);
  EXPECT_EQ((*jobs)[0].spec().name(), "long-run");
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_DETACHED);
  // Re-attach works after the restart.
  EXPECT_TRUE((*client)->AttachJob(job_id).ok());
}

TEST(DaemonLifecycle, DeadClientLosesItsAttachment) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Connect((*daemon)->socket());
  ASSERT_TRUE(client.ok());
  v1::JobSpec spec;
  spec.set_name("orphan");
  auto job = (*client)->CreateJob(spec);
  ASSERT_TRUE(job.ok());
  // A separate process attaches, then dies without detaching.
  auto holder =
      BackgroundProcess::Start({Runfile("tests/c_client/lohan_c_client"),
                                (*daemon)->socket(), "hold", job->id()});
  ASSERT_TRUE(holder.ok()) << holder.status();
  ASSERT_THAT((*holder)->first_line(), HasSubstr("holding"));
  auto held = (*client)->ListJobs();
  ASSERT_TRUE(held.ok());
  EXPECT_EQ((*held)[0].state(), v1::JOB_STATE_ATTACHED);
  EXPECT_EQ((*held)[0].attached_pid(), (*holder)->pid());
  EXPECT_EQ((*client)->AttachJob(job->id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*holder)->Stop(SIGKILL), 128 + SIGKILL);
  auto jobs = (*client)->ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_DETACHED);
  EXPECT_TRUE((*client)->AttachJob(job->id()).ok());
}

TEST(DaemonLifecycle, GarbageAndSilentConnectionsDoNotHurt) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto connect_raw = [&]() {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s",
                  (*daemon)->socket().c_str());
    EXPECT_EQ(
        connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  };
  // One peer sends bytes that are not HTTP/2, one sends nothing and stays.
  int garbage = connect_raw();
  std::string junk(64 << 10, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131);
  EXPECT_GT(write(garbage, junk.data(), junk.size()), 0);
  int silent = connect_raw();
  close(garbage);

  auto client = Connect((*daemon)->socket());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->ListJobs().ok());
  v1::JobSpec spec;
  spec.set_name(std::string(1 << 16, 'x'));  // oversized name
  EXPECT_EQ((*client)->CreateJob(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->AttachJob(std::string(1 << 16, 'j')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*client)->GetStatus().ok());
  close(silent);
  EXPECT_EQ((*daemon)->Stop(SIGTERM), 0) << (*daemon)->Log();
}

TEST(DaemonLifecycle, ProtocolMismatchIsRefusedAtHello) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto channel = grpc::CreateChannel("unix:" + (*daemon)->socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Lohan::NewStub(channel);
  grpc::ClientContext context;
  v1::HelloRequest request;
  request.mutable_client_protocol()->set_major(99);
  request.set_client_name("from-the-future");
  v1::HelloResponse response;
  grpc::Status status = stub->Hello(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("speaks protocol 99.x"));
}

}  // namespace
}  // namespace lohan::testing
