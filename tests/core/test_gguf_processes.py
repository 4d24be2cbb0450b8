"""GGUF conversions in real processes: two at once, one killed midway, one on a full disk.

Each process reads a tiny GGUF file with transformers' own reader (``convert_gguf``); what is
checked is the cache afterwards: one whole conversion that ``check_conversion`` accepts, with the
file's own weights, and never a half-written folder in its place.

- Two processes converting one file at once: both end with the same whole conversion, the file
  read once (the second waits on the conversion lock, then finds it done).
- SIGKILL while the weights are written: the half folder is a marked temporary one that no load
  uses; the next conversion removes it and converts.
- A full disk (a tmpfs as ``$HEADCOUNT_CACHE``, in a mount namespace of its own; skipped where it
  cannot be mounted, e.g. without root; ``test_gguf_cache.py`` simulates ENOSPC everywhere): 40 KB,
  less than the header says the conversion takes (81 KB), is refused before anything is written;
  92 KB passes that estimate but not the files' real size in tmpfs pages (~110 KB): one line naming
  the full disk, nothing left but the lock; with room again, it converts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from gguf_files import write_gguf

from headcount.core import gguf

pytestmark = pytest.mark.slow

#: a conversion in a process of its own: waits for the file GO (when given), converts, prints the
#: result as JSON; SLOW: seconds to sleep after the weights are written (inside the temporary folder)
SCRIPT = """
import json, os, sys, time
from pathlib import Path
import transformers
from headcount.core.gguf import convert_gguf
from headcount.runtime.errors import HeadcountError

save = transformers.PreTrainedModel.save_pretrained
def slow_save(self, folder, *a, **kw):
    save(self, folder, *a, **kw)
    Path(os.environ["MARK"]).write_text(str(folder))
    time.sleep(float(os.environ.get("SLOW", "0")))
transformers.PreTrainedModel.save_pretrained = slow_save
go = os.environ.get("GO")
Path(os.environ["READY"]).write_text("ready")
while go and not Path(go).exists():
    time.sleep(0.05)
try:
    folder, now = convert_gguf(sys.argv[1])
except HeadcountError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"folder": str(folder), "now": now}))
"""


@pytest.fixture
def world(tmp_path):
    (tmp_path / "models").mkdir()
    path = write_gguf(tmp_path / "models" / "tiny.gguf")
    (tmp_path / "convert.py").write_text(SCRIPT)
    env = {**os.environ, "HEADCOUNT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "OMP_NUM_THREADS": "1"}
    return tmp_path, path, env


def start(tmp_path: Path, path: Path, env: dict, name: str, cmd_prefix=(), **extra) -> subprocess.Popen:
    env = {**env, "READY": str(tmp_path / f"{name}.ready"), "MARK": str(tmp_path / f"{name}.saved"), **extra}
    return subprocess.Popen([*cmd_prefix, sys.executable, str(tmp_path / "convert.py"), str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def wait_for(f: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not f.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{f} never appeared"
        time.sleep(0.05)


def the_files_weights(path: Path) -> dict:
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).state_dict()


def assert_whole(folder: Path, path: Path) -> None:
    """``folder`` is the whole conversion of ``path``, holding the file's own weights."""
    assert gguf.check_conversion(folder, gguf.file_sha256(path)) is None
    got = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    want = the_files_weights(path)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_two_conversions_of_one_file_at_once(world, monkeypatch):
    tmp_path, path, env = world
    monkeypatch.setenv("HEADCOUNT_CACHE", env["HEADCOUNT_CACHE"])
    go = tmp_path / "go"
    procs = [start(tmp_path, path, env, f"p{i}", GO=str(go), SLOW="2") for i in (0, 1)]
    for i, proc in enumerate(procs):
        wait_for(tmp_path / f"p{i}.ready", proc)
    go.write_text("go")  # both call convert_gguf now; the first to lock writes slowly (2 s)
    results = [result(p) for p in procs]
    folder = gguf.converted_dir(path)
    assert {r["folder"] for r in results} == {str(folder)}
    assert sorted(r["now"] for r in results) == [False, True]  # read once: the other waited, then found it
    assert sum((tmp_path / f"p{i}.saved").exists() for i in (0, 1)) == 1
    assert_whole(folder, path)
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])


def test_a_conversion_killed_midway_is_never_used_and_the_next_one_cleans_up(world, monkeypatch):
    tmp_path, path, env = world
    monkeypatch.setenv("HEADCOUNT_CACHE", env["HEADCOUNT_CACHE"])
    proc = start(tmp_path, path, env, "killed", SLOW="300")
    wait_for(tmp_path / "killed.saved", proc)  # the weights are written, the tokenizer and the record not yet
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    half = Path((tmp_path / "killed.saved").read_text())
    folder = gguf.converted_dir(path)
    assert (half / "model.safetensors").is_file() and (half / gguf.PARTIAL).is_file() and half.parent == folder.parent
    assert not os.path.lexists(folder) and gguf.find_converted(path) is None
    # the file, not the half (convert=False: what is there is used, nothing converted)
    assert gguf.gguf_source(str(path), convert=False) == (str(path.parent), {"gguf_file": path.name})
    done = result(start(tmp_path, path, env, "next"))
    assert done == {"folder": str(folder), "now": True} and not half.exists()
    assert_whole(folder, path)
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(exist_ok=True)
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{where}'"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_full_disk_during_a_conversion_is_one_line_and_leaves_nothing(world):
    tmp_path, path, env = world
    cache = Path(env["HEADCOUNT_CACHE"])
    if not _can_mount_tmpfs(cache):
        pytest.skip("cannot mount a tmpfs here (needs root and mount namespaces); the ENOSPC case is simulated in "
                    "test_gguf_cache.py")
    # in a mount namespace of its own: a 40 KB tmpfs as the cache (the header's estimate is 81 KB),
    # then 92 KB (the files take ~110 KB in 4 KB pages), then what is left in it, then the same
    # conversion with room again
    script = (f"mount -t tmpfs -o size=40k tmpfs '{cache}' && "
              f"'{sys.executable}' '{tmp_path}/convert.py' '{path}' && "
              f"mount -o remount,size=92k '{cache}' && "
              f"'{sys.executable}' '{tmp_path}/convert.py' '{path}' && "
              f"find '{cache}' -mindepth 1 -printf '%P\\n' | sort > '{tmp_path}/left.txt' && "
              f"mount -o remount,size=8m '{cache}' && '{sys.executable}' '{tmp_path}/convert.py' '{path}'")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env={**env, "READY": str(tmp_path / "r"),
                          "MARK": str(tmp_path / "m")}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    small, full, roomy = (json.loads(line) for line in proc.stdout.strip().splitlines()[-3:])
    estimate = gguf._size(sum(gguf.conversion_bytes(path)))
    assert small["error"].startswith(f"the GGUF conversion of tiny.gguf needs about {estimate}, "), small
    assert "No space left on device" in full["error"] and "\n" not in full["error"]
    assert full["error"].startswith("cannot write the GGUF conversion")
    key = gguf.converted_dir(path).name
    left = set((tmp_path / "left.txt").read_text().split())
    assert left <= {f"gguf/.{key}.lock", "gguf", "digests.json"}, left  # no folder, no temporary one
    assert roomy == {"folder": str(cache / "gguf" / key), "now": True}
