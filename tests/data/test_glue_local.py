"""Local GLUE folders: the hub's layout and the original GLUE download's (file names, columns,
label spellings) give the same examples; a missing evaluation split is refused in one line, never
replaced by another split; a task name is never read as a folder that happens to share it.

Tiny data written here; nothing touches the network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import field_validator

from headcount.data.tasks import get_task, resolve_task_ref
from headcount.data.tasks.glue import HubSource
from headcount.experiments.runner import StudyConfig, load_study_config, register_study
from headcount.experiments.runner.config import task_ref
from headcount.runtime.errors import HeadcountError

from glue_helpers import FOLDERS, HUB, dataset, download_lines, splits_of, write_download


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HEADCOUNT_GLUE_DIR", raising=False)


def write_hub(d: Path, config: str, data: dict, offset: int = 0) -> Path:
    """``<split>.parquet|jsonl|csv|tsv`` in the columns of ``nyu-mll/glue`` (with ``idx``; ``-1`` = no label)."""
    d.mkdir(parents=True, exist_ok=True)
    fields, labels = HUB[config]
    formats = (".tsv", ".parquet", ".jsonl", ".csv")
    for k, (split, rows) in enumerate(data.items()):
        table = [{**dict(zip(fields, t)), "label": (-1 if labels else -1.0) if y is None else y, "idx": i}
                 for i, (t, y) in enumerate(rows)]
        path = d / f"{split}{formats[(k + offset) % len(formats)]}"
        if path.suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in table), encoding="utf-8")
        elif path.suffix == ".parquet":
            pd.DataFrame(table).to_parquet(path, index=False)
        elif path.suffix == ".tsv":  # plain tab-separated text: quotes are text, not CSV quoting
            path.write_text("".join("\t".join(map(str, r)) + "\n" for r in [list(table[0]), *[r.values() for r in table]]),
                            encoding="utf-8")
        else:
            pd.DataFrame(table).to_csv(path, index=False)
    return d


# --------------------------------------------------------------------------- both layouts, all nine tasks
@pytest.mark.parametrize("config", list(HUB))
def test_both_layouts_give_the_same_examples(tmp_path, config):
    data = dataset(config)
    hub = get_task(f"glue/{config}", data_dir=write_hub(tmp_path / "hub" / config, config, data,
                                                         offset=list(HUB).index(config)))
    download = get_task(f"glue/{config}", data_dir=write_download(tmp_path / "glue" / FOLDERS[config], config, data))
    fields, labels = HUB[config]
    assert hub.splits() == download.splits() == list(splits_of(config))
    assert hub.validation_split == download.validation_split == ("validation_matched" if config == "mnli" else "validation")
    assert download.text_fields == fields and download.labels == labels
    for split, rows in data.items():
        a, b = hub.load(split), download.load(split)
        assert a.texts == b.texts == [t for t, _ in rows]
        if split.startswith("test"):
            expected = [-1] * len(rows)
        else:
            expected = [y for _, y in rows]
        assert a.labels.dtype == b.labels.dtype == (np.int64 if labels else np.float32)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(b.labels, np.asarray(expected, dtype=b.labels.dtype))


def test_download_folder_names_under_the_environment_variable(tmp_path, monkeypatch):
    for config in ("sst2", "mnli"):
        write_download(tmp_path / "glue" / FOLDERS[config], config, dataset(config))
    monkeypatch.setenv("HEADCOUNT_GLUE_DIR", str(tmp_path / "glue"))
    sst2, mnli = get_task("glue/sst2"), get_task("glue/mnli-mm")
    assert sst2.load().texts == [t for t, _ in dataset("sst2")["validation"]]
    assert mnli.load().split == "validation_mismatched"
    assert len(mnli.load()) == len(dataset("mnli")["validation_mismatched"])
    (tmp_path / "glue" / "sst2").mkdir()  # the hub's folder name too: which one is meant?
    with pytest.raises(HeadcountError, match="keep one"):
        get_task("glue/sst2")
    with pytest.raises(HeadcountError, match="no GLUE rte folder .*rte/ or RTE/"):
        get_task("glue/rte")


def test_task_yaml_over_download_files(tmp_path):
    data = dataset("rte")
    d = write_download(tmp_path / "RTE", "rte", data)
    (tmp_path / "rte.yaml").write_text(f"glue: rte\nname: my-rte\nfiles: {{train: {d}/train.tsv, validation: RTE/dev.tsv}}\n")
    task = get_task(str(tmp_path / "rte.yaml"))
    assert task.load().labels.tolist() == [y for _, y in data["validation"]]
    assert task.load("train").texts == [t for t, _ in data["train"]]
    (tmp_path / "rte.yaml").write_text("glue: rte\nfiles: {train: RTE/train.tsv, dev: RTE/dev.tsv}\n")
    with pytest.raises(HeadcountError, match=r"no split 'dev' \(the GLUE download's dev.tsv is the validation split\)"):
        get_task(str(tmp_path / "rte.yaml"))


# --------------------------------------------------------------------------- missing or ambiguous splits
def run_cli(argv, capsys) -> tuple[int, list[str]]:
    from headcount.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_missing_validation_split_is_refused_not_replaced_by_train(tmp_path, monkeypatch, capsys):
    d = tmp_path / "glue" / "SST-2"
    write_download(d, "sst2", {"train": dataset("sst2")["train"]})
    with pytest.raises(HeadcountError) as e:
        get_task("glue/sst2", data_dir=d)
    message = str(e.value)
    assert "no validation split for glue/sst2" in message and "dev.tsv" in message and "found train.tsv" in message
    assert "\n" not in message
    monkeypatch.setenv("HEADCOUNT_GLUE_DIR", str(tmp_path / "glue"))
    code, err = run_cli(["data", "show", "glue/sst2"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: no validation split for glue/sst2"), err
    # the same through a task YAML that names only a train file: the default split is not train
    (tmp_path / "t.yaml").write_text(f"glue: sst2\nfiles: {{train: {d}/train.tsv}}\n")
    task = get_task(str(tmp_path / "t.yaml"))
    assert task.validation_split == "validation" and task.load("train").texts
    code, err = run_cli(["data", "show", str(tmp_path / "t.yaml")], capsys)
    assert code == 2 and len(err) == 1, err
    assert "no split 'validation' (the split it is evaluated on); splits: train" in err[0]


def test_mnli_without_matched_dev_set_is_refused(tmp_path):
    data = dataset("mnli")
    d = write_download(tmp_path / "MNLI", "mnli", {s: data[s] for s in ("train", "validation_mismatched")})
    with pytest.raises(HeadcountError, match="no validation_matched split for glue/mnli .*dev_matched.tsv.*glue/mnli-mm"):
        get_task("glue/mnli", data_dir=d)
    mm = get_task("glue/mnli-mm", data_dir=d)  # asked for by name, the mismatched set is fine
    assert mm.load().texts == [t for t, _ in data["validation_mismatched"]]
    # an unsplit dev set in an MNLI folder is neither matched nor mismatched: refused, not ignored
    write_download(tmp_path / "MNLI", "mnli", {"validation_matched": data["validation_matched"]})
    (d / "dev.tsv").write_text((d / "dev_matched.tsv").read_text())
    with pytest.raises(HeadcountError, match="matched and a mismatched dev set"):
        get_task("glue/mnli", data_dir=d)


def test_two_files_for_one_split_are_refused(tmp_path):
    data = dataset("qnli")
    d = write_download(tmp_path / "QNLI", "qnli", data)
    write_hub(d, "qnli", {"validation": data["validation"]}, offset=3)  # validation.csv beside dev.tsv
    with pytest.raises(HeadcountError, match=r"two files for the validation split .*validation.csv, dev.tsv"):
        get_task("glue/qnli", data_dir=d)


def test_bad_download_files_are_one_line_errors(tmp_path, capsys):
    data = dataset("rte")
    d = write_download(tmp_path / "RTE", "rte", data)
    lines = (d / "dev.tsv").read_text().splitlines()
    (d / "dev.tsv").write_text("\n".join([*lines[:3], lines[3] + "\textra", *lines[4:]]) + "\n")
    with pytest.raises(HeadcountError, match=r"dev.tsv, line 4: 5 fields, the header has 4"):
        get_task("glue/rte", data_dir=d).load()
    (d / "dev.tsv").write_text("\n".join(download_lines("rte", "test", data["validation"])) + "\n")
    with pytest.raises(HeadcountError, match="no label column 'label'.*only test splits"):
        get_task("glue/rte", data_dir=d).load()
    (d / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(HeadcountError, match="label 'maybe' is not one of: entailment, not_entailment"):
        get_task("glue/rte", data_dir=d).load()


# --------------------------------------------------------------------------- task names are not paths
def _config_dir(tmp_path: Path) -> Path:
    """A config folder as the README suggests it: a ``glue/`` data folder beside the configs."""
    d = tmp_path / "study"
    write_download(d / "glue" / "mnli", "mnli", dataset("mnli"))
    write_hub(d / "data", "sst2", dataset("sst2"))
    (d / "mine.yaml").write_text("glue: sst2\nfiles: {train: data/train.tsv, validation: data/validation.parquet}\n")
    return d


def test_registered_names_win_over_folders_of_the_same_name(tmp_path, monkeypatch):
    d = _config_dir(tmp_path)
    assert resolve_task_ref("glue/mnli", d) == "glue/mnli"
    assert resolve_task_ref("mine.yaml", d) == resolve_task_ref("./mine.yaml", d) == str((d / "mine.yaml").resolve())
    assert resolve_task_ref(str(d / "mine.yaml")) == str((d / "mine.yaml").resolve())
    with pytest.raises(HeadcountError, match="a folder"):
        resolve_task_ref("./glue/mnli", d)
    with pytest.raises(HeadcountError, match=r"unknown task 'glue/mnlii' \(did you mean 'glue/mnli'\?\)"):
        resolve_task_ref("glue/mnlii", d)
    with pytest.raises(HeadcountError, match="unknown task 'mine'"):  # a bare word is a name, not mine.yaml
        resolve_task_ref("mine", d)
    with pytest.raises(HeadcountError, match="task file not found"):
        resolve_task_ref("other.yaml", d)
    monkeypatch.chdir(d)  # the CLI and the API resolve from the working directory, by the same rule
    task = get_task("glue/mnli")
    assert task.name == "glue/mnli" and isinstance(task.source, HubSource)
    assert get_task("mine.yaml").load().texts == [t for t, _ in dataset("sst2")["validation"]]


class _RefConfig(StudyConfig):
    tasks: list[str]

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v, info):
        return [task_ref(t, info) for t in v]


def test_study_config_resolves_names_and_fails_at_validation(tmp_path):
    register_study("glue-ref-test", _RefConfig, lambda config: [], replace=True)
    d = _config_dir(tmp_path)
    (d / "ok.yaml").write_text("study: glue-ref-test\ntasks:\n  - glue/mnli\n  - mine.yaml\n")
    loaded = load_study_config(d / "ok.yaml")
    assert loaded.config.tasks == ["glue/mnli", str((d / "mine.yaml").resolve())]
    (d / "bad.yaml").write_text("study: glue-ref-test\ntasks:\n  - glue/mnli\n  - glue/nope\n")
    with pytest.raises(HeadcountError, match=r"bad.yaml, line 2: 'tasks': .*unknown task 'glue/nope'"):
        load_study_config(d / "bad.yaml")
    (d / "broken.yaml").write_text("files: {train: data/missing.csv}\ntext: sentence\n")
    (d / "bad2.yaml").write_text("study: glue-ref-test\ntasks: [broken.yaml]\n")
    with pytest.raises(HeadcountError, match="file not found"):  # the task is built while validating
        load_study_config(d / "bad2.yaml")


@pytest.mark.parametrize("config", ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"])
def test_glue_tasks_are_declared_in_the_users_task_yaml_format(config):
    """One task format: the shipped declaration of each GLUE task (package data) is a task YAML a
    user could write, and loading it as one gives the task ``get_task`` registers."""
    from dataclasses import fields

    from headcount.data.tasks import load_task_yaml
    from headcount.data.tasks.glue import SPECS

    path = SPECS / f"glue-{config}.yaml"
    mine, registered = load_task_yaml(path), get_task(f"glue/{config}")
    for f in fields(registered):
        if f.name == "source":
            assert (mine.source.path, mine.source.config, mine.source.splits()) == \
                (registered.source.path, registered.source.config, registered.source.splits())
        else:
            assert getattr(mine, f.name) == getattr(registered, f.name), f.name
