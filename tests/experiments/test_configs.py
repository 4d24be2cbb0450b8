"""Every shipped study config validates and expands; the demo composes both studies."""

from __future__ import annotations

from pathlib import Path

import pytest

from headcount.experiments.runner import load_study_config
from headcount.experiments.runner.registry import get_study_type

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_are_shipped_inside_the_package():
    from headcount.experiments import CONFIGS as SHIPPED

    assert (SHIPPED / "demo.yaml").is_file() and (SHIPPED / "demo-full.yaml").is_file()
    names = {p.name for p in CONFIGS}
    assert {"demo.yaml", "demo-full.yaml", "transfer-offline.yaml", "lottery-offline.yaml",
            "transfer-roberta-glue.yaml", "transfer-albert-glue.yaml", "lottery-bert-glue.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_and_expands(path):
    from headcount.data.tasks import is_fetched

    if "offline" in path.read_text() and not is_fetched():
        pytest.skip("offline data not fetched (make test fetches it)")
    loaded = load_study_config(path)
    config = getattr(loaded, "config", loaded)
    jobs = get_study_type(config.study).expand(config)
    assert len(jobs) > 5
    assert len({j.name for j in jobs}) == len(jobs)


def test_demo_prefixes_both_parts():
    from headcount.data.tasks import is_fetched

    if not is_fetched():
        pytest.skip("offline data not fetched (make test fetches it)")
    loaded = load_study_config(CONFIGS[0].parent / "demo.yaml")
    config = getattr(loaded, "config", loaded)
    jobs = get_study_type("demo").expand(config)
    prefixes = {j.name.split("/")[0] for j in jobs}
    assert prefixes == {"transfer", "lottery"}
