// JobSession on its own: a real HostPool arena, a real TensorStore on
// O_DIRECT files in a temporary directory, this CPU's Adam updater, and the
// rings driven in-process the way liblohan_client drives them (the arena
// fd mapped again, a producer on the submission ring, a consumer on the
// completion ring).

#include "daemon/session/job_session.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/common/test_point.h"
#include "daemon/optim/adam.h"
#include "daemon/optim/half.h"
#include "daemon/pool/host_pool.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"
#include "proto/lohan.pb.h"
#include "wire/ring.h"
#include "wire/ring_entry.h"

namespace lohan {
namespace {

using testing_util::TempDir;

constexpr uint64_t kMiB = 1 << 20;
// A failsafe for a completion that never comes (a broken session), not a
// measure of anything.
constexpr absl::Duration kFailsafe = absl::Seconds(60);

// Two bf16 layers of uneven size, several chunks each.
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
  adam->set_weight_decay(0.01);
  adam->set_decoupled_weight_decay(true);
  return spec;
}

// The client's mapping of the arena.
class Mapping {
 public:
  Mapping(int fd, uint64_t bytes) : bytes_(bytes) {
    void* mapped =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    base_ = mapped == MAP_FAILED ? nullptr : static_cast<uint8_t*>(mapped);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  uint8_t* base() const { return base_; }

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_;
};

class JobSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    StoreOptions options;
    options.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    options.state_dir = dir_.path() + "/state";
    options.stripe_unit = 64 << 10;
    options.queue_depth = 8;
    options.device_capacity_bytes = 16 << 20;
    auto store = TensorStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  JobSession::UpdateParts Parts() const {
    return JobSession::UpdateParts{.store = store_.get(),
                                   .updater = &*updater_,
                                   .job = {.data_parallel_rank = rank_job_}};
  }

  // Parts() makes the job a data-parallel rank's (keep_previous_commit).
  bool rank_job_ = false;

  // A session of `arena_bytes` for job "job", registered with `spec`.
  void Open(uint64_t arena_bytes, const v1::ModelSpec& spec) {
    auto session = JobSession::Create(&pool_, "job", arena_bytes);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    auto registered = session_->RegisterModel(spec, Parts());
    ASSERT_TRUE(registered.ok()) << registered.status();
    response_ = *registered;
    Attach();
  }

  // The client's side of the rings.
  void Attach() {
    const ArenaGrant& grant = session_->grant();
    mapping_.emplace(session_->arena_fd(), grant.arena_bytes);
    ASSERT_NE(mapping_->base(), nullptr);
    auto submissions =
        RingProducer::Attach(mapping_->base() + grant.submission_offset,
                             grant.submission_bytes, kRingEntryBytes);
    ASSERT_TRUE(submissions.ok()) << submissions.status();
    submissions_.emplace(*std::move(submissions));
    auto completions =
        RingConsumer::Attach(mapping_->base() + grant.completion_offset,
                             grant.completion_bytes, kRingEntryBytes);
    ASSERT_TRUE(completions.ok()) << completions.status();
    completions_.emplace(*std::move(completions));
  }

  uint8_t* At(uint64_t offset) const { return mapping_->base() + offset; }

  // Sends `entry` and waits for its completion (one request at a time).
  CompletionEntry Call(SubmissionEntry entry) {
    entry.request_id = ++request_id_;
    CompletionEntry done{};
    auto pushed = submissions_->TryPush(&entry);
    EXPECT_TRUE(pushed.ok() && *pushed);
    if (!pushed.ok() || !*pushed) return done;
    while (true) {
      auto popped = completions_->TryPop(&done);
      EXPECT_TRUE(popped.ok()) << popped.status();
      if (!popped.ok() || *popped) break;
      if (!completions_->WaitForEntries(kFailsafe).ok()) {
        ADD_FAILURE() << "no completion for request " << entry.request_id;
        break;
      }
    }
    EXPECT_EQ(done.request_id, entry.request_id);
    return done;
  }

