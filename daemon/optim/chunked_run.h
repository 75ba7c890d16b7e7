#ifndef LOHAN_DAEMON_OPTIM_CHUNKED_RUN_H_
#define LOHAN_DAEMON_OPTIM_CHUNKED_RUN_H_

// Internal to daemon/optim: splits [0, n) into fixed-size chunks
// (kChunkElements, the last one shorter), runs one kernel call per chunk on
// a pool, and combines the chunks' partial sums in chunk order. Chunk
// boundaries and combine order do not depend on the thread count, so the
// result is bit-identical for any pool (or none).

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "daemon/optim/worker_pool.h"

namespace lohan::optim_internal {

// Calls chunk_fn(begin, count) for every chunk and returns the sum of the
// values it returned, added in chunk order. `pool` may be null: the caller's
// thread runs every chunk. With a pool, a worker takes `chunks_per_task`
// consecutive chunks at a time (>= 1; which thread runs a chunk never
// changes the result). REQUIRES: chunk_fn is safe to run concurrently on
// different chunks.
double RunChunked(WorkerPool* pool, std::size_t n, std::size_t chunks_per_task,
                  absl::FunctionRef<double(std::size_t, std::size_t)> chunk_fn);

}  // namespace lohan::optim_internal

#endif  // LOHAN_DAEMON_OPTIM_CHUNKED_RUN_H_
