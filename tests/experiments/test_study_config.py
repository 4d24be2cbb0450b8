"""Study configs: YAML validated by the study type's pydantic model; errors name key and line."""

from __future__ import annotations

import pytest
import toy_study  # noqa: F401  (registers the "toy" study type)

from headcount.experiments.runner import load_study_config, parse_study_config
from headcount.experiments.runner.config import load_yaml_with_lines
from headcount.runtime.errors import HeadcountError

GOOD = """\
study: toy_study:toy
name: a toy
values: [1, 2]
steps: 3
plot:
  kind: line
  dpi: 30
"""


def error_of(text: str) -> str:
    with pytest.raises(HeadcountError) as e:
        parse_study_config(text, where="cfg.yaml")
    msg = str(e.value)
    assert "\n" not in msg  # one line, always
    return msg


def test_valid_config_is_frozen_and_typed(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(GOOD)
    loaded = load_study_config(path)
    assert loaded.config.values == [1, 2] and loaded.config.plot.kind == "line"
    assert loaded.study_type.name == "toy" and loaded.text == GOOD
    with pytest.raises(Exception):
        loaded.config.steps = 5  # frozen
    with pytest.raises(Exception):
        loaded.config.plot.dpi = 5


def test_hash_ignores_formatting_but_not_settings():
    a = parse_study_config(GOOD)
    b = parse_study_config("# a comment\n" + GOOD.replace("values: [1, 2]", "values:\n  - 1\n  - 2"))
    c = parse_study_config(GOOD.replace("steps: 3", "steps: 4"))
    assert a.hash == b.hash
    assert a.hash != c.hash


def test_unknown_top_level_key_names_key_and_line():
    msg = error_of(GOOD.replace("steps: 3", "stepz: 3"))
    assert msg.startswith("cfg.yaml, line 4:")
    assert "unknown key 'stepz'" in msg and "did you mean 'steps'" in msg


def test_unknown_nested_key_names_dotted_key_and_line():
    msg = error_of(GOOD + "  colour: red\n")
    assert msg.startswith("cfg.yaml, line 8:") and "'plot.colour'" in msg


def test_wrong_type_names_key_and_line():
    msg = error_of(GOOD.replace("steps: 3", "steps: many"))
    assert msg.startswith("cfg.yaml, line 4:") and "'steps'" in msg and "integer" in msg and "'many'" in msg


def test_wrong_type_in_a_list_item_has_the_item_line():
    msg = error_of(GOOD.replace("values: [1, 2]", "values:\n  - 1\n  - two\n  - 3"))
    assert msg.startswith("cfg.yaml, line 5:") and "'values[1]'" in msg


def test_wrong_literal_in_nested_section():
    msg = error_of(GOOD.replace("kind: line", "kind: pie"))
    assert msg.startswith("cfg.yaml, line 6:") and "'plot.kind'" in msg and "'bar'" in msg


def test_missing_key_is_named():
    msg = error_of("study: toy_study:toy\nsteps: 3\n")
    assert "missing key 'values'" in msg and "line" in msg


def test_duplicate_key_is_refused_with_both_lines():
    msg = error_of(GOOD + "steps: 5\n")
    assert msg == "cfg.yaml, line 8: key 'steps' appears twice (first on line 4)"


def test_yaml_syntax_error_has_line():
    msg = error_of("study: toy_study:toy\nvalues: [1, 2\nsteps: 3\n")
    assert msg.startswith("cfg.yaml, line ")


def test_unsafe_yaml_tags_are_refused():
    msg = error_of("study: toy_study:toy\nvalues: !!python/object/apply:os.getcwd []\n")
    assert "line 2" in msg


def test_unknown_study_type_suggests_the_closest():
    import toy_study as t

    from headcount.experiments.runner import register_study

    register_study("toy", t.ToyConfig, t.expand, t.report)
    msg = error_of("study: tyo\nvalues: [1]\n")
    assert msg.startswith("cfg.yaml, line 1: unknown study type 'tyo'") and "'toy'" in msg


def test_not_a_mapping_and_missing_study_key():
    assert "mapping" in error_of("- 1\n- 2\n")
    assert "missing key 'study'" in error_of("values: [1]\n")


def test_line_map_records_keys_and_items():
    _, lines = load_yaml_with_lines("a:\n  b: 1\n  c:\n    - x\n    - y\n")
    assert lines[("a", "b")] == 2 and lines[("a", "c", 1)] == 5


def test_cli_bad_config_exits_2_with_one_line(tmp_path, capsys):
    from headcount.cli.app import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(GOOD.replace("steps: 3", "steps: [3]"))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["study", str(cfg), "--out", str(out), "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bad.yaml, line 4: 'steps'")
    assert not out.exists()  # nothing written for a bad config


def test_a_study_types_own_seeds_validator_runs_beside_the_bases():
    """The base's seed check (negative seeds) and a study type's own validator named ``_seeds``
    both run: the base's has another name, so neither shadows the other."""
    from pydantic import ValidationError, field_validator

    from headcount.experiments.runner import StudyConfig

    class Cfg(StudyConfig):
        seeds: list[int] = [1]

        @field_validator("seeds")
        @classmethod
        def _seeds(cls, v):
            if len(set(v)) != len(v):
                raise ValueError("repeated seed")
            return v

    with pytest.raises(ValidationError, match="repeated seed"):
        Cfg(study="x", seeds=[1, 1])
    with pytest.raises(ValidationError, match=">= 0"):
        Cfg(study="x", seeds=[-1])
    assert Cfg(study="x", seeds=[2, 3]).seeds == [2, 3]


@pytest.mark.parametrize("study", ["transfer", "lottery"])
def test_an_empty_model_is_refused_not_read_as_the_configs_folder(study, tmp_path):
    from headcount.experiments.runner.config import parse_study_config

    text = f"study: {study}\nmodel: ''\ntasks: [offline/movies]\n"
    with pytest.raises(HeadcountError, match=r"line 2: 'model'.*must not be empty"):
        parse_study_config(text, base_dir=tmp_path)


# --- round 2: every value and path checked before the first job runs -----------------------------------------
#: "billion laughs": 9**9 values in a few hundred bytes
BOMB = "lol0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &{c} [{', '.join(['*' + p] * 9)}]\n" for i, p, c in zip(range(1, 9), "abcdefgh", "bcdefghi"))