  absl::StatusCode Code(const CompletionEntry& done) const {
    return static_cast<absl::StatusCode>(done.status_code);
  }

  // The text of a failed completion (ring_entry.h's error text records).
  std::string ErrorText(const CompletionEntry& done) const {
    const uint64_t records =
        response_.error_text_bytes() / kErrorTextRecordBytes;
    const uint8_t* record = At(response_.error_text_offset()) +
                            (done.detail - 1) % records * kErrorTextRecordBytes;
    return std::string(reinterpret_cast<const char*>(record + 8));
  }

  static SubmissionEntry Entry(RingOp op) {
    SubmissionEntry entry{};
    entry.op = static_cast<uint16_t>(op);
    return entry;
  }
  SubmissionEntry Staging(RingOp op, uint32_t layer) const {
    SubmissionEntry entry = Entry(op);
    entry.layer = layer;
    entry.slot_offset = response_.staging_offset();
    entry.length = elements(layer) * 4;
    return entry;
  }
  SubmissionEntry Iter(RingOp op, uint64_t iteration) const {
    SubmissionEntry entry = Entry(op);
    entry.iteration = iteration;
    return entry;
  }
  SubmissionEntry Grad(uint32_t layer) const {
    SubmissionEntry entry = Entry(RingOp::kGradReady);
    entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    entry.layer = layer;
    entry.slot_offset = response_.layers(layer).grad_offset();
    entry.length = response_.layers(layer).bytes();
    return entry;
  }

