// settle_in_background, read-ahead and dropped eager updates on a store
// whose reads can be slowed or failed (FaultInjectionDevice): a layer is
// usable once WaitLayer says so and not before, the commit follows, a
// failure is reported and rolled back, and neither read-ahead nor dropping
// changes a bit of the result.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/sched/memory_shares.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/fault_injection_device.h"
#include "daemon/store/fault_store.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using clip_test::Gradients;
using clip_test::kChunks;
using clip_test::Layout;
using clip_test::MakeGradients;
using testing_util::TempDir;

// settle_in_background on a store whose reads are slowed: the iteration's
// last updates run after EndIteration returned, each layer is usable once
// WaitLayer says so and not before, the commit follows, and a failure
// there is reported and rolled back.
class SettleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    OpenStore();
  }

  // gate_unit: the store's StoreOptions::gate_unit_bytes.
  void OpenStore(uint64_t gate_unit = 0) {
    store_.reset();
    faults_.clear();
    StoreOptions options = clip_test::SmallStore(dir_);
    options.gate_unit_bytes = gate_unit;
    auto s = testing_util::OpenStoreWithFaults(options, &faults_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  std::unique_ptr<JobPipeline> Open(const std::string& job, bool settle,
                                    uint64_t read_ahead = 0,
                                    MemoryShares* shares = nullptr,
                                    bool streamed = false) {
    PipelineOptions options;
    options.buffers = 3;
    options.settle_in_background = settle;
    options.stream_gradients = streamed;
    options.read_ahead_bytes = read_ahead;
    options.read_ahead_shares = shares;
    options.make_read_ahead_buffer = make_buffer_;
    options.read_ahead_adapts = read_ahead_adapts_;
    auto p = JobPipeline::Open(store_.get(), *updater_, job, layout_, options);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  void Initialize(JobPipeline& p, std::vector<std::vector<uint16_t>>& out) {
    out.resize(layout_.layer_elements.size());
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> w(layout_.layer_elements[l], 0.25f + 0.01f * l);
      ASSERT_TRUE(p.InitializeWeights(l, w.data()).ok());
      out[l].assign(w.size(), FloatToBf16(w[0]));
    }
  }

  // Begins an iteration that clips from its first chunk (so every update
  // waits for the norm) and hands over every layer, last layer first.
  // (Or, given `clip`, with that.)
  void Backward(JobPipeline& p, const Gradients& g,
                std::vector<std::vector<uint16_t>>& out,
                const ClipOptions& clip = {.max_grad_norm = 1e-3}) {
    ASSERT_TRUE(p.BeginIteration(1.0f, std::nullopt, clip).ok());
    for (size_t j = 0; j < g.bytes.size(); ++j) {
      const size_t l = g.bytes.size() - 1 - j;
      ASSERT_TRUE(p.SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
    }
  }

  // A reference job that settles in the foreground and a job that settles
  // in the background, both initialized alike; the reference then runs the
  // iteration of `g` to its commit.
  void OpenPairAndRunReference(const Gradients& g) {
    ref_ = Open("ref", /*settle=*/false);
    job_ = Open("job", /*settle=*/true);
    ASSERT_TRUE(ref_ && job_);
    Initialize(*ref_, ref_out_);
    Initialize(*job_, out_);
    Backward(*ref_, g, ref_out_);
    absl::StatusOr<IterationReport> want = ref_->EndIteration();
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(want->clipped);
  }

  // A reference job and a job that reads ahead (up to 1 GiB), both
  // streaming gradients, initialized alike.
  void OpenStreamedPair() {
    ref_ = Open("ref", /*settle=*/false, 0, nullptr, /*streamed=*/true);
    job_ = Open("job", /*settle=*/false, /*read_ahead=*/uint64_t{1} << 30,
                nullptr, /*streamed=*/true);
    ASSERT_TRUE(ref_ && job_);
    Initialize(*ref_, ref_out_);
    Initialize(*job_, out_);
  }

  // OpenStreamedPair, then the reference runs two iterations of `g`, the
  // job one. That one clips, so the job's next is predicted to, and reads
  // ahead from its start.
  void OpenStreamedPairPredictedToClip(const Gradients& g) {
    OpenStreamedPair();
    if (HasFatalFailure()) return;
    for (int i = 0; i < 2; ++i) {
      Backward(*ref_, g, ref_out_);
      ASSERT_TRUE(ref_->EndIteration().ok());
    }
    Backward(*job_, g, out_);
    ASSERT_TRUE(job_->EndIteration().ok());
  }

  // Until `chunks` states are read ahead and `also` holds (read-ahead
  // stops once the norm is known: counts are exact only if backward waits).
  void AwaitReadAhead(size_t chunks, const std::function<bool()>& also) {
    for (int i = 0; i < 3000 && (job_->chunks_read_ahead() < chunks || !also());
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(job_->chunks_read_ahead(), chunks);
  }

  // One iteration of `g` for the reference and for the job, which waits
  // until `read_ahead` states are read ahead before ending it (backward
  // waits: all read in time): each state read once, the same bits.
  void IterateReadingAhead(const Gradients& g, size_t read_ahead) {
    Backward(*ref_, g, ref_out_);
    ASSERT_TRUE(ref_->EndIteration().ok());
    Backward(*job_, g, out_);
    AwaitReadAhead(read_ahead, [] { return true; });
    absl::StatusOr<IterationReport> r = job_->EndIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->busy.read_ahead_used, read_ahead);
    EXPECT_EQ(r->busy.bytes_read, StateBytes());
    ExpectSameWeights();
    EXPECT_EQ(out_, ref_out_);
  }

  // The read-ahead buffers of the job's first `chunks` chunks (forward
  // order), each sized for its chunk.
  uint64_t ReadAheadBytes(size_t chunks) const {
    uint64_t bytes = 0;
    for (size_t flat = 0; flat < chunks; ++flat) {
      bytes += job_->read_ahead_buffer_bytes(flat);
    }
    return bytes;
  }

  // The state bytes of every chunk, once.
  uint64_t StateBytes() const {
    const StateLayout& state = job_->state_layout();
    uint64_t bytes = 0;
    for (size_t l = 0; l < state.num_layers(); ++l) {
      for (size_t c = 0; c < state.num_chunks(l); ++c) {
        bytes += state.state_bytes(state.chunk_count(l, c));
      }
    }
    return bytes;
  }

  // The bytes of one iteration's gradients (bf16).
  uint64_t GradBytes() const {
    uint64_t elements = 0;
    for (uint64_t n : layout_.layer_elements) elements += n;
    return 2 * elements;
  }

  // The reference's and the job's fp32 weights, bit for bit.
  void ExpectSameWeights() {
    for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
      std::vector<float> a(layout_.layer_elements[l]), b(a.size());
      ASSERT_TRUE(ref_->ReadWeights(l, a.data()).ok());
      ASSERT_TRUE(job_->ReadWeights(l, b.data()).ok());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size())) << l;
    }
  }

  // Holds the next transfer `op` for `delay_ms`, on whichever SSD it
  // reaches (a small tensor lives on one, and which one depends on the
  // store's free space): AwaitHeld disarms the others once one fired.
  void HoldNext(IoRequest::Op op, int delay_ms) {
    for (FaultInjectionDevice* ssd : faults_) {
      ssd->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
                   .op = op,
                   .count = 1,
                   .delay_ms = delay_ms});
    }
  }

  uint64_t FaultsFired() const {
    uint64_t fired = 0;
    for (const FaultInjectionDevice* ssd : faults_) {
      fired += ssd->faults_fired();
    }
    return fired;
  }

  // Until the SSDs' injected faults have fired `n` times in all; then the
  // rules left are disarmed (a transfer held sleeps on).
  void AwaitHeld(uint64_t n) {
    for (int i = 0; i < 3000 && FaultsFired() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (FaultInjectionDevice* ssd : faults_) ssd->ClearFaults();
    ASSERT_EQ(FaultsFired(), n);
  }

  void SlowReads(int delay_ms) {
    for (FaultInjectionDevice* f : faults_) {
      f->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
                 .op = IoRequest::Op::kRead,
                 .count = 1000,
                 .delay_ms = delay_ms});
    }
  }

  // The next Open's PipelineOptions::make_read_ahead_buffer and
  // read_ahead_adapts.
  std::function<std::unique_ptr<AlignedBuffer>(size_t)> make_buffer_;
  bool read_ahead_adapts_ = false;
  TempDir dir_;
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  std::vector<FaultInjectionDevice*> faults_;
  ModelLayout layout_ = Layout(DType::kBFloat16);
  std::unique_ptr<JobPipeline> ref_, job_;
  std::vector<std::vector<uint16_t>> ref_out_, out_;
};

