#include "daemon/store/tensor_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/store/aio_device.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/catalog_recovery.h"
#include "daemon/store/store_identity.h"
#include "daemon/store/tensor_store_entry.h"
#include "wire/errno_status.h"

namespace lohan {

namespace {

DeviceIdentity DeviceGeometry(const StoreOptions& options,
                              const std::string& store_id) {
  return DeviceIdentity{.store_id = store_id,
                        .stripe_unit = options.stripe_unit,
                        .block_size = options.block_size};
}

std::string CatalogPath(const std::string& state_dir) {
  return state_dir + "/catalog.log";
}

absl::Status ValidateName(absl::string_view job, absl::string_view name) {
  if (job.empty() || name.empty() || job.size() > 4096 || name.size() > 4096) {
    return absl::InvalidArgumentError(
        "tensor job and name must be non-empty and at most 4096 bytes");
  }
  return absl::OkStatus();
}

}  // namespace

void TensorStore::Warn(const std::string& message) const {
  if (options_.warn) {
    options_.warn(message);
  } else {
    std::fprintf(stderr, "lohan store: %s\n", message.c_str());
  }
}

std::string TensorStore::Describe(const Key& key, uint64_t version) {
  return absl::StrCat("'", key.first, "/", key.second, "' version ", version);
}

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Open(
    const StoreOptions& options) {
  // Before any device is opened (a path given twice would find its own lock).
  if (std::set<std::string>(options.ssd_paths.begin(), options.ssd_paths.end())
          .size() != options.ssd_paths.size()) {
    return absl::InvalidArgumentError("ssd_paths lists a path twice");
  }
  std::vector<std::unique_ptr<BlockDevice>> devices;
  for (const std::string& path : options.ssd_paths) {
    AioDeviceOptions device_options;
    device_options.path = path;
    device_options.capacity_bytes = options.device_capacity_bytes;
    device_options.block_size = options.block_size;
    device_options.queue_depth = options.queue_depth;
    device_options.allow_buffered_io = options.allow_buffered_io;
    absl::StatusOr<std::unique_ptr<AioBlockDevice>> device =
        AioBlockDevice::Open(device_options);
    if (!device.ok()) return device.status();
    devices.push_back(*std::move(device));
  }
  return OpenWithDevices(options, std::move(devices));
}

namespace {

// `state_dir`/LOCK (created if missing), flock'd: one store (or salvage) per
// state directory. FAILED_PRECONDITION while another holds it.
absl::StatusOr<UniqueFd> LockStateDir(const std::string& state_dir) {
  const std::string lock_path = state_dir + "/LOCK";
  UniqueFd lock_fd(
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("open ", lock_path));
  }
  if (::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state_dir ", state_dir, " is in use by another open store (",
          lock_path, " is locked): stop the lohand that uses it first"));
    }
    return ErrnoToStatus(errno, absl::StrCat("flock ", lock_path));
  }
  return lock_fd;
}

// FAILED_PRECONDITION if another process holds `path`'s flock (a missing
// file is fine).
absl::Status CheckNotLocked(const std::string& path, absl::string_view what) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return absl::OkStatus();
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, " is in use by a running lohand"));
  }
  return absl::OkStatus();  // closing fd lets go of the lock again
}

// What the catalog's records say, checked: the first is the store record
// of an array with these options (FAILED_PRECONDITION otherwise: the
// options changed), the rest apply in order (DATA_LOSS otherwise).
// `store_id`, if not null, gets the store record's id ("" if it has none).
absl::StatusOr<CatalogState> Replay(const StoreOptions& options,
                                    const std::string& path,
                                    const RecordLog::Contents& contents,
                                    std::string* store_id = nullptr) {
  CatalogState state;
  for (size_t i = 0; i < contents.records.size(); ++i) {
    absl::StatusOr<CatalogRecord> rec =
        CatalogRecord::Decode(contents.records[i]);
    if (!rec.ok()) {
      return absl::DataLossError(
          absl::StrCat(path, " record ", i, ": ", rec.status().message()));
    }
    if (i > 0) {
      if (absl::Status s = state.Apply(*std::move(rec)); !s.ok()) {
        return absl::DataLossError(
            absl::StrCat(path, " record ", i, " ", s.message()));
      }
      continue;
    }
    if (rec->kind != CatalogRecord::Kind::kStoreInfo) {
      return absl::DataLossError(
          absl::StrCat(path, " does not start with a store record"));
    }
    if (store_id != nullptr) *store_id = rec->store_id;
    if (rec->device_paths != options.ssd_paths ||
        rec->stripe_unit != options.stripe_unit ||
        rec->block_size != options.block_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the catalog in ", options.state_dir, " was made for ssd_paths [",
          absl::StrJoin(rec->device_paths, ", "), "] stripe_unit ",
          rec->stripe_unit, " block_size ", rec->block_size,
          "; the options give [", absl::StrJoin(options.ssd_paths, ", "),
          "] stripe_unit ", options.stripe_unit, " block_size ",
          options.block_size));
    }
  }
  return state;
}

}  // namespace

