#include "daemon/optim/isa.h"

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lohan {

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "invalid";
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  if (name == "avx512") return Isa::kAvx512;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "scalar") return Isa::kScalar;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer ISA '", name, "' (want avx512, avx2 or scalar)"));
}

bool CpuSupportsIsa(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("f16c");
  }
  return false;
}

bool CpuSupportsAvx512Bf16() {
  __builtin_cpu_init();
  return CpuSupportsIsa(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
}

Isa BestIsa() {
  if (CpuSupportsIsa(Isa::kAvx512)) return Isa::kAvx512;
  if (CpuSupportsIsa(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

absl::StatusOr<std::optional<Isa>> ForcedIsa(std::optional<Isa> requested) {
  Isa isa = Isa::kScalar;
  if (requested.has_value()) {
    isa = *requested;
  } else {
    const char* env = std::getenv(kIsaEnvVar);
    const absl::string_view value = env == nullptr ? "" : env;
    if (value.empty() || value == "auto") return std::nullopt;
    absl::StatusOr<Isa> parsed = ParseIsa(value);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kIsaEnvVar, ": ", parsed.status().message()));
    }
    isa = *parsed;
  }
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer ISA '", IsaName(isa), "' requested but this CPU lacks it"));
  }
  return isa;
}

absl::StatusOr<Isa> ResolveIsa(std::optional<Isa> requested) {
  absl::StatusOr<std::optional<Isa>> forced = ForcedIsa(requested);
  if (!forced.ok()) return forced.status();
  return forced->value_or(BestIsa());
}

}  // namespace lohan