TEST_F(SettleTest, EachLayerWaitsForItsOwnUpdateOnly) {
  const Gradients g = MakeGradients(layout_, 21, 1.0f, -1);
  OpenPairAndRunReference(g);
  JobPipeline* job = job_.get();
  std::vector<std::vector<uint16_t>>& out = out_;
  const std::vector<std::vector<uint16_t>>& ref_out = ref_out_;
  Backward(*job, g, out);
  // Every state read of the settle pass takes 100 ms: ten chunks, layer 0's
  // three first.
  SlowReads(100);
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->settling);
  EXPECT_TRUE(r->clipped);
  EXPECT_EQ(r->iteration, 1u);
  EXPECT_EQ(r->deferred_chunks, kChunks);
  EXPECT_EQ(job->iteration(), 0u);  // Not committed yet.
  ASSERT_TRUE(job->WaitLayer(0).ok());
  // Layer 0 has its new weights while layer 3's five reads are still to
  // come: the commit has not happened.
  EXPECT_EQ(out[0], ref_out[0]);
  EXPECT_EQ(job->iteration(), 0u);
  for (size_t l = 1; l < layout_.layer_elements.size(); ++l) {
    ASSERT_TRUE(job->WaitLayer(l).ok());
    EXPECT_EQ(out[l], ref_out[l]) << "layer " << l;
  }
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  // The next iteration begins once the commit is done.
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
  ASSERT_TRUE(job->AbortIteration().ok());
  ExpectSameWeights();
}

