#ifndef LOHAN_DAEMON_STORE_TENSOR_STORE_H_
#define LOHAN_DAEMON_STORE_TENSOR_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/store/block_device.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/catalog_state.h"
#include "daemon/store/io_gate.h"
#include "daemon/store/record_log.h"
#include "daemon/store/space_budget.h"
#include "daemon/store/ssd_array.h"
#include "layout/footprint.h"
#include "wire/unique_fd.h"

namespace lohan {

struct StoreOptions {
  // One entry per SSD: a directory (data in `<dir>/lohan.data`, preallocated),
  // a block device or a regular file. Order matters: it is recorded in the
  // catalog and must stay the same across restarts.
  std::vector<std::string> ssd_paths;
  // Holds the catalog (`catalog.log`) and a LOCK file; created if missing.
  // Should be on a durable filesystem (not tmpfs).
  std::string state_dir;
  // Bytes of a tensor placed on one SSD before moving to the next. A
  // multiple of block_size; fixed for the life of the catalog.
  uint64_t stripe_unit = 1 << 20;
  // O_DIRECT unit (power of two >= 512); fixed for the life of the catalog.
  uint32_t block_size = 4096;
  // Requests in flight per SSD.
  uint32_t queue_depth = 32;
  // Bytes per SSD; 0: the existing file's (or block device's) size. Needed
  // the first time a directory is used.
  uint64_t device_capacity_bytes = 0;
  // Accept SSD paths whose filesystem refuses O_DIRECT, with buffered I/O
  // (logged as slower). Without it such a path is FAILED_PRECONDITION.
  bool allow_buffered_io = false;
  // The catalog is rewritten as a snapshot of the live state once it has
  // grown past this many bytes and past twice the last snapshot, so a long
  // run (one commit record per iteration) keeps it, and the replay at the
  // next open, bounded.
  uint64_t catalog_compact_bytes = 64ull << 20;
  // With an IoGate (SetIoGate), a version's transfer passes the gate in
  // parts of at most this many bytes (whole stripe units), each part's
  // I/O done before the next enters: another job waits for a part, not for
  // a whole version (a 4 M-element chunk's state is 48 MB). 0: one pass
  // per version.
  uint64_t gate_unit_bytes = 0;
  // Told what the store recovers from or works around without failing (a
  // torn catalog tail it ignored, a compaction it will retry): the
  // daemon's log at warning. Unset: written to stderr.
  std::function<void(const std::string&)> warn;
};

struct TensorInfo {
  uint64_t bytes = 0;
  uint64_t committed_version = 0;  // 0: nothing committed yet.
  uint64_t pending_version = 0;    // 0: no written, uncommitted version.
  // 0: none kept (see TensorStore's kept commits).
  uint64_t previous_version = 0;
  // The number the next Write will return (by this process; versions that
  // were never committed are forgotten across restarts).
  uint64_t next_version = 1;
  // The labels the committed and previous versions were committed with
  // (Commit's `tag`); 0: none.
  uint64_t committed_tag = 0;
  uint64_t previous_tag = 0;
  // The committed version is volatile (CommitBatchVolatile): a restart
  // finds durable_version (0: none) with durable_tag instead.
  bool volatile_commit = false;
  uint64_t durable_version = 0;
  uint64_t durable_tag = 0;
};

struct StoreStats {
  std::vector<DeviceStats> devices;  // Capacity and bytes used per SSD.
  uint64_t tensors = 0;
  uint64_t catalog_bytes = 0;  // Size of catalog.log now.
  uint64_t catalog_compactions =
      0;  // Rewrites since open (not the one at open).
};

// Versioned tensors on a striped SSD array, the daemon's SSD store.
//
// A tensor (job, name) has a fixed size, at most one committed version (what
// Read returns) and at most one pending version. Write puts the data in new
// space and makes it the pending version; it never touches the committed
// one. Commit makes the pending version current atomically and durably (data
// fdatasync'd, then a catalog record fdatasync'd); the old version's space is
// freed once no reader uses it. Rollback drops the pending version. Every
// extent carries a CRC32C checked on every read: a mismatch is DATA_LOSS
// naming the tensor and extent.
//
// Durability: Commit and Delete are durable when they return OK. Create is
// durable once any later Commit or Delete returns (or the store reopens
// cleanly). After a crash, Open replays the catalog: committed versions
// come back bit-exact, pending versions are gone and their space is free.
//
// Kept commits: CommitBatchKeepingPrevious commits as CommitBatch but
// keeps each tensor's version until then as its previous one (a
// data-parallel rank's states of the step before, until every rank has
// committed the step); ReleasePrevious frees a job's previous versions,
// RevertToPrevious makes them the committed ones again. Both are one
// synced catalog record; previous versions survive a crash like committed
// ones. Any other commit of a tensor (Commit, CommitBatch) frees its
// previous version. A tensor holds at most committed, pending and previous
// versions.
//
// Volatile commits: CommitBatchVolatile makes pending versions the committed
// ones that Read returns, at memory speed (no sync, no catalog record),
// while the catalog keeps naming each tensor's durable version, whose space
// stays held: after a crash or restart the tensors are at their durable
// versions, all of a batch alike. The next durable commit of a tensor
// (Commit, CommitBatch) frees its durable version; CommitBatch also makes a
// volatile version durable as it is when the batch gives no pending one. A
// tensor then holds at most durable, committed and pending versions; kept
// commits and volatile ones do not mix (FAILED_PRECONDITION).
//
// Errors: a full SSD is RESOURCE_EXHAUSTED (committed data untouched); an I/O
// error names the SSD and offset; unknown tensor NOT_FOUND.
//
// Thread-safe. Reads run in parallel with each other and with mutations;
// mutations (Write/Commit/Rollback/Delete) of one tensor wait for each other,
// of different tensors run in parallel. Only one process may open a
// state_dir at a time (FAILED_PRECONDITION otherwise).
class TensorStore {
 public:
  // Opens the SSDs and replays (then compacts) the catalog.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Open(
      const StoreOptions& options);
  // As Open, with the devices given (one per options.ssd_paths, same order,
  // e.g. fault-injecting wrappers in tests). Takes ownership of them.
  static absl::StatusOr<std::unique_ptr<TensorStore>> OpenWithDevices(
      const StoreOptions& options,
      std::vector<std::unique_ptr<BlockDevice>> devices);

