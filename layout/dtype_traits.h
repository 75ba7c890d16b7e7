#ifndef LOHAN_LAYOUT_DTYPE_TRAITS_H_
#define LOHAN_LAYOUT_DTYPE_TRAITS_H_

// What each element type is called and how many bytes it takes (apart
// from dtype.h, which the per-ISA kernels include and keeps free of other
// includes).

#include <cstddef>

#include "absl/strings/string_view.h"
#include "layout/dtype.h"

namespace lohan {

absl::string_view DTypeName(DType dtype);
std::size_t DTypeSize(DType dtype);  // 4 or 2; 0 for an out-of-range value.

}  // namespace lohan

#endif  // LOHAN_LAYOUT_DTYPE_TRAITS_H_