  uint64_t elements(size_t layer) const {
    return response_.layers(static_cast<int>(layer)).bytes() / 2;
  }
  size_t layers() const { return response_.layers_size(); }
  std::vector<uint8_t> WeightSlot(size_t layer) const {
    const v1::LayerSlots& slots = response_.layers(static_cast<int>(layer));
    const uint8_t* begin = At(slots.weight_offset());
    return std::vector<uint8_t>(begin, begin + slots.bytes());
  }
  // The layer's committed fp32 weights (READ_WEIGHTS), as bf16 bytes.
  std::vector<uint8_t> CommittedBf16(uint32_t layer) {
    const CompletionEntry done = Call(Staging(RingOp::kReadWeights, layer));
    EXPECT_EQ(Code(done), absl::StatusCode::kOk) << ErrorText(done);
    const float* weights =
        reinterpret_cast<const float*>(At(response_.staging_offset()));
    std::vector<uint8_t> bytes(elements(layer) * 2);
    for (uint64_t i = 0; i < elements(layer); ++i) {
      const uint16_t h = FloatToBf16(weights[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    return bytes;
  }
  // Writes reproducible bf16 gradients into every layer's gradient slot.
  void FillGradients(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.1f);
    for (size_t l = 0; l < layers(); ++l) {
      uint16_t* grad = reinterpret_cast<uint16_t*>(
          At(response_.layers(static_cast<int>(l)).grad_offset()));
      for (uint64_t i = 0; i < elements(l); ++i) {
        grad[i] = FloatToBf16(dist(rng));
      }
    }
  }

  TempDir dir_;
  HostPool pool_{HostPool::Options{.capacity_bytes = 64 * kMiB,
                                   .try_huge_pages = false,
                                   .lock_in_ram = false}};
  std::optional<AdamUpdater> updater_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<JobSession> session_;  // before what it uses goes
  v1::RegisterModelResponse response_;
  std::optional<Mapping> mapping_;
  std::optional<RingProducer> submissions_;
  std::optional<RingConsumer> completions_;
  uint64_t request_id_ = 0;
};

TEST_F(JobSessionTest, RegisteredSlotsLieInTheArenaAndApart) {
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  EXPECT_TRUE(session_->registered());
  EXPECT_TRUE(session_->weights_resident());
  EXPECT_FALSE(session_->InIteration());
  const ArenaGrant& grant = session_->grant();
  EXPECT_EQ(grant.arena_bytes, 4 * kMiB);
  ASSERT_EQ(response_.layers_size(), 2);
  EXPECT_EQ(response_.iteration(), 0u);
  struct Range {
    uint64_t begin, bytes;
    std::string what;
  };
  std::vector<Range> ranges = {
      {grant.submission_offset, grant.submission_bytes, "submissions"},
      {grant.completion_offset, grant.completion_bytes, "completions"},
      {response_.staging_offset(), response_.staging_bytes(), "staging"},
      {response_.error_text_offset(), response_.error_text_bytes(),
       "error text"},
  };
  EXPECT_GE(response_.staging_bytes(), 2500u * 4);  // the largest, fp32
  EXPECT_EQ(response_.error_text_bytes(), JobSession::kErrorTextBytes);
  for (int l = 0; l < response_.layers_size(); ++l) {
    const v1::LayerSlots& slots = response_.layers(l);
    EXPECT_EQ(slots.bytes(), Spec().layer_elements(l) * 2u);
    ranges.push_back({slots.grad_offset(), slots.bytes(),
                      absl::StrCat("layer ", l, " gradient")});
    ranges.push_back({slots.weight_offset(), slots.bytes(),
                      absl::StrCat("layer ", l, " weights")});
    EXPECT_FALSE(response_.layer_initialized(l));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_GT(ranges[i].bytes, 0u) << ranges[i].what;
    EXPECT_LE(ranges[i].begin + ranges[i].bytes, grant.arena_bytes)
        << ranges[i].what;
    if (i > 0) {
      EXPECT_LE(ranges[i - 1].begin + ranges[i - 1].bytes, ranges[i].begin)
          << ranges[i - 1].what << " overlaps " << ranges[i].what;
    }
  }

  // One model per data plane.
  auto again = session_->RegisterModel(Spec(), Parts());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
      << again.status();
  EXPECT_EQ(pool_.GetStats().used_bytes, 4 * kMiB);
  session_.reset();
  EXPECT_EQ(pool_.GetStats().used_bytes, 0u);
}

TEST_F(JobSessionTest, AnArenaTooSmallGivesBackEverySlot) {
  // Eight layers of 128 KiB (bf16): resident they need 1 MiB of gradient
  // and 1 MiB of weight buffers; streamed through one buffer of each, 256
  // KiB plus the 256 KiB staging slot.
  v1::ModelSpec spec = Spec();
  spec.clear_layer_elements();
  for (int l = 0; l < 8; ++l) spec.add_layer_elements(64 * 1024);
  spec.set_chunk_elements(16 * 1024);
  const uint64_t arena_bytes = 1536 * 1024;
  auto created = JobSession::Create(&pool_, "job", arena_bytes);
  ASSERT_TRUE(created.ok()) << created.status();
  session_ = *std::move(created);
  auto refused = session_->RegisterModel(spec, Parts());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_NE(refused.status().message().find("host_pool_bytes"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("weight_slots"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(session_->registered());
  EXPECT_TRUE(store_->List("job").empty());  // no state opened
  // Streamed, the model fits only if the refused registration's gradient
  // buffers (1 MiB of the arena) were given back.
  spec.set_grad_slots(1);
  spec.set_weight_slots(1);
  auto registered = session_->RegisterModel(spec, Parts());
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_TRUE(session_->registered());
  EXPECT_FALSE(session_->weights_resident());
  EXPECT_EQ(registered->grad_slots(), 1u);
  EXPECT_EQ(registered->weight_slots(), 1u);
  EXPECT_EQ(pool_.GetStats().used_bytes, arena_bytes);
}

TEST_F(JobSessionTest, AClientsLayoutTableIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  // What a client registering its own layout would send: two sizes in the
  // staging slot.
  const uint64_t table[2] = {5000, 2000};
  std::memcpy(At(response_.staging_offset()), table, sizeof(table));
  SubmissionEntry entry = Entry(RingOp::kReservedRegisterLayout);
  entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
  entry.layer = 2;
  entry.slot_offset = response_.staging_offset();
  entry.length = sizeof(table);
  const CompletionEntry done = Call(entry);
  EXPECT_EQ(Code(done), absl::StatusCode::kInvalidArgument);
  const std::string text = ErrorText(done);
  EXPECT_NE(text.find("REGISTER_LAYOUT"), std::string::npos) << text;
  EXPECT_NE(text.find("RegisterModel"), std::string::npos) << text;
  // The session serves on with the registered layout.
  SubmissionEntry begin = Iter(RingOp::kIterBegin, 0);
  const CompletionEntry no_weights = Call(begin);
  EXPECT_EQ(Code(no_weights), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ErrorText(no_weights).find("INIT_WEIGHTS"), std::string::npos)
      << ErrorText(no_weights);
  EXPECT_EQ(session_->Status().failed_requests(), 2u);
}

TEST_F(JobSessionTest, IterationsThroughTheRingsAndAFailedEnd) {
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  // INIT_WEIGHTS: the fp32 weights through the staging slot; the weight
  // slot then holds their bf16 copy.
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  for (uint32_t l = 0; l < layers(); ++l) {
    float* staging = reinterpret_cast<float*>(At(response_.staging_offset()));
    for (uint64_t i = 0; i < elements(l); ++i) staging[i] = dist(rng);
    const CompletionEntry done = Call(Staging(RingOp::kInitWeights, l));
    ASSERT_EQ(Code(done), absl::StatusCode::kOk) << ErrorText(done);
    EXPECT_EQ(WeightSlot(l), CommittedBf16(l)) << "layer " << l;
  }
  const std::vector<uint8_t> initial0 = WeightSlot(0);

  // A whole iteration: the updates write the new weights into the slots.
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 0))), absl::StatusCode::kOk);
  EXPECT_TRUE(session_->InIteration());
  FillGradients(1);
  for (uint32_t l = layers(); l-- > 0;) {
    const CompletionEntry done = Call(Grad(l));
    ASSERT_EQ(Code(done), absl::StatusCode::kOk) << ErrorText(done);
  }
  const CompletionEntry ended = Call(Iter(RingOp::kIterEnd, 0));
  ASSERT_EQ(Code(ended), absl::StatusCode::kOk) << ErrorText(ended);
  double norm;
  std::memcpy(&norm, &ended.detail, sizeof(norm));
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(ended.flags, 0u);
  EXPECT_FALSE(session_->InIteration());
  EXPECT_EQ(session_->Status().iteration(), 1u);
  EXPECT_NE(WeightSlot(0), initial0);
  std::vector<std::vector<uint8_t>> committed;
  for (uint32_t l = 0; l < layers(); ++l) {
    committed.push_back(CommittedBf16(l));
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }

  // Only the last layer's gradient comes: ITER_END fails once its update
  // wrote into its weight slot, and the slot holds the committed weights.
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 1))), absl::StatusCode::kOk);
  FillGradients(2);
  ASSERT_EQ(Code(Call(Grad(1))), absl::StatusCode::kOk);
  const CompletionEntry failed = Call(Iter(RingOp::kIterEnd, 1));
  EXPECT_EQ(Code(failed), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ErrorText(failed).find("layer 0"), std::string::npos)
      << ErrorText(failed);
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }
  EXPECT_EQ(session_->Status().iteration(), 1u);

  // ITER_ABORT after a gradient: the slots hold the committed weights.
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 2))), absl::StatusCode::kOk);
  FillGradients(3);
  ASSERT_EQ(Code(Call(Grad(1))), absl::StatusCode::kOk);
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterAbort, 2))), absl::StatusCode::kOk);
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }

  // The job goes on from the committed iteration.
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 3))), absl::StatusCode::kOk);
  FillGradients(4);
  for (uint32_t l = layers(); l-- > 0;) {
    ASSERT_EQ(Code(Call(Grad(l))), absl::StatusCode::kOk);
  }
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterEnd, 3))), absl::StatusCode::kOk);
  EXPECT_EQ(session_->Status().iteration(), 2u);
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_EQ(WeightSlot(l), CommittedBf16(l)) << "layer " << l;
    EXPECT_NE(WeightSlot(l), committed[l]) << "layer " << l;
  }
}

