"""User text in figures is drawn as written (issue 29: a task named ``a$^{$b`` was read as
mathtext and `headcount score` ended in an internal error after the scores were computed)."""

from __future__ import annotations

import json

import pytest
from training_helpers import make_checkpoint, one_thread

from headcount.analysis import plots
from headcount.analysis.figtext import literal_texts, plain
from headcount.experiments.report.content import new_figure
from headcount.experiments.report.html import figure_png

MATH = "a$^{$b"  # two "$": mathtext that does not parse

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def test_plain_is_idempotent_and_shows_the_text():
    assert plain(MATH) == r"a\$^{\$b" and plain(plain(MATH)) == plain(MATH)
    assert plain("no dollars") == "no dollars"


def test_every_kind_of_text_is_literal():
    fig, ax = new_figure()
    ax.plot([1, 10, 100], [1, 2, 3], label=MATH)
    ax.set_title(MATH)
    ax.set_xlabel(MATH)
    ax.set_ylabel(MATH)
    ax.text(1, 2, MATH)
    ax.set_xticks([1, 10], [MATH, "$$"])
    ax.legend()
    fig.suptitle(MATH)
    fig.colorbar(ax.scatter([1, 2], [1, 2], c=[1, 2]), ax=ax, label=MATH)
    fig2, ax2 = new_figure()
    ax2.bar([0, 1], [1, 2])
    ax2.set_xticks([0, 1])
    ax2.set_xticklabels([MATH, "c"])
    for f in (fig, fig2):
        assert figure_png(f).startswith(b"\x89PNG")


def test_number_tick_labels_keep_their_mathtext():
    fig, ax = new_figure()
    ax.plot([1e-5, 1e5], [1e-5, 1e5])
    ax.set_yscale("log")
    literal_texts(fig)
    fig.canvas.draw()
    assert any("$" in t.get_text() and r"\$" not in t.get_text() for t in ax.get_yticklabels())


def test_plots_and_score_take_a_task_name_with_dollars(tmp_path, capsys):
    plots.head_heatmap({"heads": [[1.0, 2.0]], "mlps": [1.0]}, tmp_path / "h.png", title=MATH)
    plots.prune_curve([{"heads_kept": 2, "metric": 0.5, "accepted": True}], 0.4, tmp_path / "c.png", title=MATH)
    from headcount.cli.app import main

    ck = make_checkpoint(tmp_path / "ck", head="classification")
    (tmp_path / "x.csv").write_text("sentence,label\nthe film,negative\nthe plot,positive\n")
    (tmp_path / "t.yaml").write_text(f"name: {json.dumps(MATH)}\nfiles: {{train: x.csv, validation: x.csv}}\n"
                                     "text: sentence\nlabels: [negative, positive]\n")
    try:
        code = main(["score", "--model", str(ck), "--task", str(tmp_path / "t.yaml"), "--method", "magnitude",
                     "--out", str(tmp_path / "o")])
    except SystemExit as e:
        code = e.code
    assert not code, capsys.readouterr().err
    assert (tmp_path / "o" / "heads.png").is_file()
