#include "layout/job_meta.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(JobMetaTest, RoundTripsAndRejectsDamage) {
  JobMeta meta;
  meta.layout_fingerprint = 0x0123456789abcdefull;
  meta.iteration = 77;
  const std::string enc = meta.Encode();
  ASSERT_EQ(enc.size(), JobMeta::kBytes);
  auto back = JobMeta::Decode(enc);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layout_fingerprint, meta.layout_fingerprint);
  EXPECT_EQ(back->iteration, 77u);
  EXPECT_FALSE(back->has_weight16);
  EXPECT_EQ(JobMeta::Decode(enc.substr(1)).status().code(),
            absl::StatusCode::kDataLoss);
  std::string bad = enc;
  bad[0] = 'X';
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
  bad = enc;
  bad[63] = 1;
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
  bad = enc;
  bad[8] = 4;  // Format version.
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
  bad = enc;
  bad[32] = 9;  // No such 16-bit dtype.
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
}

TEST(JobMetaTest, CarriesTheWeight16CopyAndReadsFormat1) {
  JobMeta meta;
  meta.iteration = 5;
  meta.has_weight16 = true;
  meta.weight16_dtype = DType::kFloat16;
  auto back = JobMeta::Decode(meta.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->has_weight16);
  EXPECT_EQ(back->weight16_dtype, DType::kFloat16);
  // A format-1 record (written before the field existed): no copies.
  JobMeta old;
  old.iteration = 5;
  std::string v1 = old.Encode();
  v1[8] = 1;
  back = JobMeta::Decode(v1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->iteration, 5u);
  EXPECT_FALSE(back->has_weight16);
}

TEST(JobMetaTest, CarriesTheFirstIterationAndReadsFormat2AsUnknown) {
  JobMeta meta;
  meta.iteration = 9;
  meta.first_iteration = 4;
  auto back = JobMeta::Decode(meta.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->first_iteration, std::optional<uint64_t>(4));
  meta.first_iteration = 0;
  back = JobMeta::Decode(meta.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->first_iteration, std::optional<uint64_t>(0));
  // Written before the field: unknown.
  meta.first_iteration.reset();
  std::string v2 = meta.Encode();
  v2[8] = 2;
  back = JobMeta::Decode(v2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->first_iteration.has_value());
  // A first iteration past the current one is damage.
  meta.first_iteration = 10;
  EXPECT_EQ(JobMeta::Decode(meta.Encode()).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace lohan
