#include "daemon/optim/calibration.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "daemon/optim/worker_pool.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

// Small enough to run in a fraction of a second: the timing is real, the
// figures meaningless at this size.
CalibrationOptions QuickOptions() {
  CalibrationOptions options;
  options.tensor_parameters = 16384;
  options.working_set_bytes = std::size_t{4} << 20;
  options.rounds = 1;
  return options;
}

bool Contains(const std::vector<KernelTuning>& list, const KernelTuning& t) {
  return std::find(list.begin(), list.end(), t) != list.end();
}

TEST(CalibrationTest, ChoosesTheFastestOfTheMeasuredCandidates) {
  auto pool = WorkerPool::Create({2, true});
  ASSERT_TRUE(pool.ok());
  const std::vector<Isa> isas = CalibrationIsas(std::nullopt);
  absl::StatusOr<Calibration> c =
      CalibrateAdam(pool->get(), isas, QuickOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<KernelTuning> tunings = CandidateTunings(2);
  EXPECT_EQ(c->measured.size(), tunings.size() * isas.size());
  // The first is what runs uncalibrated.
  EXPECT_EQ(c->measured.front().isa, isas.front());
  EXPECT_EQ(c->measured.front().tuning, KernelTuning{});
  double fastest = c->measured.front().seconds();
  for (const TuningTime& t : c->measured) {
    EXPECT_GT(t.fp32_seconds, 0);
    EXPECT_GT(t.bf16_seconds, 0);
    EXPECT_TRUE(Contains(tunings, t.tuning)) << TuningName(t.tuning);
    EXPECT_NE(std::find(isas.begin(), isas.end(), t.isa), isas.end());
    fastest = std::min(fastest, t.seconds());
  }
  const auto chosen = std::find_if(
      c->measured.begin(), c->measured.end(), [&](const TuningTime& t) {
        return t.isa == c->isa && t.tuning == c->tuning;
      });
  ASSERT_NE(chosen, c->measured.end());
  EXPECT_EQ(chosen->seconds(), fastest);
  EXPECT_TRUE(CpuSupportsIsa(c->isa));
  // The default's time over the choice's, as measured (a speedup of at
  // least 1 would hold by construction: the choice is the fastest).
  EXPECT_DOUBLE_EQ(c->speedup_over_default,
                   c->measured.front().seconds() / chosen->seconds());
  EXPECT_EQ(c->parameters_per_step, QuickOptions().tensor_parameters);
}

TEST(CalibrationTest, AForcedIsaIsTheOnlyOneTimed) {
  absl::StatusOr<Calibration> c =
      CalibrateAdam(nullptr, CalibrationIsas(Isa::kScalar), QuickOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->isa, Isa::kScalar);
  for (const TuningTime& t : c->measured) EXPECT_EQ(t.isa, Isa::kScalar);
  // One thread: per-thread run lengths are not worth timing.
  EXPECT_EQ(c->measured.size(), CandidateTunings(1).size());
}

TEST(CalibrationTest, GivenCandidatesAreTimedBesideTheDefault) {
  CalibrationOptions options = QuickOptions();
  options.candidates = {{0, false, 1}};
  absl::StatusOr<Calibration> c =
      CalibrateAdam(nullptr, {Isa::kScalar}, options);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->measured.size(), 2u);
  EXPECT_EQ(c->measured[0].tuning, KernelTuning{});
  EXPECT_EQ(c->measured[1].tuning, (KernelTuning{0, false, 1}));
}

TEST(CalibrationTest, CandidatesCoverTheKnobsAndIncludeTheDefault) {
  for (int threads : {1, 4}) {
    const std::vector<KernelTuning> tunings = CandidateTunings(threads);
    EXPECT_TRUE(Contains(tunings, KernelTuning{}));
    EXPECT_TRUE(Contains(tunings, (KernelTuning{0, false, 1})));
    EXPECT_TRUE(Contains(tunings, (KernelTuning{4096, true, 1})));
    EXPECT_EQ(Contains(tunings, (KernelTuning{256, true, 16})), threads > 1);
  }
}

TEST(CalibrationTest, BadOptionsAreRefusedWithTheirName) {
  struct Case {
    CalibrationOptions options;
    const char* names;
  };
  std::vector<Case> cases;
  cases.push_back({QuickOptions(), "rounds"});
  cases.back().options.rounds = 0;
  cases.push_back({QuickOptions(), "tensor_parameters"});
  cases.back().options.tensor_parameters = 0;
  cases.push_back({QuickOptions(), "bad candidate"});
  cases.back().options.candidates = {{256, true, 0}};
  for (const Case& c : cases) {
    absl::StatusOr<Calibration> result =
        CalibrateAdam(nullptr, {Isa::kScalar}, c.options);
    ASSERT_FALSE(result.ok()) << c.names;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(result.status().message(), c.names))
        << result.status();
  }
  absl::StatusOr<Calibration> no_isa =
      CalibrateAdam(nullptr, {}, QuickOptions());
  EXPECT_EQ(no_isa.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CalibrationTest, AnIsaTheCpuLacksIsRefused) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (CpuSupportsIsa(isa)) continue;
    absl::StatusOr<Calibration> c =
        CalibrateAdam(nullptr, {isa}, QuickOptions());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(CalibrationTest, BuffersThatCannotBeMappedFailCleanly) {
  CalibrationOptions options = QuickOptions();
  options.working_set_bytes = std::size_t{1} << 60;
  absl::StatusOr<Calibration> c =
      CalibrateAdam(nullptr, {Isa::kScalar}, options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "calibration"))
      << c.status();
}

TEST(TuningNameTest, RoundTripsAndParsesPartialForms) {
  for (const KernelTuning& t : CandidateTunings(2)) {
    absl::StatusOr<KernelTuning> parsed = ParseTuning(TuningName(t));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t);
  }
  absl::StatusOr<KernelTuning> partial = ParseTuning(" chunks = 8 ,prefetch=0");
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(*partial, (KernelTuning{0, KernelTuning{}.stream_half_copy, 8}));
  absl::StatusOr<KernelTuning> empty = ParseTuning("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, KernelTuning{});
}

TEST(TuningNameTest, BadFieldsNameThemselves) {
  for (const char* bad :
       {"prefetch=-1", "prefetch=2000000", "stream=maybe", "chunks=0",
        "chunks=5000", "unroll=2", "prefetch", "=3"}) {
    absl::StatusOr<KernelTuning> parsed = ParseTuning(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), bad))
        << parsed.status();
  }
}

}  // namespace
}  // namespace lohan
