// Deterministic driver for entry_validator_fuzz.cc: tens of thousands of
// generated inputs, mostly well-formed sequences with mutations, so CI
// exercises the fuzz target's invariants without libFuzzer.

#include "daemon/ipc/entry_validator_fuzz.h"

#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "wire/ring_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace lohan::fuzz {
namespace {

class Generator {
 public:
  explicit Generator(uint64_t seed) : random_(seed) {}

  std::vector<uint8_t> Input() {
    std::vector<uint8_t> input;
    uint8_t flags =
        OneIn(8) ? static_cast<uint8_t>(random_()) : (OneIn(4) ? 3 : 1);
    if (OneIn(2)) flags |= 16;  // streamed layout
    input.push_back(flags);
    if (!(flags & 1)) {
      uint64_t table[kLayers];
      for (uint32_t i = 0; i < kLayers; ++i) {
        table[i] = OneIn(4) ? random_() % 20000 : kLayerBytes[i];
      }
      Append(&input, table, sizeof(table));
    }
    iteration_ = (flags >> 2) & 3;
    const int count = 1 + random_() % 40;
    for (int i = 0; i < count; ++i) {
      SubmissionEntry entry = Entry();
      if (OneIn(10)) {  // flip a few bits
        auto* bytes = reinterpret_cast<uint8_t*>(&entry);
        for (int flips = 1 + random_() % 3; flips > 0; --flips) {
          bytes[random_() % sizeof(entry)] ^= 1u << (random_() % 8);
        }
      }
      if (OneIn(40)) {  // garbage
        auto* bytes = reinterpret_cast<uint8_t*>(&entry);
        for (size_t b = 0; b < sizeof(entry); ++b) bytes[b] = random_();
      }
      Append(&input, &entry, sizeof(entry));
    }
    if (OneIn(10)) input.resize(input.size() - random_() % 64);  // torn tail
    return input;
  }

 private:
  bool OneIn(int n) { return random_() % n == 0; }

  static void Append(std::vector<uint8_t>* input, const void* data,
                     size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    input->insert(input->end(), bytes, bytes + size);
  }

  // A global sum of squares: mostly flagged and valid (inf and NaNs of
  // either sign included), sometimes negative, unflagged or with other
  // flag bits.
  void SumSquares(SubmissionEntry& entry) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double values[] = {0.0,  2.5,  1e300, kInf, nan,
                             -nan, -1.0, -0.0,  -kInf};
    entry.global_sum_squares = values[random_() % std::size(values)];
    entry.iter_flags = OneIn(6) ? random_() % 256 : kIterEndSumSquaresGiven;
  }

  uint64_t Offset(uint64_t good) {
    switch (random_() % 8) {
      case 0:
        return random_() % (kArenaBytes + 8192);
      case 1:
        return UINT64_MAX - random_() % 8192;
      case 2:
        return good + 8 * (random_() % 1024);
      default:
        return good;
    }
  }

  uint64_t Length(uint64_t good) {
    switch (random_() % 8) {
      case 0:
        return random_() % 10000;
      case 1:
        return UINT64_MAX - random_() % 8;
      default:
        return good;
    }
  }

  SubmissionEntry Entry() {
    SubmissionEntry entry{};
    entry.request_id = random_();
    const uint32_t layer =
        OneIn(10) ? static_cast<uint32_t>(random_()) : random_() % kLayers;
    const uint64_t layer_bytes = kLayerBytes[layer % kLayers];
    const RingOp op = static_cast<RingOp>(random_() % kAcceptedOps);
    entry.op = static_cast<uint16_t>(op);
    switch (op) {
      case RingOp::kReservedRegisterLayout:
        // The table a client once sent: always refused.
        entry.dtype =
            static_cast<uint16_t>(OneIn(8) ? random_() % 5 : uint64_t{2});
        entry.layer = OneIn(8) ? random_() % 10 : kLayers;
        entry.slot_offset = Offset(kControlOffset);
        entry.length = Length(uint64_t{entry.layer} * 8);
        break;
      case RingOp::kGradReady:
        entry.dtype = OneIn(8) ? random_() % 5 : 2;
        entry.layer = layer;
        entry.slot_offset = Offset(kGradOffsets[random_() % 2]);
        entry.length = Length(layer_bytes);
        break;
      case RingOp::kFetchParams:
        entry.layer = layer;
        entry.slot_offset = Offset(kWeightOffset);
        entry.length = Length(layer_bytes);
        break;
      case RingOp::kActPut:
      case RingOp::kActGet:
        entry.activation_id = random_() % 6;
        entry.slot_offset = Offset(kActOffsets[random_() % 2]);
        entry.length = Length(64 * (1 + random_() % 4));
        break;
      case RingOp::kActFree:
        entry.activation_id = random_() % 6;
        break;
      case RingOp::kIterBegin:
        entry.iteration = OneIn(6) ? random_() : iteration_;
        break;
      case RingOp::kIterEnd:
      case RingOp::kIterAbort:
        entry.iteration = OneIn(6) ? random_() : iteration_;
        if (!OneIn(4)) ++iteration_;
        if (op == RingOp::kIterEnd && OneIn(2)) SumSquares(entry);
        break;
      case RingOp::kInitWeights:
      case RingOp::kReadWeights:
      case RingOp::kReadState:
      case RingOp::kInitState:
        // The session checks the slot; the format check sees the rest.
        entry.layer = layer;
        entry.slot_offset = Offset(kControlOffset);
        entry.length = Length(layer_bytes);
        if (op == RingOp::kReadState || op == RingOp::kInitState) {
          entry.activation_id = OneIn(6) ? random_() % 6 : 1 + random_() % 3;
        } else if (OneIn(8)) {
          entry.activation_id = random_() % 4;
        }
        if (OneIn(10)) entry.dtype = random_() % 4;
        if (OneIn(10)) entry.iteration = random_() % 4;
        break;
      case RingOp::kIterCommitted:
        // Between iterations only; its one flag asks to release the
        // commit a rank's job keeps.
        entry.iter_flags = OneIn(8)   ? static_cast<uint8_t>(random_())
                           : OneIn(2) ? kIterCommittedRelease
                                      : 0;
        if (OneIn(10)) entry.layer = random_() % 4;
        break;
      case RingOp::kInvalid:
        break;
    }
    return entry;
  }

  std::mt19937_64 random_;
  uint64_t iteration_ = 0;
};

TEST(EntryValidatorFuzzTest, TensOfThousandsOfInputs) {
  Generator generator(20261129);
  constexpr int kInputs = 40000;
  for (int i = 0; i < kInputs; ++i) {
    const std::vector<uint8_t> input = generator.Input();
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  // Empty and tiny inputs.
  LLVMFuzzerTestOneInput(nullptr, 0);
  const uint8_t one = 1;
  LLVMFuzzerTestOneInput(&one, 1);

  // The generator reaches every client op's accepting path, not just the
  // refusals; a layout table from a client is never accepted.
  const uint64_t* accepted = AcceptedByOp();
  EXPECT_EQ(accepted[0], 0u);
  EXPECT_EQ(accepted[1], 0u);
  for (size_t op = 2; op < kAcceptedOps; ++op) {
    EXPECT_GT(accepted[op], 100u) << "op " << op;
  }
  EXPECT_GT(AcceptedStreamed(), 100u);
  EXPECT_GT(AcceptedSumSquares(), 100u);
}

}  // namespace
}  // namespace lohan::fuzz
