#ifndef LOHAN_LAYOUT_DTYPE_H_
#define LOHAN_LAYOUT_DTYPE_H_

// The element types the optimizer reads and writes. Kept free of other
// includes: the per-ISA kernel files include it (see kernel_table.h).

#include <cstdint>

namespace lohan {

enum class DType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

}  // namespace lohan

#endif  // LOHAN_LAYOUT_DTYPE_H_
