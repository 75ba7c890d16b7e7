#include "daemon/ipc/entry_validator.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kArenaBytes = 32 * kPage;

class EntryValidatorTest : public ::testing::Test {
 protected:
  EntryValidatorTest() : slots_(kArenaBytes) {
    control_ = *slots_.Allocate(kPage, SlotKind::kControl);
    grad_ = *slots_.Allocate(2 * kPage, SlotKind::kGradient);
    weight_ = *slots_.Allocate(2 * kPage, SlotKind::kWeight);
    act_ = *slots_.Allocate(kPage, SlotKind::kActivation);
    validator_ = std::make_unique<EntryValidator>(&slots_, Layout());
  }

  // Three bf16 layers of 1 page, 2 pages and 100 bytes.
  static JobLayout Layout() {
    return JobLayout{.dtype = RingDtype::kBf16,
                     .layer_bytes = {kPage, 2 * kPage, 100}};
  }

  static SubmissionEntry Entry(RingOp op) {
    SubmissionEntry entry{};
    entry.op = static_cast<uint16_t>(op);
    entry.request_id = 77;
    return entry;
  }
  // What a client that registered its layout on the ring would send: a
  // table of `layers` sizes in the control slot.
  SubmissionEntry Register(uint32_t layers = 3) const {
    SubmissionEntry entry = Entry(RingOp::kReservedRegisterLayout);
    entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    entry.layer = layers;
    entry.slot_offset = control_.offset;
    entry.length = layers * 8;
    return entry;
  }
  static SubmissionEntry Iter(RingOp op, uint64_t n) {
    SubmissionEntry entry = Entry(op);
    entry.iteration = n;
    return entry;
  }
  SubmissionEntry Grad(uint32_t layer, uint64_t length) const {
    SubmissionEntry entry = Entry(RingOp::kGradReady);
    entry.dtype = static_cast<uint16_t>(RingDtype::kBf16);
    entry.layer = layer;
    entry.slot_offset = grad_.offset;
    entry.length = length;
    return entry;
  }
  SubmissionEntry Fetch(uint32_t layer, uint64_t length) const {
    SubmissionEntry entry = Entry(RingOp::kFetchParams);
    entry.layer = layer;
    entry.slot_offset = weight_.offset;
    entry.length = length;
    return entry;
  }
  SubmissionEntry Act(RingOp op, uint64_t id, uint64_t length) const {
    SubmissionEntry entry = Entry(op);
    entry.activation_id = id;
    if (op != RingOp::kActFree) {
      entry.slot_offset = act_.offset;
      entry.length = length;
    }
    return entry;
  }

  void Ready() {
    ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
  }

  absl::StatusCode Code(const SubmissionEntry& entry) {
    return validator_->Accept(entry).code();
  }

  SlotAllocator slots_;
  Slot control_, grad_, weight_, act_;
  std::unique_ptr<EntryValidator> validator_;
};

TEST_F(EntryValidatorTest, AHappyIteration) {
  EXPECT_EQ(validator_->layout().dtype, RingDtype::kBf16);
  EXPECT_EQ(validator_->layout().layer_bytes,
            (std::vector<uint64_t>{kPage, 2 * kPage, 100}));
  for (uint64_t iteration = 0; iteration < 3; ++iteration) {
    ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, iteration)).ok());
    EXPECT_TRUE(validator_->in_iteration());
    ASSERT_TRUE(validator_->Accept(Fetch(0, kPage)).ok());
    ASSERT_TRUE(validator_->Accept(Act(RingOp::kActPut, 5, 300)).ok());
    ASSERT_TRUE(validator_->Accept(Act(RingOp::kActGet, 5, 300)).ok());
    ASSERT_TRUE(validator_->Accept(Act(RingOp::kActFree, 5, 0)).ok());
    ASSERT_TRUE(validator_->Accept(Grad(2, 100)).ok());
    ASSERT_TRUE(validator_->Accept(Grad(1, 2 * kPage)).ok());
    ASSERT_TRUE(validator_->Accept(Grad(0, kPage)).ok());
    ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, iteration)).ok());
  }
  EXPECT_EQ(validator_->iteration(), 3u);
  EXPECT_EQ(validator_->live_activations(), 0u);
}

