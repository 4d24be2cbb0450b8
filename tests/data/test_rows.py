"""Never lose a row: every data format reads every row with its exact text, or refuses the file.

A ``.tsv`` is plain tab-separated text (quotes are text, as in the GLUE download), a ``.csv`` is
CSV (quoted fields may hold commas, tabs and line breaks), ``.jsonl`` one object a line, parquet
checked against its metadata. Texts here carry unbalanced and balanced quotes, ``NA`` and its
kin, U+2028 and padding; files come with CRLF line ends, a byte-order mark and blank trailing
lines; each is read through a task YAML, the GLUE hub layout and the GLUE download layout.

Tiny data written here; nothing touches the network.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from glue_helpers import FOLDERS, dataset, write_download

from headcount.data.tasks import get_task, tables
from headcount.runtime.errors import HeadcountError


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HEADCOUNT_GLUE_DIR", raising=False)


#: texts that CSV quoting, NA guessing or str.splitlines would change, drop or glue together
TEXTS = [
    'a "quoted word and more',          # an unbalanced quote inside (real SST-2 / QQP)
    '"starts with a quote',             # an unbalanced quote that opens the field
    '"fully quoted"',
    'ends with a quote"',
    'he said "yes", then "no"',
    "NA", "null", "None", "nan", "N/A", "#N/A", "",
    "  padded  ",
    "comma, inside",
    "it 's a line\u2028separator and a form\x0cfeed",
    "'single' quotes and a back\\slash",
]
#: only CSV and JSON can carry these
CSV_ONLY = ["a tab\tinside", "a line\nbreak inside", "a CRLF\r\nbreak inside"]


def rows_of(texts: list[str], n: int = 320) -> list[tuple[str, str]]:
    """``n`` (text, label) rows cycling through ``texts``, each text made unique by its number."""
    return [(f"{texts[i % len(texts)]} #{i}" if i % 3 else texts[i % len(texts)], "pos" if i % 2 else "neg")
            for i in range(n)]


def tsv_text(rows, header=("sentence", "label"), crlf=False, bom=False, trailing="") -> str:
    end = "\r\n" if crlf else "\n"
    body = end.join("\t".join(r) for r in [header, *rows]) + end + trailing
    return ("\ufeff" if bom else "") + body


def csv_text(rows, header=("sentence", "label"), crlf=True, bom=False, trailing="") -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n" if crlf else "\n").writerows([header, *rows])
    return ("\ufeff" if bom else "") + buf.getvalue() + trailing


def jsonl_text(rows, crlf=False, bom=False, trailing="") -> str:
    end = "\r\n" if crlf else "\n"
    body = "".join(json.dumps({"sentence": t, "label": y}, ensure_ascii=False) + end for t, y in rows)
    return ("\ufeff" if bom else "") + body + trailing


def task_yaml(d: Path, train: str, dev: str | None = None) -> str:
    files = f"train: {train}" + (f", validation: {dev}" if dev else "")
    (d / "t.yaml").write_text(f"name: rows\nfiles: {{{files}}}\ntext: sentence\nlabels: [neg, pos]\n")
    return str(d / "t.yaml")


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))  # bytes: no newline translation
    return path


def check(task, split: str, rows) -> None:
    data = task.load(split)
    assert [t for (t,) in data.texts] == [t for t, _ in rows]
    assert data.labels.tolist() == [int(y == "pos") for _, y in rows]


# --------------------------------------------------------------------------- every row, exact text
VARIANTS = {"lf": {}, "crlf": {"crlf": True}, "bom": {"bom": True},
            "crlf-bom-blank-tail": {"crlf": True, "bom": True, "trailing": "\n  \n\n"}}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tsv_reads_every_row_with_quotes_as_text(tmp_path, variant):
    rows = rows_of(TEXTS)
    write(tmp_path / "train.tsv", tsv_text(rows, **VARIANTS[variant]))
    check(get_task(task_yaml(tmp_path, "train.tsv")), "train", rows)  # 320 of 320, quotes as written


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_csv_reads_every_row_and_multi_line_fields(tmp_path, variant):
    rows = rows_of(TEXTS + CSV_ONLY)
    write(tmp_path / "train.csv", csv_text(rows, **{"crlf": False, **VARIANTS[variant]}))
    check(get_task(task_yaml(tmp_path, "train.csv")), "train", rows)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_jsonl_reads_every_row(tmp_path, variant):
    rows = rows_of(TEXTS + CSV_ONLY)
    write(tmp_path / "train.jsonl", jsonl_text(rows, **VARIANTS[variant]))
    check(get_task(task_yaml(tmp_path, "train.jsonl")), "train", rows)


def test_parquet_reads_every_row(tmp_path):
    rows = rows_of(TEXTS + CSV_ONLY)
    pd.DataFrame(rows, columns=["sentence", "label"]).to_parquet(tmp_path / "train.parquet", index=False)
    check(get_task(task_yaml(tmp_path, "train.parquet")), "train", rows)


def test_pandas_csv_round_trip_and_na_texts(tmp_path):
    """A .csv as pandas writes it reads back every text, ``NA`` and the empty text included."""
    rows = rows_of(TEXTS + CSV_ONLY, n=64)
    pd.DataFrame(rows, columns=["sentence", "label"]).to_csv(tmp_path / "train.csv", index=False)
    check(get_task(task_yaml(tmp_path, "train.csv")), "train", rows)


def test_glue_hub_layout_every_format(tmp_path):
    """``train.tsv`` (quotes that once swallowed rows: 195 of 320 read) beside validation/test in the other formats."""
    d = tmp_path / "sst2"
    d.mkdir()
    train, dev, test = rows_of(TEXTS), rows_of(TEXTS + CSV_ONLY, 48), rows_of(TEXTS + CSV_ONLY, 30)
    write(d / "train.tsv", tsv_text([(t, str(int(y == "pos")), str(i)) for i, (t, y) in enumerate(train)],
                                    header=("sentence", "label", "idx"), crlf=True, bom=True))
    write(d / "validation.csv", csv_text([(t, y + "itive" if y == "pos" else "negative", str(i))
                                          for i, (t, y) in enumerate(dev)],
                                         header=("sentence", "label", "idx")))
    write(d / "test.jsonl", "".join(json.dumps({"sentence": t, "label": -1, "idx": i}) + "\n"
                                    for i, (t, _) in enumerate(test)))
    task = get_task("glue/sst2", data_dir=d)
    assert len(task.load("train")) == 320
    assert [t for (t,) in task.load("train").texts] == [t for t, _ in train]
    assert task.load("train").labels.tolist() == [int(y == "pos") for _, y in train]
    dev_data = task.load()
    assert [t for (t,) in dev_data.texts] == [t for t, _ in dev]
    assert dev_data.labels.tolist() == [int(y == "pos") for _, y in dev]  # label names
    assert [t for (t,) in task.load("test").texts] == [t for t, _ in test]


def test_glue_download_layout_with_quotes_crlf_and_bom(tmp_path):
    pair = [(f"{a} #{i}", f"{TEXTS[(i + 5) % len(TEXTS)]}") for i, a in enumerate(TEXTS * 3)]
    d = tmp_path / "QQP"
    d.mkdir()
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    lines += [f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{i % 2}" for i, (a, b) in enumerate(pair)]
    for name in ("train.tsv", "dev.tsv"):
        write(d / name, "\ufeff" + "\r\n".join(lines) + "\r\n\r\n")
    task = get_task("glue/qqp", data_dir=d)
    for split in ("train", "validation"):
        data = task.load(split)
        assert data.texts == pair
        assert data.labels.tolist() == [i % 2 for i in range(len(pair))]
    # CoLA's labelled files have no header line: every line is a row, quotes as written
    d = tmp_path / "CoLA"
    d.mkdir()
    cola = [f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\t{t}" for i, t in enumerate(TEXTS)]
    for name in ("train.tsv", "dev.tsv"):
        write(d / name, "\r\n".join(cola) + "\r\n")
    data = get_task("glue/cola", data_dir=d).load()
    assert [t for (t,) in data.texts] == TEXTS and data.labels.tolist() == [i % 2 for i in range(len(TEXTS))]


def test_download_files_of_pair_and_single_tasks_read_every_row(tmp_path):
    """test_glue_local's download files (quotes in their texts), every split and row as written."""
    for config in ("sst2", "mrpc", "rte", "stsb"):
        data = dataset(config)
        task = get_task(f"glue/{config}", data_dir=write_download(tmp_path / FOLDERS[config], config, data))
        for split, rows in data.items():
            assert task.load(split).texts == [t for t, _ in rows]