absl::Status TensorStore::Check(const StoreOptions& options) {
  if (absl::Status s =
          CheckNotLocked(options.state_dir + "/LOCK", "the store state in");
      !s.ok()) {
    return s;
  }
  for (const std::string& path : options.ssd_paths) {
    if (absl::Status s =
            CheckNotLocked(AioBlockDevice::DataFilePath(path), "SSD file");
        !s.ok()) {
      return s;
    }
  }
  const std::string path = CatalogPath(options.state_dir);
  absl::StatusOr<CatalogRead> read = ReadCatalog(path);
  if (!read.ok()) return read.status();
  const RecordLog::Contents* contents = &read->contents;
  std::string store_id;
  absl::StatusOr<CatalogState> state =
      Replay(options, path, *contents, &store_id);
  if (!state.ok()) return state.status();
  if (absl::Status s =
          CheckDevices(options.ssd_paths, DeviceGeometry(options, store_id),
                       !store_id.empty());
      !s.ok()) {
    return s;
  }
  if (contents->records.empty()) return absl::OkStatus();  // a new store
  if (options.device_capacity_bytes == 0) return absl::OkStatus();
  for (const auto& [key, tensor] : state->tensors()) {
    for (const std::optional<Placement>& placement :
         {tensor.placement, tensor.previous_placement}) {
      if (!placement.has_value()) continue;
      if (absl::Status s = CheckWithinCapacity(options, key, *placement);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TensorStore::CheckWithinCapacity(const StoreOptions& options,
                                              const Key& key,
                                              const Placement& p) {
  for (const Placement::Run& run : RunsOf(p)) {
    if (run.offset + run.length > options.device_capacity_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the catalog keeps tensor '", key.first, "/", key.second,
          "' up to byte ", run.offset + run.length, " of SSD ",
          run.device < options.ssd_paths.size() ? options.ssd_paths[run.device]
                                                : std::string("?"),
          ", past the ", options.device_capacity_bytes,
          " bytes the options give it"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::OpenWithDevices(
    const StoreOptions& options,
    std::vector<std::unique_ptr<BlockDevice>> devices) {
  if (options.ssd_paths.empty() || options.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "the SSD store needs ssd_paths and a state_dir");
  }
  if (devices.size() != options.ssd_paths.size()) {
    return absl::InvalidArgumentError("one device per SSD path is needed");
  }
  std::set<std::string> unique(options.ssd_paths.begin(),
                               options.ssd_paths.end());
  if (unique.size() != options.ssd_paths.size()) {
    return absl::InvalidArgumentError("ssd_paths lists a path twice");
  }
  if (::mkdir(options.state_dir.c_str(), 0700) == 0) {
    // Make the new directory's entry durable in its parent.
    const std::string& dir = options.state_dir;
    const size_t slash = dir.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "."
                               : slash == 0               ? "/"
                                            : dir.substr(0, slash);
    UniqueFd parent_fd(
        ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent_fd.valid() || ::fsync(parent_fd.get()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fsync ", parent));
    }
  } else if (errno != EEXIST) {
    return ErrnoToStatus(errno,
                         absl::StrCat("create state_dir ", options.state_dir));
  }
  absl::StatusOr<UniqueFd> lock_fd = LockStateDir(options.state_dir);
  if (!lock_fd.ok()) return lock_fd.status();
  absl::StatusOr<std::unique_ptr<SsdArray>> array =
      SsdArray::Create(std::move(devices), options.stripe_unit);
  if (!array.ok()) return array.status();
  std::unique_ptr<TensorStore> store(
      new TensorStore(options, *std::move(lock_fd), *std::move(array)));
  absl::Status recovered = store->Recover();
  if (!recovered.ok()) return recovered;
  return store;
}

TensorStore::TensorStore(StoreOptions options, UniqueFd lock_fd,
                         std::unique_ptr<SsdArray> array)
    : options_(std::move(options)),
      lock_fd_(std::move(lock_fd)),
      array_(std::move(array)) {}

TensorStore::~TensorStore() {
  // Versions free their space into array_, so drop them first.
  absl::MutexLock lock(&mu_);
  tensors_.clear();
}

absl::Status TensorStore::Recover() {
  const std::string path = CatalogPath(options_.state_dir);
  // Damage is refused here, before anything is rewritten (the compaction
  // below would make it permanent).
  absl::StatusOr<CatalogRead> read = ReadCatalog(path);
  if (!read.ok()) return read.status();
  if (!read->torn.empty()) Warn(read->torn);
  const RecordLog::Contents* contents = &read->contents;

  std::string store_id;
  absl::StatusOr<CatalogState> replayed =
      Replay(options_, path, *contents, &store_id);
  if (!replayed.ok()) return replayed.status();
  // Whose SSDs these are, before anything is written: a new catalog must
  // not take another store's data for free space.
  const bool id_known = !store_id.empty();
  if (!id_known) store_id = NewStoreId();  // a new store, or an older one
  const DeviceIdentity geometry = DeviceGeometry(options_, store_id);
  if (absl::Status s = CheckDevices(options_.ssd_paths, geometry, id_known);
      !s.ok()) {
    return s;
  }
  store_id_ = store_id;

  absl::MutexLock lock(&mu_);
  for (const auto& [key, tensor] : replayed->tensors()) {
    auto entry = std::make_shared<Entry>();
    entry->bytes = tensor.bytes;
    entry->last_version =
        std::max(tensor.committed_version, tensor.previous_version);
    absl::StatusOr<std::shared_ptr<const Version>> committed = RecoveredVersion(
        key, tensor.committed_version, tensor.placement, tensor.committed_tag);
    if (!committed.ok()) return committed.status();
    entry->committed = *std::move(committed);
    absl::StatusOr<std::shared_ptr<const Version>> previous =
        RecoveredVersion(key, tensor.previous_version,
                         tensor.previous_placement, tensor.previous_tag);
    if (!previous.ok()) return previous.status();
    entry->previous = *std::move(previous);
    tensors_[key] = std::move(entry);
  }

  // Compact: the log now holds exactly the live state.
  absl::StatusOr<std::unique_ptr<RecordLog>> log =
      RecordLog::Rewrite(path, replayed->Snapshot(StoreInfoRecord()));
  if (!log.ok()) return log.status();
  // After the catalog names the id: a crash in between leaves identity
  // files missing, which the next open writes.
  if (absl::Status s = ClaimDevices(options_.ssd_paths, geometry); !s.ok()) {
    return s;
  }
  absl::MutexLock log_lock(&log_mu_);
  log_ = *std::move(log);
  catalog_bytes_.store(log_->size(), std::memory_order_relaxed);
  catalog_ = *std::move(replayed);
  compact_at_bytes_ =
      std::max(options_.catalog_compact_bytes, 2 * log_->size());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TensorStore::Version>>
TensorStore::RecoveredVersion(const Key& key, uint64_t number,
                              const std::optional<Placement>& placement,
                              uint64_t tag) {
  if (!placement.has_value()) return nullptr;
  absl::Status s = array_->Reserve(*placement);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat(
        "the catalog ", CatalogPath(options_.state_dir),
        " is damaged: its entry of tensor ", Describe(key, number), ": ",
        s.message(),
        ". Nothing was changed. Keep a copy of the file; `lohand --salvage` "
        "(same configuration) rebuilds the catalog from what is consistent "
        "and reports what it leaves out"));
  }
  auto version = std::make_shared<Version>(array_.get(), *placement);
  version->number = number;
  version->tag = tag;
  return version;
}

CatalogRecord TensorStore::StoreInfoOf(const StoreOptions& options) {
  CatalogRecord info;
  info.kind = CatalogRecord::Kind::kStoreInfo;
  info.stripe_unit = options.stripe_unit;
  info.block_size = options.block_size;
  info.device_paths = options.ssd_paths;
  return info;
}

absl::StatusOr<std::string> TensorStore::Salvage(const StoreOptions& options) {
  // Held while it runs: no store may open the state meanwhile.
  absl::StatusOr<UniqueFd> lock_fd = LockStateDir(options.state_dir);
  if (!lock_fd.ok()) return lock_fd.status();
  // A lost store record is rebuilt from the options, with the id the SSDs'
  // identity files agree on.
  CatalogRecord info = StoreInfoOf(options);
  info.store_id = IdOfDevices(options.ssd_paths).value_or("");
  return SalvageCatalog(CatalogPath(options.state_dir), info);
}

absl::Status TensorStore::AppendToCatalog(CatalogRecord record, bool sync) {
  absl::MutexLock lock(&log_mu_);
  // Checked first, so that what the log says and catalog_ never part.
  if (absl::Status valid = catalog_.Check(record); !valid.ok()) {
    return absl::InternalError(absl::StrCat(
        "catalog record out of step with the store: ", valid.message()));
  }
  absl::Status s = log_->Append(record.Encode());
  if (!s.ok()) return s;
  // Appended, durable or not: from now on a snapshot must say it too.
  (void)catalog_.Apply(std::move(record));
  catalog_bytes_.store(log_->size(), std::memory_order_relaxed);
  if (sync) {
    s = log_->Sync();
    if (!s.ok()) return s;
    // Written after the sync returned: intact, it proves the bytes before
    // it durable, so damage there is never taken for a torn tail. Synced
    // with the next record; losing it in a crash costs nothing.
    CatalogRecord mark;
    mark.kind = CatalogRecord::Kind::kSyncMark;
    (void)log_->Append(mark.Encode());
    catalog_bytes_.store(log_->size(), std::memory_order_relaxed);
    MaybeCompactCatalog();
  }
  return s;
}

void TensorStore::MaybeCompactCatalog() {
  if (log_->size() < compact_at_bytes_) return;
  const std::string path = CatalogPath(options_.state_dir);
  absl::StatusOr<std::unique_ptr<RecordLog>> log =
      RecordLog::Rewrite(path, catalog_.Snapshot(StoreInfoRecord()));
  if (!log.ok()) {
    // Rewrite replaces the log only once the snapshot is durable, so the old
    // one is still in place and complete: go on appending to it, and try
    // again once it has doubled.
    Warn(absl::StrCat("could not compact ", path, " (", log.status().message(),
                      "); will retry"));
    compact_at_bytes_ = 2 * log_->size();
    return;
  }
  log_ = *std::move(log);
  compactions_.fetch_add(1, std::memory_order_relaxed);
  catalog_bytes_.store(log_->size(), std::memory_order_relaxed);
  compact_at_bytes_ =
      std::max(options_.catalog_compact_bytes, 2 * log_->size());
}

absl::StatusOr<std::shared_ptr<TensorStore::Entry>> TensorStore::BeginMutation(
    absl::string_view job, absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(Key(job, name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no tensor '", job, "/", name, "'"));
  }
  std::shared_ptr<Entry> entry = it->second;
  mu_.Await(absl::Condition(
      +[](Entry* e) { return !e->busy; }, entry.get()));
  if (entry->deleted) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", job, "/", name, "' was deleted"));
  }
  entry->busy = true;
  return entry;
}

void TensorStore::EndMutation(Entry& entry) {
  absl::MutexLock lock(&mu_);
  entry.busy = false;
}

absl::Status TensorStore::Create(absl::string_view job, absl::string_view name,
                                 uint64_t bytes) {
  absl::Status valid = ValidateName(job, name);
  if (!valid.ok()) return valid;
  if (bytes == 0) {
    return absl::InvalidArgumentError("a tensor needs at least one byte");
  }
  const Key key(job, name);
  auto entry = std::make_shared<Entry>();
  entry->bytes = bytes;
  entry->busy = true;
  {
    absl::MutexLock lock(&mu_);
    if (!tensors_.emplace(key, entry).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("tensor '", job, "/", name, "' already exists"));
    }
  }
  CatalogRecord create;
  create.kind = CatalogRecord::Kind::kCreate;
  create.job = key.first;
  create.name = key.second;
  create.bytes = bytes;
  absl::Status s = AppendToCatalog(std::move(create), /*sync=*/false);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    entry->deleted = true;
    tensors_.erase(key);
  }
  entry->busy = false;
  return s;
}

absl::StatusOr<uint64_t> TensorStore::Write(absl::string_view job,
                                            absl::string_view name,
                                            absl::Span<const uint8_t> data) {
  absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
  if (!found.ok()) return found.status();
  Entry& entry = **found;
  uint64_t bytes;
  uint64_t next;
  {
    absl::MutexLock lock(&mu_);
    bytes = entry.bytes;
    next = entry.last_version + 1;
  }
  if (data.size() != bytes) {
    EndMutation(entry);
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", job, "/", name, "' has ", bytes,
                     " bytes, the write ", data.size()));
  }
  const uint64_t footprint = FootprintBytes(bytes);
  const uint8_t account = budget_ != nullptr ? budget_->AccountOf(name) : 0;
  if (budget_ != nullptr) {
    if (absl::Status allowed = budget_->Reserve(job, account, footprint);
        !allowed.ok()) {
      EndMutation(entry);
      return absl::Status(allowed.code(),
                          absl::StrCat("write of tensor '", job, "/", name,
                                       "': ", allowed.message()));
    }
  }
  absl::StatusOr<Placement> placement = array_->Allocate(bytes);
  if (!placement.ok()) {
    absl::Status refused(placement.status().code(),
                         absl::StrCat("write of tensor '", job, "/", name,
                                      "': ", placement.status().message()));
    if (budget_ != nullptr) budget_->Release(job, account, footprint);
    EndMutation(entry);
    return budget_ != nullptr ? budget_->NoRoom(job, std::move(refused))
                              : refused;
  }
  // From here the version frees its space (and its budget) on every exit
  // path.
  auto version = std::make_shared<Version>(array_.get(), *std::move(placement));
  if (budget_ != nullptr) {
    version->budget = budget_;
    version->job = std::string(job);
    version->account = account;
    version->charged = footprint;
  }
  const std::string what = Describe(Key(job, name), next);
  const absl::Status s =
      Gated(job, bytes, IoGate::Direction::kWrite,
            [&](size_t first, size_t end, std::function<void()> done) {
              return array_->SubmitWrite(data.data(), version->placement, what,
                                         first, end, std::move(done));
            });
  absl::MutexLock lock(&mu_);
  entry.busy = false;
  if (!s.ok()) return s;
  version->number = next;
  entry.last_version = next;
  entry.pending = std::move(version);
  return next;
}

absl::Status TensorStore::Rollback(absl::string_view job,
                                   absl::string_view name) {
  absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
  if (!found.ok()) return found.status();
  Entry& entry = **found;
  absl::MutexLock lock(&mu_);
  entry.busy = false;
  if (entry.pending == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", job, "/", name, "' has no version to roll back"));
  }
  entry.pending.reset();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> TensorStore::Read(absl::string_view job,
                                           absl::string_view name,
                                           absl::Span<uint8_t> dest) {
  return ReadVersion(job, name, dest, /*pending=*/false);
}

absl::StatusOr<uint64_t> TensorStore::ReadPending(absl::string_view job,
                                                  absl::string_view name,
                                                  absl::Span<uint8_t> dest) {
  return ReadVersion(job, name, dest, /*pending=*/true);
}

absl::StatusOr<uint64_t> TensorStore::ReadPrefix(absl::string_view job,
                                                 absl::string_view name,
                                                 absl::Span<uint8_t> dest,
                                                 bool pending) {
  return ReadVersion(job, name, dest, pending, /*prefix=*/true);
}

absl::StatusOr<uint64_t> TensorStore::ReadYielding(
    absl::string_view job, absl::string_view name, absl::Span<uint8_t> dest,
    absl::FunctionRef<void()> before_part) {
  return ReadVersion(job, name, dest, /*pending=*/false, /*prefix=*/false,
                     &before_part);
}

absl::StatusOr<uint64_t> TensorStore::ReadVersion(
    absl::string_view job, absl::string_view name, absl::Span<uint8_t> dest,
    bool pending, bool prefix, absl::FunctionRef<void()>* before_part) {
  const Key key(job, name);
  // Held for the read: a concurrent Commit, Rollback or Delete cannot free
  // the space under it.
  std::shared_ptr<const Version> version;
  uint64_t bytes;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(key);
    if (it == tensors_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no tensor '", job, "/", name, "'"));
    }
    version = pending ? it->second->pending : it->second->committed;
    bytes = it->second->bytes;
  }
  if (prefix ? dest.size() > bytes : dest.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", job, "/", name, "' has ", bytes,
                     " bytes, the read buffer ", dest.size()));
  }
  if (version == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", job, "/", name, "' has no ",
                     pending ? "pending" : "committed", " version"));
  }
  const std::string what = Describe(key, version->number);
  const uint64_t wanted =
      prefix ? dest.size() : std::numeric_limits<uint64_t>::max();
  absl::Status s = Gated(
      job, dest.size(), IoGate::Direction::kRead,
      [&](size_t first, size_t end, std::function<void()> done) {
        return array_->SubmitRead(version->placement, dest.data(), what, wanted,
                                  first, end, std::move(done));
      },
      before_part);
  if (!s.ok()) return s;
  return version->number;
}

