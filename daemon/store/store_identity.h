#ifndef LOHAN_DAEMON_STORE_STORE_IDENTITY_H_
#define LOHAN_DAEMON_STORE_STORE_IDENTITY_H_

// Which store an SSD's data belongs to. A store gets a random id when it is
// made; its catalog's store record holds it, and so does a small file
// beside each SSD's data file (`<ssd path>/lohan.store`: the id, the
// device's place in the array and the stripe geometry). A store opened
// with a state directory that is not the one its SSDs were written by (a
// new state_dir pointed at old SSDs, SSDs swapped between stores or
// reordered) is refused, naming both, before anything is written: without
// this a new catalog would take the old data for free space.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lohan {

struct DeviceIdentity {
  std::string store_id;
  uint32_t device = 0;   // Its index in the array (ssd_paths order).
  uint32_t devices = 0;  // How many the array has.
  uint64_t stripe_unit = 0;
  uint32_t block_size = 0;
  bool operator==(const DeviceIdentity&) const = default;
};

// 32 hex digits from the kernel's random source.
std::string NewStoreId();

// The identity file beside `ssd_path`'s data; nullopt if there is none.
absl::StatusOr<std::optional<DeviceIdentity>> ReadDeviceIdentity(
    const std::string& ssd_path);
// Writes it (a temporary file, synced, renamed, the directory synced).
absl::Status WriteDeviceIdentity(const std::string& ssd_path,
                                 const DeviceIdentity& identity);

// Checks every SSD path's identity file against the store `store_id` with
// this geometry. `catalog_id_known`: the catalog names the id (else the
// store is new, or its catalog predates ids, and any identity file found
// belongs to another store). FAILED_PRECONDITION naming the path, both ids
// or the geometry on a mismatch. Nothing is written.
absl::Status CheckDevices(const std::vector<std::string>& ssd_paths,
                          const DeviceIdentity& geometry,
                          bool catalog_id_known);
// Writes the identity files that are missing (after CheckDevices).
absl::Status ClaimDevices(const std::vector<std::string>& ssd_paths,
                          const DeviceIdentity& geometry);
// The store id the SSDs' identity files agree on, or nullopt (none, or
// they disagree).
std::optional<std::string> IdOfDevices(
    const std::vector<std::string>& ssd_paths);

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_STORE_IDENTITY_H_
