"""The distributed launcher's environment: which rank this process is (torchrun, accelerate launch).

``torchrun`` and ``accelerate launch`` start one process per GPU (or CPU worker) and set ``RANK``
and ``WORLD_SIZE``; the Trainer then trains one model across them (DDP). Only ``headcount
finetune`` runs across ranks (rank 0 guards and writes ``--out``); every other command runs in
one process and refuses a launcher at once, before touching its output. No torch import here:
[`headcount.runtime.io`][headcount.runtime.io] asks too.
"""

from __future__ import annotations

import os

from headcount.runtime.errors import HeadcountError


def launch_rank() -> tuple[int, int]:
    """``(rank, world size)`` of this process under a distributed launcher, ``(0, 1)`` otherwise.

    >>> launch_rank() if "WORLD_SIZE" not in os.environ else (0, 1)
    (0, 1)
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise HeadcountError(f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
                             "are not integers (set by torchrun / accelerate launch)") from None
    return (rank, world) if world > 1 else (0, 1)


def refuse_launcher(what: str) -> None:
    """Refuse to run ``what`` (``"headcount score"``) as one of several ranks of a launcher.

    Raises:
        HeadcountError: ``WORLD_SIZE`` > 1 (every rank would run the whole command on one output).
    """
    rank, world = launch_rank()
    if world > 1:
        raise HeadcountError(f"`{what}` runs in one process, not as rank {rank} of {world} under torchrun / "
                             "accelerate launch (only `headcount finetune` trains across ranks); run it directly")
