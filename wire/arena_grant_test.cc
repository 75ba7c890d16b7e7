#include "wire/arena_grant.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

ArenaGrant Good() {
  ArenaGrant grant;
  grant.arena_bytes = 1 << 20;
  grant.submission_offset = 0;
  grant.submission_bytes = 4096;
  grant.completion_offset = 4096;
  grant.completion_bytes = 4096;
  return grant;
}

absl::StatusCode Decode(const ArenaGrant& grant) {
  return DecodeArenaGrant(EncodeArenaGrant(grant)).status().code();
}

TEST(ArenaGrantTest, RoundTrip) {
  const std::vector<uint8_t> bytes = EncodeArenaGrant(Good());
  ASSERT_EQ(bytes.size(), kArenaGrantBytes);
  EXPECT_EQ(bytes[0], 'L');  // little-endian magic reads "LGNT"
  auto decoded = DecodeArenaGrant(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, Good());
}

TEST(ArenaGrantTest, RefusesBadGrants) {
  std::vector<uint8_t> bytes = EncodeArenaGrant(Good());
  bytes.pop_back();
  EXPECT_FALSE(DecodeArenaGrant(bytes).ok());
  bytes = EncodeArenaGrant(Good());
  bytes[0] ^= 1;
  EXPECT_FALSE(DecodeArenaGrant(bytes).ok());
  bytes = EncodeArenaGrant(Good());
  bytes[4] = 2;  // version
  EXPECT_FALSE(DecodeArenaGrant(bytes).ok());
  bytes = EncodeArenaGrant(Good());
  bytes[63] = 1;  // reserved
  EXPECT_FALSE(DecodeArenaGrant(bytes).ok());

  ArenaGrant grant = Good();
  grant.completion_offset = 2048;  // overlaps the submission ring
  EXPECT_EQ(Decode(grant), absl::StatusCode::kInvalidArgument);
  grant = Good();
  grant.completion_offset = (1 << 20) - 2048;  // runs past the arena
  EXPECT_EQ(Decode(grant), absl::StatusCode::kInvalidArgument);
  grant = Good();
  grant.completion_offset = UINT64_MAX - 63;  // overflow
  EXPECT_EQ(Decode(grant), absl::StatusCode::kInvalidArgument);
  grant = Good();
  grant.submission_offset = 8192 + 8;  // misaligned
  EXPECT_EQ(Decode(grant), absl::StatusCode::kInvalidArgument);
  grant = Good();
  grant.submission_bytes = 0;
  EXPECT_EQ(Decode(grant), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lohan
