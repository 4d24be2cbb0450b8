"""Every setting has one declaration: the command line reads its defaults from the
library, job parameters validate into the library's settings, and the defaults that used to be
restated (MLM head steps and texts, the ignored label, the masking probability, the resampling
statistics) appear once in the source.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from pathlib import Path

import pytest
import typer

from headcount.cli.app import app
from headcount.importance.pruning import PruneConfig
from headcount.importance.settings import (
    DataConfig,
    PruneSettings,
    ScoreSettings,
    default_of,
    settings_from,
)
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig
from headcount.train.magnitude_search import MagnitudeConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "headcount"

#: the library's settings classes a command-line option may stand for
SOURCES = (TrainConfig, MagnitudeConfig, PruneConfig, DataConfig, ScoreSettings, PruneSettings)

#: options named like a library setting whose default is the command's own, with the reason
OWN_DEFAULTS = {
    # `headcount patterns ...`: the pattern CNN's module imports scipy (2.7 s): its options leave
    # the library's defaults to it (None) except the seed; synthetic maps: a larger CLI sample
    ("patterns train", "seed"), ("patterns synthetic", "seed"), ("patterns synthetic", "size"),
}


def _commands(group: typer.Typer, prefix: str = ""):
    """``(name, callback)`` of every command, sub-typers included."""
    for cmd in group.registered_commands:
        yield (prefix + (cmd.name or cmd.callback.__name__)).strip(), cmd.callback
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance, prefix + sub.name + " ")


def _options(callback):
    import inspect

    for name, param in inspect.signature(callback).parameters.items():
        if isinstance(param.default, (typer.models.OptionInfo, typer.models.ArgumentInfo)):
            yield name, param.default


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(cls.model_fields)


COMMANDS = sorted(_commands(app), key=lambda c: c[0])


def test_the_cli_has_the_commands_this_test_walks():
    names = {n for n, _ in COMMANDS}
    assert {"score", "prune", "finetune", "magnitude", "patterns train"} <= names


@pytest.mark.parametrize("command, callback", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_cli_defaults_are_read_from_the_library(command, callback):
    """An option that stands for a library setting takes its default from there (and says so);
    an option named like one without saying where its default comes from is a restated default."""
    declared = {f for cls in SOURCES for f in _fields(cls)}
    for name, option in _options(callback):
        source = getattr(option, "headcount_setting", None)
        if source is not None:
            cls, field = source
            assert option.default == default_of(cls, field), (command, name)
            assert type(option.default) is type(default_of(cls, field))
        elif name in declared and option.default is not None and (command, name) not in OWN_DEFAULTS:
            pytest.fail(f"`headcount {command} --{name.replace('_', '-')}` restates a library default "
                        f"({option.default!r}): use commands.setting(...)")


def test_an_option_takes_whatever_its_class_declares():
    """The option's default *is* the class's: another class, another default; no copy is kept."""
    from headcount.cli.commands import setting

    @dataclasses.dataclass(frozen=True)
    class Toy:
        threshold: float = 0.5

    option = setting(Toy, "threshold", "--threshold")
    assert option.default == 0.5 and option.headcount_setting == (Toy, "threshold")
    assert setting(PruneConfig, "threshold").default == PruneConfig().threshold


def test_default_of_reads_dataclasses_pydantic_models_and_functions():
    from pydantic import BaseModel

    from headcount.train import finetune

    class Model(BaseModel):
        n: int = 3

    assert default_of(DataConfig, "max_examples") == DataConfig().max_examples
    assert default_of(Model, "n") == 3
    assert default_of(finetune, "mask_mode") == "prune"
    with pytest.raises(KeyError):
        default_of(DataConfig, "nonesuch")


def test_job_params_validate_into_the_settings():
    assert settings_from(ScoreSettings, {"task": "t", "method": "ablation"}) == ScoreSettings(method="ablation")
    assert settings_from(PruneSettings, {"normalize": None}).normalize == PruneSettings().normalize
    with pytest.raises(HeadcountError, match="cannot drive pruning"):
        settings_from(PruneSettings, {"method": "entropy"})
    with pytest.raises(HeadcountError, match="unknown normalisation"):
        ScoreSettings(normalize="sideways")
    with pytest.raises(HeadcountError, match="unknown objective"):
        ScoreSettings(objective="vibes")
    with pytest.raises(HeadcountError, match="cumulative"):
        ScoreSettings(method="gradient-token", accumulate="cumulative")


# --- literals that used to be restated: one line of source each ----------------------------------------
#: (literal, a regex one of the line's names matches, the one file that declares it)
ONCE = [
    ("300", r"steps", "data/mlm_head.py"),  # MLM head fitting steps
    ("2000", r"texts", "data/mlm_head.py"),  # MLM head fitting texts
    ("-100", None, "data/tasks/base.py"),  # the ignored label
    ("0.15", r"prob", "data/tasks/mlm.py"),  # masking probability
    ("9999", r"permutation", "analysis/helpers.py"),
    ("0.95", r"level", "analysis/helpers.py"),
    ("1000", r"boot", "analysis/helpers.py"),
    ("2e-5", r"lr", "train/config.py"),
    ("8192", None, "runtime/bounds.py"),  # the longest tokenised example
]


def literal_lines(literal: str, name_pattern: str | None) -> list[tuple[str, int]]:
    """``(file, line)`` of code lines holding the number ``literal`` (strings and comments left
    out) next to a name matching ``name_pattern`` (case-insensitive)."""
    negative, value = literal.startswith("-"), literal.lstrip("-")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
        by_line: dict[int, list[int]] = {}
        for i, t in enumerate(tokens):
            if t.type in (tokenize.NAME, tokenize.NUMBER, tokenize.OP):
                by_line.setdefault(t.start[0], []).append(i)
        for line, idx in by_line.items():
            names = [tokens[i].string for i in idx if tokens[i].type == tokenize.NAME]
            for i in idx:
                t = tokens[i]
                signed = tokens[i - 1].string == "-"
                if t.type == tokenize.NUMBER and t.string == value and signed == negative and (
                        name_pattern is None or any(re.search(name_pattern, n, re.I) for n in names)):
                    found.append((str(path.relative_to(SRC)), line))
    return sorted(set(found))


def test_literal_finder_sees_code_but_not_strings_or_comments():
    assert ("data/mlm_head.py", _line_of("data/mlm_head.py", "MLM_HEAD_STEPS = ")) in literal_lines("300", r"steps")
    assert all(f != "data/tasks/mlm.py" or "0.15 * n" not in _text(f, line) for f, line in literal_lines("0.15", None))


def _text(rel: str, line: int) -> str:
    return (SRC / rel).read_text(encoding="utf-8").splitlines()[line - 1]


def _line_of(rel: str, needle: str) -> int:
    return next(i for i, text in enumerate((SRC / rel).read_text(encoding="utf-8").splitlines(), 1) if needle in text)


@pytest.mark.parametrize("literal, names, home", ONCE, ids=[f"{lit}-{n}" for lit, n, _ in ONCE])
def test_each_default_has_one_source(literal, names, home):
    found = literal_lines(literal, names)
    assert [f for f, _ in found] == [home], f"{literal} ({names}) declared in {found}; once, in {home}"


# --- the sane range of every numeric option -------------
#: positional arguments a command needs before its options are read
_POSITIONAL = {"study": ["none.yaml"], "data show": ["offline/movies"]}
#: required options given paths that do not exist (the range check comes first)
_REQUIRED = {"--maps": "none.safetensors", "--labels": "none.csv", "--mask": "none.json"}


def _numeric_options():
    import inspect
    import typing

    out = []
    for command, callback in COMMANDS:
        hints = typing.get_type_hints(callback)
        params = inspect.signature(callback).parameters
        for name, option in _options(callback):
            args = typing.get_args(hints[name]) or (hints[name],)
            if int in args or float in args:
                flag = next((o for o in option.param_decls if o.startswith("--")), "--" + name.replace("_", "-"))
                needs = [f for f, p in (("--out", "out"), ("--maps", "maps"), ("--labels", "labels"), ("--mask", "mask"))
                         if p in params and params[p].default.default is ...]
                out.append((command, flag, float in args, "model" in params, needs))
    return out


NUMERIC = _numeric_options()


def test_the_numeric_options_are_all_found():
    found = {(c, f) for c, f, *_ in NUMERIC}
    assert {("finetune", "--epochs"), ("finetune", "--seed"), ("magnitude", "--rate"), ("prune", "--max-eval-examples"),
            ("score", "--tokens-per-batch"), ("export", "--tolerance"), ("patterns train", "--lr"),
            ("study", "--gpus-per-job"), ("data show", "--n")} <= found
    assert len(found) >= 40


@pytest.mark.parametrize("command, flag, is_float, has_model, needs", NUMERIC,
                         ids=[f"{c.replace(' ', '-')}{f}" for c, f, *_ in NUMERIC])
def test_every_numeric_option_is_bounded(command, flag, is_float, has_model, needs, tmp_path, capsys, monkeypatch):
    """inf, nan (a float) or +-10^12 (an int) for any numeric option: one error line that names the
    option, exit 2, before anything is written (the model given does not exist: a command that
    did not check the value first would name the model instead)."""
    from headcount.cli.app import main

    monkeypatch.chdir(tmp_path)
    base = [*command.split(), *_POSITIONAL.get(command, [])] + (["--model", "/nonexistent/model"] if has_model else [])
    for need in needs:
        base += [need, str(tmp_path / ("o" if need == "--out" else _REQUIRED[need]))]
    words = {flag, flag[2:].replace("-", " ")} | ({"learning rate"} if flag == "--lr" else set())
    for value in (["inf", "nan", "-inf"] if is_float else [str(10**12), str(-10**12)]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main([*base, flag, value])
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), (value, err)
        assert any(w in err[0] for w in words), (value, err[0])
        assert not (tmp_path / "o").exists()


def test_bounds_refuse_what_is_not_a_finite_number_in_range():
    from headcount.runtime.bounds import SEED, Bound
    from headcount.train.config import EPOCHS

    assert EPOCHS.contains(0.5) and EPOCHS.contains(1000) and not EPOCHS.contains(0) and not EPOCHS.contains(1000.5)
    for bad in (float("inf"), float("nan"), 1e308, True, "3", None):
        assert not EPOCHS.contains(bad), bad
    assert SEED.contains(2**32 - 1) and not SEED.contains(2**32) and not SEED.contains(-1) and not SEED.contains(1.0)
    assert not SEED.contains(True) and not SEED.contains(10**400)  # exact, however large
    assert Bound(0, 1, low_open=True, high_open=True).limits() == {"gt": 0, "lt": 1}
    with pytest.raises(HeadcountError, match=r"^--epochs must be in \(0, 1000\], got inf$"):
        EPOCHS.check(float("inf"), "--epochs")


def test_library_settings_share_the_bounds():
    """TrainConfig and MagnitudeConfig check every numeric field (the CLI and the study configs build them)."""
    numeric = {"int", "float", "int | None", "float | None"}
    for cls in (TrainConfig, MagnitudeConfig):
        fields = {f.name for f in dataclasses.fields(cls) if str(f.type) in numeric}
        assert fields - {"sparsity"} <= set(cls.BOUNDS), (cls.__name__, fields - set(cls.BOUNDS))
    for bad in (dict(epochs=float("inf")), dict(epochs=1e308), dict(lr=float("nan")), dict(lr=2.0), dict(batch_size=0),
                dict(max_length=10**6), dict(data_seed=-1), dict(data_seed=True), dict(max_steps=10**12),
                dict(warmup=float("inf")), dict(max_grad_norm=float("nan"))):
        with pytest.raises(HeadcountError, match="must be"):
            TrainConfig(**bad)
    for bad in (dict(rate=1.5), dict(rate=float("nan")), dict(threshold=float("inf")), dict(threshold=-0.1),
                dict(rounds=10**6), dict(rewind_step=-1)):
        with pytest.raises(HeadcountError, match="must be"):
            MagnitudeConfig(**bad)
    with pytest.raises(HeadcountError, match="--seed"):
        DataConfig(seed=2**40)