absl::Status TensorStore::Gated(absl::string_view job, uint64_t bytes,
                                IoGate::Direction direction,
                                absl::FunctionRef<PartSubmitter> submit,
                                absl::FunctionRef<void()>* before_part) {
  const size_t chunks = array_->chunk_count(bytes);
  if (gate_ == nullptr && before_part == nullptr) {
    return submit(0, chunks, nullptr)->Wait();
  }
  const uint64_t stripe = options_.stripe_unit;
  const size_t per_pass =
      options_.gate_unit_bytes == 0
          ? chunks
          : std::max<size_t>(1, options_.gate_unit_bytes / stripe);
  // Each part holds its pass until its last request completes, and gives
  // it back from the completion thread: the next part, already waiting at
  // the gate, goes in the moment this one is done (or another job's does,
  // when it is that job's turn).
  std::vector<std::unique_ptr<SsdArray::InFlight>> parts;
  for (size_t first = 0; first < chunks; first += per_pass) {
    if (!parts.empty() && parts.back()->failed()) break;
    const size_t end = std::min(chunks, first + per_pass);
    const uint64_t part = std::min<uint64_t>(bytes, end * stripe) -
                          std::min<uint64_t>(bytes, first * stripe);
    if (before_part != nullptr) (*before_part)();
    std::shared_ptr<IoGate::Pass> pass =
        gate_ == nullptr ? nullptr : gate_->Enter(job, part, direction);
    parts.push_back(submit(
        first, end, [pass = std::move(pass)]() mutable { pass.reset(); }));
  }
  absl::Status status;
  for (const std::unique_ptr<SsdArray::InFlight>& part : parts) {
    status.Update(part->Wait());
  }
  return status;
}

