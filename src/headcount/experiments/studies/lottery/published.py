"""Published numbers of Prasanna, Rogers & Rumshisky (2020), shown beside a run's own.

Dev-set means over 5 seeds, bert-base-uncased on GLUE (the paper's main table; metrics: CoLA
Matthews correlation, STS-B mean of Pearson and Spearman, MNLI matched accuracy, accuracy
otherwise), and the mean number of heads (of 144) the good subnetworks keep.
"""

from __future__ import annotations

import re

#: The paper's GLUE tasks, in its column order.
PAPER_TASKS: tuple[str, ...] = ("MNLI", "QNLI", "RTE", "MRPC", "QQP", "SST-2", "CoLA", "STS-B", "WNLI")

#: experiment -> dev mean per task of [`PAPER_TASKS`][headcount.experiments.studies.lottery.published.PAPER_TASKS].
PRASANNA_2020: dict[str, tuple[float, ...]] = {
    "full": (.84, .92, .63, .84, .91, .93, .56, .89, .34),
    "good pruned": (.76, .83, .57, .77, .83, .84, .51, .80, .54),
    "good retrained": (.80, .89, .58, .77, .89, .87, .50, .75, .54),
    "random retrained": (.79, .84, .56, .68, .88, .89, .42, .79, .54),
    "bad retrained": (.80, .77, .59, .68, .82, .86, .41, .61, .54),
    "magnitude good retrained": (.84, .91, .61, .84, .91, .92, .54, .88, .41),
    "magnitude random retrained": (.76, .81, .56, .70, .86, .83, .16, .24, .47),
    "magnitude bad retrained": (.62, .61, .49, .68, .78, .82, .02, .08, .49),
}

#: Heads (of 144) the good subnetwork keeps, mean over 5 seeds (the paper gives none for WNLI).
PAPER_HEADS_KEPT: dict[str, int] = {"MNLI": 95, "QNLI": 85, "QQP": 78, "SST-2": 67, "CoLA": 92, "MRPC": 89,
                                    "STS-B": 77, "RTE": 74}

_KEYS = {re.sub(r"[^a-z0-9]", "", t.lower()): t for t in PAPER_TASKS}


def paper_task(task: str) -> str | None:
    """The paper's column for a task name (``glue/sst2`` -> ``SST-2``), or None.

    >>> paper_task("glue/sst2"), paper_task("STS-B"), paper_task("offline/movies")
    ('SST-2', 'STS-B', None)
    """
    return _KEYS.get(re.sub(r"[^a-z0-9]", "", task.rsplit("/", 1)[-1].lower()))


#: Offline tasks the paper lacks -> its nearest task: binary sentiment polarity of short English
#: texts, as SST-2 (docs/lottery.md sets offline/amazon beside SST-2 the same way). Used only where
#: the cell says which task it is (the report's glance table).
NEAREST: dict[str, str] = {"offline/amazon": "SST-2", "offline/movies": "SST-2", "offline/tweets": "SST-2"}


def nearest_published(experiment: str, task: str) -> tuple[float | None, str | None]:
    """The paper's dev mean for the task, or for its nearest task ([`NEAREST`][headcount.experiments.studies.lottery.published.NEAREST]), and that task's name.

    >>> nearest_published("full", "offline/tweets"), nearest_published("full", "glue/rte"), nearest_published("full", "x")
    ((0.93, 'SST-2'), (0.63, 'RTE'), (None, None))
    """
    col = paper_task(task) or NEAREST.get(task)
    row = PRASANNA_2020.get(experiment)
    if col is None or row is None:
        return None, None
    return row[PAPER_TASKS.index(col)], col


def published(experiment: str, task: str) -> float | None:
    """The paper's dev mean for an experiment (a row of [`PRASANNA_2020`][headcount.experiments.studies.lottery.published.PRASANNA_2020]) and task, or None.

    >>> published("good retrained", "glue/mnli"), published("full", "offline/movies")
    (0.8, None)
    """
    col = paper_task(task)
    row = PRASANNA_2020.get(experiment)
    return None if col is None or row is None else row[PAPER_TASKS.index(col)]
