#include "wire/errno_status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(ErrnoToStatus, MapsCodesAndKeepsContext) {
  EXPECT_TRUE(ErrnoToStatus(0, "x").ok());
  absl::Status full = ErrnoToStatus(ENOSPC, "writing /ssd0/lohan.data");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("/ssd0/lohan.data"), absl::string_view::npos);
  EXPECT_NE(full.message().find("errno 28"), absl::string_view::npos);
  EXPECT_EQ(ErrnoToStatus(EIO, "read").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "open").code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace lohan