TEST_F(EntryValidatorTest, StreamedLayoutNamesExactlyOneOfTheSlots) {
  // Two gradient slots and one weight slot shared by all layers, each as
  // large as the largest layer (2 pages).
  const Slot grad2 = *slots_.Allocate(2 * kPage, SlotKind::kGradient);
  EntryValidator::Options options;
  options.grad_slots = {grad2.offset, grad_.offset};  // any order
  options.weight_slots = {weight_.offset};
  validator_ = std::make_unique<EntryValidator>(&slots_, Layout(), options);
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
  for (uint32_t layer = 0; layer < 3; ++layer) {
    const uint64_t bytes = validator_->layout().layer_bytes[layer];
    SubmissionEntry fetch = Fetch(layer, bytes);
    ASSERT_TRUE(validator_->Accept(fetch).ok()) << layer;
    // Slot (layer % 2), as a simple client would use them.
    SubmissionEntry grad = Grad(layer, bytes);
    grad.slot_offset = layer % 2 == 0 ? grad_.offset : grad2.offset;
    ASSERT_TRUE(validator_->Accept(grad).ok()) << layer;
  }
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, 0)).ok());
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 1)).ok());
  // Inside a slot but not at its start: fine for a resident layout, not
  // for a streamed one.
  SubmissionEntry inside = Grad(2, 100);
  inside.slot_offset = grad_.offset + kPage;
  absl::Status status = validator_->Accept(inside);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GRAD_READY"), std::string::npos) << status;
  EXPECT_NE(
      status.message().find(absl::StrCat(grad_.offset, ", ", grad2.offset)),
      std::string::npos)
      << status;
  SubmissionEntry wrong_kind = Grad(2, 100);
  wrong_kind.slot_offset = weight_.offset;
  EXPECT_EQ(Code(wrong_kind), absl::StatusCode::kInvalidArgument);
  SubmissionEntry fetch = Fetch(0, kPage);
  fetch.slot_offset = grad_.offset;
  status = validator_->Accept(fetch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("weight slots"), std::string::npos) << status;
  // A length other than the layer's, even one that fits the slot.
  SubmissionEntry short_grad = Grad(1, kPage);
  short_grad.slot_offset = grad2.offset;
  EXPECT_EQ(Code(short_grad), absl::StatusCode::kInvalidArgument);
  // None of that consumed layer 2's delivery.
  SubmissionEntry good = Grad(2, 100);
  good.slot_offset = grad2.offset;
  EXPECT_TRUE(validator_->Accept(good).ok());
}

TEST_F(EntryValidatorTest, FormatRules) {
  SubmissionEntry entry = Fetch(0, kPage);
  entry.reserved[2] = 1;
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);
  // ITER_BEGIN's flags: only on ITER_BEGIN, only the known bit.
  entry = Fetch(0, kPage);
  entry.iter_flags = kIterBeginLrGiven;
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Entry(RingOp::kInvalid)), absl::StatusCode::kInvalidArgument);
  SubmissionEntry unknown = Entry(RingOp::kInvalid);
  unknown.op = 999;
  EXPECT_EQ(Code(unknown), absl::StatusCode::kInvalidArgument);
  entry = Iter(RingOp::kIterBegin, 0);
  entry.layer = 1;  // not an ITER_BEGIN field
  const absl::Status status = validator_->Accept(entry);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("ITER_BEGIN"), std::string::npos);
  EXPECT_FALSE(validator_->in_iteration());  // state unchanged
  EXPECT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
}

