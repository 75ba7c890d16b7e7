#include "daemon/store/fault_injection_device.h"

#include <cstring>

#include "daemon/store/aio_device.h"
#include "daemon/store/aligned_buffer.h"
#include "daemon/store/test_util.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using Fault = FaultInjectionDevice::Fault;
using Op = IoRequest::Op;
constexpr uint32_t kBlock = 4096;

class FaultInjectionDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AioDeviceOptions options;
    options.path = dir_.path();
    options.capacity_bytes = 1 << 20;
    auto base = AioBlockDevice::Open(options);
    ASSERT_TRUE(base.ok()) << base.status();
    device_ = std::make_unique<FaultInjectionDevice>(*std::move(base));
    testing_util::FillPattern(1, out_.data(), out_.size());
  }
  testing_util::TempDir dir_;
  std::unique_ptr<FaultInjectionDevice> device_;
  AlignedBuffer out_{4 * kBlock, kBlock};
  AlignedBuffer in_{4 * kBlock, kBlock};
};

TEST_F(FaultInjectionDeviceTest, ForwardsWithoutRules) {
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kWrite, out_.data(), out_.size(), 0)
                  .status.ok());
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kRead, in_.data(), in_.size(), 0)
                  .status.ok());
  EXPECT_EQ(std::memcmp(out_.data(), in_.data(), out_.size()), 0);
  EXPECT_EQ(device_->faults_fired(), 0u);
}

TEST_F(FaultInjectionDeviceTest, EioAndEnospcNameDeviceAndOffset) {
  device_->Inject({Fault::kEio, Op::kRead, 1, 0, UINT64_MAX});
  device_->Inject({Fault::kEnospc, Op::kWrite, 1, 0, UINT64_MAX});
  IoResult r = SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 8192);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status.message().find(dir_.path()), std::string::npos);
  EXPECT_NE(r.status.message().find("offset 8192"), std::string::npos);
  r = SubmitAndWait(*device_, Op::kWrite, out_.data(), kBlock, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kResourceExhausted);
  // Each rule fired once and is spent.
  EXPECT_TRUE(
      SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 0).status.ok());
  EXPECT_EQ(device_->faults_fired(), 2u);
}

TEST_F(FaultInjectionDeviceTest, ShortTransferReportsResidual) {
  device_->Inject({Fault::kShortTransfer, Op::kWrite, 1, 0, UINT64_MAX});
  IoResult r = SubmitAndWait(*device_, Op::kWrite, out_.data(), 4 * kBlock, 0);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.transferred, 2u * kBlock);
  EXPECT_EQ(r.residual(), 2u * kBlock);
}

TEST_F(FaultInjectionDeviceTest, BitFlipOnWriteCorruptsStoredDataOnly) {
  device_->Inject({Fault::kBitFlip, Op::kWrite, 1, 0, UINT64_MAX});
  AlignedBuffer copy(out_.size(), kBlock);
  std::memcpy(copy.data(), out_.data(), out_.size());
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kWrite, out_.data(), out_.size(), 0)
                  .status.ok());
  EXPECT_EQ(std::memcmp(copy.data(), out_.data(), out_.size()), 0);
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kRead, in_.data(), in_.size(), 0)
                  .status.ok());
  EXPECT_NE(std::memcmp(out_.data(), in_.data(), out_.size()), 0);
}

TEST_F(FaultInjectionDeviceTest, RulesMatchOffsetRange) {
  device_->Inject({Fault::kEio, Op::kRead, 10, 2 * kBlock, 3 * kBlock});
  EXPECT_TRUE(
      SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 0).status.ok());
  EXPECT_FALSE(SubmitAndWait(*device_, Op::kRead, in_.data(), 4 * kBlock, 0)
                   .status.ok());
  EXPECT_FALSE(
      SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 2 * kBlock)
          .status.ok());
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 3 * kBlock)
                  .status.ok());
  device_->ClearFaults();
  EXPECT_TRUE(SubmitAndWait(*device_, Op::kRead, in_.data(), kBlock, 2 * kBlock)
                  .status.ok());
}

}  // namespace
}  // namespace lohan