# --------------------------------------------------------------------------- malformed files are refused
def refused(tmp_path, name: str, text: str, match: str) -> str:
    """``name`` with ``text`` as the train file of a task YAML: loading it fails with ``match``, in one line."""
    write(tmp_path / name, text)
    task = get_task(task_yaml(tmp_path, name))
    with pytest.raises(HeadcountError, match=match) as e:
        task.load("train")
    assert "\n" not in str(e.value) and str(tmp_path / name) in str(e.value)
    return str(e.value)


def test_tsv_tab_inside_quotes_is_refused_with_its_line(tmp_path):
    # pandas' to_csv(sep="\t") quotes a text with a tab; in a .tsv that tab still separates fields
    rows = [("fine", "pos"), ("a tab\tinside", "neg"), ("fine too", "pos")]
    text = pd.DataFrame(rows, columns=["sentence", "label"]).to_csv(sep="\t", index=False)
    message = refused(tmp_path, "train.tsv", text, r"train.tsv, line 3: 3 fields, the header has 2 \(sentence, label\)")
    assert "quotes are part of the text" in message


def test_tsv_line_break_inside_a_text_is_refused(tmp_path):
    refused(tmp_path, "train.tsv", "sentence\tlabel\nfine\tpos\na line\nbreak\tneg\n",
            r"train.tsv, line 3: 1 fields, the header has 2")
    refused(tmp_path, "train.tsv", "sentence\tlabel\r\nfine\tpos\r\na lone\rCR\tneg\r\n", r"line 3: 1 fields")


