#include "daemon/rpc/peer_table.h"

#include "gtest/gtest.h"

namespace lohan {
namespace {

TEST(PeerTable, MapsFdPeersAndRefusesOthers) {
  PeerTable table;
  table.Register(7, Caller{.uid = 1000, .pid = 42});
  absl::StatusOr<Caller> caller = table.Lookup("fd:7");
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->uid, 1000u);
  EXPECT_EQ(caller->pid, 42);
  // A reused fd number belongs to the newest connection.
  table.Register(7, Caller{.uid = 0, .pid = 43});
  EXPECT_EQ(table.Lookup("fd:7")->uid, 0u);
  for (const char* bad : {"fd:8", "ipv4:127.0.0.1:5", "fd:", "fd:x", ""}) {
    EXPECT_EQ(table.Lookup(bad).status().code(),
              absl::StatusCode::kUnauthenticated)
        << bad;
  }
}

}  // namespace
}  // namespace lohan