TEST_F(SettleTest, UnclippedTailRunsLayerZeroFirst) {
  // Nothing clips: every chunk was handed to the stages in backward order
  // (layer 3 first), and reads are slow, so most of them are still queued
  // when EndIteration returns. Those left go in forward order: layer 0's
  // update is done while later layers' still run.
  auto job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  const Gradients g = MakeGradients(layout_, 26, 1.0f, -1);
  SlowReads(100);
  ASSERT_TRUE(
      job->BeginIteration(1.0f, std::nullopt, ClipOptions{.max_grad_norm = 1e9})
          .ok());
  for (size_t j = 0; j < g.bytes.size(); ++j) {
    const size_t l = g.bytes.size() - 1 - j;
    ASSERT_TRUE(job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->clipped);
  EXPECT_EQ(r->eager_chunks, kChunks);
  ASSERT_TRUE(r->settling);
  ASSERT_TRUE(job->WaitLayer(0).ok());
  EXPECT_GT(job->layers_settling(), 0u);
  ASSERT_TRUE(job->WaitLayer(3).ok());
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
  EXPECT_EQ(job->layers_settling(), 0u);
  ASSERT_TRUE(job->AbortIteration().ok());
}

TEST_F(SettleTest, ReadsOfTheWeightsWaitAndSeeTheNewOnes) {
  const Gradients g = MakeGradients(layout_, 22, 1.0f, -1);
  OpenPairAndRunReference(g);
  JobPipeline* ref = ref_.get();
  JobPipeline* job = job_.get();
  Backward(*job, g, out_);
  SlowReads(30);
  ASSERT_TRUE(job->EndIteration().ok());
  // ReadWeights of the last layer in forward order, mid-settle: the new
  // fp32 weights (pending until the commit), as the reference committed.
  std::vector<float> a(layout_.layer_elements[3]), b(a.size());
  ASSERT_TRUE(job->ReadWeights(3, b.data()).ok());
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(ref->ReadWeights(3, a.data()).ok());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size()));
  // States are read between iterations only: after the commit.
  std::vector<float> m(layout_.layer_elements[0]);
  ASSERT_TRUE(job->ReadState(0, StatePart::kExpAvg, m.data()).ok());
  EXPECT_EQ(job->iteration(), 1u);
}

TEST_F(SettleTest, AFailedSettleIsRolledBackAndReported) {
  auto job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  std::vector<float> before(layout_.layer_elements[3]);
  ASSERT_TRUE(job->ReadWeights(3, before.data()).ok());
  // Resident: the pipeline reads the gradients until the iteration ends.
  const Gradients g = MakeGradients(layout_, 23, 1.0f, -1);
  Backward(*job, g, out);
  // The settle pass's writes fail (after a delay, so EndIteration returns
  // first).
  for (FaultInjectionDevice* f : faults_) {
    f->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
               .op = IoRequest::Op::kRead,
               .count = 1,
               .delay_ms = 50});
    f->Inject({.fault = FaultInjectionDevice::Fault::kEio,
               .op = IoRequest::Op::kWrite,
               .count = 1000});
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->settling) << r->deferred_chunks << " deferred, clipped "
                           << r->clipped << " norm " << r->global_norm;
  absl::Status waited = job->WaitLayer(3);
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("stays at iteration 0"), std::string::npos)
      << waited;
  EXPECT_EQ(job->iteration(), 0u);
  // Refused from now on, with the same words.
  EXPECT_EQ(job->BeginIteration().code(), absl::StatusCode::kAborted);
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  job.reset();
  // Opened again: at iteration 0, the weights as they were, and trainable.
  job = Open("job", /*settle=*/true);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->iteration(), 0u);
  std::vector<float> after(before.size());
  ASSERT_TRUE(job->ReadWeights(3, after.data()).ok());
  EXPECT_EQ(before, after);
  const Gradients next = MakeGradients(layout_, 24, 1.0f, -1);
  Backward(*job, next, out);
  ASSERT_TRUE(job->EndIteration().ok());
  ASSERT_TRUE(job->BeginIteration().ok());
  EXPECT_EQ(job->iteration(), 1u);
}