def distinct_nodes(text: str) -> int:
    """The nodes of a YAML document as composed (an anchor and its aliases: one node)."""
    import yaml

    from headcount.runtime.yamlfile import _children

    seen, stack = set(), [yaml.compose(text)]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def count_expanded(monkeypatch) -> list:
    """The nodes the loader expands (lists the children of) from now on, and whether it builds values."""
    import yaml

    from headcount.runtime import yamlfile

    expanded, children, construct = [], yamlfile._children, yaml.SafeLoader.construct_document

    def counting(node):
        expanded.append(node)
        return children(node)

    def building(self, node):
        expanded.append("constructed")
        return construct(self, node)

    monkeypatch.setattr(yamlfile, "_children", counting)
    monkeypatch.setattr(yaml.SafeLoader, "construct_document", building)
    return expanded


def test_an_alias_bomb_is_refused_at_once(monkeypatch):
    """Refused after work that grows with the file (44 nodes here), not with what it expands to (9**9):
    each node is expanded at most twice (entered, left), and no value is built."""
    text = GOOD + BOMB
    expanded = count_expanded(monkeypatch)
    msg = error_of(text)
    assert "expands to more than 100,000 values" in msg and msg.startswith("cfg.yaml, line ")
    assert "constructed" not in expanded and 0 < len(expanded) <= 2 * distinct_nodes(text) < 100


def test_an_alias_inside_itself_is_refused():
    assert "refers to the value it is in" in error_of(GOOD + "loop: &x [1, *x]\n")


def test_aliases_that_stay_small_are_read():
    text = GOOD.replace("values: [1, 2]", "values: &v [1, 2]") + "# the same list again\n"
    assert parse_study_config(text).config.values == [1, 2]
    _, lines = load_yaml_with_lines("a: &x [1, 2]\nb: *x\nc: *x\n")
    assert lines[("c",)] == 3


def test_a_task_yaml_uses_the_same_loader(tmp_path, monkeypatch):
    from training_helpers import make_task

    from headcount.data.tasks import load_task_yaml

    path = make_task(tmp_path / "t", n_train=8, n_dev=4)
    text = path.read_text()
    path.write_text(text + "name: again\n")
    with pytest.raises(HeadcountError, match=r"task\.yaml, line \d+: key 'name' appears twice \(first on line 1\)"):
        load_task_yaml(path)
    path.write_text(text + BOMB)
    expanded = count_expanded(monkeypatch)
    with pytest.raises(HeadcountError, match="expands to more than"):
        load_task_yaml(path)
    assert "constructed" not in expanded and 0 < len(expanded) <= 2 * distinct_nodes(text + BOMB)
    path.write_text(text + "description: [1\n")
    with pytest.raises(HeadcountError, match="not valid YAML"):
        load_task_yaml(path)


@pytest.mark.parametrize("old, new, needle", [
    ("values: [1, 2]", "values: [true, 2]", "line 3: 'values[0]' must be a number, not true"),
    ("steps: 3", "steps: false", "line 4: 'steps' must be a number, not false"),
    ("steps: 3", "factor: .inf", "line 4: 'factor' must be a finite number (got inf)"),
    ("steps: 3", "factor: .nan", "'factor' must be a finite number (got nan)"),
    ("steps: 3", "seed: 4294967296", "line 4: 'seed' must be an integer in 0..4294967295, got 4294967296"),
    ("steps: 3", "seed: true", "'seed' must be a number, not true"),
])
def test_numbers_are_finite_numbers_and_seeds_fit_32_bits(old, new, needle):
    assert needle in error_of(GOOD.replace(old, new))
    assert parse_study_config(GOOD.replace("steps: 3", "seed: 4294967295")).config.seed == 2**32 - 1


