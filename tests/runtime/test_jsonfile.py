"""The one JSON reader (``headcount.runtime.jsonfile``): integers of more than 20 digits (``1e400``
written as 401 digits, 5,000 digits past Python's int-string limit) and nesting deeper than any
file headcount writes are refused in one line naming the file, by ``read_json`` and by every
command that reads a user's scores.json, budget.json or mask.json; what headcount itself writes
(NaN, Infinity, 64-bit integers) still reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_helpers import assert_one_error_line, run_cli
from conftest import save_tiny, tiny_model

from headcount.core.masks import Mask
from headcount.kv.budget import KVBudget
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import MAX_DEPTH, parse_json, read_json
from headcount.runtime.record import Record

SCORES = [[0.1, 0.8, 0.3, 0.2], [0.5, 0.0, 0.9, 0.05], [0.6, 0.65, 0.7, 0.1]]  # the tiny Llama: 3 x 4 heads
BIG = "1" + "0" * 400  # 1e400 written as digits: float() of it overflows
HUGE = "9" * 5000  # past Python's int-string conversion limit (4,300 digits)


def deep(n: int) -> str:
    return "[" * n + "]" * n


def scores_text(entry: str) -> str:
    """A scores.json of the tiny Llama whose head (0, 1) is ``entry`` (JSON text)."""
    rows = json.dumps(SCORES).replace("0.8", entry, 1)
    return '{"heads": %s, "method": "test"}' % rows


# --------------------------------------------------------------------------- the reader
@pytest.mark.parametrize("text, why", [
    (scores_text(BIG), "401 digits"), (scores_text("-" + BIG), "401 digits"), (scores_text(HUGE), "5000 digits"),
    (scores_text("1" * 21), "21 digits"), ('{"heads": %s}' % deep(5000), "nested"),
    ('{"heads": %s}' % deep(MAX_DEPTH), "nested"),
])
def test_huge_integers_and_deep_nesting_are_one_line_naming_the_file(tmp_path, text, why):
    path = tmp_path / "scores.json"
    path.write_text(text)
    with pytest.raises(HeadcountError) as e:
        read_json(path, "scores file")
    message = str(e.value)
    assert why in message and str(path) in message and "\n" not in message
    with pytest.raises(HeadcountError, match=why):
        parse_json(text, "a text")


def test_what_headcount_writes_still_reads(tmp_path):
    doc = {"heads": [[math.nan, math.inf, -math.inf, 0.5]], "seed": 2**32 - 1, "big": 2**64 - 1, "low": -2**63,
           "nested": [[[[[[[[1]]]]]]]], "float": 1e300, "digits": "1" * 64,
           "brackets": '[{"\\' * 300}  # digits and brackets in a string are text
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(doc, indent=2))  # what atomic_write_json writes: NaN / Infinity as Python spells them
    got = read_json(path, "scores file", kind=dict)
    assert math.isnan(got["heads"][0][0]) and got["heads"][0][1:3] == [math.inf, -math.inf]
    assert (got["seed"], got["big"], got["low"], got["float"]) == (2**32 - 1, 2**64 - 1, -2**63, 1e300)
    assert got["nested"] == doc["nested"] and got["digits"] == "1" * 64 and got["brackets"] == doc["brackets"]
    with pytest.raises(HeadcountError, match="nested"):  # spaced out, in an object: the same depth
        parse_json('{"a": ' + "[ {\"b\": " * 60 + "1" + "} ]" * 60 + "}")
    assert parse_json(deep(MAX_DEPTH - 1)) == json.loads(deep(MAX_DEPTH - 1))
    assert parse_json(json.dumps({"n": 2**64 - 1}).encode("utf-16")) == {"n": 2**64 - 1}  # bytes, as json.loads reads them
    with pytest.raises(HeadcountError, match="401 digits"):
        parse_json(scores_text(BIG).encode("utf-16"))


def test_a_deep_record_is_not_a_record(tmp_path):
    """A folder's record nested 5,000 deep is no record (as a corrupt one), not a RecursionError."""
    (tmp_path / ".headcount-out.json").write_text('{"headcount_record": %s}' % deep(5000))
    assert Record.read(tmp_path) is None


