#include "daemon/store/extent_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"

namespace lohan {

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity), alignment_(alignment), free_bytes_(capacity) {
  LOHAN_CHECK(capacity > 0 && alignment > 0 && capacity % alignment == 0);
  free_[0] = capacity;
}

absl::StatusOr<uint64_t> ExtentAllocator::Allocate(uint64_t length) {
  LOHAN_CHECK(length > 0 && length % alignment_ == 0);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < length) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - length;
    free_.erase(it);
    if (rest > 0) free_[offset + length] = rest;
    free_bytes_ -= length;
    return offset;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("no free run of ", length, " bytes (", free_bytes_,
                   " bytes free, largest run ", largest_free_run(), ")"));
}

absl::Status ExtentAllocator::Reserve(uint64_t offset, uint64_t length) {
  if (length == 0 || offset % alignment_ != 0 || length % alignment_ != 0 ||
      offset > capacity_ || length > capacity_ - offset) {
    return absl::DataLossError(absl::StrCat("extent at ", offset, " length ",
                                            length, " is not valid on a ",
                                            capacity_, "-byte device"));
  }
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) {
    return absl::DataLossError(
        absl::StrCat("extent at ", offset, " is already used"));
  }
  --it;
  const uint64_t run_start = it->first;
  const uint64_t run_end = run_start + it->second;
  if (offset + length > run_end) {
    return absl::DataLossError(absl::StrCat("extent at ", offset, " length ",
                                            length, " overlaps used space"));
  }
  free_.erase(it);
  if (offset > run_start) free_[run_start] = offset - run_start;
  if (offset + length < run_end) {
    free_[offset + length] = run_end - (offset + length);
  }
  free_bytes_ -= length;
  return absl::OkStatus();
}

void ExtentAllocator::Free(uint64_t offset, uint64_t length) {
  LOHAN_CHECK(length > 0 && offset + length <= capacity_);
  auto next = free_.lower_bound(offset);
  LOHAN_CHECK(next == free_.end() || next->first >= offset + length);
  uint64_t start = offset;
  uint64_t end = offset + length;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    LOHAN_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == end) {
    end += next->second;
    free_.erase(next);
  }
  free_[start] = end - start;
  free_bytes_ += length;
}

uint64_t ExtentAllocator::largest_free_run() const {
  uint64_t best = 0;
  for (const auto& [offset, length] : free_) best = std::max(best, length);
  return best;
}

}  // namespace lohan
