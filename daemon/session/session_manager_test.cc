// SessionManager in this process: a real listener on a unix socket, a real
// registry, pool arena and store on temporary files; the test plays the
// client with the wire alone (the attach handshake, its own mapping of the
// arena, the rings). The timing of a drain against an ITER_END is set with
// test points (daemon/common/test_point.h), never left to a race.
#include "daemon/session/session_manager.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/common/test_point.h"
#include "daemon/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/attach_protocol.h"
#include "wire/fd_passing.h"
#include "wire/plane_notice.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;

constexpr uint64_t kMiB = 1 << 20;
// A failsafe for what never comes (a broken manager), not a measure.
constexpr absl::Duration kFailsafe = absl::Seconds(60);

v1::ModelSpec Spec() {
  v1::ModelSpec spec;
  spec.set_dtype(v1::DTYPE_BF16);
  spec.add_layer_elements(2500);
  spec.add_layer_elements(1000);
  spec.set_chunk_elements(1000);
  v1::AdamSpec* adam = spec.mutable_adam();
  adam->set_lr(1e-2);
  adam->set_beta1(0.9);
  adam->set_beta2(0.999);
  adam->set_eps(1e-8);
  return spec;
}

SubmissionEntry Entry(RingOp op) {
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(op);
  return entry;
}

class SessionManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: a unix socket's path has at most 107 bytes.
    char socket_dir[] = "/tmp/lohan_sm_XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    StoreOptions options;
    options.ssd_paths = {dir_.Subdir("ssd0")};
    options.state_dir = dir_.Subdir("state");
    options.stripe_unit = 64 << 10;
    options.queue_depth = 8;
    options.device_capacity_bytes = 16 << 20;
    auto store = TensorStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto jobs = JobRegistry::Open({.state_dir = dir_.Subdir("jobs")});
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    jobs_ = *std::move(jobs);
    auto listener = UnixListener::Bind(socket_dir_ + "/d.sock");
    ASSERT_TRUE(listener.ok()) << listener.status();
    manager_ =
        SessionManager::Start(*std::move(listener), {.jobs = jobs_.get(),
                                                     .pool = &pool_,
                                                     .store = store_.get(),
                                                     .updater = &*updater_,
                                                     .quotas = &quotas_});
    v1::JobSpec spec;
    spec.set_name("job");
    spec.set_host_pool_bytes(4 * kMiB);
    auto job = jobs_->Create(caller_, spec);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
    ASSERT_TRUE(jobs_->Attach(caller_, job_id_).ok());
  }

  void TearDown() override {
    if (manager_ != nullptr) manager_->Shutdown();
    if (mapping_ != nullptr) munmap(mapping_, grant_.arena_bytes);
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  // The client's side: attached, its arena mapped, the model registered.
  void Open() {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = socket_dir_ + "/d.sock";
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    connection_ = UniqueFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(
        connect(connection_.get(), reinterpret_cast<const sockaddr*>(&address),
                sizeof(address)),
        0);
    ASSERT_TRUE(
        SendWithFds(connection_.get(), EncodeAttachRequest(job_id_), {}).ok());
    auto reply = ReceiveWithFds(connection_.get(), kMaxAttachReplyBytes, 0);
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto decoded = DecodeAttachReply(reply->payload);
    ASSERT_TRUE(decoded.ok() && decoded->daemon_status.ok());
    auto granted = ReceiveWithFds(connection_.get(), kArenaGrantBytes, 1);
    ASSERT_TRUE(granted.ok()) << granted.status();
    auto grant = DecodeArenaGrant(granted->payload);
    ASSERT_TRUE(grant.ok()) << grant.status();
    grant_ = *grant;
    void* mapped = mmap(nullptr, grant_.arena_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED, granted->fds[0].get(), 0);
    ASSERT_NE(mapped, MAP_FAILED);
    mapping_ = static_cast<uint8_t*>(mapped);
    auto submissions =
        RingProducer::Attach(mapping_ + grant_.submission_offset,
                             grant_.submission_bytes, kRingEntryBytes);
    auto completions =
        RingConsumer::Attach(mapping_ + grant_.completion_offset,
                             grant_.completion_bytes, kRingEntryBytes);
    ASSERT_TRUE(submissions.ok() && completions.ok());
    submissions_.emplace(*std::move(submissions));
    completions_.emplace(*std::move(completions));
    v1::RegisterModelRequest request;
    request.set_job_id(job_id_);
    *request.mutable_model() = Spec();
    auto registered = manager_->RegisterModel(caller_, request);
    ASSERT_TRUE(registered.ok()) << registered.status();
    response_ = *registered;
  }

  uint64_t Push(SubmissionEntry entry) {
    entry.request_id = ++request_id_;
    auto pushed = submissions_->TryPush(&entry);
    EXPECT_TRUE(pushed.ok() && *pushed);
    return entry.request_id;
  }

  // The next completion; none when the daemon hung up without one, or none
  // came within the failsafe.
  std::optional<CompletionEntry> Next() {
    CompletionEntry done{};
    const absl::Time deadline = absl::Now() + kFailsafe;
    while (absl::Now() < deadline) {
      const bool hung_up = HungUp();
      auto popped = completions_->TryPop(&done);
      if (!popped.ok()) return std::nullopt;
      if (*popped) return done;
      if (hung_up) return std::nullopt;
      (void)completions_->WaitForEntries(absl::Milliseconds(100));
    }
    return std::nullopt;
  }

  bool HungUp() const {
    pollfd fd{connection_.get(), POLLRDHUP, 0};
    return poll(&fd, 1, 0) == 1;
  }

  absl::StatusCode Call(SubmissionEntry entry) {
    const uint64_t id = Push(entry);
    std::optional<CompletionEntry> done = Next();
    if (!done.has_value() || done->request_id != id) {
      ADD_FAILURE() << "no completion for request " << id;
      return absl::StatusCode::kUnknown;
    }
    return static_cast<absl::StatusCode>(done->status_code);
  }

  // Initial weights, then ITER_BEGIN and GRAD_READY of every layer but the
  // first (layer 0's is the test's to send).
  void BeginIteration() {
    for (int l = 0; l < response_.layers_size(); ++l) {
      SubmissionEntry init = Entry(RingOp::kInitWeights);
      init.layer = l;
      init.slot_offset = response_.staging_offset();
      init.length = response_.layers(l).bytes() * 2;
      std::memset(mapping_ + init.slot_offset, 0, init.length);
      ASSERT_EQ(Call(init), absl::StatusCode::kOk) << "layer " << l;
    }
    ASSERT_EQ(Call(Entry(RingOp::kIterBegin)), absl::StatusCode::kOk);
    for (int l = response_.layers_size(); l-- > 1;) {
      ASSERT_EQ(Call(Grad(l)), absl::StatusCode::kOk) << "layer " << l;
    }
  }

  SubmissionEntry Grad(int layer) const {
    SubmissionEntry entry = Entry(RingOp::kGradReady);
    entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    entry.layer = layer;
    entry.slot_offset = response_.layers(layer).grad_offset();
    entry.length = response_.layers(layer).bytes();
    return entry;
  }

  // Waits for the daemon's end of the connection to close, then reads the
  // closing notice it sent before.
  absl::StatusOr<PlaneNotice> NoticeAfterHangUp() {
    pollfd fd{connection_.get(), POLLRDHUP, 0};
    if (poll(&fd, 1, absl::ToInt64Milliseconds(kFailsafe)) != 1) {
      return absl::DeadlineExceededError("the connection stayed open");
    }
    auto frame =
        ReceiveWithFds(connection_.get(), kMaxPlaneNoticeBytes, 0, 1000);
    if (!frame.ok()) return frame.status();
    return DecodePlaneNotice(frame->payload);
  }

  TempDir dir_;
  std::string socket_dir_;
  HostPool pool_{HostPool::Options{.capacity_bytes = 64 * kMiB,
                                   .try_huge_pages = false,
                                   .lock_in_ram = false}};
  // daemon_memory is resolved by lohand's config (0 would allow nothing).
  QuotaTable quotas_{UserLimits{.daemon_memory_bytes = 64 * kMiB}, {}};
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<JobRegistry> jobs_;
  const Caller caller_{.uid = getuid(), .pid = getpid()};
  std::string job_id_;
  UniqueFd connection_;
  ArenaGrant grant_;
  uint8_t* mapping_ = nullptr;
  std::optional<RingProducer> submissions_;
  std::optional<RingConsumer> completions_;
  v1::RegisterModelResponse response_;
  uint64_t request_id_ = 0;
  std::unique_ptr<SessionManager> manager_;  // last: goes first
};

