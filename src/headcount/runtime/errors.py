"""User-facing errors: the CLI prints ``error: <message>`` and exits with status 2."""


class HeadcountError(Exception):
    """Bad input or an impossible request; the message is one line meant for the user."""


def fail(message: str) -> None:
    """Raise a [`HeadcountError`][headcount.runtime.errors.HeadcountError] (a helper so call sites stay one line)."""
    raise HeadcountError(message)
