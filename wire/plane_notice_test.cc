#include "wire/plane_notice.h"

#include <string>

#include "gtest/gtest.h"

namespace lohan {
namespace {

std::string TextOf(const absl::StatusOr<PlaneNotice>& notice) {
  return std::string(notice->status.message());
}

TEST(PlaneNotice, ClosingNoticesRoundTripWithTheirReasonsCodes) {
  struct Case {
    ClosingReason reason;
    absl::StatusCode code;
  };
  for (const Case c :
       {Case{ClosingReason::kGaveWay, absl::StatusCode::kAborted},
        Case{ClosingReason::kStopped, absl::StatusCode::kAborted},
        Case{ClosingReason::kDaemonStopping, absl::StatusCode::kUnavailable}}) {
    const std::vector<uint8_t> bytes =
        EncodeClosingNotice(c.reason, "gave way to uid 1001's job j-2 — ok");
    absl::StatusOr<PlaneNotice> notice = DecodePlaneNotice(bytes);
    ASSERT_TRUE(notice.ok()) << notice.status();
    EXPECT_EQ(notice->kind, PlaneNoticeKind::kClosing);
    EXPECT_EQ(notice->reason, c.reason);
    EXPECT_EQ(notice->status.code(), c.code);
    EXPECT_EQ(TextOf(notice), "gave way to uid 1001's job j-2 — ok");
  }
}

TEST(PlaneNotice, TheTextIsBoundedAndCleanedWhenEncoded) {
  // Cut at a character's start: the 2-byte characters never split.
  std::string accents;
  for (size_t i = 0; i < kMaxPlaneNoticeTextBytes; ++i) accents += "é";
  absl::StatusOr<PlaneNotice> cut =
      DecodePlaneNotice(EncodeClosingNotice(ClosingReason::kStopped, accents));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(TextOf(cut).size(), kMaxPlaneNoticeTextBytes);
  absl::StatusOr<PlaneNotice> cleaned = DecodePlaneNotice(EncodeClosingNotice(
      ClosingReason::kStopped, std::string("a\nb\x01\xff", 5)));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status();
  EXPECT_EQ(TextOf(cleaned), std::string("a b ?", 5));
}

// Whatever the peer sent that is not a notice is refused, never trusted.
TEST(PlaneNotice, MalformedNoticesAreRefused) {
  const std::vector<uint8_t> good =
      EncodeClosingNotice(ClosingReason::kGaveWay, "why");
  ASSERT_TRUE(DecodePlaneNotice(good).ok());
  auto with = [&](size_t index, uint8_t value) {
    std::vector<uint8_t> bytes = good;
    bytes[index] = value;
    return DecodePlaneNotice(bytes).status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(with(0, 'X')));    // magic
  EXPECT_TRUE(absl::IsInvalidArgument(with(4, 2)));      // version
  EXPECT_TRUE(absl::IsInvalidArgument(with(8, 0)));      // reason
  EXPECT_TRUE(absl::IsInvalidArgument(with(8, 4)));      // reason
  EXPECT_TRUE(absl::IsInvalidArgument(with(10, 14)));    // not its code
  EXPECT_TRUE(absl::IsInvalidArgument(with(12, 4)));     // text length
  EXPECT_TRUE(absl::IsInvalidArgument(with(16, 0)));     // a NUL in the text
  EXPECT_TRUE(absl::IsInvalidArgument(with(17, 0x0a)));  // a newline
  EXPECT_TRUE(absl::IsInvalidArgument(with(18, 0xc3)));  // a cut character
  EXPECT_TRUE(absl::IsInvalidArgument(with(18, 0x80)));  // a stray byte
  // Too short, empty text, too long.
  EXPECT_TRUE(absl::IsInvalidArgument(
      DecodePlaneNotice(absl::MakeSpan(good).subspan(0, 15)).status()));
  std::vector<uint8_t> empty(good.begin(), good.begin() + 16);
  empty[12] = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodePlaneNotice(empty).status()));
  std::vector<uint8_t> huge = good;
  huge.resize(kMaxPlaneNoticeBytes + 1, 'a');
  const uint32_t text = kMaxPlaneNoticeBytes + 1 - kPlaneNoticeHeaderBytes;
  for (int i = 0; i < 4; ++i)
    huge[12 + i] = static_cast<uint8_t>(text >> 8 * i);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodePlaneNotice(huge).status()));
  // An overlong encoding of '/' and a surrogate are not UTF-8.
  std::vector<uint8_t> overlong = good;
  overlong[16] = 0xc0;
  overlong[17] = 0xaf;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodePlaneNotice(overlong).status()));
  std::vector<uint8_t> surrogate = good;
  surrogate[16] = 0xed;
  surrogate[17] = 0xa0;
  surrogate[18] = 0x80;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodePlaneNotice(surrogate).status()));
}

// A well-formed notice of a kind from a later lohand is skipped, not taken
// for a malformed one.
TEST(PlaneNotice, AnUnknownKindIsUnimplemented) {
  std::vector<uint8_t> later =
      EncodeClosingNotice(ClosingReason::kGaveWay, "x");
  later[6] = 2;
  EXPECT_TRUE(absl::IsUnimplemented(DecodePlaneNotice(later).status()));
}

}  // namespace
}  // namespace lohan