def test_tsv_missing_or_extra_field_is_refused(tmp_path):
    refused(tmp_path, "train.tsv", "sentence\tlabel\na\tpos\nb\n", r"line 3: 1 fields, the header has 2")
    refused(tmp_path, "train.tsv", "sentence\tlabel\na\tpos\t\n", r"line 2: 3 fields, the header has 2")


def test_csv_unclosed_quote_is_refused(tmp_path):
    text = csv_text(rows_of(["plain"], 10), crlf=False).replace("plain #4", '"plain #4', 1)
    refused(tmp_path, "train.csv", text, r"train.csv, line 6: a quote opens a field and is never closed")


def test_csv_stray_quote_after_a_quoted_field_is_refused(tmp_path):
    refused(tmp_path, "train.csv", 'sentence,label\na,pos\n"quoted word" and more,neg\n',
            r"""train.csv, line 3: not valid CSV \(',' expected after '"'\)""")


def test_csv_swallowed_lines_are_refused_by_their_field_count(tmp_path):
    message = refused(tmp_path, "train.csv", 'sentence,label\na,pos\n"oops,neg\nb,pos\nc",neg,x\ne,pos\n',
                      r"train.csv, line 3: 3 fields, the header has 2")
    assert "from line 3 to line 5" in message


def test_csv_wrong_field_count_is_refused(tmp_path):
    refused(tmp_path, "train.csv", "sentence,label\na,pos\nb, c,neg\n", r"line 3: 3 fields, the header has 2")
    refused(tmp_path, "train.csv", "sentence,label\na,pos\nb\n", r"line 3: 1 fields, the header has 2")


def test_header_naming_a_column_twice_is_refused(tmp_path):
    refused(tmp_path, "train.tsv", "sentence\tsentence\tlabel\na\tb\tpos\n", "names the column 'sentence' twice")