TEST_F(JobSessionTest, AGivenGlobalSumOfSquaresDecidesTheIterationsEnd) {
  // Clipping at 1: this job's own gradients (norm about 6) always clip.
  v1::ModelSpec spec = Spec();
  spec.set_max_grad_norm(1.0);
  spec.set_skip_nonfinite(true);
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, spec));
  for (uint32_t l = 0; l < layers(); ++l) {
    float* staging = reinterpret_cast<float*>(At(response_.staging_offset()));
    for (uint64_t i = 0; i < elements(l); ++i) staging[i] = 0.25f;
    ASSERT_EQ(Code(Call(Staging(RingOp::kInitWeights, l))),
              absl::StatusCode::kOk);
  }
  auto end_with = [&](uint64_t iteration, double global) {
    SubmissionEntry end = Iter(RingOp::kIterEnd, iteration);
    end.iter_flags = kIterEndSumSquaresGiven;
    end.global_sum_squares = global;
    return Call(end);
  };
  auto run_backward = [&](uint64_t iteration, uint32_t seed) {
    ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, iteration))),
              absl::StatusCode::kOk);
    FillGradients(seed);
    for (uint32_t l = layers(); l-- > 0;) {
      ASSERT_EQ(Code(Call(Grad(l))), absl::StatusCode::kOk);
    }
  };
  auto norm_of = [](const CompletionEntry& done) {
    double norm;
    std::memcpy(&norm, &done.detail, sizeof(norm));
    return norm;
  };

  // Every rank's sum says norm 0.5: committed unclipped, the norm reported
  // is the given one.
  ASSERT_NO_FATAL_FAILURE(run_backward(0, 1));
  const CompletionEntry unclipped = end_with(0, 0.25);
  ASSERT_EQ(Code(unclipped), absl::StatusCode::kOk) << ErrorText(unclipped);
  EXPECT_EQ(unclipped.flags, 0u);
  EXPECT_EQ(norm_of(unclipped), 0.5);
  EXPECT_EQ(session_->Status().iteration(), 1u);
  std::vector<std::vector<uint8_t>> committed;
  for (uint32_t l = 0; l < layers(); ++l) {
    committed.push_back(CommittedBf16(l));
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }

  // Another rank's gradient held an inf: skipped here too, though this
  // job's own are finite; the slots keep the committed weights.
  ASSERT_NO_FATAL_FAILURE(run_backward(1, 2));
  const CompletionEntry skipped =
      end_with(1, std::numeric_limits<double>::infinity());
  ASSERT_EQ(Code(skipped), absl::StatusCode::kOk) << ErrorText(skipped);
  EXPECT_EQ(skipped.flags, kIterEndSkipped | kIterEndNonfinite);
  EXPECT_EQ(session_->Status().iteration(), 1u);
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }

  // A negative sum is refused and ends nothing; the ITER_END after it
  // (no sum: the job's own decides) clips.
  ASSERT_NO_FATAL_FAILURE(run_backward(2, 3));
  const CompletionEntry negative = end_with(2, -1.0);
  EXPECT_EQ(Code(negative), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ErrorText(negative).find("negative"), std::string::npos)
      << ErrorText(negative);
  EXPECT_TRUE(session_->InIteration());
  const CompletionEntry own = Call(Iter(RingOp::kIterEnd, 2));
  ASSERT_EQ(Code(own), absl::StatusCode::kOk) << ErrorText(own);
  EXPECT_EQ(own.flags, kIterEndClipped);
  EXPECT_GT(norm_of(own), 1.0);
  EXPECT_EQ(session_->Status().iteration(), 2u);
}

