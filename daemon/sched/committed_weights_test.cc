// The weights a caller's buffers hold after an iteration that commits
// nothing: when EndIteration fails or AbortIteration runs, every
// weight16_out buffer given to SubmitGradients holds the committed weights
// again, bit for bit (what ReadWeightCopy reads), although the iteration's
// updates had written new ones into it. Also: InitializeWeights'
// weight_copy_out and ReadWeightCopy are the updates' conversion of the
// fp32 masters (16-bit copies, or the fp32 values with fp32_weights_out).

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/fair_queue.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/fault_store.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::Layout;
using clip_test::MakeGradients;
using Buffers = std::vector<std::vector<uint8_t>>;

struct Variant {
  DType grad_dtype;
  bool fp32_weights_out;  // else bf16 copies
  Schedule schedule;
};

class CommittedWeightsTest : public clip_test::UpdaterAndStoreTest<Variant> {
 protected:
  void SetUp() override {
    UpdaterAndStoreTest::SetUp();
    if (HasFatalFailure()) return;
    // The same store, every SSD behind a fault-injecting wrapper.
    store_.reset();
    auto store = testing_util::OpenStoreWithFaults(clip_test::SmallStore(dir_),
                                                   &faults_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    PipelineOptions options;
    options.buffers = 3;
    options.schedule = GetParam().schedule;
    options.fp32_weights_out = GetParam().fp32_weights_out;
    // One slot: the test sees (Stats) how many chunk updates have begun;
    // the compute stage asks for chunk n + 1's turn once chunk n's update
    // (and its copy into the buffer) is done.
    options.optimizer_queue = &optimizer_;
    auto p =
        JobPipeline::Open(store_.get(), *updater_, "job", layout_, options);
    ASSERT_TRUE(p.ok()) << p.status();
    pipeline_ = *std::move(p);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    out_.resize(layout_.layer_elements.size());
    for (size_t l = 0; l < out_.size(); ++l) {
      std::vector<float> weights(layout_.layer_elements[l]);
      for (float& x : weights) x = dist(rng);
      out_[l].assign(weights.size() * CopySize(), 0xa5);
      ASSERT_TRUE(
          pipeline_->InitializeWeights(l, weights.data(), out_[l].data()).ok());
      // The updates' conversion of what was stored.
      std::vector<uint8_t> want(out_[l].size());
      if (GetParam().fp32_weights_out) {
        std::memcpy(want.data(), weights.data(), want.size());
      } else {
        for (size_t i = 0; i < weights.size(); ++i) {
          const uint16_t h = FloatToBf16(weights[i]);
          std::memcpy(&want[2 * i], &h, 2);
        }
      }
      ASSERT_EQ(out_[l], want) << "layer " << l;
    }
    ASSERT_EQ(Committed(), out_);
  }

  size_t CopySize() const { return GetParam().fp32_weights_out ? 4 : 2; }

  // What ReadWeightCopy reads for every layer.
  Buffers Committed() const {
    Buffers copies(out_.size());
    for (size_t l = 0; l < copies.size(); ++l) {
      copies[l].resize(layout_.layer_elements[l] * CopySize());
      EXPECT_TRUE(pipeline_->ReadWeightCopy(l, copies[l].data()).ok());
    }
    return copies;
  }

  uint64_t UpdatesBegun() const {
    const auto stats = optimizer_.Stats();
    const auto it = stats.find("job");
    return it == stats.end() ? 0 : it->second.grants;
  }

  // Begins an iteration and hands over `layers` (in that order) with the
  // test's buffers.
  void Submit(std::initializer_list<size_t> layers, uint32_t seed) {
    grads_ = MakeGradients(layout_, seed, 1.0f, -1);
    ASSERT_TRUE(pipeline_->BeginIteration().ok());
    for (size_t l : layers) {
      ASSERT_TRUE(
          pipeline_->SubmitGradients(l, grads_.bytes[l].data(), out_[l].data())
              .ok());
    }
  }

  const ModelLayout layout_ = Layout(GetParam().grad_dtype);
  FairQueue optimizer_{1};
  std::vector<FaultInjectionDevice*> faults_;
  std::unique_ptr<JobPipeline> pipeline_;
  Buffers out_;
  Gradients grads_;
};

TEST_P(CommittedWeightsTest, ACommittedIterationChangesTheBuffers) {
  // What the other tests undo: an iteration's updates write new weights
  // into every buffer.
  const Buffers before = out_;
  Submit({3, 2, 1, 0}, 1);
  auto report = pipeline_->EndIteration();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->iteration, 1u);
  for (size_t l = 0; l < out_.size(); ++l) {
    EXPECT_NE(out_[l], before[l]) << "layer " << l;
  }
  EXPECT_EQ(out_, Committed());
}

