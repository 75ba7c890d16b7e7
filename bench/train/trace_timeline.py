"""Where a training step waits, from lohand's span trace.

Start lohand with LOHAN_TRACE=/some/prefix in its environment (bench
scripts pass their environment on to the lohand they start); it writes
/some/prefix.<pid> (daemon/common/span_trace.h). Then

    .venv/bin/python bench/train/trace_timeline.py /some/prefix.<pid>
    .venv/bin/python bench/train/trace_timeline.py FILE --iteration 7

The first form gives, for each iteration (from one BeginIteration to the
next: for a client that begins an iteration at its backward, backward then
the next forward), its length, when EndIteration came (the norm), and per
kind of span the count, the sum of their durations and the time covered by
at least one (the union); `ssd` is the union of the kinds that move bytes
to or from the SSDs (read, read_ahead, write, grad_store), and
`wait_layer` the time the client's weight fetches waited for the updates.
The second lists one iteration's spans in time order, relative to its
start.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

SSD_KINDS = ("read", "read_ahead", "write", "grad_store")


@dataclass(frozen=True)
class Span:
    name: str
    start: float
    end: float
    thread: int
    a: int
    b: int
    c: int


def read_spans(path: Path) -> List[Span]:
    spans = []
    for line in path.read_text().splitlines():
        name, start, end, thread, a, b, c = line.split()
        spans.append(Span(name, float(start), float(end), int(thread),
                          int(a), int(b), int(c)))
    spans.sort(key=lambda s: s.start)
    return spans


def union(intervals: Iterable[Tuple[float, float]]) -> float:
    """Seconds covered by at least one of the intervals."""
    covered = 0.0
    current = None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                covered += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        covered += current[1] - current[0]
    return covered


def iterations(spans: List[Span]) -> List[Tuple[float, float, List[Span]]]:
    """(start, end, spans begun in it) from one begin_iteration to the
    next; the spans after the last begin are left out (no end)."""
    begins = [s.start for s in spans if s.name == "begin_iteration"]
    out = []
    for start, end in zip(begins, begins[1:]):
        out.append((start, end,
                    [s for s in spans if start <= s.start < end]))
    return out


def summarize(start: float, end: float, spans: List[Span]) -> Dict[str, float]:
    row: Dict[str, float] = {"length": end - start}
    ends = [s.start for s in spans if s.name == "end_iteration"]
    row["norm_at"] = (ends[0] - start) if ends else float("nan")
    kinds = sorted({s.name for s in spans} - {"begin_iteration"})
    for kind in kinds:
        of_kind = [(s.start, s.end) for s in spans if s.name == kind]
        row[f"{kind}.n"] = len(of_kind)
        row[f"{kind}.sum"] = sum(e - b for b, e in of_kind)
        row[f"{kind}.union"] = union(of_kind)
    row["ssd.union"] = union(
        (s.start, s.end) for s in spans if s.name in SSD_KINDS)
    return row


def print_summary(rows: List[Dict[str, float]]) -> None:
    print(f"{'iteration':>9} {'s':>6} {'norm at':>7} {'ssd busy':>8} "
          f"{'waited for layers':>17}")
    for i, row in enumerate(rows):
        print(f"{i:>9} {row['length']:6.3f} {row['norm_at']:7.3f} "
              f"{row['ssd.union']:8.3f} {row.get('wait_layer.sum', 0.0):17.3f}")
    if not rows:
        return
    keys = sorted({k for row in rows for k in row})
    print("\nmedians over the iterations (seconds; .n: spans)")
    for key in keys:
        values = [row.get(key, 0.0) for row in rows]
        print(f"  {key:<24} {statistics.median(values):9.3f}")


def print_timeline(start: float, spans: List[Span]) -> None:
    print(f"{'span':<18} {'from':>7} {'to':>7} {'ms':>7}  a b c")
    for s in spans:
        print(f"{s.name:<18} {s.start - start:7.3f} {s.end - start:7.3f} "
              f"{1000 * (s.end - s.start):7.1f}  {s.a} {s.b} {s.c}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path, help="a LOHAN_TRACE file")
    parser.add_argument("--iteration", type=int,
                        help="list this iteration's spans")
    parser.add_argument("--skip", type=int, default=0,
                        help="iterations to leave out of the summary "
                             "(warm-up)")
    args = parser.parse_args()
    its = iterations(read_spans(args.trace))
    if args.iteration is not None:
        if not 0 <= args.iteration < len(its):
            parser.error(f"--iteration: the trace has {len(its)} complete "
                         f"iterations (0 to {len(its) - 1})")
        start, _, spans = its[args.iteration]
        print_timeline(start, spans)
        return
    print_summary([summarize(*it) for it in its[args.skip:]])


if __name__ == "__main__":
    main()