TEST_F(EntryValidatorTest, StagingOpsAreTheSessionsAndCheckedForFormat) {
  auto staging = [&](RingOp op, uint64_t part) {
    SubmissionEntry entry = Entry(op);
    entry.layer = 1;
    entry.slot_offset = control_.offset;
    entry.length = 4 * kPage;
    entry.activation_id = part;
    return entry;
  };
  const RingOp weights_ops[] = {RingOp::kInitWeights, RingOp::kReadWeights};
  const RingOp state_ops[] = {RingOp::kReadState, RingOp::kInitState};
  for (RingOp op : weights_ops) {
    EXPECT_TRUE(CheckStagingEntry(staging(op, 0)).ok());
    absl::Status status = CheckStagingEntry(staging(op, 2));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("activation_id"), std::string::npos)
        << status;
  }
  for (RingOp op : state_ops) {
    for (uint64_t part : {1, 2, 3}) {
      EXPECT_TRUE(CheckStagingEntry(staging(op, part)).ok()) << part;
    }
    for (uint64_t part : {uint64_t{0}, uint64_t{4}, ~uint64_t{0}}) {
      absl::Status status = CheckStagingEntry(staging(op, part));
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << part;
      EXPECT_NE(status.message().find("exp_avg_sq"), std::string::npos)
          << status;
    }
    // Every field the op does not use must be zero.
    SubmissionEntry entry = staging(op, 1);
    entry.dtype = static_cast<uint16_t>(RingDtype::kFp32);
    EXPECT_EQ(CheckStagingEntry(entry).code(),
              absl::StatusCode::kInvalidArgument);
    entry = staging(op, 1);
    entry.iteration = 1;
    EXPECT_EQ(CheckStagingEntry(entry).code(),
              absl::StatusCode::kInvalidArgument);
    entry = staging(op, 1);
    entry.grad_scale = -0.0f;
    EXPECT_EQ(CheckStagingEntry(entry).code(),
              absl::StatusCode::kInvalidArgument);
    entry = staging(op, 1);
    entry.lr = 1e-3;
    const absl::Status status = CheckStagingEntry(entry);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(op == RingOp::kReadState ? "READ_STATE"
                                                             : "INIT_STATE"),
              std::string::npos)
        << status;
    entry = staging(op, 1);
    entry.reserved[0] = 1;
    EXPECT_EQ(CheckStagingEntry(entry).code(),
              absl::StatusCode::kInvalidArgument);
    // Accept leaves them to the session, whatever their fields.
    const absl::Status accepted = validator_->Accept(staging(op, 1));
    EXPECT_EQ(accepted.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(accepted.message().find("job session"), std::string::npos)
        << accepted;
  }
  // Not a staging op.
  EXPECT_EQ(CheckStagingEntry(Fetch(0, kPage)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckStagingEntry(Entry(RingOp::kInvalid)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EntryValidatorTest, TheLayoutIsTheConstructorsAndNoClientsOp) {
  // The layout holds from the first entry on: no entry comes before it.
  EXPECT_EQ(Code(Grad(0, kPage)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(Fetch(0, 2 * kPage)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Fetch(3, kPage)), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(validator_->Accept(Fetch(2, 100)).ok());
  // A client's layout table is refused, well formed or not, before an
  // iteration and inside one, and changes nothing.
  SubmissionEntry table = Register();
  for (int round = 0; round < 2; ++round) {
    const absl::Status status = validator_->Accept(table);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << round;
    EXPECT_NE(status.message().find("REGISTER_LAYOUT"), std::string::npos)
        << status;
    EXPECT_NE(status.message().find("RegisterModel"), std::string::npos)
        << status;
    table.dtype = 9;  // malformed too: the same refusal
    EXPECT_EQ(Code(table), absl::StatusCode::kInvalidArgument) << round;
    table = Register(1);
    table.length = 0;
    EXPECT_EQ(Code(table), absl::StatusCode::kInvalidArgument) << round;
    table = Register();
    EXPECT_EQ(validator_->layout().layer_bytes,
              (std::vector<uint64_t>{kPage, 2 * kPage, 100}));
    if (round == 0) {
      ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
    }
  }
  EXPECT_TRUE(validator_->in_iteration());
  EXPECT_TRUE(validator_->Accept(Grad(1, 2 * kPage)).ok());
}

TEST_F(EntryValidatorTest, AnFp32LayoutChecksFp32Gradients) {
  EntryValidator validator(
      &slots_, JobLayout{.dtype = RingDtype::kFp32, .layer_bytes = {kPage}});
  ASSERT_TRUE(validator.Accept(Iter(RingOp::kIterBegin, 0)).ok());
  SubmissionEntry grad = Grad(0, kPage);  // bf16
  EXPECT_EQ(validator.Accept(grad).code(), absl::StatusCode::kInvalidArgument);
  grad.dtype = static_cast<uint16_t>(RingDtype::kFp32);
  EXPECT_TRUE(validator.Accept(grad).ok());
  EXPECT_EQ(validator.Accept(Grad(1, kPage)).code(),
            absl::StatusCode::kInvalidArgument);  // one layer only
}

TEST_F(EntryValidatorTest, IterationStateMachine) {
  // GRAD_READY only inside an iteration; FETCH_PARAMS also between them
  // (the committed weights, for the next forward).
  EXPECT_EQ(Code(Grad(0, kPage)), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(validator_->Accept(Fetch(0, kPage)).ok());
  EXPECT_EQ(Code(Iter(RingOp::kIterEnd, 0)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(Iter(RingOp::kIterBegin, 1)),  // does not follow
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
  EXPECT_EQ(Code(Iter(RingOp::kIterBegin, 1)),  // nested
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(Iter(RingOp::kIterEnd, 5)),  // wrong one
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Register()), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, 0)).ok());
  EXPECT_EQ(Code(Grad(0, kPage)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Code(Iter(RingOp::kIterBegin, 0)),  // replayed
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 1)).ok());
  // ITER_ABORT ends the iteration begun, like ITER_END (nothing committed
  // is the daemon's business); the next one follows it.
  EXPECT_EQ(Code(Iter(RingOp::kIterAbort, 0)),
            absl::StatusCode::kInvalidArgument);  // not this one
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterAbort, 1)).ok());
  EXPECT_EQ(Code(Iter(RingOp::kIterAbort, 2)),
            absl::StatusCode::kFailedPrecondition);  // none in progress
  EXPECT_EQ(Code(Grad(0, kPage)), absl::StatusCode::kFailedPrecondition);
  // An explicit rate, 0 included (a warmup's first step); unknown flag
  // bits and a negative rate are refused without starting an iteration.
  SubmissionEntry begin = Iter(RingOp::kIterBegin, 2);
  begin.iter_flags = 0x80;
  EXPECT_EQ(Code(begin), absl::StatusCode::kInvalidArgument);
  begin.iter_flags = kIterBeginLrGiven;
  begin.lr = -1e-3;
  EXPECT_EQ(Code(begin), absl::StatusCode::kInvalidArgument);
  begin.lr = 0.0;
  EXPECT_TRUE(validator_->Accept(begin).ok());
  SubmissionEntry end = Iter(RingOp::kIterEnd, 2);
  end.iter_flags = kIterBeginLrGiven;  // not an ITER_END field
  EXPECT_EQ(Code(end), absl::StatusCode::kInvalidArgument);
}

