"""A toy study type for the runner tests (registered on import; never shipped in the library).

Jobs do arithmetic and write files, deterministically from their params:

    make-<v>  (one per value)  writes numbers.txt (``steps`` seeded random numbers), returns their total
    combine   (reads every make job)  factor * sum of totals; writes combined.json and plot.png
    square    (reads combine)  combine's result squared

Side effects that never change results, for the tests (environment variables):
    TOY_COUNT_DIR   append a line to <dir>/<label>.count on every execution
    TOY_SLEEP       seconds to sleep after each step of a make job
    TOY_SIGNAL_DIR  touch <dir>/<label>.midway halfway through a make job
    TOY_FAIL        a label whose job raises
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Literal

import pandas as pd

from headcount.experiments.report import ReportContent, Section, new_figure
from headcount.experiments.runner import ConfigSection, Job, StudyConfig, register_study

HERE = "toy_study"


class Plot(ConfigSection):
    kind: Literal["bar", "line"] = "bar"
    dpi: int = 40


class ToyConfig(StudyConfig):
    values: list[int]
    steps: int = 4
    seed: int = 0
    factor: float = 1.0
    plot: Plot = Plot()


def _side_effects(label: str) -> None:
    count_dir = os.environ.get("TOY_COUNT_DIR")
    if count_dir:
        with open(Path(count_dir) / f"{label}.count", "a") as f:
            f.write("run\n")
    if os.environ.get("TOY_FAIL") == label:
        raise RuntimeError(f"toy failure in {label}")


def make(params, inputs, workdir, progress):
    label = params["label"]
    _side_effects(label)
    rng = random.Random(params["seed"] * 1000 + params["value"])
    sleep = float(os.environ.get("TOY_SLEEP", "0"))
    numbers = []
    with open(workdir / "numbers.txt", "w") as f:
        for step in range(params["steps"]):
            x = params["value"] * 100 + rng.randint(0, 99)
            numbers.append(x)
            f.write(f"{x}\n")
            f.flush()
            progress(step + 1, params["steps"], "drawing")
            if step == params["steps"] // 2 and os.environ.get("TOY_SIGNAL_DIR"):
                (Path(os.environ["TOY_SIGNAL_DIR"]) / f"{label}.midway").touch()
            if sleep:
                time.sleep(sleep)
    (workdir / "sub").mkdir()
    (workdir / "sub" / "first.txt").write_text(str(numbers[0]))
    return {"value": params["value"], "total": sum(numbers), "n": len(numbers)}


def combine(params, inputs, workdir, progress):
    _side_effects(params["label"])
    totals = {name: r.result["total"] for name, r in sorted(inputs.items())}
    # read a file of each input too: inputs must be reachable with their files
    firsts = {name: int((r.dir / "sub" / "first.txt").read_text()) for name, r in sorted(inputs.items())}
    value = params["factor"] * sum(totals.values())
    (workdir / "combined.json").write_text(json.dumps({"totals": totals, "firsts": firsts}, sort_keys=True))
    fig, ax = new_figure(size=(3, 2))
    ax.bar(range(len(totals)), list(totals.values()))
    fig.savefig(workdir / "plot.png", dpi=params["dpi"], metadata={"Software": None})
    return {"value": value, "firsts": firsts}


def square(params, inputs, workdir, progress):
    _side_effects(params["label"])
    v = inputs["combined"].result["value"]
    return {"value": v * v}


def expand(config: ToyConfig) -> list[Job]:
    makes = [
        Job(f"make-{v}", "make", f"{HERE}:make",
            {"label": f"make-{v}", "value": v, "steps": config.steps, "seed": config.seed})
        for v in config.values
    ]
    comb = Job("combine", "combine", f"{HERE}:combine",
               {"label": "combine", "factor": config.factor, "dpi": config.plot.dpi}, deps=makes)
    sq = Job("square", "square", f"{HERE}:square", {"label": "square"}, deps={"combined": comb})
    return [sq, *makes]


def report(store, config: ToyConfig) -> ReportContent:
    rows = [{"job": r.name, "value": r.result["value"], "total": r.result["total"]} for r in store.results("make")]
    totals = pd.DataFrame(rows)
    steps = pd.DataFrame(
        [{"job": r.name, "step": i, "number": int(x)}
         for r in store.results("make") for i, x in enumerate(r.path("numbers.txt").read_text().split())]
    )
    fig, ax = new_figure(size=(3, 2))
    (ax.bar if config.plot.kind == "bar" else ax.plot)(totals["job"], totals["total"])
    return ReportContent(
        summary=f"square = {store.result('square').result['value']:g}",
        sections=[
            Section("Totals", "Totals of each `make` job.", figures={"totals": fig}, tables={"totals": totals}),
            Section("Steps", figures={"combined": store.result("combine").path("plot.png")},
                    tables={"steps": steps}),
        ],
    )


register_study("toy", ToyConfig, expand, report, description="arithmetic jobs for the runner tests")