TEST_F(JobSessionTest, AReopenedJobFindsItsCommittedWeightsInItsSlots) {
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  std::vector<std::vector<uint8_t>> committed;
  for (uint32_t l = 0; l < layers(); ++l) {
    float* staging = reinterpret_cast<float*>(At(response_.staging_offset()));
    for (uint64_t i = 0; i < elements(l); ++i) {
      staging[i] = 0.001f * static_cast<float>(i % 977) - 0.3f;
    }
    ASSERT_EQ(Code(Call(Staging(RingOp::kInitWeights, l))),
              absl::StatusCode::kOk);
    committed.push_back(WeightSlot(l));
  }
  completions_.reset();
  submissions_.reset();
  mapping_.reset();
  session_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_TRUE(response_.layer_initialized(l));
    EXPECT_EQ(WeightSlot(l), committed[l]) << "layer " << l;
  }
}

// An ITER_END that commits while its session stops (lohand's SIGTERM closes
// every session) is answered: the client hears of the step the store holds,
// not UNAVAILABLE. The test holds the ITER_END right after its commit until
// the session has begun to stop.
TEST_F(JobSessionTest, AnIterationCommittedAsItsSessionStopsIsAnswered) {
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  for (uint32_t l = 0; l < layers(); ++l) {
    float* staging = reinterpret_cast<float*>(At(response_.staging_offset()));
    for (uint64_t i = 0; i < elements(l); ++i) staging[i] = 0.25f;
    ASSERT_EQ(Code(Call(Staging(RingOp::kInitWeights, l))),
              absl::StatusCode::kOk);
  }
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 0))), absl::StatusCode::kOk);
  FillGradients(1);
  for (uint32_t l = layers(); l-- > 0;) {
    ASSERT_EQ(Code(Call(Grad(l))), absl::StatusCode::kOk);
  }
  {
    absl::Notification committed, stopping;
    ScopedTestPointHook at_commit("job_session.iteration_committed", [&] {
      committed.Notify();
      stopping.WaitForNotification();
    });
    ScopedTestPointHook at_stop("job_session.stopping",
                                [&] { stopping.Notify(); });
    SubmissionEntry end = Iter(RingOp::kIterEnd, 0);
    end.request_id = ++request_id_;
    auto pushed = submissions_->TryPush(&end);
    ASSERT_TRUE(pushed.ok() && *pushed);
    ASSERT_TRUE(committed.WaitForNotificationWithTimeout(kFailsafe));
    session_.reset();  // lets the ITER_END go on once it is stopping
  }
  CompletionEntry done{};
  auto popped = completions_->TryPop(&done);
  ASSERT_TRUE(popped.ok()) << popped.status();
  ASSERT_TRUE(*popped) << "the committed ITER_END was not answered";
  EXPECT_EQ(done.request_id, request_id_);
  EXPECT_EQ(Code(done), absl::StatusCode::kOk);
  completions_.reset();
  submissions_.reset();
  mapping_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  EXPECT_EQ(session_->Status().committed_iteration(), 1u);
}