TEST_F(EntryValidatorTest, IterEndCarriesANonNegativeGlobalSumOfSquares) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  uint64_t iteration = 0;
  // Refused without ending the iteration: negative sums (-0.0 and -inf
  // too), a sum without its flag, other flag bits, the begin's flag.
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, iteration)).ok());
  for (double bad : {-1.0, -0.0, -kInf, -1e-300}) {
    SubmissionEntry end = Iter(RingOp::kIterEnd, iteration);
    end.iter_flags = kIterEndSumSquaresGiven;
    end.global_sum_squares = bad;
    const absl::Status status = validator_->Accept(end);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("negative"), std::string::npos) << status;
  }
  for (double unflagged : {2.0, -0.0, nan}) {
    SubmissionEntry end = Iter(RingOp::kIterEnd, iteration);
    end.global_sum_squares = unflagged;
    EXPECT_EQ(Code(end), absl::StatusCode::kInvalidArgument) << unflagged;
  }
  for (uint8_t flags : {uint8_t{kIterBeginLrGiven}, uint8_t{0x80},
                        uint8_t{kIterEndSumSquaresGiven | 0x04}}) {
    SubmissionEntry end = Iter(RingOp::kIterEnd, iteration);
    end.iter_flags = flags;
    end.global_sum_squares = 1.0;
    EXPECT_EQ(Code(end), absl::StatusCode::kInvalidArgument) << int{flags};
  }
  // The flag is ITER_END's alone (a nested ITER_BEGIN would be
  // FAILED_PRECONDITION: the field rule refuses it first).
  SubmissionEntry abort = Iter(RingOp::kIterAbort, iteration);
  abort.iter_flags = kIterEndSumSquaresGiven;
  abort.global_sum_squares = 1.0;
  EXPECT_EQ(Code(abort), absl::StatusCode::kInvalidArgument);
  SubmissionEntry begin = Iter(RingOp::kIterBegin, iteration + 1);
  begin.iter_flags = kIterEndSumSquaresGiven;
  EXPECT_EQ(Code(begin), absl::StatusCode::kInvalidArgument);
  // Accepted, each ending the iteration: zero, finite, inf, NaN of either
  // sign (inf - inf in an all-reduce), and no sum at all.
  for (double good : {0.0, 3.25, 1e300, kInf, nan, -nan}) {
    SubmissionEntry end = Iter(RingOp::kIterEnd, iteration);
    end.iter_flags = kIterEndSumSquaresGiven;
    end.global_sum_squares = good;
    EXPECT_TRUE(validator_->Accept(end).ok()) << good;
    EXPECT_FALSE(validator_->in_iteration());
    ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, ++iteration)).ok());
  }
  EXPECT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, iteration)).ok());
}

