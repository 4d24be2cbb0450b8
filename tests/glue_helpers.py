"""Local GLUE data written for tests: examples with quotes and commas, in the hub's columns and
as the original GLUE download writes them (file names, headers, label spellings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------- the data, written out here
#: hub text fields and label names (index = the hub's class id), independently of headcount's table
HUB = {
    "cola": (("sentence",), ("unacceptable", "acceptable")),
    "sst2": (("sentence",), ("negative", "positive")),
    "mrpc": (("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "qqp": (("question1", "question2"), ("not_duplicate", "duplicate")),
    "stsb": (("sentence1", "sentence2"), None),
    "mnli": (("premise", "hypothesis"), ("entailment", "neutral", "contradiction")),
    "qnli": (("question", "sentence"), ("entailment", "not_entailment")),
    "rte": (("sentence1", "sentence2"), ("entailment", "not_entailment")),
    "wnli": (("sentence1", "sentence2"), ("not_entailment", "entailment")),
}
#: hub split -> the file stem of the GLUE download
SPLITS = {"train": "train", "validation": "dev", "test": "test"}
MNLI_SPLITS = {"train": "train", "validation_matched": "dev_matched", "validation_mismatched": "dev_mismatched",
               "test_matched": "test_matched"}
MNLI_PARSES = "sentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse"
FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def splits_of(config: str) -> dict[str, str]:
    return MNLI_SPLITS if config == "mnli" else SPLITS


def examples(config: str, split: str, n: int) -> list[tuple[tuple[str, ...], object]]:
    """(texts, label) rows; text with quotes and commas (CSV-quoted in a .csv, as written in a .tsv)."""
    fields, labels = HUB[config]
    rng = np.random.default_rng(len(config) * 10 + len(split))
    rows = []
    for i in range(n):
        texts = tuple(f'"{config}" {split} {f} {i}, a "quoted" word' if i % 2 else f"{config} {split} {f} {i}'s"
                      for f in fields)
        if split.startswith("test"):
            label = None
        elif labels:
            label = int(rng.integers(len(labels)))
        else:
            label = round(float(rng.uniform(0, 5)), 3)
        rows.append((texts, label))
    return rows


def dataset(config: str) -> dict[str, list]:
    return {split: examples(config, split, 5 + k) for k, split in enumerate(splits_of(config))}


def download_lines(config: str, split: str, rows: list) -> list[str]:
    """One split as the GLUE download writes it: the task's own header (none for labelled CoLA),
    columns and label spelling (names for MNLI/QNLI/RTE, 0/1 elsewhere, STS-B scores as %.3f)."""
    labels = HUB[config][1]
    test = split.startswith("test")
    name = (lambda y: labels[y]) if config in ("mnli", "qnli", "rte") else (lambda y: str(y))
    out = []
    if config == "cola":
        out = ["index\tsentence"] if test else []
        out += [f"{i}\t{t[0]}" if test else f"gj0{i}\t{y}\t{'' if y else '*'}\t{t[0]}" for i, (t, y) in enumerate(rows)]
    elif config == "sst2":
        out = ["index\tsentence" if test else "sentence\tlabel"]
        out += [f"{i}\t{t[0]}" if test else f"{t[0]}\t{y}" for i, (t, y) in enumerate(rows)]
    elif config == "mrpc":
        out = [("index" if test else "Quality") + "\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        out += [f"{i if test else y}\t{100 + i}\t{200 + i}\t{t[0]}\t{t[1]}" for i, (t, y) in enumerate(rows)]
    elif config == "qqp":
        out = ["id\tquestion1\tquestion2" if test else "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
        out += [f"{i}\t{t[0]}\t{t[1]}" if test else f"{i}\t{2 * i}\t{2 * i + 1}\t{t[0]}\t{t[1]}\t{y}"
                for i, (t, y) in enumerate(rows)]
    elif config == "stsb":
        out = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2" + ("" if test else "\tscore")]
        out += [f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{t[0]}\t{t[1]}" + ("" if test else f"\t{y:.3f}")
                for i, (t, y) in enumerate(rows)]
    elif config == "mnli":
        tail = "" if test else ("\tlabel1\tgold_label" if split == "train" else
                                "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
        out = [f"index\tpromptID\tpairID\tgenre\t{MNLI_PARSES}\tsentence1\tsentence2{tail}"]
        for i, (t, y) in enumerate(rows):
            votes = "" if test else "\t" + "\t".join([name(y)] * tail.count("\t"))
            out.append(f"{i}\t{31 + i}\t{31 + i}e\tfiction\t( a )\t( b )\t(ROOT (S a))\t(ROOT (S b))\t{t[0]}\t{t[1]}{votes}")
    else:  # qnli, rte, wnli
        head = "index\tquestion\tsentence" if config == "qnli" else "index\tsentence1\tsentence2"
        out = [head if test else head + "\tlabel"]
        out += [f"{i}\t{t[0]}\t{t[1]}" + ("" if test else f"\t{name(y)}") for i, (t, y) in enumerate(rows)]
    return out


def write_download(d: Path, config: str, data: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for split, rows in data.items():
        (d / f"{splits_of(config)[split]}.tsv").write_text("\n".join(download_lines(config, split, rows)) + "\n",
                                                           encoding="utf-8")
    return d