TEST_F(SettleTest, ClosingWhileSettlingCommitsFirst) {
  const Gradients g = MakeGradients(layout_, 25, 1.0f, -1);
  OpenPairAndRunReference(g);
  Backward(*job_, g, out_);
  SlowReads(20);
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok() && r->settling);
  job_.reset();  // The step was reported done: it must not be lost.
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  job_ = Open("job", /*settle=*/true);
  ASSERT_TRUE(job_);
  EXPECT_EQ(job_->iteration(), 1u);
  ExpectSameWeights();
}

// Many aborts right after the gradients are handed over, then a full
// iteration: each abort leaves the job at iteration 0 and the iteration
// after them commits step 1. (An abort waits only until every chunk of its
// pass is finished, and the decide stage takes its count of a chunk off a
// moment after; a stale count taken off the next pass's once wrapped it
// below zero and the next EndIteration waited for ever. The rounds give
// that narrow race chances; the pass check in DecideLoop closes it.)
TEST_F(SettleTest, AbortsRightAfterSubmittingNeverStallTheNextIteration) {
  auto job = Open("job", /*settle=*/false);
  ASSERT_TRUE(job);
  std::vector<std::vector<uint16_t>> out;
  Initialize(*job, out);
  const Gradients g = MakeGradients(layout_, 31, 1.0f, -1);
  for (int round = 0; round < 200; ++round) {
    ASSERT_TRUE(job->BeginIteration(1.0f, std::nullopt,
                                    ClipOptions{.max_grad_norm = 1e9})
                    .ok());
    for (size_t l = 0; l < g.bytes.size(); ++l) {
      ASSERT_TRUE(
          job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
    }
    ASSERT_TRUE(job->AbortIteration().ok()) << "round " << round;
  }
  ASSERT_TRUE(
      job->BeginIteration(1.0f, std::nullopt, ClipOptions{.max_grad_norm = 1e9})
          .ok());
  for (size_t l = 0; l < g.bytes.size(); ++l) {
    ASSERT_TRUE(job->SubmitGradients(l, g.bytes[l].data(), out[l].data()).ok());
  }
  absl::StatusOr<IterationReport> r = job->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->iteration, 1u);
}

// Reads slowed to 100 ms: while the reader is on the first eager chunk,
// the decisions run on, and clipping becomes certain at decision 7. The
// eager chunks not begun by then are dropped, not updated and redone: they
// run once after the norm. The result is the reference's, bit for bit.
TEST_F(SettleTest, EagerUpdatesNotBegunAreDroppedOnceClippingIsCertain) {
  const Gradients g = MakeGradients(layout_, 41, 1.0f, -1);
  const ClipOptions clip{.max_grad_norm =
                             clip_test::LimitCrossingAt(layout_, 41, 7)};
  ref_ = Open("ref", /*settle=*/false);
  job_ = Open("job", /*settle=*/false);
  ASSERT_TRUE(ref_ && job_);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  Backward(*ref_, g, ref_out_, clip);
  ASSERT_TRUE(ref_->EndIteration().ok());
  SlowReads(100);
  Backward(*job_, g, out_, clip);
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->clipped);
  EXPECT_EQ(r->eager_chunks, 7u);
  EXPECT_GE(r->dropped_chunks, 1u);
  EXPECT_EQ(r->redone_chunks + r->dropped_chunks, r->eager_chunks);
  // Every state read once, and those updated before the norm once more.
  EXPECT_LT(r->busy.bytes_read, 2 * StateBytes());
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// Read-ahead of every chunk once clipping is certain (at the first
// decision); the first state read on one SSD fails. That read-ahead is
// dropped, its chunk's update reads the state again, and the iteration
// commits the reference's weights.
TEST_F(SettleTest, AFailedReadAheadIsReadAgainByTheUpdate) {
  const Gradients g = MakeGradients(layout_, 43, 1.0f, -1);
  ref_ = Open("ref", /*settle=*/false);
  job_ = Open("job", /*settle=*/false, /*read_ahead=*/uint64_t{1} << 30);
  ASSERT_TRUE(ref_ && job_);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  faults_[0]->Inject({.fault = FaultInjectionDevice::Fault::kEio,
                      .op = IoRequest::Op::kRead,
                      .count = 1});
  Backward(*job_, g, out_);
  // Every read-ahead done (one failed) before the norm stops them.
  AwaitReadAhead(kChunks - 1, [&] { return faults_[0]->faults_fired() == 1; });
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(faults_[0]->faults_fired(), 1u);
  EXPECT_EQ(r->deferred_chunks, kChunks);
  EXPECT_EQ(r->busy.read_ahead_used, kChunks - 1);
  // The failed read moved nothing: each state was read once.
  EXPECT_EQ(r->busy.bytes_read, StateBytes());
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
  // The next iteration (predicted to clip) reads ahead from its start.
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  Backward(*job_, g, out_);
  AwaitReadAhead(kChunks, [] { return true; });
  r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->started_deferred);
  EXPECT_EQ(r->busy.read_ahead_used, kChunks);
  EXPECT_EQ(r->busy.bytes_read, StateBytes());
  ExpectSameWeights();
}

