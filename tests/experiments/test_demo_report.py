"""The demo's report: both parts' main tables come before any figure section."""

from __future__ import annotations

import headcount.experiments.studies.demo as demo
from headcount.experiments.report import Section


def test_both_parts_main_sections_come_first(monkeypatch):
    monkeypatch.setattr(demo, "transfer_tables", lambda store, s, prefix: {})
    monkeypatch.setattr(demo, "transfer_summary", lambda tables, s: "t")
    monkeypatch.setattr(demo, "transfer_sections",
                        lambda store, s, prefix, tables: [Section(t) for t in ("t-main", "t-fig1", "t-fig2")])
    monkeypatch.setattr(demo, "lottery_summary", lambda store, s, prefix: "l")
    monkeypatch.setattr(demo, "lottery_sections", lambda store, s, prefix: [Section(t) for t in ("l-main", "l-fig")])
    config = demo.DemoConfig.model_construct(study="demo", transfer=object(), lottery=object(), notice="n")
    content = demo.report(None, config)
    assert [x.title for x in content.sections] == ["t-main", "l-main", "t-fig1", "t-fig2", "l-fig"]
    assert content.summary == "t\n\nl" and content.notice == "n"
    only_lottery = demo.DemoConfig.model_construct(study="demo", transfer=None, lottery=object(), notice="n")
    assert [x.title for x in demo.report(None, only_lottery).sections] == ["l-main", "l-fig"]


def test_demo_reports_open_with_the_illustration_notice():
    """Both demo profiles say plainly, first, that their numbers illustrate the pipeline only."""
    from importlib.resources import files

    from headcount.experiments.runner import load_study_config

    for name in ("demo.yaml", "demo-full.yaml"):
        loaded = load_study_config(files("headcount.experiments") / "configs" / name)
        assert loaded.config.notice == demo.NOTICE and "illustrate the pipeline only" in demo.NOTICE