TEST_P(CommittedWeightsTest, AFailedEndIterationLeavesTheCommittedWeights) {
  Submit({3, 2, 1, 0}, 1);
  ASSERT_TRUE(pipeline_->EndIteration().ok());
  const Buffers committed = Committed();
  ASSERT_EQ(out_, committed);
  // Layer 0 never comes: EndIteration waits for the three layers' updates
  // (they write into their buffers; after backward none runs), then fails.
  Submit({3, 2, 1}, 2);
  const absl::StatusOr<IterationReport> missing = pipeline_->EndIteration();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition)
      << missing.status();
  // The first iteration's 10 chunks, then layers 3..1's 7 (after backward,
  // every update waits for the norm, which a missing layer leaves unknown).
  EXPECT_EQ(UpdatesBegun(),
            GetParam().schedule == Schedule::kAfterBackward ? 10u : 17u);
  EXPECT_EQ(pipeline_->iteration(), 1u);
  for (size_t l = 0; l < out_.size(); ++l) {
    EXPECT_EQ(out_[l], committed[l]) << "layer " << l;
  }

  // Every first write of each SSD fails: an update's state cannot be
  // written after its compute wrote the new weights into the buffer.
  Submit({3, 2, 1, 0}, 3);
  using Fault = FaultInjectionDevice::Fault;
  for (FaultInjectionDevice* device : faults_) {
    device->Inject({Fault::kEio, IoRequest::Op::kWrite, 1});
  }
  const absl::StatusOr<IterationReport> failed = pipeline_->EndIteration();
  for (FaultInjectionDevice* device : faults_) device->ClearFaults();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(pipeline_->iteration(), 1u);
  for (size_t l = 0; l < out_.size(); ++l) {
    EXPECT_EQ(out_[l], committed[l]) << "layer " << l;
  }
  EXPECT_EQ(Committed(), committed);

  // The job goes on from the committed weights.
  Submit({3, 2, 1, 0}, 4);
  ASSERT_TRUE(pipeline_->EndIteration().ok());
  EXPECT_EQ(pipeline_->iteration(), 2u);
  EXPECT_EQ(out_, Committed());
  EXPECT_NE(out_, committed);
}

TEST_P(CommittedWeightsTest, AnAbortedIterationLeavesTheCommittedWeights) {
  Submit({3, 2, 1, 0}, 1);
  ASSERT_TRUE(pipeline_->EndIteration().ok());
  const Buffers committed = Committed();
  const uint64_t begun = UpdatesBegun();
  // Backward fails half-way: layers 3 and 2 (six chunks) were handed over.
  Submit({3, 2}, 2);
  if (GetParam().schedule != Schedule::kAfterBackward) {
    // Wait until five updates are done: the sixth has its turn once the
    // fifth wrote its new weights into a buffer.
    while (UpdatesBegun() < begun + 6) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(pipeline_->AbortIteration().ok());
  EXPECT_EQ(pipeline_->iteration(), 1u);
  for (size_t l = 0; l < out_.size(); ++l) {
    EXPECT_EQ(out_[l], committed[l]) << "layer " << l;
  }
  EXPECT_EQ(Committed(), committed);
  EXPECT_EQ(pipeline_->AbortIteration().code(),
            absl::StatusCode::kFailedPrecondition);  // none in progress
}

std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  const char* schedules[] = {"Pipelined", "Serialized", "AfterBackward"};
  return std::string(info.param.fp32_weights_out ? "Fp32Out" : "Bf16Out") +
         schedules[static_cast<int>(info.param.schedule)];
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CommittedWeightsTest,
    ::testing::Values(Variant{DType::kBFloat16, false, Schedule::kPipelined},
                      Variant{DType::kFloat32, true, Schedule::kPipelined},
                      Variant{DType::kFloat16, false, Schedule::kSerialized},
                      Variant{DType::kFloat32, true, Schedule::kAfterBackward}),
    VariantName);

}  // namespace
}  // namespace lohan