// Streamed gradients are stored in SubmitGradients, which backward waits
// for: a read-ahead does not begin while one is being stored. The first
// read-ahead's read is held (3 s) and the first gradient's store begins
// while it is (held 8 s); the next read-ahead then waits for that store
// to end. Each step waits for the fault hook to fire, not for a time.
TEST_F(SettleTest, ReadAheadWaitsWhileAStreamedGradientIsStored) {
  const Gradients g = MakeGradients(layout_, 47, 1.0f, -1);
  OpenStreamedPairPredictedToClip(g);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(job_->read_ahead_budget_chunks(), kChunks);
  HoldNext(IoRequest::Op::kRead, 3000);
  ASSERT_TRUE(
      job_->BeginIteration(1.0f, std::nullopt, {.max_grad_norm = 1e-3}).ok());
  AwaitHeld(1);  // the first read-ahead's read, held
  HoldNext(IoRequest::Op::kWrite, 8000);
  const size_t last = g.bytes.size() - 1;
  std::atomic<bool> stored{false};
  std::thread backward([&] {
    EXPECT_TRUE(
        job_->SubmitGradients(last, g.bytes[last].data(), out_[last].data())
            .ok());
    stored = true;
  });
  AwaitHeld(2);                              // the gradient's store, held
  EXPECT_EQ(job_->chunks_read_ahead(), 0u);  // the read still held
  // The held read-ahead done, the store still under way: no other
  // read-ahead began beside it.
  AwaitReadAhead(1, [] { return true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(stored.load());
  EXPECT_EQ(job_->chunks_read_ahead(), 1u);
  backward.join();
  // Once it is stored, the rest are read ahead.
  AwaitReadAhead(kChunks, [] { return true; });
  for (size_t l = last; l-- > 0;) {
    ASSERT_TRUE(
        job_->SubmitGradients(l, g.bytes[l].data(), out_[l].data()).ok());
  }
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->started_deferred);
  EXPECT_EQ(r->busy.read_ahead_used, kChunks);
  // The gradients handed over once their chunks' states were read ahead
  // stayed in those buffers; only the last layer's (5 chunks, stored
  // before their read-ahead) went to the SSDs and came back.
  const uint64_t last_grad = 2 * layout_.layer_elements[last];
  EXPECT_EQ(r->busy.grad_bytes_kept_ahead, GradBytes() - last_grad);
  EXPECT_EQ(r->busy.bytes_written, StateBytes() + last_grad);
  EXPECT_EQ(r->busy.bytes_read, StateBytes() + last_grad);
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// A chunk's read-ahead yields to a gradient's store part by part, not
// only at its start: a store that begins while the first of its three
// parts is read holds the other two until it is done.
TEST_F(SettleTest, ReadAheadYieldsToAStoreBetweenItsParts) {
  layout_.layer_elements = {16000, 16000};
  layout_.chunk_elements = 16000;  // a state of 192,000 bytes: 3 stripes
  OpenStore(/*gate_unit=*/64 << 10);
  const Gradients g = MakeGradients(layout_, 48, 1.0f, -1);
  OpenStreamedPairPredictedToClip(g);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(job_->read_ahead_budget_chunks(), 2u);
  // Layer 0's read-ahead: its first part held in its submission for 1.5 s.
  HoldNext(IoRequest::Op::kRead, 1500);
  ASSERT_TRUE(
      job_->BeginIteration(1.0f, std::nullopt, {.max_grad_norm = 1e-3}).ok());
  AwaitHeld(1);
  // Layer 1's gradient stored meanwhile, its write held for 6 s.
  HoldNext(IoRequest::Op::kWrite, 6000);
  std::atomic<bool> stored{false};
  std::thread backward([&] {
    EXPECT_TRUE(
        job_->SubmitGradients(1, g.bytes[1].data(), out_[1].data()).ok());
    stored = true;
  });
  AwaitHeld(2);
  // Any read from now on fires this (a second part's, say).
  for (FaultInjectionDevice* ssd : faults_) {
    ssd->Inject({.fault = FaultInjectionDevice::Fault::kDelay,
                 .op = IoRequest::Op::kRead,
                 .count = 1,
                 .delay_ms = 1});
  }
  // The first part is long done; the store is not, nor any other read.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_FALSE(stored.load());
  EXPECT_EQ(FaultsFired(), 2u);
  EXPECT_EQ(job_->chunks_read_ahead(), 0u);
  backward.join();
  // Stored: the parts left go, and layer 1's chunk after them.
  AwaitReadAhead(2, [] { return true; });
  ASSERT_TRUE(job_->SubmitGradients(0, g.bytes[0].data(), out_[0].data()).ok());
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->busy.read_ahead_used, 2u);
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// A read-ahead buffer is made on a thread of its own: a read-ahead that
// waits for one (its allocation held here until the test ends, or for 20 s
// at most) lets the read stage go to the updates the moment the norm is
// known, and the iteration ends as without it.
TEST_F(SettleTest, AReadAheadWaitingForMemoryNeverHoldsTheUpdatesUp) {
  const Gradients g = MakeGradients(layout_, 57, 1.0f, -1);
  absl::Mutex mu;
  int made = 0;
  bool released = false;
  make_buffer_ = [&](size_t bytes) {
    absl::MutexLock lock(&mu);
    if (++made > 1) mu.Await(absl::Condition(&released));
    return std::make_unique<AlignedBuffer>(bytes, 4096);
  };
  ref_ = Open("ref", /*settle=*/false);
  job_ = Open("job", /*settle=*/false, /*read_ahead=*/uint64_t{1} << 30);
  ASSERT_TRUE(ref_ && job_);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  std::thread watchdog([&] {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(20));
    released = true;
  });
  // Clipping certain from the first chunk: read-ahead begins at once; the
  // first buffer is made, the second held.
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  Backward(*job_, g, out_);
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n >= 2; }, &made));
  }
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(released);  // ended while the allocation was still held
    released = true;
  }
  watchdog.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->clipped);
  EXPECT_LE(r->busy.read_ahead_used, 1u);
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// A streamed gradient handed over after its chunk's state was read ahead
// (the update certain to run once, after the norm) is copied into that
// buffer instead of stored: the SSDs carry only the states. An aborted
// iteration and a skipped one leave nothing behind; each result is the
// same, bit for bit, as a job that stores every gradient.
TEST_F(SettleTest, GradientsOfChunksReadAheadNeverReachTheSsds) {
  const Gradients g = MakeGradients(layout_, 53, 1.0f, -1);
  const Gradients nan = MakeGradients(layout_, 54, 1.0f, /*nan_layer=*/1);
  OpenStreamedPair();
  ASSERT_FALSE(HasFatalFailure());
  // Begins an iteration predicted to clip (it reads ahead from its start)
  // and hands over the layers below `first` once every state is read
  // ahead. With `held`, the first read-ahead's read is held (3 s) while
  // the layers from `first` up are handed over: their gradients are
  // stored before their chunks are read ahead.
  auto backward = [&](const Gradients& grads, size_t first, bool held) {
    const uint64_t fired = FaultsFired();
    if (held) HoldNext(IoRequest::Op::kRead, 3000);
    ASSERT_TRUE(
        job_->BeginIteration(1.0f, std::nullopt, {.max_grad_norm = 1e-3}).ok());
    if (held) AwaitHeld(fired + 1);
    for (size_t l = grads.bytes.size(); l-- > first;) {
      ASSERT_TRUE(
          job_->SubmitGradients(l, grads.bytes[l].data(), out_[l].data()).ok());
    }
    AwaitReadAhead(kChunks, [] { return true; });
    for (size_t l = first; l-- > 0;) {
      ASSERT_TRUE(
          job_->SubmitGradients(l, grads.bytes[l].data(), out_[l].data()).ok());
    }
  };
  const size_t layers = g.bytes.size();
  // Clipped: the next iteration is predicted to clip.
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  Backward(*job_, g, out_);
  ASSERT_TRUE(job_->EndIteration().ok());
  // Every gradient kept, then thrown away.
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->AbortIteration().ok());
  backward(g, layers, /*held=*/false);
  ASSERT_TRUE(job_->AbortIteration().ok());
  // The last layer's gradient stored while the first read-ahead is held:
  // its chunks (5), read ahead after it, read it back from the SSDs, not
  // from buffers that held gradients in the iteration thrown away.
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  backward(g, layers - 1, /*held=*/true);
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->clipped);
  EXPECT_EQ(r->busy.grad_bytes_kept_ahead,
            GradBytes() - 2 * layout_.layer_elements.back());
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
  // Skipped (a NaN): nothing written.
  Backward(*ref_, nan, ref_out_);
  absl::StatusOr<IterationReport> want = ref_->EndIteration();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(want->skipped);
  backward(nan, layers, /*held=*/false);
  r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped);
  EXPECT_EQ(r->busy.bytes_written, 0u);
  // Clipped, every gradient kept: the SSDs carry the states alone.
  Backward(*ref_, g, ref_out_);
  want = ref_->EndIteration();
  ASSERT_TRUE(want.ok()) << want.status();
  backward(g, layers, /*held=*/false);
  r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->clipped);
  EXPECT_EQ(r->busy.read_ahead_used, kChunks);
  EXPECT_EQ(r->busy.grad_bytes_kept_ahead, GradBytes());
  EXPECT_EQ(r->busy.bytes_read, StateBytes());
  EXPECT_EQ(r->busy.bytes_written, StateBytes());
  EXPECT_GT(want->busy.bytes_written, StateBytes());  // its gradients
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// As above, but a NaN in the last layer handed over, kept
// (skip_nonfinite=false): clipping looked certain, then the non-finite sum
// cancels it, and the dropped chunks must still get their (unclipped)
// update after the norm.
TEST_F(SettleTest, DroppedUpdatesRunWhenANonFiniteGradientCancelsTheClip) {
  const Gradients g = MakeGradients(layout_, 45, 1.0f, /*nan_layer=*/0);
  ref_ = Open("ref", /*settle=*/false);
  job_ = Open("job", /*settle=*/false);
  ASSERT_TRUE(ref_ && job_);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  // Eager until clipping is certain at decision 3.
  const ClipOptions crossing{
      .max_grad_norm = clip_test::LimitCrossingAt(layout_, 45, 3),
      .skip_nonfinite = false};
  Backward(*ref_, g, ref_out_, crossing);
  absl::StatusOr<IterationReport> want = ref_->EndIteration();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(want->nonfinite);
  ASSERT_FALSE(want->clipped);
  SlowReads(100);
  Backward(*job_, g, out_, crossing);
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  for (FaultInjectionDevice* f : faults_) f->ClearFaults();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->clipped);
  EXPECT_FALSE(r->skipped);
  EXPECT_EQ(r->iteration, 1u);
  EXPECT_GE(r->dropped_chunks, 1u);
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
}

