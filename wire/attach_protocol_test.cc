#include "wire/attach_protocol.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(AttachProtocol, RequestRoundTrip) {
  std::vector<uint8_t> bytes = EncodeAttachRequest("j-000042");
  ASSERT_EQ(bytes.size(), kAttachRequestBytes);
  absl::StatusOr<std::string> job = DecodeAttachRequest(bytes);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(*job, "j-000042");
}

TEST(AttachProtocol, RequestRejectsMalformedBytes) {
  std::vector<uint8_t> good = EncodeAttachRequest("j-1");
  EXPECT_FALSE(DecodeAttachRequest(absl::MakeSpan(good).subspan(0, 63)).ok());
  auto broken = [&](size_t index, uint8_t value) {
    std::vector<uint8_t> bytes = good;
    bytes[index] = value;
    return DecodeAttachRequest(bytes).status().code();
  };
  EXPECT_EQ(broken(0, 'X'), absl::StatusCode::kInvalidArgument);   // magic
  EXPECT_EQ(broken(4, 9), absl::StatusCode::kInvalidArgument);     // version
  EXPECT_EQ(broken(8, 0), absl::StatusCode::kInvalidArgument);     // empty id
  EXPECT_EQ(broken(20, 'x'), absl::StatusCode::kInvalidArgument);  // after NUL
  EXPECT_EQ(broken(60, 1), absl::StatusCode::kInvalidArgument);    // reserved
  std::vector<uint8_t> unterminated = good;
  for (size_t i = 8; i < 56; ++i) unterminated[i] = 'a';
  EXPECT_FALSE(DecodeAttachRequest(unterminated).ok());
}

TEST(AttachProtocol, ReplyCarriesStatus) {
  absl::StatusOr<AttachReply> ok =
      DecodeAttachReply(EncodeAttachReply(absl::OkStatus()));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->daemon_status.ok());
  absl::StatusOr<AttachReply> denied = DecodeAttachReply(
      EncodeAttachReply(absl::PermissionDeniedError("not yours")));
  ASSERT_TRUE(denied.ok());
  EXPECT_EQ(denied->daemon_status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied->daemon_status.message(), "not yours");
  EXPECT_EQ(
      EncodeAttachReply(absl::InternalError(std::string(5000, 'x'))).size(),
      kMaxAttachReplyBytes);
  std::vector<uint8_t> bad = EncodeAttachReply(absl::OkStatus());
  bad[4] = 99;
  EXPECT_FALSE(DecodeAttachReply(bad).ok());
  EXPECT_FALSE(DecodeAttachReply({}).ok());
}

}  // namespace
}  // namespace lohan
