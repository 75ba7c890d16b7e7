#include "daemon/optim/chunked_run.h"

#include <algorithm>
#include <vector>

#include "daemon/optim/kernels.h"

namespace lohan::optim_internal {

double RunChunked(
    WorkerPool* pool, std::size_t n, std::size_t chunks_per_task,
    absl::FunctionRef<double(std::size_t, std::size_t)> chunk_fn) {
  const std::size_t num_chunks = (n + kChunkElements - 1) / kChunkElements;
  auto count_of = [n](std::size_t chunk) {
    return std::min(kChunkElements, n - chunk * kChunkElements);
  };
  double sum = 0.0;
  if (pool == nullptr || num_chunks <= 1) {
    for (std::size_t c = 0; c < num_chunks; ++c) {
      sum += chunk_fn(c * kChunkElements, count_of(c));
    }
    return sum;
  }
  const std::size_t per_task = std::max<std::size_t>(chunks_per_task, 1);
  std::vector<double> partials(num_chunks);
  pool->ParallelFor(
      (num_chunks + per_task - 1) / per_task, [&](std::size_t task) {
        const std::size_t end = std::min(num_chunks, (task + 1) * per_task);
        for (std::size_t c = task * per_task; c < end; ++c) {
          partials[c] = chunk_fn(c * kChunkElements, count_of(c));
        }
      });
  for (double partial : partials) sum += partial;
  return sum;
}

}  // namespace lohan::optim_internal
