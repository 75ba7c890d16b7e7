// The serving thread only admits: what runs on the ordered lane (ITER_END
// and the other ops that must see everything before them done) and on the
// bulk lane (streamed gradients' SSD writes) never holds up a request the
// client is waiting on now, nor the answer to a bad entry. Through a real
// daemon and its data plane.
#include <cstring>
#include <vector>

#include "client/control_client.h"
#include "client/data_plane.h"
#include "gtest/gtest.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(120);
// Large enough that the queued work (SSD writes of the streamed gradients,
// then the updates ITER_END waits for) takes tens to hundreds of ms here,
// against microseconds for what the serving thread must answer at once.
constexpr uint32_t kLayers = 8;
constexpr uint64_t kElements = uint64_t{4} << 20;

class ServeOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start(
        dir_.path(), {"--ssd-capacity", "2GiB", "--host-pool-size", "256MiB"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto client = ControlClient::Connect({.socket_path = daemon_->socket()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    v1::JobSpec spec;
    spec.set_name("ordered");
    spec.set_host_pool_bytes(uint64_t{64} << 20);
    auto job = client_->CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(client_->AttachJob(job->id()).ok());
    auto plane =
        DataPlane::Open(client_->hello().data_socket_path(), job->id());
    ASSERT_TRUE(plane.ok()) << plane.status();
    plane_ = *std::move(plane);
    // bf16, one shared gradient and weight buffer: each GRAD_READY writes
    // its gradient to the SSDs before it completes.
    v1::RegisterModelRequest request;
    request.set_job_id(job->id());
    v1::ModelSpec* model = request.mutable_model();
    for (uint32_t l = 0; l < kLayers; ++l) model->add_layer_elements(kElements);
    model->set_dtype(v1::DTYPE_BF16);
    model->set_grad_slots(1);
    model->set_weight_slots(1);
    model->set_activation_bytes(4096);
    model->mutable_adam()->set_lr(1e-3);
    model->mutable_adam()->set_beta1(0.9);
    model->mutable_adam()->set_beta2(0.999);
    model->mutable_adam()->set_eps(1e-8);
    auto layout = client_->RegisterModel(request);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *std::move(layout);
    plane_->SetErrorText(layout_.error_text_offset(),
                         layout_.error_text_bytes());
    float* staging =
        reinterpret_cast<float*>(plane_->arena() + layout_.staging_offset());
    for (uint64_t i = 0; i < kElements; ++i) staging[i] = 0.5f;
    for (uint32_t l = 0; l < kLayers; ++l) {
      SubmissionEntry init{};
      init.op = static_cast<uint16_t>(RingOp::kInitWeights);
      init.layer = l;
      init.slot_offset = layout_.staging_offset();
      init.length = kElements * 4;
      ASSERT_TRUE(plane_->Call(init, kTimeout).ok());
    }
  }

  DataPlane::Ticket Submit(const SubmissionEntry& entry) {
    auto ticket = plane_->Submit(entry, kTimeout);
    EXPECT_TRUE(ticket.ok()) << ticket.status();
    return ticket.ok() ? *ticket : DataPlane::Ticket{};
  }

  bool Done(DataPlane::Ticket ticket) {
    absl::StatusOr<bool> done = plane_->Poll(ticket);
    EXPECT_TRUE(done.ok()) << done.status();
    return done.ok() && *done;
  }

  PublicTempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ControlClient> client_;
  std::unique_ptr<DataPlane> plane_;
  v1::RegisterModelResponse layout_;
};

TEST_F(ServeOrderTest, NeitherGradientWritesNorIterEndHoldUpWhatComesAfter) {
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  begin.iteration = layout_.iteration();
  ASSERT_TRUE(plane_->Call(begin, kTimeout).ok());
  SubmissionEntry put{};
  put.op = static_cast<uint16_t>(RingOp::kActPut);
  put.activation_id = 1;
  put.slot_offset = layout_.activation_offset();
  put.length = 4096;
  ASSERT_TRUE(plane_->Call(put, kTimeout).ok());

  // Backward as a client races it: every gradient handed over through the
  // shared buffer without waiting, an activation freed, the iteration
  // ended, then an entry the daemon must refuse.
  std::vector<DataPlane::Ticket> grads;
  for (uint32_t back = 0; back < kLayers; ++back) {
    const uint32_t l = kLayers - 1 - back;
    SubmissionEntry ready{};
    ready.op = static_cast<uint16_t>(RingOp::kGradReady);
    ready.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    ready.layer = l;
    ready.slot_offset = layout_.layers(l).grad_offset();
    ready.length = layout_.layers(l).bytes();
    grads.push_back(Submit(ready));
  }
  SubmissionEntry free{};
  free.op = static_cast<uint16_t>(RingOp::kActFree);
  free.activation_id = 1;
  const DataPlane::Ticket freed = Submit(free);
  SubmissionEntry end{};
  end.op = static_cast<uint16_t>(RingOp::kIterEnd);
  end.iteration = begin.iteration;
  const DataPlane::Ticket ended = Submit(end);
  SubmissionEntry bad{};
  bad.op = static_cast<uint16_t>(RingOp::kFetchParams);
  bad.layer = kLayers + 5;
  const DataPlane::Ticket refused = Submit(bad);

  // The free is answered while the gradients queued before it are still
  // being written (served in arrival order it would wait for all of them).
  ASSERT_TRUE(plane_->Wait(freed, kTimeout).ok());
  EXPECT_FALSE(Done(grads.back()))
      << "ACT_FREE waited for the gradient writes queued before it";
  // The refusal comes while ITER_END still waits for the updates.
  absl::StatusOr<CompletionEntry> refusal = plane_->Wait(refused, kTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(refusal.status())) << refusal.status();
  EXPECT_FALSE(Done(ended)) << "the refusal waited for ITER_END";

  for (DataPlane::Ticket ticket : grads) {
    EXPECT_TRUE(plane_->Wait(ticket, kTimeout).ok());
  }
  absl::StatusOr<CompletionEntry> end_done = plane_->Wait(ended, kTimeout);
  ASSERT_TRUE(end_done.ok()) << end_done.status();
  // The next iteration goes on as usual.
  begin.iteration += 1;
  EXPECT_TRUE(plane_->Call(begin, kTimeout).ok());
  auto status = client_->GetStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->sessions_size(), 1);
  EXPECT_EQ(status->sessions(0).iteration(), layout_.iteration() + 1);
  EXPECT_EQ(status->sessions(0).swapped_activations(), 0u);
}

}  // namespace
}  // namespace lohan::testing