@pytest.mark.parametrize("study", ["transfer", "lottery"])
def test_a_model_path_that_is_not_there_is_refused_and_hub_ids_pass(study, tmp_path):
    from headcount.data.tasks import is_fetched

    if not is_fetched():
        pytest.skip("offline data not fetched (make test fetches it)")
    seeds = "seeds: [1]\n" if study == "lottery" else ""
    text = f"study: {study}\nmodel: {{}}\ntasks: [offline/movies]\n{seeds}"
    for missing in ("/nonexistent", "./nowhere", "~/nowhere-headcount", "nowhere/deeper/still"):
        with pytest.raises(HeadcountError, match=r"line 2: 'model'.*not found"):
            parse_study_config(text.format(missing), base_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeadcountError, match="no config.json"):
        parse_study_config(text.format("./empty"), base_dir=tmp_path)
    for hub in ("roberta-base", "org/name", "offline"):  # no network: a hub id is not looked up here
        assert parse_study_config(text.format(hub), base_dir=tmp_path).config.model == hub


@pytest.mark.parametrize("study, old, new, needle", [
    ("transfer", "stats: {n_boot: 200, n_permutations: 999}", "stats: {n_boot: 1.0e+26}", "n_boot"),
    ("transfer", "stats: {n_boot: 200, n_permutations: 999}", "stats: {n_boot: 10000000}", "n_boot"),
    ("transfer", "random_draws: 1", "random_draws: 100000", "random_draws"),
    ("transfer", "head_corpus: offline/corpus", "head_corpus: ./none.txt", "file not found"),
    ("transfer", "epochs: 1,", "epochs: 2000,", "epochs must be in (0, 1000]"),
    ("lottery", "rounds: 1,", "rounds: 10000,", "rounds"),
    ("lottery", "max_examples: 64, batch_size: 64", "max_examples: 64, batch_size: 1000000", "batch_size"),
    ("lottery", "patterns: {max_examples: 32, batch_size: 16, size: 32}",
     "patterns: {max_examples: 32, batch_size: 16, size: 100000}", "size"),
    ("lottery", "patterns: {max_examples: 32, batch_size: 16, size: 32}",
     "patterns: {cnn: {maps: none.safetensors, labels: none.csv}}", "file not found"),
    ("lottery", "super_survivors: {retrain: false}", "super_survivors: {retrain: false, draw_seed: 4294967296}", "draw_seed"),
])
def test_study_values_are_bounded(study, old, new, needle):
    from headcount.experiments import CONFIGS
    from headcount.data.tasks import is_fetched

    if not is_fetched():
        pytest.skip("offline data not fetched (make test fetches it)")
    text = (CONFIGS / "demo.yaml").read_text()
    assert old in text
    with pytest.raises(HeadcountError) as e:
        parse_study_config(text.replace(old, new), "demo.yaml", base_dir=CONFIGS)
    assert needle in str(e.value) and f"'{study}." in str(e.value)


# --- round 4: a study module beside its config ------------------------------------------------------------
STUDY_MODULE = '''
from headcount.experiments.runner import Job, StudyConfig, register_study


class BesideConfig(StudyConfig):
    n: int = 2


def make(params, inputs, workdir, progress):
    (workdir / "made.txt").write_text(str(params["i"]))
    return {"i": params["i"]}


register_study("beside", BesideConfig,
               lambda c: [Job(f"make-{i}", "beside", __name__ + ":make", {"i": i}) for i in range(c.n)])
'''


def test_a_study_module_beside_its_config_is_found_without_pythonpath(tmp_path, monkeypatch, capsys):
    """Issue 43: ``study: mystudy:name`` with mystudy.py beside the config needed PYTHONPATH. The
    config's folder goes on the import path (last: it never shadows an installed package), and so
    into the sys.path the Ray executor sends its nodes."""
    import importlib.util
    import sys

    from cli_helpers import run_cli

    from headcount.experiments.runner import RayExecutor, RunStore, registry

    module = "hc_study_beside_its_config"
    folder = tmp_path / "my study"
    folder.mkdir()
    (folder / f"{module}.py").write_text(STUDY_MODULE)
    config = folder / "study.yaml"
    config.write_text(f"study: {module}:beside\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    try:
        assert importlib.util.find_spec(module) is None  # not importable as things are
        loaded = load_study_config(config)
        assert loaded.study_type.name == "beside" and loaded.config.n == 2
        assert sys.path[-1] == str(folder.resolve()) and sys.path.count(sys.path[-1]) == 1
        assert str(folder.resolve()) in RayExecutor._sys_path()  # what the nodes receive
        code, out, err = run_cli(capsys, "study", config, "--out", tmp_path / "run", "--no-report", "-q")
        assert code == 0, err
        assert RunStore(tmp_path / "run").result("make-1").result == {"i": 1}
        assert sys.path.count(str(folder.resolve())) == 1  # loaded twice, added once
        # a module that is not beside the config is still refused with one line
        (tmp_path / "other.yaml").write_text("study: hc_study_nowhere:nowhere\n")
        with pytest.raises(HeadcountError, match=r"other.yaml, line 1: cannot import study module 'hc_study_nowhere'"):
            load_study_config(tmp_path / "other.yaml")
    finally:
        sys.modules.pop(module, None)
