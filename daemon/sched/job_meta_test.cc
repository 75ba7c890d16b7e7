#include "daemon/sched/job_meta.h"

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
  EXPECT_EQ(JobMeta::Decode(enc.substr(1)).status().code(),
            absl::StatusCode::kDataLoss);
  std::string bad = enc;
  bad[0] = 'X';
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
  bad = enc;
  bad[63] = 1;
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
  bad = enc;
  bad[8] = 2;  // Format version.
  EXPECT_FALSE(JobMeta::Decode(bad).ok());
}

}  // namespace
}  // namespace lohan
