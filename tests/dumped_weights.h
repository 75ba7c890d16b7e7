#ifndef LOHAN_TESTS_DUMPED_WEIGHTS_H_
#define LOHAN_TESTS_DUMPED_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace lohan::testing {

struct DumpCheck {
  std::vector<uint64_t> layers;
  int iterations = 0;
  bool bf16 = false;
  double max_norm = 0;
  double grad_scale = 0.01;
  uint64_t seed = 7;
};

// Compares the weights train_client dumped to `path` (per layer: the fp32
// masters, then what FETCH_PARAMS gave) with a float64 AdamW reference of
// the synthetic model after `check.iterations`:
// |w - reference| <= 2e-5 * (1 + |reference|) per master weight, and each
// fetched weight exactly its master (rounded to bf16 for bf16 models).
// The first mismatch (layer, element, values) otherwise. `worst` gets the
// largest relative error seen.
absl::Status CheckDumpedWeights(const std::string& path, const DumpCheck& check,
                                double* worst = nullptr);

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_DUMPED_WEIGHTS_H_
