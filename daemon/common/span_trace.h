#ifndef LOHAN_DAEMON_COMMON_SPAN_TRACE_H_
#define LOHAN_DAEMON_COMMON_SPAN_TRACE_H_

// Spans of the daemon's work in time, to find where a training step
// waits (bench/train/trace_timeline.py reads them). Off unless the
// environment's LOHAN_TRACE names a path prefix when the process first
// records, and <prefix>.<pid> can be made as a new file (never an existing
// one, nor through a link; otherwise stderr says why and nothing is
// recorded); then each span is a line of it:
//   <name> <start> <end> <thread id> <a> <b> <c>
// with start and end in seconds on the steady clock and a, b, c integers
// the caller chose (a layer, a chunk, bytes). Off, recording costs one
// relaxed atomic load. The file is written through a buffer: lines reach
// it at FlushSpans, when the buffer fills, and at exit.

#include <cstdint>

namespace lohan {

// Seconds on the steady clock (what spans are measured on).
double SpanClock();

// Whether spans are recorded (LOHAN_TRACE was set and its file opened).
bool SpanTraceOn();

// One span, or a point in time (start == end). `name` outlives the call.
void RecordSpan(const char* name, double start, double end, int64_t a,
                int64_t b = 0, int64_t c = 0);

// Writes the buffered lines out (a natural pause: an iteration's start).
void FlushSpans();

// A span from construction to destruction.
class SpanScope {
 public:
  explicit SpanScope(const char* name, int64_t a = 0, int64_t b = 0,
                     int64_t c = 0)
      : name_(name),
        a_(a),
        b_(b),
        c_(c),
        start_(SpanTraceOn() ? SpanClock() : 0.0) {}
  ~SpanScope() {
    if (SpanTraceOn()) RecordSpan(name_, start_, SpanClock(), a_, b_, c_);
  }
  SpanScope(const SpanScope&) = delete;
  SpanScope& operator=(const SpanScope&) = delete;

 private:
  const char* const name_;
  const int64_t a_, b_, c_;
  const double start_;
};

}  // namespace lohan

#endif  // LOHAN_DAEMON_COMMON_SPAN_TRACE_H_
