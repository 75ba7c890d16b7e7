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

// lohand's default ([pool] durable_every = "auto"): an iteration is durable
// once kAutoDurableEverySeconds passed since the last durable one, or, when
// a durable commit's writes take longer than kAutoDurableWriteShare of
// that, once that share is kept: the durable writes take at most a tenth of
// the time, and a crash of lohand loses about a minute of training where
// the states write in under 6 s.
inline constexpr double kAutoDurableEverySeconds = 60.0;
inline constexpr double kAutoDurableWriteShare = 0.1;

// The seconds from one durable iteration to the next: `every_seconds`, or
// with a `write_share` (> 0) at least `last_write_seconds` (what the last
// durable commit's writes took) over that share.
inline double DurableSpacingSeconds(double every_seconds, double write_share,
                                    double last_write_seconds) {
  if (write_share <= 0.0) return every_seconds;
  const double kept = last_write_seconds / write_share;
  return kept > every_seconds ? kept : every_seconds;
}

}  // namespace lohan

#endif  // LOHAN_LAYOUT_DURABILITY_H_
