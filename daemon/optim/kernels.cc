#include "daemon/optim/kernels.h"

#include "daemon/common/check.h"

namespace lohan::optim_internal {

const KernelTable& KernelsFor(Isa isa) {
  LOHAN_CHECK(CpuSupportsIsa(isa));
  switch (isa) {
    case Isa::kScalar:
      return ScalarKernels();
    case Isa::kAvx2:
      return Avx2Kernels();
    case Isa::kAvx512:
      return CpuSupportsAvx512Bf16() ? Avx512Bf16Kernels() : Avx512Kernels();
  }
  return ScalarKernels();
}

}  // namespace lohan::optim_internal
