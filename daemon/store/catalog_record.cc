#include "daemon/store/catalog_record.h"

#include "absl/strings/str_cat.h"

namespace lohan {
namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Every getter fails (returns false) once the input runs out.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t& v) {
    if (in_.size() < 1) return false;
    v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t& v) {
    if (in_.size() < 4) return false;
    v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(4);
    return true;
  }
  bool U64(uint64_t& v) {
    if (in_.size() < 8) return false;
    v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(8);
    return true;
  }
  bool Str(std::string& s) {
    uint32_t n;
    if (!U32(n) || in_.size() < n) return false;
    s.assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  // Reads a count of elements of at least `min_size` bytes each, rejecting
  // counts the remaining input cannot hold.
  bool Count(uint32_t& n, size_t min_size) {
    return U32(n) && Fits(n, min_size);
  }
  // Whether `n` elements of at least `min_size` bytes can still follow.
  bool Fits(uint32_t n, size_t min_size) const {
    return n <= in_.size() / min_size;
  }
  bool done() const { return in_.empty(); }

 private:
  absl::string_view in_;
};

// The device count's top bit says more runs follow the CRCs (a placement
// split over several runs of a device): without them a placement encodes
// as it always did.
constexpr uint32_t kHasMoreRuns = 0x80000000u;

void PutPlacement(Writer& w, const Placement& placement) {
  w.U64(placement.bytes);
  w.U32(placement.first_device);
  w.U32(static_cast<uint32_t>(placement.region_offset.size()) |
        (placement.more_runs.empty() ? 0 : kHasMoreRuns));
  for (size_t d = 0; d < placement.region_offset.size(); ++d) {
    w.U64(placement.region_offset[d]);
    w.U64(placement.region_length[d]);
  }
  w.U32(static_cast<uint32_t>(placement.chunk_crc.size()));
  for (uint32_t crc : placement.chunk_crc) w.U32(crc);
  if (placement.more_runs.empty()) return;
  w.U32(static_cast<uint32_t>(placement.more_runs.size()));
  for (const Placement::Run& run : placement.more_runs) {
    w.U32(run.device);
    w.U64(run.offset);
    w.U64(run.length);
  }
}

bool GetPlacement(Reader& r, Placement& placement) {
  uint32_t n = 0;
  bool ok = r.U64(placement.bytes) && r.U32(placement.first_device) && r.U32(n);
  const bool more_runs = (n & kHasMoreRuns) != 0;
  n &= ~kHasMoreRuns;
  ok = ok && r.Fits(n, 16);
  for (uint32_t d = 0; ok && d < n; ++d) {
    uint64_t off = 0, len = 0;
    ok = r.U64(off) && r.U64(len);
    placement.region_offset.push_back(off);
    placement.region_length.push_back(len);
  }
  uint32_t chunks = 0;
  ok = ok && r.Count(chunks, 4);
  for (uint32_t i = 0; ok && i < chunks; ++i) {
    uint32_t crc = 0;
    ok = r.U32(crc);
    placement.chunk_crc.push_back(crc);
  }
  uint32_t runs = 0;
  ok = ok && (!more_runs || (r.Count(runs, 20) && runs > 0));
  for (uint32_t i = 0; ok && i < runs; ++i) {
    Placement::Run run;
    ok = r.U32(run.device) && r.U64(run.offset) && r.U64(run.length);
    placement.more_runs.push_back(run);
  }
  return ok;
}

}  // namespace

