// A store's SSDs carry its identity: a new state directory pointed at
// another store's SSDs, SSDs swapped between stores or reordered, are
// refused before anything is written; a store made before identities, or
// one whose identity files were lost, gets them back.

#include "daemon/store/store_identity.h"

#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using testing::HasSubstr;
using testing_util::Pattern;
using testing_util::TempDir;

class StoreIdentityTest : public ::testing::Test {
 protected:
  StoreOptions Options(const std::string& state,
                       std::vector<std::string> ssds) {
    StoreOptions o;
    o.ssd_paths = std::move(ssds);
    o.state_dir = dir_.path() + "/" + state;
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 4 << 20;
    return o;
  }

  // Opens a store and commits one tensor; returns its id.
  std::string MakeStore(const StoreOptions& o) {
    auto store = TensorStore::Open(o);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return "";
    EXPECT_TRUE((*store)->Create("job", "t", 100000).ok());
    EXPECT_TRUE((*store)->Write("job", "t", Pattern(1, 100000)).ok());
    EXPECT_TRUE((*store)->Commit("job", "t").ok());
    auto id = ReadDeviceIdentity(o.ssd_paths[0]);
    EXPECT_TRUE(id.ok() && id->has_value());
    return id.ok() && id->has_value() ? (*id)->store_id : "";
  }

  TempDir dir_;
};

TEST_F(StoreIdentityTest, EachSsdNamesItsStoreAndPlace) {
  const StoreOptions o =
      Options("state", {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")});
  const std::string id = MakeStore(o);
  EXPECT_EQ(id.size(), 32u);
  for (uint32_t i = 0; i < 2; ++i) {
    auto found = ReadDeviceIdentity(o.ssd_paths[i]);
    ASSERT_TRUE(found.ok() && found->has_value());
    EXPECT_EQ(**found, (DeviceIdentity{.store_id = id,
                                       .device = i,
                                       .devices = 2,
                                       .stripe_unit = 64 << 10,
                                       .block_size = 4096}));
  }
  // Reopened: the same identity, the data there.
  auto store = TensorStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Stat("job", "t")->committed_version, 1u);
  EXPECT_EQ(IdOfDevices(o.ssd_paths), id);
}

TEST_F(StoreIdentityTest, ANewStateDirOnAnotherStoresSsdsIsRefused) {
  const StoreOptions old_store =
      Options("state", {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")});
  const std::string id = MakeStore(old_store);
  StoreOptions fresh = old_store;
  fresh.state_dir = dir_.path() + "/other-state";
  auto refused = TensorStore::Open(fresh);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("holds the data of another store (store " + id));
  EXPECT_TRUE(TensorStore::Check(fresh).code() ==
              absl::StatusCode::kFailedPrecondition);
  // Nothing was written: the old store opens with its data.
  auto store = TensorStore::Open(old_store);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<uint8_t> back(100000);
  ASSERT_TRUE((*store)->Read("job", "t", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, Pattern(1, 100000));
}

TEST_F(StoreIdentityTest, SwappedOrReorderedSsdsAreRefused) {
  const StoreOptions a = Options("a", {dir_.Subdir("a0"), dir_.Subdir("a1")});
  const StoreOptions b = Options("b", {dir_.Subdir("b0"), dir_.Subdir("b1")});
  const std::string id_a = MakeStore(a);
  const std::string id_b = MakeStore(b);
  ASSERT_NE(id_a, id_b);
  // b's first SSD's identity where a's first SSD's was (a disk moved).
  auto b0 = ReadDeviceIdentity(b.ssd_paths[0]);
  ASSERT_TRUE(b0.ok() && b0->has_value());
  ASSERT_TRUE(WriteDeviceIdentity(a.ssd_paths[0], **b0).ok());
  auto refused = TensorStore::Open(a);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("belongs to store " + id_b));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("catalog is store " + id_a));
  // The right identity back; the paths in another order: the catalog's
  // store record already refuses them (its paths differ).
  DeviceIdentity a0 = **b0;
  a0.store_id = id_a;
  ASSERT_TRUE(WriteDeviceIdentity(a.ssd_paths[0], a0).ok());
  ASSERT_TRUE(TensorStore::Open(a).ok());
}

TEST_F(StoreIdentityTest, LostIdentityFilesAreWrittenAgain) {
  const StoreOptions o =
      Options("state", {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")});
  const std::string id = MakeStore(o);
  ASSERT_EQ(::unlink((o.ssd_paths[1] + "/lohan.store").c_str()), 0);
  ASSERT_TRUE(TensorStore::Open(o).ok());
  auto again = ReadDeviceIdentity(o.ssd_paths[1]);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->store_id, id);
  EXPECT_EQ((*again)->device, 1u);
}

TEST_F(StoreIdentityTest, AGarbledIdentityFileIsRefusedByName) {
  const StoreOptions o = Options("state", {dir_.Subdir("ssd0")});
  MakeStore(o);
  std::ofstream(o.ssd_paths[0] + "/lohan.store") << "lohan store x\n";
  auto refused = TensorStore::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("is not a lohan store identity file"));
}

}  // namespace
}  // namespace lohan
