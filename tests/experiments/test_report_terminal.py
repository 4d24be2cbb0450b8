"""The report's main tables in the terminal: the same cells as report.html, at most 100 columns."""

from __future__ import annotations

import io
import json
import re

import pandas as pd
import pytest
import toy_study  # noqa: F401  (registers the toy study type: its make job is reused below)

from headcount.experiments.report import ReportContent, ReportTable, Section, new_figure
from headcount.experiments.report.format import seed_cell
from headcount.experiments.report.terminal import (
    SUMMARY_FILE,
    column_groups,
    print_tables,
    summary_record,
)
from headcount.experiments.runner import Job, StudyConfig, register_study

STATS = ["Spearman", "Kendall", "top-10% Jaccard (chance 0.05)", "top-25% Jaccard (chance 0.14)",
         "top-50% Jaccard (chance 0.33)", "layer-mass L1", "Spearman, layer-normalised",
         "Spearman p within-layer (max)", "Spearman p global (max)"]


def wide_main() -> pd.DataFrame:
    """A main table as wide as the transfer study's coherence table, with missing cells."""
    rows = []
    for i, comparison in enumerate(["MLM vs task (fine-tuned)", "Task vs task", "Seed vs seed (same task)"]):
        row = {"comparison": comparison, "task": f"offline/task-{i}", "pairs": i + 1}
        for j, s in enumerate(STATS):
            row[s] = None if (i + j) % 4 == 0 else seed_cell(0.1 * j + 0.01 * i, 0.02, 0.05, 0.4, n=2, n_total=2)
        rows.append(row)
    return pd.DataFrame(rows)


def content() -> ReportContent:
    fig, ax = new_figure(size=(2, 2))
    ax.plot([0, 1])
    return ReportContent("T", "summary", [
        Section("Main results", tables=[ReportTable("main_wide", wide_main(), caption="Do they agree? Details."),
                                        ReportTable("main_small", pd.DataFrame({"task": ["a"], "score": [0.5]}))]),
        Section("Raw", figures={"f": fig}, tables=[ReportTable("raw", pd.DataFrame({"x": [1.0]}), collapsed=True)]),
        Section("Folded only", tables=[ReportTable("raw2", pd.DataFrame({"x": [2.0]}), collapsed=True)]),
    ])


def printed(record, width=100) -> str:
    from rich.console import Console

    buf = io.StringIO()
    print_tables(record, Console(file=buf, width=width, highlight=False))
    return buf.getvalue()


def test_the_main_tables_are_those_of_sections_with_shown_tables_only():
    c = content()
    assert [t.name for _, t in c.main_tables()] == ["main_wide", "main_small"]
    c.sections[0].main = False
    c.sections[1].main = True  # marked: its shown tables (none here) count, the folded do not
    assert c.main_tables() == []


def test_a_wide_table_prints_in_column_groups_within_100_columns_with_blank_missing_cells():
    record = summary_record(content())
    df = wide_main()
    out = printed(record)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "None" not in out and "nan" not in out
    for cell in df[STATS].stack().dropna():  # every number, whole (not wrapped)
        assert cell in out, cell
    headers = [line for line in lines if line.startswith("comparison")]
    assert len(headers) == len(column_groups(list(df.columns), record["tables"][0]["rows"])) >= 3
    assert all("task" in h for h in headers)  # the label columns start every group
    assert "Do they agree?" in out and "Details" not in out  # the caption's first sentence
    assert printed(record, width=60).count("comparison") > len(headers)  # narrower: more groups


def test_summary_record_cells_are_the_html_cells():
    from headcount.experiments.report.html import _table_html

    record = summary_record(content())
    table = record["tables"][0]
    assert table["rows"][0][3] == "" and table["rows"][1][3] == wide_main().iloc[1, 3]
    page = _table_html(content().sections[0].tables[0]).replace("\u00a0", " ")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page)
    assert cells == [c for r in table["rows"] for c in r]


# --- the CLI: `headcount study` and `headcount report` print them ---------------------------------
class MainConfig(StudyConfig):
    value: int = 3


def _expand(config):
    return [Job("one", "toy", "toy_study:make", {"label": "one", "value": config.value, "steps": 2, "seed": 0})]


def _report(store, config):
    total = store.result("one").result["total"]
    df = pd.DataFrame({"task": ["toy/a", "toy/b"], "total": [seed_cell(total, 1.5), None], "paper": ["0.81", ""]})
    return ReportContent(sections=[Section("The paper's main table", tables={"main": df})])


register_study("terminal-main", MainConfig, _expand, _report, replace=True)


def test_study_and_report_commands_print_the_main_table(tmp_path, capsys):
    from headcount.cli.app import main

    (tmp_path / "s.yaml").write_text("study: terminal-main\nvalue: 3\n")
    run = tmp_path / "run"
    assert main(["study", str(tmp_path / "s.yaml"), "--out", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    saved = json.loads((run / "results" / SUMMARY_FILE).read_text())
    row = saved["tables"][0]["rows"][0]
    assert row[0] == "toy/a" and re.fullmatch(r"\d+\.\d\d ± 1\.50", row[1]) and saved["tables"][0]["rows"][1][1] == ""
    assert "The paper's main table" in out and row[1] in out and "0.81" in out and "None" not in out
    assert out.index("The paper's main table") < out.index("report:")
    assert max(len(line) for line in out.splitlines()) <= 100

    assert main(["report", str(run)]) == 0
    assert row[1] in capsys.readouterr().out


def test_no_summary_file_prints_nothing(tmp_path):
    from headcount.experiments.report import print_summary

    assert print_summary(tmp_path) is False


@pytest.mark.parametrize("columns", [["task", "score"], ["only"]])
def test_narrow_tables_are_one_group(columns):
    rows = [["a"] * len(columns)]
    assert column_groups(columns, rows) == [list(range(len(columns)))]


def test_a_notice_comes_first_in_the_terminal_and_the_html(tmp_path):
    """A report's notice (the demo's "illustrate the pipeline only") is printed before the tables."""
    from rich.console import Console

    from headcount.experiments.report import print_summary
    from headcount.experiments.report.html import render_html

    c = content()
    c.notice = "**These numbers illustrate the pipeline only.** Cite nothing."
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / SUMMARY_FILE).write_text(json.dumps(summary_record(c)))
    buf = io.StringIO()
    assert print_summary(tmp_path, Console(file=buf, width=100, highlight=False)) is True
    out = buf.getvalue()
    assert "These numbers illustrate the pipeline only. Cite nothing." in out and "**" not in out
    assert out.index("illustrate the pipeline only") < out.index("Main results")
    small = ReportContent("T", "summary", [Section("Main", tables={"m": pd.DataFrame({"x": [1]})})], notice=c.notice)
    page = render_html(small, {}, subtitle="s", config_text="", jobs_table=ReportTable("jobs", pd.DataFrame({"job": ["a"]})),
                       versions_table=ReportTable("versions", pd.DataFrame({"package": ["p"]})))
    assert '<div class="notice">' in page and page.index("illustrate the pipeline") < page.index('<div class="summary">')
    assert "<strong>These numbers illustrate the pipeline only.</strong> Cite nothing." in page and "**" not in page