  // What Open would refuse, found without opening (nothing is written or
  // locked for good): the state_dir or an SSD file in use by an open store,
  // a catalog made for other ssd_paths, stripe unit or block size, or one
  // naming space past options.device_capacity_bytes (when set). For
  // `lohand --check-config` after a config change.
  static absl::Status Check(const StoreOptions& options);
  // The operator's way out of a damaged catalog (which Open refuses, naming
  // the damage): rebuilds it from the records that are intact and apply
  // (see SalvageCatalog), keeping the damaged file beside it, and returns
  // the report of what was kept and left out. FAILED_PRECONDITION when the
  // state_dir is in use by an open store or the catalog is not damaged.
  static absl::StatusOr<std::string> Salvage(const StoreOptions& options);

  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;
  // REQUIRES: no call in progress.
  ~TensorStore();

  // Declares a tensor of `bytes` (> 0). ALREADY_EXISTS if present.
  absl::Status Create(absl::string_view job, absl::string_view name,
                      uint64_t bytes);
  // Writes `data` (exactly the tensor's size) as the new pending version,
  // replacing any previous pending one, and returns its version number.
  // Buffers aligned to block_size avoid a copy.
  absl::StatusOr<uint64_t> Write(absl::string_view job, absl::string_view name,
                                 absl::Span<const uint8_t> data);
  // Makes the pending version the committed one. FAILED_PRECONDITION if
  // there is no pending version. `tag` (any value, 0: none) is recorded
  // with the version in the catalog and returned by Stat as committed_tag
  // (and previous_tag once a kept commit replaces it): the caller's label,
  // e.g. the iteration, so that tensors committed apart can be checked to
  // belong together after a restart.
  absl::Status Commit(absl::string_view job, absl::string_view name,
                      uint64_t tag = 0);
  // Group commit: makes the pending versions of `names` (tensors of `job`,
  // at least one, no name twice) committed together, all or none, with one
  // fdatasync of the SSDs and one catalog record, fdatasync'd. A tensor
  // with a volatile commit and no pending version has its committed
  // version made durable in the same record. After a crash
  // the catalog shows either every tensor of the batch at its new version or
  // every one at its old version. FAILED_PRECONDITION (nothing committed) if
  // one has no pending version; NOT_FOUND if one is missing; INVALID_ARGUMENT
  // for an empty list or a repeated name. Waits for the other mutations of
  // these tensors (taken in name order, so concurrent batches cannot
  // deadlock). `tag` as for Commit, the same for every tensor of the batch.
  absl::Status CommitBatch(absl::string_view job,
                           absl::Span<const std::string> names,
                           uint64_t tag = 0);
  // As CommitBatch; each tensor's committed version until now becomes its
  // previous one (freeing any previous one it had), in the same record.
  absl::Status CommitBatchKeepingPrevious(absl::string_view job,
                                          absl::Span<const std::string> names,
                                          uint64_t tag = 0);
  // As CommitBatch, volatile (see above): no sync, no record; every tensor
  // needs a pending version. Never fails for I/O. FAILED_PRECONDITION for a
  // tensor that keeps a previous version.
  absl::Status CommitBatchVolatile(absl::string_view job,
                                   absl::Span<const std::string> names,
                                   uint64_t tag = 0);
  // Every volatile commit of `job`'s tensors undone: each is at its
  // durable version again (none: no committed version), as a restart would
  // find it; returns how many went back.
  size_t RevertVolatile(absl::string_view job);
  // Frees every previous version of `job`'s tensors, durably (the space
  // is reused only once the catalog no longer names it); the number of
  // tensors that had one (0: nothing written).
  absl::StatusOr<size_t> ReleasePrevious(absl::string_view job);
  // Makes every previous version of `job`'s tensors the committed one
  // again, all or none, durably; their committed versions (and any
  // pending ones) are freed. Returns how many went back;
  // FAILED_PRECONDITION (nothing changed) if no tensor of the job keeps
  // one.
  absl::StatusOr<size_t> RevertToPrevious(absl::string_view job);
  // Drops the pending version. FAILED_PRECONDITION if there is none.
  absl::Status Rollback(absl::string_view job, absl::string_view name);
  // Reads the committed version into `dest` (exactly the tensor's size) and
  // returns its number. FAILED_PRECONDITION if nothing is committed.
  absl::StatusOr<uint64_t> Read(absl::string_view job, absl::string_view name,
                                absl::Span<uint8_t> dest);
  // As Read, of the pending version: data written and never meant to be
  // committed (scratch) can be read back without paying for a commit.
  // FAILED_PRECONDITION if there is no pending version.
  absl::StatusOr<uint64_t> ReadPending(absl::string_view job,
                                       absl::string_view name,
                                       absl::Span<uint8_t> dest);
  // As Read (or ReadPending), of the first dest.size() bytes only
  // (<= the tensor's size): only the stripe chunks that hold them are read.
  // An fp32 weight, the first part of a chunk's state, costs a third of it.
  absl::StatusOr<uint64_t> ReadPrefix(absl::string_view job,
                                      absl::string_view name,
                                      absl::Span<uint8_t> dest,
                                      bool pending = false);
  // As Read, calling `before_part()` on the calling thread before each part
  // of the transfer (StoreOptions::gate_unit_bytes; one part when 0) is
  // submitted, the first included: a reader that yields the SSDs to other
  // work waits there (with the parts it submitted before still in flight;
  // behind the gate, at most one).
  absl::StatusOr<uint64_t> ReadYielding(absl::string_view job,
                                        absl::string_view name,
                                        absl::Span<uint8_t> dest,
                                        absl::FunctionRef<void()> before_part);
  // Removes the tensor and all its versions. Durable when it returns if the
  // tensor had a committed version; a tensor that never had one names no
  // space in the catalog, so its delete record is not synced (a crash may
  // bring it back, empty, as an uncommitted Create would).
  absl::Status Delete(absl::string_view job, absl::string_view name);

