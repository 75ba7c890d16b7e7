// AVX-512 F/BW/VL kernels, 16 floats a vector, bf16 rounding in integers.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mf16c; only reached through
// KernelsFor() on a CPU that has them.

#include "daemon/optim/kernel_generic_inl.h"
#include "daemon/optim/kernel_table.h"
#include "daemon/optim/kernels_avx512_inl.h"

namespace lohan::optim_internal {

const KernelTable& Avx512Kernels() {
  static const KernelTable table = generic::MakeTable<Avx512>("avx512");
  return table;
}

}  // namespace lohan::optim_internal
