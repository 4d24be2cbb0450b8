"""Command line: a thin typer app over the API (one module per area under ``commands/``).

Bad input ends in one ``error: ...`` line and exit status 2, never a traceback.
"""

from __future__ import annotations

import errno
import gc
import os
import sys

import typer

from headcount.cli import commands as _commands  # the command modules load lazily (commands.LazyGroup)
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import ACTIVE_OUTS, io_error_message

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as _click_exc


def __getattr__(name: str):
    """``headcount.cli.app.app``: the typer app with every command registered (tests, the docs)."""
    if name == "app":
        _commands.load_commands()
        return _commands.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _quiet_libraries() -> None:
    """transformers and huggingface_hub report errors only, without progress bars (the hub's retry
    warnings, "Retrying in 1s [Retry 1/5]", would bury the one error line).

    Through their environment variables, read when they are imported: the command line does not
    load transformers to set them (1.2 s of every start, ``headcount --help`` included). When they
    are loaded already (the CLI called in-process), directly. A variable the user set wins.
    """
    for name, value in (("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_VERBOSITY", "error")):
        os.environ.setdefault(name, value)
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.logging.set_verbosity_error()


#: options whose value may not be an empty string (typer would read "" as "." or as the default)
_NON_EMPTY = ("--out", "-o", "--model", "-m", "--task", "-t", "--mask", "--weight-mask", "--match")


def _check_empty_values(argv: list[str]) -> None:
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _NON_EMPTY and ((eq and not value.strip()) or (not eq and i + 1 < len(argv) and not argv[i + 1].strip())):
            raise HeadcountError(f"{name} must not be empty")


#: how a full disk reads in the message of an exception that wraps the OSError in text
#: (safetensors' SafetensorError: "... IoError(Os { code: 28, kind: StorageFull, ... })")
_FULL_DISK_TEXT = ("No space left on device", "StorageFull", "Disk quota exceeded", "QuotaExceeded")


def _environment_message(e: BaseException) -> str | None:
    """One line for an error that is the environment, not a bug: an OSError that
    [`io_error_message`][headcount.runtime.io.io_error_message] knows (full disk, read-only), also when a library raised it as the
    cause or context of its own exception, or named a full disk only in its message (safetensors
    raises ``SafetensorError``, not an OSError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            msg = io_error_message(e)
            if msg is not None:
                return msg
        elif any(text in str(e) for text in _FULL_DISK_TEXT):
            where = ACTIVE_OUTS[-1] if ACTIVE_OUTS else None
            return io_error_message(OSError(errno.ENOSPC, "No space left on device", str(where) if where else None))
        e = e.__cause__ or e.__context__
    return None


def _interrupted() -> None:
    where = f"finished results in {ACTIVE_OUTS[-1]} are kept" if ACTIVE_OUTS else "finished results are kept"
    print(f"error: interrupted: {where}; run the same command again to resume", file=sys.stderr)
    sys.exit(130)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``headcount`` console script.

    Exit status: 0 done, 1 internal error (a bug), 2 bad input (one ``error:`` line), 130 interrupted.
    """
    _quiet_libraries()
    debug = bool(os.environ.get("HEADCOUNT_DEBUG"))
    args = list(sys.argv[1:] if argv is None else argv)
    ACTIVE_OUTS.clear()
    try:
        _check_empty_values(args)
        if argv is None:  # the console script: what it imported lives until it exits, and a command
            gc.freeze()   # freezes what it imports too (commands.analyse): the collector skips them
        code = _commands.app(args=args, standalone_mode=False)
        if argv is None:  # it ends next: the last collections would walk every object (~1 s with
            gc.freeze()   # transformers loaded, on 2 busy cores)
        if code == 130:  # typer turns KeyboardInterrupt into Exit(130) and returns its code
            _interrupted()
        if isinstance(code, int) and code:
            sys.exit(code)
    except HeadcountError as e:
        if debug:
            raise
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(2)
    except _click_exc.NoArgsIsHelpError:
        sys.exit(0)
    except _click_exc.UsageError as e:
        print(f"error: {e.format_message().splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        _interrupted()
    except typer.Exit as e:
        if e.exit_code == 130:
            _interrupted()
        sys.exit(e.exit_code)
    except Exception as e:  # a bug, not bad input: short message, traceback on request
        msg = _environment_message(e)  # unless it is a full disk or a read-only folder: the environment
        if debug:
            raise
        if msg is not None:
            print(f"error: {msg}", file=sys.stderr)
            sys.exit(2)
        if isinstance(e, BrokenPipeError):  # the reader went away (`headcount tasks | head -1`)
            raise
        print(f"error: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set HEADCOUNT_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)
    return 0