  absl::StatusOr<TensorInfo> Stat(absl::string_view job,
                                  absl::string_view name) const;
  // Names of the tensors of `job`, sorted.
  std::vector<std::string> List(absl::string_view job) const;
  // The jobs that have tensors, sorted.
  std::vector<std::string> Jobs() const;
  // Per job, the bytes its tensors' versions (committed and pending) hold:
  // one pass over the catalog in memory.
  std::map<std::string, uint64_t> BytesByJob() const;
  // Per job, how many tensors it has (scratch and activations included).
  std::map<std::string, uint64_t> TensorsByJob() const;
  // Deletes every tensor of `job`; the first error (the others are still
  // tried). Frees a deleted job's space.
  absl::Status DeleteJob(absl::string_view job);
  // DeleteJob for every job with tensors that is not in `keep` (jobs
  // deleted while their space could not be freed); the jobs it freed.
  std::vector<std::string> DeleteJobsExcept(
      const std::vector<std::string>& keep);
  StoreStats Stats() const;

  // The SSD space one version of a tensor of `tensor_bytes` takes: what a
  // SpaceBudget is asked for and given back (TensorFootprintBytes at this
  // store's block size).
  uint64_t FootprintBytes(uint64_t tensor_bytes) const;
  uint32_t block_size() const { return options_.block_size; }

  // From now on every Write asks `budget` first (its refusal is the
  // write's error) and every version's space is given back to it when
  // freed; the versions held now are charged to it. REQUIRES: called once,
  // before the store is shared (no call in progress); `budget` outlives
  // the store.
  void SetSpaceBudget(SpaceBudget* budget) ABSL_LOCKS_EXCLUDED(mu_);
  // From now on every version's transfer (Write, Read, ReadPending) passes
  // `gate` first. REQUIRES: as SetSpaceBudget.
  void SetIoGate(IoGate* gate);

 private:
  struct Version;
  struct Entry;
  using Key = std::pair<std::string, std::string>;

