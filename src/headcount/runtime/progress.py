"""Progress of a long step on stderr, never stdout (stdout may be piped JSON or tables): done / total,
the rate and an ETA.

One display for every long step (scoring, pruning steps, fine-tuning, a study's jobs). On a
terminal the line is redrawn in place (``\\r``); elsewhere (a log file, CI) a plain line is written
at most every [`PLAIN_EVERY_S`][headcount.runtime.progress.PLAIN_EVERY_S] seconds, plus the first and
the final line, so a log gets a few readable lines instead of one giant one.
[`tqdm_lines`][headcount.runtime.progress.tqdm_lines] does the same for a library's own tqdm bar.

>>> import io
>>> t = [0.0]
>>> out = io.StringIO()
>>> p = Progress(100, "scoring", unit="examples", stream=out, clock=lambda: t[0], quiet=0)
>>> t[0] = 10.0; p.update(25)
>>> p.close()
>>> print(out.getvalue().strip())
scoring: 0/100 examples
scoring: 25/100 examples (25%), 2.5 examples/s, 10s elapsed
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

#: seconds between two plain progress lines when stderr is not a terminal (the one setting)
PLAIN_EVERY_S = 30.0
#: seconds between two redraws on a terminal
TERMINAL_EVERY_S = 0.2
#: seconds a step runs before its first line: a step done sooner prints nothing (a quick command's
#: stderr stays its one ``error:`` or ``note:`` line; progress is for steps a user waits on)
QUIET_S = 2.0


def eta_seconds(done: float, total: float | None, elapsed: float) -> float | None:
    """Seconds left at the mean rate so far: ``(total - done) * elapsed / done``; None while
    nothing is done or the total is unknown.

    >>> eta_seconds(25, 100, 10.0)
    30.0
    >>> eta_seconds(0, 100, 10.0) is None, eta_seconds(5, None, 1.0) is None
    (True, True)
    """
    if total is None or done <= 0 or elapsed <= 0:
        return None
    return max(0.0, (total - done) * elapsed / done)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h10m``.

    >>> duration(42.4), duration(185), duration(7800)
    ('42s', '3m05s', '2h10m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or bare stream: plain lines
        return False


class Progress:
    """``what: done/total unit (pct), rate unit/s, elapsed, ETA`` on stderr.

    Args:
        total: the amount of work (None: unknown, no ETA).
        what: the step's name (``scoring (gradient)``).
        unit: what is counted (``examples``, ``steps``).
        stream: where to write (default: ``sys.stderr`` at each write, so a redirection applies).
        clock: seconds (``time.monotonic``; tests pass a fake one).
        every: seconds between plain lines (default [`PLAIN_EVERY_S`][headcount.runtime.progress.PLAIN_EVERY_S]).
        terminal: redraw in place (default: whether ``stream`` is a terminal).
        quiet: seconds before the first line (default [`QUIET_S`][headcount.runtime.progress.QUIET_S]; 0: at once).
    """

    def __init__(self, total: float | None, what: str, unit: str = "", *, stream=None,
                 clock: Callable[[], float] = time.monotonic, every: float | None = None,
                 terminal: bool | None = None, quiet: float | None = None):
        self.total, self.what, self.unit = total, what, unit
        self._stream = stream
        self.clock = clock
        self.every = PLAIN_EVERY_S if every is None else every
        self.terminal = is_terminal(self.stream) if terminal is None else terminal
        self.start = clock()
        self.done: float = 0
        self.detail = ""
        self._last = self.start
        self._closed = False
        self.quiet = QUIET_S if quiet is None else quiet
        self._shown = False  # a line has been written: the final one follows
        if self.quiet <= 0:
            self._show(self.line(), self.start)

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def line(self, now: float | None = None, end: bool = False) -> str:
        """The progress line at ``now`` (default: the clock's time)."""
        now = self.clock() if now is None else now
        elapsed = now - self.start
        unit = f" {self.unit}" if self.unit else ""
        of = f"/{self.total:g}" if self.total is not None else ""
        text = f"{self.what}: {self.done:g}{of}{unit}"
        if self.done > 0 and elapsed > 0:
            pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            rate = self.done / elapsed
            text += f"{pct}, {rate:.3g} {self.unit or 'steps'}/s, {duration(elapsed)} elapsed"
            if not end:
                left = eta_seconds(self.done, self.total, elapsed)
                if left is not None:
                    text += f", ETA {duration(left)}"
        return text + (f"; {self.detail}" if self.detail else "")

    def update(self, done: float, total: float | None = None, detail: str | None = None) -> None:
        """``done`` units finished so far (``total``, ``detail``: a new total, a short note)."""
        if self._closed:
            return
        self.done = done
        if total is not None:
            self.total = total
        if detail is not None:
            self.detail = detail
        now = self.clock()
        if not self._shown:
            if now - self.start >= self.quiet:
                self._show(self.line(now), now)
        elif now - self._last >= (TERMINAL_EVERY_S if self.terminal else self.every):
            self._show(self.line(now), now)

    def __call__(self, done: float, total: float | None = None, detail: str | None = None) -> None:
        self.update(done, total, detail)

    def close(self) -> None:
        """The final line (once)."""
        if not self._closed:
            self._closed = True
            now = self.clock()
            if self._shown or now - self.start >= self.quiet:
                self._write(self.line(now, end=True), final=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _show(self, text: str, now: float) -> None:
        self._shown, self._last = True, now
        self._write(text, final=False)

    def _write(self, text: str, final: bool) -> None:
        s = self.stream
        try:
            if self.terminal:
                s.write("\r\x1b[2K" + text + ("\n" if final else ""))
            else:
                s.write(text + "\n")
            s.flush()
        except (OSError, ValueError):  # stderr gone: progress is never worth an error
            pass


class TqdmLines:
    """A stream for a library's tqdm bar (``contextlib.redirect_stderr(tqdm_lines(...))``): on a
    terminal, written through; elsewhere each ``\\r``-redrawn state is held and written as one line
    at most every [`PLAIN_EVERY_S`][headcount.runtime.progress.PLAIN_EVERY_S] seconds, plus the last one.

    >>> import io
    >>> out = io.StringIO()
    >>> t = [0.0]
    >>> s = TqdmLines(out, clock=lambda: t[0], terminal=False)
    >>> for i in range(100):
    ...     t[0] = i; _ = s.write(f"\\rLoading: {i}%")
    >>> s.close()
    >>> out.getvalue().splitlines()
    ['Loading: 0%', 'Loading: 30%', 'Loading: 60%', 'Loading: 90%', 'Loading: 99%']
    """

    def __init__(self, stream=None, *, clock: Callable[[], float] = time.monotonic, every: float | None = None,
                 terminal: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr  # taken before a redirection to this
        self.clock = clock
        self.every = PLAIN_EVERY_S if every is None else every
        self.terminal = is_terminal(self.stream) if terminal is None else terminal
        self._pending = ""   # the latest state not written yet
        self._last: float | None = None

    def isatty(self) -> bool:
        return self.terminal

    def write(self, text: str) -> int:
        if self.terminal:
            self.stream.write(text)
            return len(text)
        lines = text.split("\n")
        for i, line in enumerate(lines):
            ended = i < len(lines) - 1  # a newline followed: the bar's final state, written now
            part = line.split("\r")[-1].strip() or line.strip("\r ").rsplit("\r", 1)[-1].strip()
            if part:
                self._pending = part
            now = self.clock()
            if self._pending and (ended or self._last is None or now - self._last >= self.every):
                self._emit(now)
        return len(text)

    def _emit(self, now: float) -> None:
        try:
            self.stream.write(self._pending + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self._pending, self._last = "", now

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Write the last state held back."""
        if self._pending:
            self._emit(self.clock())

    def __enter__(self) -> "TqdmLines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LinesTo:
    """A stream that hands each line written to ``say(line)``: a [`Progress`][headcount.runtime.progress.Progress]
    whose lines go through a one-line-message callback (fine-tuning's ``progress``).

    >>> said = []
    >>> p = Progress(10, "training", unit="steps", stream=LinesTo(said.append), terminal=False, quiet=0)
    >>> said
    ['training: 0/10 steps']
    """

    def __init__(self, say: Callable[[str], None]):
        self.say = say

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self.say(line.strip())
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def tqdm_lines(stream=None) -> TqdmLines:
    """A [`TqdmLines`][headcount.runtime.progress.TqdmLines] on ``stream`` (default: ``sys.stderr`` now):
    ``with tqdm_lines() as lines, contextlib.redirect_stderr(lines): ...``."""
    return TqdmLines(stream)


__all__ = ["PLAIN_EVERY_S", "QUIET_S", "LinesTo", "Progress", "TqdmLines", "eta_seconds", "duration", "tqdm_lines"]
