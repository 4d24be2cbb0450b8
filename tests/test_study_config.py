"""Study configs: YAML validated by the study type's pydantic model; errors name key and line."""

from __future__ import annotations

import pytest
import toy_study  # noqa: F401  (registers the "toy" study type)

from headcount.errors import HeadcountError
from headcount.runner import load_study_config, parse_study_config
from headcount.runner.config import load_yaml_with_lines

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

    from headcount.runner import register_study

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
    from headcount.cli import main

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

    from headcount.runner import StudyConfig

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
    from headcount.runner.config import parse_study_config

    text = f"study: {study}\nmodel: ''\ntasks: [offline/movies]\n"
    with pytest.raises(HeadcountError, match=r"line 2: 'model'.*must not be empty"):
        parse_study_config(text, base_dir=tmp_path)
