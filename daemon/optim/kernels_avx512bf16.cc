// AVX-512 kernels using AVX512_BF16's VCVTNEPS2BF16 for bf16 output.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mf16c; only
// reached through KernelsFor() on a CPU that has them.

#define LOHAN_OPTIM_AVX512BF16 1

#include "daemon/optim/kernel_generic_inl.h"
#include "daemon/optim/kernel_table.h"
#include "daemon/optim/kernels_avx512_inl.h"

namespace lohan::optim_internal {

const KernelTable& Avx512Bf16Kernels() {
  static const KernelTable table = generic::MakeTable<Avx512>("avx512+bf16");
  return table;
}

}  // namespace lohan::optim_internal
