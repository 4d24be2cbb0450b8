"""Tasks and data: GLUE (local files in the GLUE schema, and the hub path with a stand-in),
task YAML files in every format, metrics against scikit-learn / scipy, bad input on the CLI.

Nothing here touches the network or needs the offline data (see test_tasks_offline.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headcount.data.tasks import compute_metrics, get_task, list_tasks
from headcount.runtime.errors import HeadcountError


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HEADCOUNT_GLUE_DIR", raising=False)


# --------------------------------------------------------------------------- writing files
def write(path: Path, rows: list[dict]) -> Path:
    """Write rows as .csv / .tsv / .jsonl / .parquet, by the suffix of ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix == ".tsv":  # plain tab-separated text: quotes are text, not CSV quoting
        path.write_text("".join("\t".join(map(str, r)) + "\n" for r in [list(df.columns), *df.values.tolist()]),
                        encoding="utf-8")
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        df.to_parquet(path, index=False)
    return path


# --------------------------------------------------------------------------- GLUE
#: what the GLUE tasks must be (written out here, independently of headcount's table)
GLUE_EXPECTED = {
    "cola": (("sentence",), ("unacceptable", "acceptable"), "mcc"),
    "sst2": (("sentence",), ("negative", "positive"), "accuracy"),
    "mrpc": (("sentence1", "sentence2"), ("not_equivalent", "equivalent"), "f1"),
    "qqp": (("question1", "question2"), ("not_duplicate", "duplicate"), "f1"),
    "stsb": (("sentence1", "sentence2"), None, "pearson_spearman"),
    "mnli": (("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), "accuracy"),
    "qnli": (("question", "sentence"), ("entailment", "not_entailment"), "accuracy"),
    "rte": (("sentence1", "sentence2"), ("entailment", "not_entailment"), "accuracy"),
    "wnli": (("sentence1", "sentence2"), ("not_entailment", "entailment"), "accuracy"),
}
FORMATS = (".parquet", ".jsonl", ".csv", ".tsv")


def glue_rows(config: str, n: int, seed: int, test: bool = False) -> list[dict]:
    fields, labels, _ = GLUE_EXPECTED[config]
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        row = {f: f"{config} {f} number {i}, with a comma and \"quotes\"" for f in fields}
        if test:
            row["label"] = -1 if labels else -1.0
        else:
            row["label"] = int(rng.integers(len(labels))) if labels else round(float(rng.uniform(0, 5)), 3)
        row["idx"] = i
        rows.append(row)
    return rows


def glue_dir(tmp_path: Path, config: str, fmt_offset: int = 0) -> tuple[Path, dict]:
    splits = (("train", "validation_matched", "validation_mismatched", "test_matched") if config == "mnli"
              else ("train", "validation", "test"))
    d = tmp_path / "glue" / config
    rows = {}
    for k, split in enumerate(splits):
        rows[split] = glue_rows(config, 6 + k, seed=k, test=split.startswith("test"))
        write(d / f"{split}{FORMATS[(k + fmt_offset) % len(FORMATS)]}", rows[split])
    return d, rows


@pytest.mark.parametrize("config", list(GLUE_EXPECTED))
def test_glue_task_from_local_files(tmp_path, config):
    fields, labels, metric = GLUE_EXPECTED[config]
    d, rows = glue_dir(tmp_path, config, fmt_offset=list(GLUE_EXPECTED).index(config))
    task = get_task(f"glue/{config}", data_dir=d)
    assert task.text_fields == fields
    assert task.labels == labels
    assert task.metric == metric
    assert task.kind == ("classification" if labels else "regression")
    assert task.num_labels == (len(labels) if labels else 1)
    assert task.validation_split == ("validation_matched" if config == "mnli" else "validation")
    for split, expected in rows.items():
        data = task.load(split)
        assert len(data) == len(expected)
        assert data.texts == [tuple(r[f] for f in fields) for r in expected]
        if labels:
            assert data.labels.dtype == np.int64
            assert data.labels.tolist() == [r["label"] for r in expected]
        else:
            assert data.labels.dtype == np.float32
            np.testing.assert_allclose(data.labels, [r["label"] for r in expected], rtol=1e-6)
    test_split = task.splits()[-1]
    assert test_split.startswith("test")
    assert set(task.load(test_split).labels.tolist()) == {-1}  # unlabelled GLUE test split


def test_glue_registry_and_mnli_mismatched(tmp_path):
    names = list_tasks()
    assert {f"glue/{c}" for c in GLUE_EXPECTED} <= set(names)
    assert names.index("glue/cola") < names.index("offline/movies")
    d, _ = glue_dir(tmp_path, "mnli")
    mm = get_task("glue/mnli-mm", data_dir=d)
    assert mm.validation_split == "validation_mismatched"
    assert len(mm.load()) == 8  # validation_mismatched has 6 + 2 rows
    sizes = get_task("glue/sst2").sizes  # the hub task knows the official sizes
    assert sizes == {"train": 67349, "validation": 872, "test": 1821}


def test_glue_labels_by_name_and_data_files(tmp_path):
    f = write(tmp_path / "sst2-train.csv", [{"sentence": "good", "label": "positive"},
                                            {"sentence": "bad", "label": "negative"},
                                            {"sentence": "fine", "label": 1}])
    task = get_task("glue/sst2", data_files={"train": f})
    assert task.splits() == ["train"]
    assert task.load("train").labels.tolist() == [1, 0, 1]
    bad = write(tmp_path / "sst2-bad.jsonl", [{"sentence": "ok", "label": 0}, {"sentence": "what", "label": 2}])
    with pytest.raises(HeadcountError, match="row 2: label 2 is not one of: negative, positive"):
        get_task("glue/sst2", data_files={"train": bad}).load("train")
    with pytest.raises(HeadcountError, match="label -1"):  # -1 means unlabelled only in test splits
        write(bad, [{"sentence": "ok", "label": -1}])
        get_task("glue/sst2", data_files={"train": bad}).load("train")


def test_glue_environment_folder(tmp_path, monkeypatch):
    glue_dir(tmp_path, "rte")
    monkeypatch.setenv("HEADCOUNT_GLUE_DIR", str(tmp_path / "glue"))
    task = get_task("glue/rte")
    assert task.load("validation").texts[0][0].startswith("rte sentence1")


def test_glue_hub_path_goes_through_datasets(monkeypatch):
    """The hub path: datasets.load_dataset("nyu-mll/glue", config) (replaced, no network)."""
    import datasets

    calls = []

    def fake_load(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        features = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=["not_equivalent", "equivalent"]),
                                      "idx": datasets.Value("int32")})
        return datasets.Dataset.from_dict({"sentence1": ["a", "b", "c"], "sentence2": ["x", "y", "z"],
                                           "label": [1, 0, 1], "idx": [0, 1, 2]}, features=features)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    data = get_task("glue/mrpc").load("validation")
    assert calls == [("nyu-mll/glue", "mrpc", "validation")]
    assert data.texts == [("a", "x"), ("b", "y"), ("c", "z")]
    assert data.labels.tolist() == [1, 0, 1]