absl::Status TensorStore::Delete(absl::string_view job,
                                 absl::string_view name) {
  absl::StatusOr<std::shared_ptr<Entry>> found = BeginMutation(job, name);
  if (!found.ok()) return found.status();
  Entry& entry = **found;
  bool committed;
  {
    absl::MutexLock lock(&mu_);
    committed = entry.committed != nullptr || entry.previous != nullptr ||
                entry.durable != nullptr;
  }
  CatalogRecord del;
  del.kind = CatalogRecord::Kind::kDelete;
  del.job = std::string(job);
  del.name = std::string(name);
  // Durable before the space can be reused by another tensor. Only a
  // committed version's space is named in the catalog: without one, a lost
  // record brings back an empty tensor after a crash, nothing worse, and
  // per-iteration scratch tensors must not cost an fdatasync each.
  absl::Status s = AppendToCatalog(std::move(del), /*sync=*/committed);
  absl::MutexLock lock(&mu_);
  entry.busy = false;
  if (!s.ok()) return s;
  entry.deleted = true;
  entry.committed.reset();
  entry.pending.reset();
  entry.previous.reset();
  entry.MakeDurable();
  tensors_.erase(Key(job, name));
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> TensorStore::Stat(absl::string_view job,
                                             absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(Key(job, name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no tensor '", job, "/", name, "'"));
  }
  const Entry& e = *it->second;
  TensorInfo info;
  info.bytes = e.bytes;
  info.committed_version = e.committed ? e.committed->number : 0;
  info.pending_version = e.pending ? e.pending->number : 0;
  info.previous_version = e.previous ? e.previous->number : 0;
  info.next_version = e.last_version + 1;
  info.committed_tag = e.committed ? e.committed->tag : 0;
  info.previous_tag = e.previous ? e.previous->tag : 0;
  info.volatile_commit = e.volatile_commit;
  info.durable_version = !e.volatile_commit ? info.committed_version
                         : e.durable        ? e.durable->number
                                            : 0;
  info.durable_tag = !e.volatile_commit ? info.committed_tag
                     : e.durable        ? e.durable->tag
                                        : 0;
  return info;
}

std::vector<std::string> TensorStore::List(absl::string_view job) const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : tensors_) {
      if (key.first == job) names.push_back(key.second);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> TensorStore::Jobs() const {
  std::vector<std::string> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : tensors_) {
      if (jobs.empty() || jobs.back() != key.first) jobs.push_back(key.first);
    }
  }
  std::sort(jobs.begin(), jobs.end());
  jobs.erase(std::unique(jobs.begin(), jobs.end()), jobs.end());
  return jobs;
}

