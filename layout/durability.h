#ifndef LOHAN_LAYOUT_DURABILITY_H_
#define LOHAN_LAYOUT_DURABILITY_H_

#include <cstdint>

namespace lohan {

// The bounds of a job's durability (ModelSpec.commit_interval and
// durable_every_seconds, lohand.toml's [pool] commit_interval and
// durable_every): every that many iterations, or once that many seconds
// passed since the last durable one.
inline constexpr uint32_t kMaxCommitInterval = 1000000;
inline constexpr double kMaxDurableEverySeconds = 7 * 24 * 3600.0;  // 7 days

}  // namespace lohan

#endif  // LOHAN_LAYOUT_DURABILITY_H_