def test_glue_hub_failure_is_one_clear_line(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(HeadcountError, match="local files") as e:
        get_task("glue/cola").load("train")
    assert "\n" not in str(e.value)


def test_task_yaml_with_glue_schema(tmp_path):
    d, rows = glue_dir(tmp_path, "qnli")
    (tmp_path / "qnli.yaml").write_text(
        f"glue: qnli\nname: my-qnli\nfiles: {{train: {d}/train.parquet, validation: {d}/validation.jsonl}}\n")
    task = get_task(str(tmp_path / "qnli.yaml"))
    assert (task.name, task.text_fields, task.metric) == ("my-qnli", ("question", "sentence"), "accuracy")
    assert task.load("validation").labels.tolist() == [r["label"] for r in rows["validation"]]


# --------------------------------------------------------------------------- task YAML
@pytest.mark.parametrize("suffix", FORMATS)
def test_task_yaml_single_sentence_classification(tmp_path, suffix):
    write(tmp_path / f"data/train{suffix}", [{"text": f"sentence {i}", "y": ["neg", "pos"][i % 2], "x": i}
                                             for i in range(10)])
    write(tmp_path / f"data/dev{suffix}", [{"text": "NA", "y": "pos", "x": 0}, {"text": "", "y": "neg", "x": 1}])
    (tmp_path / "t.yaml").write_text(
        f"name: polar\nfiles: {{train: data/train{suffix}, validation: data/dev{suffix}}}\ntext: text\nlabel: y\n")
    task = get_task(str(tmp_path / "t.yaml"))
    assert (task.name, task.kind, task.metric) == ("polar", "classification", "accuracy")
    assert task.labels == ("neg", "pos")  # sorted distinct values of the train split
    assert task.splits() == ["train", "validation"]
    train = task.load("train")
    assert train.texts[3] == ("sentence 3",)
    assert train.labels.tolist() == [i % 2 for i in range(10)]
    dev = task.load("validation")
    assert dev.texts == [("NA",), ("",)]  # "NA" stays text
    assert dev.labels.tolist() == [1, 0]
    sub = task.load("train", max_examples=4, seed=3)
    assert len(sub) == 4 and sub.texts == task.load("train", max_examples=4, seed=3).texts
    assert sub.texts == sorted(sub.texts, key=lambda t: int(t[0].split()[1]))  # original order kept


@pytest.mark.parametrize("suffix", FORMATS)
def test_task_yaml_pair_regression(tmp_path, suffix):
    rows = [{"a": f"first {i}", "b": f"second {i}", "score": i / 4} for i in range(8)]
    write(tmp_path / f"train{suffix}", rows)
    (tmp_path / "pair.yaml").write_text(
        f"name: sim\nkind: regression\nfiles: {{train: train{suffix}}}\ntext: [a, b]\nlabel: score\n")
    task = get_task(str(tmp_path / "pair.yaml"))
    assert task.metric == "pearson_spearman" and task.num_labels == 1 and task.labels is None
    assert task.validation_split == "validation"  # no validation file: never train in its place
    with pytest.raises(HeadcountError, match=r"no split 'validation' \(the split it is evaluated on\); splits: train"):
        task.load()
    data = task.load("train")
    assert data.texts[2] == ("first 2", "second 2")
    np.testing.assert_allclose(data.labels, [i / 4 for i in range(8)])


def test_task_yaml_explicit_labels_and_metric(tmp_path):
    write(tmp_path / "train.jsonl", [{"s": "x", "l": 3}, {"s": "y", "l": 1}, {"s": "z", "l": 2}])
    (tmp_path / "t.yaml").write_text(
        "files: {train: train.jsonl}\ntext: [s]\nlabel: l\nlabels: [1, 2, 3]\nmetric: mcc\n")
    task = get_task(str(tmp_path / "t.yaml"))
    assert task.name == "t" and task.labels == ("1", "2", "3") and task.metric == "mcc"
    assert task.load("train").labels.tolist() == [2, 0, 1]  # by name, not as ids


# --------------------------------------------------------------------------- metrics
def _rng_preds(n=200, k=2, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(k, size=n)
    logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[labels]  # better than chance, not perfect
    return logits, labels


@pytest.mark.parametrize("k", [2, 3])
def test_classification_metrics_match_sklearn(k):
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    logits, labels = _rng_preds(k=k, seed=k)
    pred = logits.argmax(1)
    acc = accuracy_score(labels, pred)
    f1 = f1_score(labels, pred) if k == 2 else f1_score(labels, pred, average="macro")
    mcc = matthews_corrcoef(labels, pred)
    assert 0.3 < mcc < 0.95  # the inputs are informative but imperfect
    got = compute_metrics("accuracy", logits, labels)
    assert got == pytest.approx({"score": acc, "accuracy": acc})
    got = compute_metrics("f1", logits, labels)
    assert got == pytest.approx({"score": f1, "f1": f1, "accuracy": acc})
    got = compute_metrics("mcc", pred, labels)  # class ids work as well as logits
    assert got == pytest.approx({"score": mcc, "mcc": mcc, "accuracy": acc})


def test_metric_edge_cases_match_sklearn():
    from sklearn.metrics import f1_score, matthews_corrcoef

    y = np.array([0, 1, 1, 0])
    assert compute_metrics("mcc", np.zeros(4, int), y)["mcc"] == matthews_corrcoef(y, np.zeros(4, int)) == 0.0
    assert compute_metrics("f1", np.zeros(4, int), y)["f1"] == f1_score(y, np.zeros(4, int), zero_division=0) == 0.0
    assert compute_metrics("accuracy", np.array([0.0, 1.0, 1.0, 1.0]), y)["score"] == 0.75


@pytest.mark.parametrize("metric", ["pearson", "spearman", "pearson_spearman"])
def test_regression_metrics_match_scipy(metric):
    from scipy.stats import pearsonr, spearmanr

    rng = np.random.default_rng(1)
    y = rng.uniform(0, 5, size=100)
    pred = (y + rng.normal(scale=1.0, size=100)).reshape(-1, 1)  # logits [n, 1]
    p, s = pearsonr(pred[:, 0], y)[0], spearmanr(pred[:, 0], y)[0]
    assert abs(p - s) > 1e-4
    got = compute_metrics(metric, pred, y)
    want = {"pearson": p, "spearman": s, "pearson_spearman": (p + s) / 2}[metric]
    assert got == pytest.approx({"score": want, "pearson": p, "spearman": s})


def test_metric_bad_input():
    with pytest.raises(HeadcountError, match="unknown metric"):
        compute_metrics("bleu", [1], [1])
    with pytest.raises(HeadcountError, match="2 predictions for 3 labels"):
        compute_metrics("accuracy", [1, 0], [1, 0, 1])
    with pytest.raises(HeadcountError, match="unlabelled"):
        compute_metrics("accuracy", [1, 0], [-1, -1])


# --------------------------------------------------------------------------- bad input
def run_cli(argv, capsys) -> tuple[int, str]:
    from headcount.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    return e.value.code, err


def _yaml(tmp_path: Path, body: str, name: str = "t.yaml") -> str:
    (tmp_path / name).write_text(body)
    return str(tmp_path / name)


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    write(tmp_path / "train.csv", [{"text": "a", "label": "pos"}, {"text": "b", "label": "neg"}])
    write(tmp_path / "neutral.csv", [{"text": "a", "label": "pos"}, {"text": "c", "label": "neutral"}])
    (tmp_path / "empty.csv").write_text("text,label\n")
    (tmp_path / "latin1.csv").write_bytes("text,label\ncaf\xe9,pos\n".encode("latin-1"))
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    labels = "labels: [neg, pos]\n"
    return {
        "unknown task": (["data", "show", "glue/sst3"], "did you mean 'glue/sst2'"),
        "missing column": ([_yaml(tmp_path, f"files: {{train: train.csv}}\ntext: [sentence]\n{labels}", "a.yaml")],
                           "no column 'sentence'"),
        "label outside set": ([_yaml(tmp_path, f"files: {{train: train.csv, validation: neutral.csv}}\ntext: text\n"
                                               f"{labels}", "b.yaml")], "label 'neutral' is not one of: neg, pos"),
        "empty split": ([_yaml(tmp_path, f"files: {{train: train.csv, validation: empty.csv}}\ntext: text\n{labels}",
                               "c.yaml")], "empty"),
        "non-UTF-8 file": ([_yaml(tmp_path, f"files: {{train: latin1.csv}}\ntext: text\n{labels}", "d.yaml")],
                           "not UTF-8"),
        "unreadable file": ([_yaml(tmp_path, f"files: {{train: dir.csv}}\ntext: text\n{labels}", "e.yaml")],
                            "not a file"),
        "broken parquet": ([_yaml(tmp_path, f"files: {{train: broken.parquet}}\ntext: text\n{labels}", "f.yaml")],
                           "cannot read"),
        "YAML not a mapping": ([_yaml(tmp_path, "- name: x\n- kind: regression\n", "g.yaml")], "must be a mapping"),
        "not YAML": ([_yaml(tmp_path, "name: [unclosed\n", "h.yaml")], "not valid YAML"),
        "non-UTF-8 YAML": ([str(tmp_path / "latin1.csv").replace(".csv", ".yaml")], "not UTF-8"),
        "unknown key": ([_yaml(tmp_path, "files: {train: train.csv}\ntext: text\nlabelz: y\n", "i.yaml")],
                        "unknown key 'labelz'"),
        "missing YAML file": ([str(tmp_path / "nope.yaml")], "task file not found"),
    }


BAD = ["unknown task", "missing column", "label outside set", "empty split", "non-UTF-8 file", "unreadable file",
       "broken parquet", "YAML not a mapping", "not YAML", "non-UTF-8 YAML", "unknown key", "missing YAML file"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, case):
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    argv, message = _bad_cases(tmp_path)[case]
    if argv[0] != "data":
        argv = ["data", "show", *argv]
    code, err = run_cli(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err


def test_bad_input_through_the_console_script(tmp_path):
    """The real entry point, in a subprocess: exit 2, one line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "headcount", "data", "show", "offline/movie"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: unknown task 'offline/movie' (did you mean 'offline/movies'?): "
                                   "`headcount tasks` lists them (a task YAML path also works: it ends in "
                                   ".yaml or starts with ./ or /)")


def test_unknown_split_and_bad_max_examples(tmp_path):
    write(tmp_path / "train.tsv", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    task = get_task(_yaml(tmp_path, "files: {train: train.tsv}\ntext: text\n"))
    with pytest.raises(HeadcountError, match="no split 'dev'; splits: train"):
        task.load("dev")
    with pytest.raises(HeadcountError, match="at least 1"):
        task.load("train", max_examples=0)
    with pytest.raises(HeadcountError, match="data_dir"):
        get_task("offline/movies", data_dir=tmp_path)


def test_cli_tasks_lists_every_task(capsys):
    from headcount.cli.app import main

    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in list_tasks():
        assert name in out
    assert "glue/stsb" in out and "pearson_spearman" in out
    assert "offline/movies " in out and "8,043" in out  # documented sizes, fetched or not
