#ifndef LOHAN_DAEMON_STORE_TENSOR_STORE_ENTRY_H_
#define LOHAN_DAEMON_STORE_TENSOR_STORE_ENTRY_H_

// TensorStore's private parts, shared by its source files
// (tensor_store.cc, tensor_store_kept.cc); no one else includes this.

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/store/space_budget.h"
#include "daemon/store/ssd_array.h"
#include "daemon/store/tensor_store.h"

namespace lohan {

// One written version of a tensor. Frees its space when the last holder
// (the tensor entry, a reader in progress) lets go.
struct TensorStore::Version {
  Version(SsdArray* array, Placement placement)
      : array(array), placement(std::move(placement)) {}
  Version(const Version&) = delete;
  Version& operator=(const Version&) = delete;
  ~Version() {
    array->Free(placement);
    if (budget != nullptr) budget->Release(job, account, charged);
  }

  SsdArray* const array;
  uint64_t number = 0;  // Set before the version is published.
  Placement placement;
  // The committer's label (CatalogRecord::tag), set as it is committed
  // (under TensorStore::mu_ while the tensor's mutation is held).
  mutable uint64_t tag = 0;
  // Set when the version's bytes are counted in a SpaceBudget (by Write, or
  // by SetSpaceBudget before the store serves anyone), which the destructor
  // gives them back to.
  mutable SpaceBudget* budget = nullptr;
  mutable std::string job;
  mutable uint8_t account = 0;  // SpaceBudget::AccountOf the tensor
  mutable uint64_t charged = 0;
};

// All fields are protected by TensorStore::mu_.
struct TensorStore::Entry {
  uint64_t bytes = 0;
  uint64_t last_version = 0;  // Highest version number handed out.
  std::shared_ptr<const Version> committed;
  std::shared_ptr<const Version> pending;
  // The version committed before `committed`, kept by a kept commit
  // (CommitBatchKeepingPrevious) until ReleasePrevious or RevertToPrevious.
  std::shared_ptr<const Version> previous;
  // With a volatile commit (CommitBatchVolatile): `committed` is not what
  // the catalog names; this is (null: the catalog names no committed
  // version), kept until a durable commit of the tensor.
  bool volatile_commit = false;
  std::shared_ptr<const Version> durable;
  bool busy = false;  // A mutation is in progress.

  // `pending` becomes the committed version, volatile: the durable one
  // stays held (the last volatile one, if any, is freed).
  void CommitVolatile(uint64_t tag) {
    if (!volatile_commit) {
      durable = std::move(committed);
      volatile_commit = true;
    }
    pending->tag = tag;
    committed = std::move(pending);
  }
  // The committed version is what the catalog names now: the durable one
  // it replaced frees its space.
  void MakeDurable() {
    volatile_commit = false;
    durable.reset();
  }
  bool deleted = false;  // Removed from tensors_ while someone waited.
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_TENSOR_STORE_ENTRY_H_