def test_jsonl_bad_line_is_refused(tmp_path):
    refused(tmp_path, "train.jsonl", '{"sentence": "a", "label": "pos"}\n{"sentence": "b", "label"\n',
            r"train.jsonl, line 2: not JSON")


def test_parquet_rows_are_checked_against_the_metadata(tmp_path, monkeypatch):
    pd.DataFrame(rows_of(["x"], 8), columns=["sentence", "label"]).to_parquet(tmp_path / "train.parquet")
    read = tables.pq.read_table
    monkeypatch.setattr(tables.pq, "read_table", lambda p: read(p).slice(0, 5))  # a reader that lost rows
    task = get_task(task_yaml(tmp_path, "train.parquet"))
    with pytest.raises(HeadcountError, match=r"read 5 rows but the file has 8 rows by its metadata"):
        task.load("train")


def test_the_count_check_names_file_counts_and_cause(tmp_path):
    """The last guard (rows read against the file's own count) refuses in one line."""
    tables._check_count(tmp_path / "train.tsv", 6, 6, "data lines", "a line was skipped")
    with pytest.raises(HeadcountError, match=r"train.tsv: read 5 rows but the file has 6 data lines; "
                                             r"a line was skipped\. Refusing"):
        tables._check_count(tmp_path / "train.tsv", 5, 6, "data lines", "a line was skipped")


# --------------------------------------------------------------------------- GLUE download: what to do
def test_download_file_without_its_header_says_so(tmp_path):
    for config, line in (("mrpc", "1\t100\t200\ta \"b\tc"), ("qqp", "0\t0\t1\ta?\tb?\t0"),
                         ("rte", "0\ta\tb\tentailment")):
        d = tmp_path / FOLDERS[config]
        d.mkdir()
        write(d / "train.tsv", line + "\n")
        write(d / "dev.tsv", line + "\n")
        with pytest.raises(HeadcountError) as e:
            get_task(f"glue/{config}", data_dir=d).load()
        message = str(e.value)
        assert "dev.tsv: the header line is missing" in message and "\n" not in message
        assert {"mrpc": "naming #1 String, #2 String and Quality", "qqp": "naming question1, question2 and is_duplicate",
                "rte": "naming sentence1, sentence2 and label"}[config] in message


def test_raw_mrpc_files_say_what_to_run(tmp_path, capsys, monkeypatch):
    d = tmp_path / "MRPC"
    d.mkdir()
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n"
    write(d / "msr_paraphrase_train.txt", header)
    write(d / "msr_paraphrase_test.txt", header)
    with pytest.raises(HeadcountError) as e:
        get_task("glue/mrpc", data_dir=d)
    message = str(e.value)
    assert "found no data files (the folder holds: msr_paraphrase_test.txt, msr_paraphrase_train.txt)" in message
    assert f"download_glue_data.py --data_dir OUT --tasks MRPC --path_to_mrpc {d}" in message
    assert "train.tsv, dev.tsv and test.tsv" in message and "\n" not in message
    from headcount.cli.app import main

    monkeypatch.setenv("HEADCOUNT_GLUE_DIR", str(tmp_path))  # the folder found as MRPC/
    with pytest.raises(SystemExit) as code:
        main(["data", "show", "glue/mrpc"])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code.value.code == 2 and len(err) == 1 and "--path_to_mrpc" in err[0], err


def test_cli_refuses_a_swallowing_tsv_row_in_one_line(tmp_path, capsys):
    from headcount.cli.app import main

    write(tmp_path / "train.tsv", tsv_text(rows_of(TEXTS, 20)))
    write(tmp_path / "dev.tsv", tsv_text([("ok", "pos"), ('a "tab\tinside', "neg")]))
    with pytest.raises(SystemExit) as e:
        main(["data", "show", task_yaml(tmp_path, "train.tsv", "dev.tsv")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and "dev.tsv, line 3: 3 fields, the header has 2" in err[0]
