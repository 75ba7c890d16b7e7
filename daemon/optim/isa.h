#ifndef LOHAN_DAEMON_OPTIM_ISA_H_
#define LOHAN_DAEMON_OPTIM_ISA_H_

// Which SIMD path the optimizer kernels use, chosen at run time from cpuid.

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lohan {

enum class Isa {
  kScalar,  // baseline x86-64, any CPU
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F/BW/VL (+ AVX512_BF16 conversions where present)
};

// The environment variable that forces a path: avx512, avx2, scalar or auto.
inline constexpr char kIsaEnvVar[] = "LOHAN_OPTIM_ISA";

absl::string_view IsaName(Isa isa);  // "avx512", "avx2", "scalar"

// Parses "avx512" / "avx2" / "scalar". Anything else: InvalidArgument.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);

// Whether this CPU (and OS: register state enabled) can run `isa`.
bool CpuSupportsIsa(Isa isa);
// Whether the AVX-512 path can use AVX512_BF16 conversion instructions.
bool CpuSupportsAvx512Bf16();

// The fastest path this CPU supports.
Isa BestIsa();

// The path forced on the optimizer: `requested` if given, else
// $LOHAN_OPTIM_ISA if set and not empty or "auto", else nullopt (free to
// choose). Errors as ResolveIsa.
absl::StatusOr<std::optional<Isa>> ForcedIsa(std::optional<Isa> requested);

// The path to use: `requested` if given, else $LOHAN_OPTIM_ISA if set and
// not empty or "auto", else BestIsa(). Errors: InvalidArgument for a bad
// variable value; FailedPrecondition when the CPU lacks the chosen path.
absl::StatusOr<Isa> ResolveIsa(std::optional<Isa> requested);

}  // namespace lohan

#endif  // LOHAN_DAEMON_OPTIM_ISA_H_