TEST_F(EntryValidatorTest, IterCommittedWaitsBetweenIterationsWithNoFields) {
  const SubmissionEntry committed = Entry(RingOp::kIterCommitted);
  EXPECT_TRUE(validator_->Accept(committed).ok());
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 0)).ok());
  const absl::Status inside = validator_->Accept(committed);
  EXPECT_EQ(inside.code(), absl::StatusCode::kFailedPrecondition) << inside;
  EXPECT_NE(inside.message().find("ITER_COMMITTED"), std::string::npos);
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, 0)).ok());
  EXPECT_TRUE(validator_->Accept(committed).ok());
  // Every field is unused: any of them set is refused, nothing changed.
  SubmissionEntry with_iteration = committed;
  with_iteration.iteration = 1;
  SubmissionEntry with_layer = committed;
  with_layer.layer = 1;
  SubmissionEntry with_flag = committed;
  with_flag.iter_flags = kIterBeginLrGiven;
  SubmissionEntry with_lr = committed;
  with_lr.lr = 1e-3;
  for (const SubmissionEntry& bad :
       {with_iteration, with_layer, with_flag, with_lr}) {
    EXPECT_EQ(Code(bad), absl::StatusCode::kInvalidArgument);
  }
  // Its one flag: free the kept states too.
  SubmissionEntry release = committed;
  release.iter_flags = kIterCommittedRelease;
  EXPECT_TRUE(validator_->Accept(release).ok());
  EXPECT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 1)).ok());
}

TEST_F(EntryValidatorTest, ResumesAtAGivenIteration) {
  EntryValidator::Options options;
  options.next_iteration = 41;
  EntryValidator validator(&slots_, Layout(), options);
  EXPECT_FALSE(validator.Accept(Iter(RingOp::kIterBegin, 0)).ok());
  EXPECT_TRUE(validator.Accept(Iter(RingOp::kIterBegin, 41)).ok());
}

TEST_F(EntryValidatorTest, GradientRules) {
  Ready();
  EXPECT_EQ(Code(Grad(3, kPage)), absl::StatusCode::kInvalidArgument);  // layer
  EXPECT_EQ(Code(Grad(0, kPage - 2)), absl::StatusCode::kInvalidArgument);
  SubmissionEntry entry = Grad(0, kPage);
  entry.dtype = static_cast<uint16_t>(RingDtype::kFp16);
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);  // dtype
  entry = Grad(0, kPage);
  entry.slot_offset = weight_.offset;  // wrong kind of slot
  EXPECT_EQ(Code(entry), absl::StatusCode::kFailedPrecondition);
  entry.slot_offset = grad_.offset + kPage + 8;  // runs past the slot
  EXPECT_EQ(Code(entry), absl::StatusCode::kNotFound);
  entry.slot_offset = kArenaBytes - 8;  // past the arena
  EXPECT_EQ(Code(entry), absl::StatusCode::kOutOfRange);
  entry.slot_offset = UINT64_MAX - 100;  // offset + length overflows
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(validator_->Accept(Grad(0, kPage)).ok());
  const absl::Status twice = validator_->Accept(Grad(0, kPage));
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("already delivered"), std::string::npos);
  // A new iteration clears the record.
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterEnd, 0)).ok());
  ASSERT_TRUE(validator_->Accept(Iter(RingOp::kIterBegin, 1)).ok());
  EXPECT_TRUE(validator_->Accept(Grad(0, kPage)).ok());
}

TEST_F(EntryValidatorTest, FetchRules) {
  Ready();
  EXPECT_EQ(Code(Fetch(7, kPage)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Fetch(0, 2 * kPage)), absl::StatusCode::kInvalidArgument);
  SubmissionEntry entry = Fetch(0, kPage);
  entry.slot_offset = grad_.offset;
  EXPECT_EQ(Code(entry), absl::StatusCode::kFailedPrecondition);
  entry.dtype = 2;  // not a FETCH_PARAMS field
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(validator_->Accept(Fetch(0, kPage)).ok());
  EXPECT_TRUE(validator_->Accept(Fetch(0, kPage)).ok());  // may fetch again
}