TEST_F(JobSessionTest, ARanksJobReportsItsCommitAndGoesBackToTheOneBefore) {
  rank_job_ = true;
  ASSERT_NO_FATAL_FAILURE(Open(4 * kMiB, Spec()));
  for (uint32_t l = 0; l < layers(); ++l) {
    float* staging = reinterpret_cast<float*>(At(response_.staging_offset()));
    for (uint64_t i = 0; i < elements(l); ++i) {
      staging[i] = 0.002f * static_cast<float>(i % 409) - 0.4f;
    }
    ASSERT_EQ(Code(Call(Staging(RingOp::kInitWeights, l))),
              absl::StatusCode::kOk);
  }
  std::vector<std::vector<uint8_t>> initial;
  for (uint32_t l = 0; l < layers(); ++l) initial.push_back(WeightSlot(l));
  CompletionEntry committed = Call(Entry(RingOp::kIterCommitted));
  ASSERT_EQ(Code(committed), absl::StatusCode::kOk) << ErrorText(committed);
  EXPECT_EQ(committed.detail, 0u);
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 0))), absl::StatusCode::kOk);
  EXPECT_EQ(Code(Call(Entry(RingOp::kIterCommitted))),
            absl::StatusCode::kFailedPrecondition)
      << "only between iterations";
  FillGradients(1);
  for (uint32_t l = layers(); l-- > 0;) {
    ASSERT_EQ(Code(Call(Grad(l))), absl::StatusCode::kOk);
  }
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterEnd, 0))), absl::StatusCode::kOk);
  committed = Call(Entry(RingOp::kIterCommitted));
  ASSERT_EQ(Code(committed), absl::StatusCode::kOk) << ErrorText(committed);
  EXPECT_EQ(committed.detail, 1u);
  ASSERT_NE(WeightSlot(0), initial[0]);
  std::vector<std::vector<uint8_t>> after_first;
  for (uint32_t l = 0; l < layers(); ++l) after_first.push_back(WeightSlot(l));

  // Reopened: the commit before is kept, until freed on request; after
  // another step it is kept again and, asked to, the job goes back to it,
  // its slots holding those weights again.
  auto reopen = [&](bool revert) {
    completions_.reset();
    submissions_.reset();
    mapping_.reset();
    session_.reset();
    v1::ModelSpec spec = Spec();
    spec.set_revert_last_commit(revert);
    Open(4 * kMiB, spec);
  };
  ASSERT_NO_FATAL_FAILURE(reopen(false));
  EXPECT_EQ(response_.iteration(), 1u);
  EXPECT_TRUE(response_.previous_commit_kept());
  const uint64_t kept_bytes = store_->BytesByJob()["job"];
  {
    // Freed at once on request (a run closing), then nothing to go back to.
    SubmissionEntry release = Entry(RingOp::kIterCommitted);
    release.iter_flags = kIterCommittedRelease;
    const CompletionEntry released = Call(release);
    ASSERT_EQ(Code(released), absl::StatusCode::kOk) << ErrorText(released);
    EXPECT_EQ(released.detail, 1u);
    EXPECT_LT(store_->BytesByJob()["job"], kept_bytes);
    ASSERT_NO_FATAL_FAILURE(reopen(false));
    EXPECT_FALSE(response_.previous_commit_kept());
  }
  // Another step, kept again, to go back from.
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterBegin, 1))), absl::StatusCode::kOk);
  FillGradients(2);
  for (uint32_t l = layers(); l-- > 0;) {
    ASSERT_EQ(Code(Call(Grad(l))), absl::StatusCode::kOk);
  }
  ASSERT_EQ(Code(Call(Iter(RingOp::kIterEnd, 1))), absl::StatusCode::kOk);
  {
    ASSERT_NO_FATAL_FAILURE(reopen(false));
    ASSERT_EQ(response_.iteration(), 2u);
    ASSERT_TRUE(response_.previous_commit_kept());
  }
  ASSERT_NO_FATAL_FAILURE(reopen(true));
  EXPECT_EQ(response_.iteration(), 1u);
  EXPECT_FALSE(response_.previous_commit_kept());
  for (uint32_t l = 0; l < layers(); ++l) {
    EXPECT_EQ(WeightSlot(l), after_first[l]) << "layer " << l;
  }
  // Once is all: there is nothing further back.
  completions_.reset();
  submissions_.reset();
  mapping_.reset();
  session_.reset();
  auto session = JobSession::Create(&pool_, "job", 4 * kMiB);
  ASSERT_TRUE(session.ok()) << session.status();
  v1::ModelSpec spec = Spec();
  spec.set_revert_last_commit(true);
  auto refused = (*session)->RegisterModel(spec, Parts());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.status();
}

}  // namespace
}  // namespace lohan