std::string CatalogRecord::Encode() const {
  Writer w;
  w.U8(static_cast<uint8_t>(kind));
  switch (kind) {
    case Kind::kStoreInfo:
      w.U32(format_version);
      w.U64(stripe_unit);
      w.U32(block_size);
      w.U32(static_cast<uint32_t>(device_paths.size()));
      for (const std::string& p : device_paths) w.Str(p);
      if (!store_id.empty() || has_snapshot_size) w.Str(store_id);
      if (has_snapshot_size) {
        w.U64(snapshot_records);
        w.U64(snapshot_bytes);
      }
      break;
    case Kind::kCreate:
      w.Str(job);
      w.Str(name);
      w.U64(bytes);
      break;
    case Kind::kCommit:
    case Kind::kPrevious:
      w.Str(job);
      w.Str(name);
      w.U64(version);
      PutPlacement(w, placement);
      if (tag != 0) w.U64(tag);
      break;
    case Kind::kReleasePrevious:
    case Kind::kRevertToPrevious:
      w.Str(job);
      break;
    case Kind::kCommitBatch:
    case Kind::kCommitBatchKeepingPrevious:
      w.Str(job);
      w.U32(static_cast<uint32_t>(commits.size()));
      for (const CommittedVersion& c : commits) {
        w.Str(c.name);
        w.U64(c.version);
        PutPlacement(w, c.placement);
      }
      if (tag != 0) w.U64(tag);
      break;
    case Kind::kDelete:
      w.Str(job);
      w.Str(name);
      break;
    case Kind::kSyncMark:
      break;
  }
  return w.Take();
}

absl::StatusOr<CatalogRecord> CatalogRecord::Decode(absl::string_view payload) {
  Reader r(payload);
  CatalogRecord rec;
  uint8_t kind = 0;
  bool ok = r.U8(kind);
  rec.kind = static_cast<Kind>(kind);
  if (ok) {
    switch (rec.kind) {
      case Kind::kStoreInfo: {
        uint32_t n = 0;
        ok = r.U32(rec.format_version) && r.U64(rec.stripe_unit) &&
             r.U32(rec.block_size) && r.Count(n, 4);
        for (uint32_t i = 0; ok && i < n; ++i) {
          rec.device_paths.emplace_back();
          ok = r.Str(rec.device_paths.back());
        }
        if (ok && !r.done()) ok = r.Str(rec.store_id);  // absent: older
        if (ok && !r.done()) {                          // absent: older
          rec.has_snapshot_size = true;
          ok = r.U64(rec.snapshot_records) && r.U64(rec.snapshot_bytes);
        }
        break;
      }
      case Kind::kCreate:
        ok = r.Str(rec.job) && r.Str(rec.name) && r.U64(rec.bytes);
        break;
      case Kind::kCommit:
      case Kind::kPrevious:
        ok = r.Str(rec.job) && r.Str(rec.name) && r.U64(rec.version) &&
             GetPlacement(r, rec.placement);
        if (ok && !r.done()) ok = r.U64(rec.tag) && rec.tag != 0;
        rec.bytes = rec.placement.bytes;
        break;
      case Kind::kReleasePrevious:
      case Kind::kRevertToPrevious:
        ok = r.Str(rec.job);
        break;
      case Kind::kCommitBatch:
      case Kind::kCommitBatchKeepingPrevious: {
        // An entry takes at least 4 (name) + 8 + 8 + 4 + 4 + 4 bytes.
        uint32_t n = 0;
        ok = r.Str(rec.job) && r.Count(n, 32) && n > 0;
        for (uint32_t i = 0; ok && i < n; ++i) {
          rec.commits.emplace_back();
          CommittedVersion& c = rec.commits.back();
          ok =
              r.Str(c.name) && r.U64(c.version) && GetPlacement(r, c.placement);
        }
        if (ok && !r.done()) ok = r.U64(rec.tag) && rec.tag != 0;
        break;
      }
      case Kind::kDelete:
        ok = r.Str(rec.job) && r.Str(rec.name);
        break;
      case Kind::kSyncMark:
        break;
      default:
        return absl::DataLossError(
            absl::StrCat("catalog record of unknown kind ", kind));
    }
  }
  if (!ok || !r.done()) {
    return absl::DataLossError(absl::StrCat("malformed catalog record of kind ",
                                            kind, " (", payload.size(),
                                            " bytes)"));
  }
  return rec;
}

}  // namespace lohan
