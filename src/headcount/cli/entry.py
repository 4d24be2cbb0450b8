"""The ``headcount`` console script and ``python -m headcount``: Ctrl-C from the first instruction.

The command line imports typer, torch and transformers (a second or more); a Ctrl-C meanwhile
would print the import's traceback. This module imports nothing heavy, so its handler is in place
before those imports start: Ctrl-C ends in one line and exit status 130 wherever it comes, and a
reader that goes away (``headcount tasks | head -1``) ends the output quietly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    """Run [`headcount.cli.app.main`][headcount.cli.app.main] (its exit status: 0, 1 internal error, 2 bad input, 130 interrupted)."""
    try:
        with _exit_on_interrupt():  # the imports: nothing written yet, nothing to clean up
            from headcount.cli.app import main as cli_main
        try:
            return cli_main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except KeyboardInterrupt:  # before the command started (the imports), or a second Ctrl-C
        _ignore_further_interrupts()
        outs = getattr(sys.modules.get("headcount.runtime.io"), "ACTIVE_OUTS", None)
        where = f": finished results in {outs[-1]} are kept; run the same command again to resume" if outs else ""
        print(f"error: interrupted{where}", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # the reader has gone: nothing more can be shown; keep the interpreter's last flush quiet
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(128 + signal.SIGPIPE)  # as a program killed by SIGPIPE


@contextlib.contextmanager
def _exit_on_interrupt():
    """While the command line is imported, Ctrl-C exits at once (one line, status 130) instead of
    raising KeyboardInterrupt: raised inside torch's C++ initialisation, that aborts the process
    (``terminate called after throwing an instance of 'pybind11::error_already_set'``) or leaves
    the interrupt pending until the interpreter exits. An inherited "ignore SIGINT" (a background
    job of a shell script) stays as it is."""
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.default_int_handler:
            previous = None
        else:
            signal.signal(signal.SIGINT, _exit_now)
    except (ValueError, OSError):  # not the main thread: leave the handling as it is
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _exit_now(signum, frame) -> None:
    try:
        os.write(2, b"error: interrupted\n")
    finally:
        os._exit(130)


def _ignore_further_interrupts() -> None:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the message
    except (ValueError, OSError):  # not the main thread
        pass