TEST_F(EntryValidatorTest, ActivationRules) {
  EXPECT_EQ(Code(Act(RingOp::kActGet, 1, 64)), absl::StatusCode::kNotFound);
  EXPECT_EQ(Code(Act(RingOp::kActFree, 1, 0)), absl::StatusCode::kNotFound);
  SubmissionEntry entry = Act(RingOp::kActPut, 1, 64);
  entry.slot_offset = grad_.offset;
  EXPECT_EQ(Code(entry), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(validator_->live_activations(), 0u);  // refused put left nothing
  EXPECT_EQ(Code(Act(RingOp::kActPut, 1, 0)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Act(RingOp::kActPut, 1, 2 * kPage)),
            absl::StatusCode::kNotFound);  // larger than its slot
  ASSERT_TRUE(validator_->Accept(Act(RingOp::kActPut, 1, 64)).ok());
  EXPECT_EQ(Code(Act(RingOp::kActPut, 1, 64)),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Code(Act(RingOp::kActGet, 1, 32)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(validator_->Accept(Act(RingOp::kActGet, 1, 64)).ok());
  entry = Act(RingOp::kActFree, 1, 0);
  entry.length = 64;  // not an ACT_FREE field
  EXPECT_EQ(Code(entry), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(validator_->Accept(Act(RingOp::kActFree, 1, 0)).ok());
  EXPECT_EQ(Code(Act(RingOp::kActFree, 1, 0)), absl::StatusCode::kNotFound);
}

TEST_F(EntryValidatorTest, AForgottenPutCanBeRetriedAndFreesItsPlace) {
  EntryValidator::Options options;
  options.max_live_activations = 1;
  EntryValidator validator(&slots_, Layout(), options);
  ASSERT_TRUE(validator.Accept(Act(RingOp::kActPut, 7, 64)).ok());
  validator.ForgetActivation(7);  // the store refused the put
  EXPECT_EQ(validator.live_activations(), 0u);
  EXPECT_EQ(validator.Accept(Act(RingOp::kActGet, 7, 64)).code(),
            absl::StatusCode::kNotFound);
  validator.ForgetActivation(7);   // not held: nothing happens
  validator.ForgetActivation(99);  // never put: nothing happens
  EXPECT_TRUE(validator.Accept(Act(RingOp::kActPut, 7, 64)).ok());
  EXPECT_EQ(validator.live_activations(), 1u);
}

TEST_F(EntryValidatorTest, LiveActivationLimit) {
  EntryValidator::Options options;
  options.max_live_activations = 2;
  EntryValidator validator(&slots_, Layout(), options);
  ASSERT_TRUE(validator.Accept(Act(RingOp::kActPut, 1, 64)).ok());
  ASSERT_TRUE(validator.Accept(Act(RingOp::kActPut, 2, 64)).ok());
  EXPECT_EQ(validator.Accept(Act(RingOp::kActPut, 3, 64)).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(EntryValidatorTest, FreedSlotIsNoLongerAcceptable) {
  Ready();
  ASSERT_TRUE(slots_.Free(grad_.offset).ok());
  EXPECT_EQ(Code(Grad(0, kPage)), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lohan

namespace lohan {
namespace {

TEST(EntryValidatorGradScale, OnlyIterBeginCarriesAFiniteNonNegativeScale) {
  SlotAllocator slots(1 << 16);
  EntryValidator validator(
      &slots, JobLayout{.dtype = RingDtype::kBf16, .layer_bytes = {4096}});
  SubmissionEntry entry{};
  entry.op = static_cast<uint16_t>(RingOp::kIterBegin);
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -0.0f}) {
    entry.grad_scale = bad;
    EXPECT_FALSE(validator.Accept(entry).ok()) << bad;
  }
  // The field rule on an op that never carries a scale.
  SubmissionEntry end{};
  end.op = static_cast<uint16_t>(RingOp::kActFree);
  end.activation_id = 1;
  end.grad_scale = 0.5f;
  absl::Status status = validator.Accept(end);
  end.grad_scale = 0.0f;
  end.lr = 1e-3;
  EXPECT_FALSE(validator.Accept(end).ok());
  entry.grad_scale = 0.0f;
  for (double bad : {-1e-3, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    entry.lr = bad;
    EXPECT_FALSE(validator.Accept(entry).ok()) << bad;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("does not use"), absl::string_view::npos);
}

}  // namespace
}  // namespace lohan