# --------------------------------------------------------------------------- the commands
@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny(tiny_model("llama", head="lm"), tmp_path_factory.mktemp("m") / "llama")


@pytest.mark.parametrize("text, why", [(scores_text(BIG), "401 digits"), (scores_text(HUGE), "5000 digits"),
                                       ('{"heads": %s}' % deep(5000), "nested")])
@pytest.mark.parametrize("named", [True, False])
def test_kv_budget_refuses_such_a_scores_file_in_one_line(capsys, llama, tmp_path, text, why, named):
    """With --model and without it (the model's name is then read from the scores file first: the
    same line, not "give --model")."""
    scores = tmp_path / "scores.json"
    scores.write_text(text)
    model = ["--model", llama] if named else []
    code, _, err = run_cli(capsys, "kv-budget", "--scores", scores, *model, "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert why in err and str(scores) in err, err


@pytest.mark.parametrize("entry", [BIG, HUGE, deep(5000)])
def test_shrink_refuses_such_a_mask_in_one_line(capsys, llama, tmp_path, entry):
    mask = tmp_path / "mask.json"
    mask.write_text('{"heads": [[1, 1, 1, %s], [1, 1, 1, 1], [1, 1, 1, 1]], "mlps": [1, 1, 1]}' % entry)
    code, _, err = run_cli(capsys, "shrink", "--model", llama, "--mask", mask, "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert str(mask) in err and not (tmp_path / "o").exists()
    with pytest.raises(HeadcountError):
        Mask.load(mask)


@pytest.mark.parametrize("entry, why", [(BIG, "401 digits"), (HUGE, "5000 digits"), (deep(5000), "nested")])
def test_a_budget_file_with_such_entries_is_one_line(capsys, llama, tmp_path, entry, why):
    code, _, err = run_cli(capsys, "kv-budget", "--model", llama, "--uniform", "--memory", 0.5, "--context", 64,
                           "--sink", 4, "--window", 8, "--out", tmp_path / "b")
    assert code == 0, err
    good = (tmp_path / "b" / "budget.json").read_text()
    assert KVBudget.load(tmp_path / "b" / "budget.json").n_heads == 4  # headcount's own file reads
    doc = json.loads(good)
    doc["sink"][0][0] = "@"
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(doc).replace('"@"', entry))
    with pytest.raises(HeadcountError, match=why) as e:
        KVBudget.load(path)
    assert str(path) in str(e.value)
    from headcount.kv.cache import apply_kv_budget

    with pytest.raises(HeadcountError, match=why):
        apply_kv_budget(tiny_model("llama", head="lm"), path)


@pytest.mark.parametrize("entry, why", [(BIG, "401 digits"), (deep(5000), "nested")])
def test_a_jsonl_task_file_with_such_a_row_is_one_line(tmp_path, entry, why):
    from headcount.data.tasks.tables import read_table

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "fine", "label": 1}\n{"text": "odd", "label": %s}\n' % entry)
    with pytest.raises(HeadcountError, match=f"train.jsonl, line 2 .*{why}"):
        read_table(path)


def test_a_jobs_edited_scores_file_is_one_line_and_its_own_still_reads(tmp_path):
    """``JobResult.load_json`` (how study jobs read their inputs' scores.json) uses the same reader."""
    from headcount.experiments.runner.jobs import JobResult

    job = JobResult("k", "score", "scores/retrieval/passkey/seed1", {}, {}, tmp_path)
    (tmp_path / "scores.json").write_text(json.dumps({"heads": [[math.nan, 0.5]], "n_examples": 3}))
    assert job.load_json("scores.json")["n_examples"] == 3
    (tmp_path / "scores.json").write_text(scores_text(BIG))
    with pytest.raises(HeadcountError, match="scores/retrieval/passkey/seed1.*401 digits"):
        job.load_json("scores.json")
    (tmp_path / "scores.json").write_text("{not json")
    with pytest.raises(HeadcountError, match="corrupt"):
        job.load_json("scores.json")