  TensorStore(StoreOptions options, UniqueFd lock_fd,
              std::unique_ptr<SsdArray> array);
  absl::Status Recover();
  // Finds the entry and waits until no other mutation runs on it, then
  // marks it busy. NOT_FOUND if absent (or deleted while waiting).
  absl::StatusOr<std::shared_ptr<Entry>> BeginMutation(absl::string_view job,
                                                       absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EndMutation(Entry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  // BeginMutation of every tensor of `job`, in name order (as CommitBatch
  // takes them, so the two cannot wait for each other in a cycle).
  std::vector<std::shared_ptr<Entry>> BeginJobMutation(absl::string_view job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // How many of `entries` keep a previous version.
  size_t CountPrevious(const std::vector<std::shared_ptr<Entry>>& entries) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A job-wide record (kReleasePrevious, kRevertToPrevious), synced.
  absl::Status AppendJobRecord(CatalogRecord::Kind kind, absl::string_view job);
  // Ends BeginJobMutation's mutations; with `apply`, `change` each entry
  // that keeps a previous version first.
  void EndJobMutation(const std::vector<std::shared_ptr<Entry>>& entries,
                      bool apply, absl::FunctionRef<void(Entry&)> change)
      ABSL_LOCKS_EXCLUDED(mu_);
  enum class CommitKind { kDurable, kKeepingPrevious, kVolatile };
  absl::Status CommitBatchImpl(absl::string_view job,
                               absl::Span<const std::string> names,
                               CommitKind kind, uint64_t tag);
  // OK when `entry` can take part in a batch of `kind`, else why not.
  absl::Status CheckCommittableLocked(const Entry& entry, CommitKind kind) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `record` (synced if `sync`), keeps catalog_ in step with it, and
  // compacts the log when it has grown enough.
  absl::Status AppendToCatalog(CatalogRecord record, bool sync)
      ABSL_LOCKS_EXCLUDED(log_mu_);
  void MaybeCompactCatalog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);
  // The store record of the catalog: the options' geometry and this
  // store's id (store_identity.h).
  CatalogRecord StoreInfoRecord() const {
    CatalogRecord info = StoreInfoOf(options_);
    info.store_id = store_id_;
    return info;
  }
  static CatalogRecord StoreInfoOf(const StoreOptions& options);
  static std::string Describe(const Key& key, uint64_t version);
  void Warn(const std::string& message) const;
  // Check's test of one placement against options.device_capacity_bytes.
  static absl::Status CheckWithinCapacity(const StoreOptions& options,
                                          const Key& key, const Placement& p);
  // A version the catalog names (none without a placement), its space
  // reserved in the array. DATA_LOSS if that space is taken.
  absl::StatusOr<std::shared_ptr<const Version>> RecoveredVersion(
      const Key& key, uint64_t number,
      const std::optional<Placement>& placement, uint64_t tag);
  // Starts the I/O of chunks [first, end) of a version, `done` to run when
  // it has completed (SsdArray::SubmitWrite / SubmitRead).
  using PartSubmitter = std::unique_ptr<SsdArray::InFlight>(
      size_t first, size_t end, std::function<void()> done);
  // A version of `bytes` moved through the gate in parts of
  // options_.gate_unit_bytes, each holding its own pass until it is done;
  // the first failure. `before_part` (ReadYielding) runs before each part.
  absl::Status Gated(absl::string_view job, uint64_t bytes,
                     IoGate::Direction direction,
                     absl::FunctionRef<PartSubmitter> submit,
                     absl::FunctionRef<void()>* before_part = nullptr);
  absl::StatusOr<uint64_t> ReadVersion(
      absl::string_view job, absl::string_view name, absl::Span<uint8_t> dest,
      bool pending, bool prefix = false,
      absl::FunctionRef<void()>* before_part = nullptr);

  // Constant after construction.
  const StoreOptions options_;
  const UniqueFd lock_fd_;  // flock'd: one process per state_dir.
  const std::unique_ptr<SsdArray> array_;  // Outlives every Version.
  std::string store_id_;                   // Set by Recover, then constant.

  absl::Mutex log_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::unique_ptr<RecordLog> log_ ABSL_GUARDED_BY(log_mu_);
  // What the log says: each appended record is applied here.
  CatalogState catalog_ ABSL_GUARDED_BY(log_mu_);
  uint64_t compact_at_bytes_ ABSL_GUARDED_BY(log_mu_) = 0;
  // Written under log_mu_, read by Stats without it.
  std::atomic<uint64_t> catalog_bytes_{0};
  std::atomic<uint64_t> compactions_{0};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<Entry>> tensors_
      ABSL_GUARDED_BY(mu_);
  // Set once before the store is shared, then only read.
  SpaceBudget* budget_ = nullptr;
  IoGate* gate_ = nullptr;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_TENSOR_STORE_H_