uint64_t TensorStore::FootprintBytes(uint64_t tensor_bytes) const {
  return TensorFootprintBytes(tensor_bytes, options_.block_size);
}

void TensorStore::SetIoGate(IoGate* gate) { gate_ = gate; }

void TensorStore::SetSpaceBudget(SpaceBudget* budget) {
  absl::MutexLock lock(&mu_);
  budget_ = budget;
  for (const auto& [key, entry] : tensors_) {
    for (const std::shared_ptr<const Version>& version :
         {entry->committed, entry->pending, entry->previous, entry->durable}) {
      if (version == nullptr || version->budget != nullptr) continue;
      version->charged = FootprintBytes(version->placement.bytes);
      version->account = budget->AccountOf(key.second);
      budget->Charge(key.first, version->account, version->charged);
      version->budget = budget;
      version->job = key.first;
    }
  }
}

std::map<std::string, uint64_t> TensorStore::BytesByJob() const {
  std::map<std::string, uint64_t> bytes;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, entry] : tensors_) {
    bytes[key.first] += entry->bytes * ((entry->committed != nullptr ? 1 : 0) +
                                        (entry->pending != nullptr ? 1 : 0) +
                                        (entry->previous != nullptr ? 1 : 0) +
                                        (entry->durable != nullptr ? 1 : 0));
  }
  return bytes;
}

