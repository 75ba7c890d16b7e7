#ifndef LOHAN_DAEMON_OPTIM_KERNELS_H_
#define LOHAN_DAEMON_OPTIM_KERNELS_H_

// Internal to daemon/optim: picks the kernel table for an ISA (the tables
// and the kernels' contracts are in kernel_table.h).

#include "daemon/optim/isa.h"
#include "daemon/optim/kernel_table.h"
#include "daemon/optim/optim_types.h"

namespace lohan::optim_internal {

// The table for `isa` on this CPU (AVX-512 picks the BF16 variant when the
// CPU has AVX512_BF16). REQUIRES: CpuSupportsIsa(isa).
const KernelTable& KernelsFor(Isa isa);

inline int OutKindIndex(const HalfOutput& out) {
  if (out.data == nullptr) return 0;
  return out.dtype == DType::kBFloat16 ? 1 : 2;
}

}  // namespace lohan::optim_internal

#endif  // LOHAN_DAEMON_OPTIM_KERNELS_H_