// A drain asked for once the ITER_END is admitted (the iteration over for
// the validator) but before it runs: the ITER_END still commits and is
// answered OK before the plane closes, and the notice says the job keeps
// that iteration. The test holds the last GRAD_READY on its lane, so the
// ITER_END waits queued behind it while the drain is asked for, and lets
// it go once the session has decided how to end: its serving thread
// draining (waiting for what it admitted), or its lanes dropping what is
// queued (a close at once, which would lose the ITER_END).
TEST_F(SessionManagerTest, ADrainAfterAnAdmittedIterEndAnswersItFirst) {
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_NO_FATAL_FAILURE(BeginIteration());
  absl::Notification grad_runs, release, end_posted;
  std::atomic<bool> released{false};
  auto let_go = [&] {
    if (!released.exchange(true)) release.Notify();
  };
  ScopedTestPointHook at_drain("job_session.draining", let_go);
  ScopedTestPointHook at_drop("serve_lanes.dropped", let_go);
  uint64_t end_id = 0;
  {
    ScopedTestPointHook hold_grad("job_session.lane_task_runs", [&] {
      grad_runs.Notify();
      release.WaitForNotification();
    });
    const uint64_t grad_id = Push(Grad(0));
    ASSERT_TRUE(grad_runs.WaitForNotificationWithTimeout(kFailsafe));
    {
      ScopedTestPointHook at_posted("job_session.ordered_posted",
                                    [&] { end_posted.Notify(); });
      end_id = Push(Entry(RingOp::kIterEnd));
      ASSERT_TRUE(end_posted.WaitForNotificationWithTimeout(kFailsafe));
    }
    absl::StatusOr<std::string> outcome =
        manager_->StopSession(job_id_, /*drain=*/true, caller_.uid);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    std::optional<CompletionEntry> grad = Next();
    ASSERT_TRUE(grad.has_value());
    EXPECT_EQ(grad->request_id, grad_id);
    EXPECT_EQ(grad->status_code, 0u);
  }
  std::optional<CompletionEntry> end = Next();
  ASSERT_TRUE(end.has_value()) << "the admitted ITER_END was not answered";
  EXPECT_EQ(end->request_id, end_id);
  EXPECT_EQ(end->status_code, 0u) << "the ITER_END committed: OK";
  absl::StatusOr<PlaneNotice> notice = NoticeAfterHangUp();
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(notice->reason, ClosingReason::kStopped);
  EXPECT_EQ(notice->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(notice->status.message(), HasSubstr("`lohanctl drain` by uid " +
                                                  std::to_string(caller_.uid)));
  EXPECT_THAT(notice->status.message(), HasSubstr("the job keeps iteration 1"));
}

// lohand stopping closes every plane, each told so (UNAVAILABLE) with the
// iteration its job keeps; an iteration in progress is rolled back.
TEST_F(SessionManagerTest, ShutdownTellsEachPlaneLohandIsStopping) {
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_NO_FATAL_FAILURE(BeginIteration());
  manager_->Shutdown();
  absl::StatusOr<PlaneNotice> notice = NoticeAfterHangUp();
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(notice->reason, ClosingReason::kDaemonStopping);
  EXPECT_EQ(notice->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(notice->status.message(), HasSubstr("lohand is stopping"));
  EXPECT_THAT(notice->status.message(), HasSubstr("the job keeps iteration 0"));
}

// A client that hangs up itself is told nothing (it is gone).
TEST_F(SessionManagerTest, NoNoticeWhenTheClientClosesItself) {
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_EQ(shutdown(connection_.get(), SHUT_WR), 0);
  absl::StatusOr<PlaneNotice> notice = NoticeAfterHangUp();
  EXPECT_TRUE(absl::IsUnavailable(notice.status())) << notice.status();
}

}  // namespace
}  // namespace lohan
