"""Each scorer's options declared once (``headcount.importance.scorer_options``): registered with the
scorer, handed to it typed, and read by ``ScoreSettings``, ``headcount score``'s flags and the
retrieval study's config."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from pydantic import ValidationError

from headcount.data.tasks.niah import NiahSpec
from headcount.experiments.studies.retrieval.config import (
    AblationSettings,
    BudgetSettings,
    NiahParams,
    NiahSettings,
    ScoringSettings,
)
from headcount.importance.scorer_options import (
    MAX_NEW_TOKENS_RANGE,
    LongRangeOptions,
    RetrievalOptions,
    ScorerOptions,
    option,
)
from headcount.importance.scorers import Scorer, register_scorer, unregister_scorer
from headcount.importance.scores import Scores
from headcount.importance.scoring import get_scorer, score
from headcount.importance.settings import ScoreSettings
from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError


def test_the_scorers_register_their_options_classes():
    assert get_scorer("retrieval").options is RetrievalOptions
    assert get_scorer("long-range").options is LongRangeOptions
    assert get_scorer("gradient").options is ScorerOptions and not dataclasses.fields(ScorerOptions)


def test_a_scorer_is_handed_its_options_object():
    @dataclasses.dataclass(frozen=True)
    class ToyOptions(ScorerOptions):
        k: int = option(3, Bound(1, 9, integer=True), "how many")

    seen = []

    def toy(model, batches, ctx):
        seen.append(ctx.options)
        return Scores(heads=torch.zeros(1, 1), mlps=torch.zeros(1), method="toy")

    register_scorer(Scorer("toy-options", toy, needs_data=False, options=ToyOptions))
    try:
        model = torch.nn.Linear(1, 1)
        score(model, method="toy-options", device="cpu")
        score(model, method="toy-options", device="cpu", options={"k": 5})
        score(model, method="toy-options", device="cpu", options=ToyOptions(k=7))
        assert seen == [ToyOptions(), ToyOptions(k=5), ToyOptions(k=7)]
        with pytest.raises(HeadcountError, match=r"^--k must be an integer in 1\.\.9, got 10$"):
            score(model, method="toy-options", device="cpu", options={"k": 10})
        with pytest.raises(HeadcountError, match=r"^--sink is an option of --method long-range, not toy-options$"):
            score(model, method="toy-options", device="cpu", options={"sink": 2})
        with pytest.raises(HeadcountError, match="RetrievalOptions are not the options of --method toy-options"):
            score(model, method="toy-options", device="cpu", options=RetrievalOptions())
    finally:
        unregister_scorer("toy-options")


def test_score_settings_hold_the_chosen_scorers_options():
    assert ScoreSettings().options == ScorerOptions()
    assert ScoreSettings(method="long-range", options={"window": 8}).options == LongRangeOptions(window=8)
    assert dataclasses.asdict(ScoreSettings(method="retrieval"))["options"] == dataclasses.asdict(RetrievalOptions())
    with pytest.raises(HeadcountError, match=r"^--max-new-tokens is an option of --method retrieval, not long-range$"):
        ScoreSettings(method="long-range", options={"max_new_tokens": 8})
    with pytest.raises(HeadcountError, match=r"^--nonesuch is no scorer's option, not gradient$"):
        ScoreSettings(options={"nonesuch": 1})
    with pytest.raises(HeadcountError, match="--copies must be one of reference, once, not 'twice'"):
        ScoreSettings(method="retrieval", options={"copies": "twice"})


def test_the_score_flags_read_the_declaration():
    from headcount.cli.commands.options import SCORER_OPTIONS

    for cls, method in ((RetrievalOptions, "retrieval"), (LongRangeOptions, "long-range")):
        for f in dataclasses.fields(cls):
            _, flag = SCORER_OPTIONS.options[f.name]
            assert flag.default == f.default and flag.headcount_setting == (cls, f.name)
            assert flag.help == f"{method}: {f.metadata['help']}"
    assert SCORER_OPTIONS.build(max_new_tokens=50, success="exact", stop="newline", rouge="porter", copies="reference",
                                sink=4, window=8, kv_reduce="max") == {"success": "exact", "window": 8}


def test_a_scorer_option_for_another_method_is_one_error_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "score", "--model", "/nonexistent/model", "--method", "gradient", "--sink", 8,
                           "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert "--sink is an option of --method long-range, not gradient" in err and not (tmp_path / "o").exists()
    code, _, err = run_cli(capsys, "score", "--model", "/nonexistent/model", "--method", "gradient", "--sink", 4,
                           "--out", tmp_path / "o")
    assert code != 0 and "--sink" not in err  # the default, as if left out: the model is what fails


def test_the_retrieval_study_reads_the_options_and_the_niah_declarations():
    sc = ScoringSettings()
    assert sc.options("retrieval") == dataclasses.asdict(RetrievalOptions())
    assert sc.options("long-range") == dataclasses.asdict(LongRangeOptions())
    with pytest.raises(ValidationError, match="--window must be"):
        ScoringSettings(window=0)
    for section in (AblationSettings, BudgetSettings):  # one range for every greedy decoding length
        assert section(max_new_tokens=int(MAX_NEW_TOKENS_RANGE.high)).max_new_tokens == MAX_NEW_TOKENS_RANGE.high
        with pytest.raises(ValidationError):
            section(max_new_tokens=int(MAX_NEW_TOKENS_RANGE.high) + 1)
    spec = {f.name: f.default for f in dataclasses.fields(NiahSpec)}
    assert list(NiahParams.model_fields) == [*spec, "split"]
    assert all(NiahParams.model_fields[n].is_required() for n in spec)
    niah = NiahSettings()
    assert list(NiahSettings.model_fields) == ["needle", "lengths", "depths", "examples", "digits", "haystack", "split"]
    assert all(getattr(niah, n) == spec[n] for n in ("needle", "lengths", "depths", "digits", "haystack"))
    assert niah.examples == 20  # the study's own default
    assert list(niah.spec(1, "book")) == list(spec)


def test_a_runs_identity_keeps_the_flat_form_of_earlier_versions():
    """`headcount score` / `prune` outputs made before the options moved to their scorers keep their
    identity: the generic fields and every option, flat, the others' at their defaults."""
    from headcount.importance.settings import PruneSettings, ScoreSettings

    before = {"objective": "task", "method": "long-range", "normalize": "none", "accumulate": "per-batch",
              "batch_order": "auto", "unit": "heads", "max_new_tokens": 50, "success": "rouge1",
              "copies": "reference", "stop": "newline", "rouge": "porter", "sink": 2, "window": 64,
              "kv_reduce": "max"}
    got = ScoreSettings(method="long-range", options={"sink": 2}).identity()
    assert set(got) == set(before) and got["sink"] == 2 and got["max_new_tokens"] == 50
    assert "options" not in ScoreSettings().identity()
    assert {"importance_split", "stop_split"} <= set(PruneSettings().identity())
