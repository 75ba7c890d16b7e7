#include "tests/dumped_weights.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "daemon/optim/half.h"
#include "tests/synthetic_model.h"

namespace lohan::testing {

absl::Status CheckDumpedWeights(const std::string& path, const DumpCheck& check,
                                double* worst) {
  auto grad = [&](int t, size_t l, uint64_t i) -> double {
    const float g = Gradient(check.seed, t, l, i, check.grad_scale);
    return check.bf16 ? Bf16ToFloat(FloatToBf16(g)) : g;
  };
  const auto reference =
      ReferenceAdamW(check.layers, check.seed, check.iterations,
                     SyntheticAdam(), check.max_norm, grad);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no weights in ", path));
  double largest = 0;
  for (size_t l = 0; l < check.layers.size(); ++l) {
    const uint64_t n = check.layers[l];
    std::vector<float> master(n);
    in.read(reinterpret_cast<char*>(master.data()), n * 4);
    std::vector<uint8_t> copy(n * (check.bf16 ? 2 : 4));
    in.read(reinterpret_cast<char*>(copy.data()), copy.size());
    if (!in) return absl::DataLossError(absl::StrCat("short file ", path));
    for (uint64_t i = 0; i < n; ++i) {
      const double expected = reference[l][i];
      const double error = std::abs(master[i] - expected);
      largest = std::max(largest, error / (1 + std::abs(expected)));
      const std::string where =
          absl::StrCat("layer ", l, " element ", i, " after ", check.iterations,
                       " iterations: ");
      if (!(error <= 2e-5 * (1 + std::abs(expected)))) {
        return absl::InternalError(absl::StrCat(where, "master ", master[i],
                                                ", reference ", expected));
      }
      // What the next forward gets (FETCH_PARAMS) is exactly the master
      // weight, rounded (an fp32 model's: the master itself).
      if (check.bf16) {
        uint16_t published;
        std::memcpy(&published, copy.data() + 2 * i, 2);
        if (published != FloatToBf16(master[i])) {
          return absl::InternalError(absl::StrCat(
              where, "fetched bf16 ", published, " of master ", master[i]));
        }
      } else if (std::memcmp(copy.data() + 4 * i, &master[i], 4) != 0) {
        return absl::InternalError(
            absl::StrCat(where, "fetched weight is not the master"));
      }
    }
  }
  if (worst != nullptr) *worst = largest;
  return absl::OkStatus();
}

}  // namespace lohan::testing