// The read-ahead memory is the daemon's, shared among jobs: alone, a job
// reads ahead every chunk; once a second job joins, half of them (its
// share), the buffers beyond it given back; when that job leaves, all
// again. The results are the reference's throughout.
// The read-ahead buffers are made up to the budget at once, in the first
// iteration that reads ahead: here while its first read is held, before
// any read-ahead could ask for a second one.
TEST_F(SettleTest, ReadAheadBuffersAreMadeUpToTheBudgetAtOnce) {
  const Gradients g = MakeGradients(layout_, 47, 1.0f, -1);
  ref_ = Open("ref", /*settle=*/false);
  ASSERT_TRUE(ref_);
  const uint64_t buffer = ref_->chunk_buffer_bytes();
  MemoryShares shares(uint64_t{1} << 30);
  job_ = Open("job", /*settle=*/false, /*read_ahead=*/3 * buffer, &shares);
  ASSERT_TRUE(job_);
  // Layer 0's chunks: two full ones and a half one, whose buffer is
  // smaller; with layer 1's full one they would not fit.
  ASSERT_EQ(job_->read_ahead_budget_chunks(), 3u);
  ASSERT_LT(job_->read_ahead_buffer_bytes(2), buffer);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  Backward(*ref_, g, ref_out_);
  ASSERT_TRUE(ref_->EndIteration().ok());
  // Clipping is certain from the first chunk on: read-ahead begins, its
  // first read held.
  HoldNext(IoRequest::Op::kRead, 4000);
  Backward(*job_, g, out_);
  AwaitHeld(1);
  // (Buffers made one per read-ahead would stay at one for the hold.)
  for (int i = 0; i < 200 && shares.Held("job") < ReadAheadBytes(3); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(shares.Held("job"), ReadAheadBytes(3));
  EXPECT_EQ(job_->chunks_read_ahead(), 0u);  // the first read still held
  absl::StatusOr<IterationReport> r = job_->EndIteration();
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSameWeights();
  EXPECT_EQ(out_, ref_out_);
  EXPECT_EQ(shares.Held("job"), ReadAheadBytes(3));  // kept for the next one
  job_.reset();  // before the shares it holds
}

// read_ahead_adapts with a cap of every chunk: the first iteration reads
// ahead up to the cap. One whose first read is held past the norm shrinks
// the next to what was read then (none: one), and the spare buffers
// beyond the next growth are given back, but only if its read-ahead was
// queued at its start (the first iteration's, queued once clipping became
// certain, leaves the target); each that reads all it queued before the
// norm grows the next by a quarter (one at least). The same bits as a job
// that reads nothing ahead, every time.
TEST_F(SettleTest, AnAdaptingReadAheadFollowsWhatBackwardReadsInTime) {
  const Gradients g = MakeGradients(layout_, 53, 1.0f, -1);
  ref_ = Open("ref", /*settle=*/false);
  ASSERT_TRUE(ref_);
  const uint64_t buffer = ref_->chunk_buffer_bytes();
  MemoryShares shares(uint64_t{1} << 30);
  read_ahead_adapts_ = true;
  job_ = Open("job", /*settle=*/false, kChunks * buffer, &shares);
  ASSERT_TRUE(job_);
  ASSERT_EQ(job_->read_ahead_budget_chunks(), kChunks);
  EXPECT_EQ(job_->read_ahead_target_chunks(), kChunks);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  // The first read is held past the norm (the read stage's others wait
  // behind it): no read-ahead is done in time. (Not predicted, the first
  // is an eager update's, whose chunk may span both SSDs.)
  auto held_past_the_norm = [&](bool predicted) {
    Backward(*ref_, g, ref_out_);
    ASSERT_TRUE(ref_->EndIteration().ok());
    const uint64_t fired = FaultsFired();
    HoldNext(IoRequest::Op::kRead, 2000);
    Backward(*job_, g, out_);
    for (int i = 0; i < 3000 && FaultsFired() == fired; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (FaultInjectionDevice* ssd : faults_) ssd->ClearFaults();
    ASSERT_GT(FaultsFired(), fired);
    EXPECT_EQ(job_->chunks_read_ahead(), 0u);
    absl::StatusOr<IterationReport> r = job_->EndIteration();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->started_deferred, predicted);
    ExpectSameWeights();
    EXPECT_EQ(out_, ref_out_);
  };
  held_past_the_norm(/*predicted=*/false);
  EXPECT_EQ(job_->read_ahead_target_chunks(), kChunks);
  IterateReadingAhead(g, kChunks);
  EXPECT_EQ(job_->read_ahead_target_chunks(), kChunks);  // the cap
  EXPECT_EQ(shares.Held("job"), ReadAheadBytes(kChunks));
  held_past_the_norm(/*predicted=*/true);
  EXPECT_EQ(job_->read_ahead_target_chunks(), 1u);
  // Kept: the buffers the next growth (to two) would take (the largest:
  // two full chunks').
  EXPECT_EQ(shares.Held("job"), 2 * buffer);
  for (size_t want : {1, 2, 3, 4}) {
    IterateReadingAhead(g, want);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(job_->read_ahead_target_chunks(), want + 1);
  }
  IterateReadingAhead(g, 5);
  EXPECT_EQ(job_->read_ahead_target_chunks(), 6u);  // 5 + 5 / 4
  EXPECT_EQ(shares.Held("job"), ReadAheadBytes(5));
  job_.reset();  // before the shares it holds
}

// Each read-ahead buffer is sized for its chunk: layer 0's half chunk and
// layer 2's small one take less than a full chunk's, so the memory of four
// full buffers reads five chunks ahead, and holds no more.
TEST_F(SettleTest, EachReadAheadBufferIsSizedForItsChunk) {
  const Gradients g = MakeGradients(layout_, 59, 1.0f, -1);
  ref_ = Open("ref", /*settle=*/false);
  ASSERT_TRUE(ref_);
  const uint64_t buffer = ref_->chunk_buffer_bytes();
  MemoryShares shares(uint64_t{1} << 30);
  job_ = Open("job", /*settle=*/false, /*read_ahead=*/4 * buffer, &shares);
  ASSERT_TRUE(job_);
  EXPECT_EQ(job_->read_ahead_buffer_bytes(0), buffer);
  EXPECT_LT(job_->read_ahead_buffer_bytes(2), buffer);
  EXPECT_LT(job_->read_ahead_buffer_bytes(4), job_->read_ahead_buffer_bytes(2));
  ASSERT_EQ(ReadAheadBytes(5), 4 * buffer);
  ASSERT_EQ(job_->read_ahead_budget_chunks(), 5u);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  for (int i = 0; i < 2; ++i) {
    IterateReadingAhead(g, 5);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(shares.Held("job"), 4 * buffer);
  }
  job_.reset();  // before the shares it holds
}

TEST_F(SettleTest, ReadAheadTakesOnlyItsShareOfTheDaemonsMemory) {
  const Gradients g = MakeGradients(layout_, 47, 1.0f, -1);
  ref_ = Open("ref", /*settle=*/false);
  ASSERT_TRUE(ref_);
  const uint64_t buffer = ref_->chunk_buffer_bytes();
  MemoryShares shares(kChunks * buffer);
  job_ = Open("job", /*settle=*/false, uint64_t{1} << 30, &shares);
  ASSERT_TRUE(job_);
  Initialize(*ref_, ref_out_);
  Initialize(*job_, out_);
  IterateReadingAhead(g, kChunks);
  EXPECT_EQ(shares.Held("job"), ReadAheadBytes(kChunks));
  std::unique_ptr<JobPipeline> other =
      Open("other", /*settle=*/false, uint64_t{1} << 30, &shares);
  ASSERT_TRUE(other);
  EXPECT_EQ(shares.ShareOf("job"), kChunks / 2 * buffer);
  // Given back, the smallest first, down to the share: five full chunks'
  // buffers, which the first five chunks take.
  IterateReadingAhead(g, kChunks / 2);
  EXPECT_EQ(shares.Held("job"), kChunks / 2 * buffer);
  other.reset();
  // Those five kept, and the rest's own.
  IterateReadingAhead(g, kChunks);
  EXPECT_EQ(shares.Held("job"), kChunks / 2 * buffer + ReadAheadBytes(kChunks) -
                                    ReadAheadBytes(kChunks / 2));
  job_.reset();
  EXPECT_EQ(shares.Held("job"), 0u);
}

}  // namespace
}  // namespace lohan
