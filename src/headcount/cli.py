"""Command line: a thin typer app over the API (one module per area under ``commands/``).

Bad input ends in one ``error: ...`` line and exit status 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

import typer

from .commands import app
from .commands import core  # noqa: F401  (registers info, shrink)
from .commands import train  # noqa: F401  (finetune, magnitude)
from .commands import data  # noqa: F401  (registers tasks, data fetch)
from .commands import study  # noqa: F401  (registers study, report)
from .commands import patterns  # noqa: F401  (patterns train, patterns synthetic)
from .commands import analyse  # noqa: F401  (score, prune)
from .commands import demo  # noqa: F401  (demo)
from .errors import HeadcountError

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as _click_exc


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``headcount`` console script."""
    _quiet_libraries()
    debug = bool(os.environ.get("HEADCOUNT_DEBUG"))
    try:
        app(args=argv, standalone_mode=False)
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
        print("error: interrupted (run the same command again to resume where supported)", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # a bug, not bad input: short message, traceback on request
        if debug:
            raise
        print(f"error: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              "(set HEADCOUNT_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)
    return 0
