#ifndef LOHAN_BENCH_SCHED_CLIP_COMPARE_H_
#define LOHAN_BENCH_SCHED_CLIP_COMPARE_H_

#include <cstdint>
#include <vector>

#include "bench/sched/bench_common.h"
#include "daemon/optim/adam.h"
#include "daemon/store/tensor_store.h"
#include "layout/model_layout.h"

namespace lohan {
namespace sched_bench {

// --compare=clip: the clip schedules on jobs of one shape, each running
// --steps iterations back to back per round (forward, backward,
// EndIteration), interleaved by round; prints a table. `grads` holds each
// layer's gradient, `outs` each layer's 16-bit weight buffer.
int CompareClip(const Flags& flags, TensorStore* store,
                const AdamUpdater& updater, const ModelLayout& layout,
                uint64_t state_total,
                const std::vector<std::vector<uint8_t>>& grads,
                std::vector<std::vector<uint16_t>>& outs);

}  // namespace sched_bench
}  // namespace lohan

#endif  // LOHAN_BENCH_SCHED_CLIP_COMPARE_H_