std::map<std::string, uint64_t> TensorStore::TensorsByJob() const {
  std::map<std::string, uint64_t> tensors;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, entry] : tensors_) ++tensors[key.first];
  return tensors;
}

absl::Status TensorStore::DeleteJob(absl::string_view job) {
  absl::Status first;
  for (const std::string& name : List(job)) {
    absl::Status deleted = Delete(job, name);
    if (!deleted.ok() && !absl::IsNotFound(deleted) && first.ok()) {
      first = deleted;
    }
  }
  return first;
}

std::vector<std::string> TensorStore::DeleteJobsExcept(
    const std::vector<std::string>& keep) {
  std::vector<std::string> freed;
  for (const std::string& job : Jobs()) {
    if (std::find(keep.begin(), keep.end(), job) != keep.end()) continue;
    if (DeleteJob(job).ok()) freed.push_back(job);
  }
  return freed;
}

StoreStats TensorStore::Stats() const {
  StoreStats stats;
  stats.devices = array_->Stats();
  {
    absl::MutexLock lock(&mu_);
    stats.tensors = tensors_.size();
  }
  // Not under log_mu_: a compaction in progress must not hold up status.
  stats.catalog_bytes = catalog_bytes_.load(std::memory_order_relaxed);
  stats.catalog_compactions = compactions_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace lohan
