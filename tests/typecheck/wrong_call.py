"""A call with a wrong type that the type check must catch (`make typecheck` expects mypy to fail
here: the check is not vacuous)."""

from __future__ import annotations

import headcount as hc

hc.score(hc.load_model("offline"), [], method=3)  # method is a str
