"""The demo's report: both parts' main tables come before any figure section."""

from __future__ import annotations

import headcount.experiments.studies.demo as demo
from headcount.experiments.report import Section


def test_both_parts_main_sections_come_first(monkeypatch):
    import importlib

    lottery_report = importlib.import_module("headcount.experiments.studies.lottery.report")  # the package's `report` is a function
    import headcount.experiments.studies.transfer.report as transfer_report
    import headcount.experiments.studies.transfer.summary as transfer_summary
    import headcount.experiments.studies.transfer.tables as transfer_tables

    monkeypatch.setattr(transfer_tables, "transfer_tables", lambda store, s, prefix: {})
    monkeypatch.setattr(transfer_summary, "transfer_summary", lambda tables, s: "t")
    monkeypatch.setattr(transfer_summary, "transfer_caveats", lambda tables: ["† c"])
    monkeypatch.setattr(transfer_report, "transfer_sections",
                        lambda store, s, prefix, tables: [Section(t) for t in ("t-main", "t-fig1", "t-fig2")])
    monkeypatch.setattr(transfer_report, "transfer_glance",
                        lambda tables, s: [{"quantity": "q", "task": "t", "this run": "1", "paper": ""}])
    monkeypatch.setattr(lottery_report, "lottery_glance", lambda store, s, prefix: [])
    monkeypatch.setattr(demo, "lottery_summary", lambda store, s, prefix: "l")
    monkeypatch.setattr(demo, "lottery_sections", lambda store, s, prefix: [Section(t) for t in ("l-main", "l-fig")])
    config = demo.DemoConfig.model_construct(study="demo", transfer=object(), lottery=object(), notice="n")
    content = demo.report(None, config)
    assert [x.title for x in content.sections] == ["t-main", "l-main", "t-fig1", "t-fig2", "l-fig"]
    assert content.summary == "t\n\nl" and content.notice == "n"
    assert content.caveats == ["† c"] and content.glance.data["quantity"].tolist() == ["transfer: q"]
    only_lottery = demo.DemoConfig.model_construct(study="demo", transfer=None, lottery=object(), notice="n")
    assert [x.title for x in demo.report(None, only_lottery).sections] == ["l-main", "l-fig"]


def test_demo_reports_open_with_the_illustration_notice():
    """Both demo profiles say plainly, first, that their numbers illustrate the pipeline only."""
    from importlib.resources import files

    from headcount.experiments.runner import load_study_config

    for name in ("demo.yaml", "demo-full.yaml"):
        loaded = load_study_config(files("headcount.experiments") / "configs" / name)
        assert loaded.config.notice == demo.NOTICE and "illustrate the pipeline only" in demo.NOTICE
