"""lohan.progress: a progress line on a terminal once the work has taken a
moment, nothing otherwise."""

from __future__ import annotations

import io

from lohan.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_the_layers_and_the_end():
    out = Terminal()
    progress = Progress("writing the initial states", 3, 3_000_000,
                        stream=out, after_seconds=0.0)
    for _ in range(3):
        progress.advance(1_000_000)
    progress.done()
    text = out.getvalue()
    assert "\rlohan: writing the initial states: 1/3 layers" in text
    assert "3/3 layers, 3/3 M parameters" in text
    assert text.endswith("\n") and "3 M parameters in" in text


def test_quiet_when_not_a_terminal_or_quick():
    for stream, after in ((io.StringIO(), 0.0), (Terminal(), 3600.0)):
        progress = Progress("saving", 2, 10, stream=stream,
                            after_seconds=after)
        progress.advance(5)
        progress.advance(5)
        progress.done()
        assert stream.getvalue() == ""
