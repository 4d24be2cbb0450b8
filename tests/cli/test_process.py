"""The process around a command: Ctrl-C while the command line starts (``import torch``) and while
a command runs, a reader that closes the pipe, a disk that fills while the weights are written.

Ctrl-C and the closed pipe run the real entry points in a subprocess (``python -m headcount`` and
the ``headcount`` console script); the full disk runs in-process with safetensors' writer failing as
it fails on a full disk.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.cli.app import main

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

SCRIPT = Path(sys.executable).parent / "headcount"
FT = ["--epochs", "1", "--batch-size", "16", "--max-length", "32"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("process")
    return {"root": root, "pre": make_checkpoint(root / "pre"), "clf": make_checkpoint(root / "clf", head="classification"),
            "task": make_task(root / "task", n_train=32, n_dev=16)}


def _command(how: str) -> list[str]:
    if how == "script":
        if not SCRIPT.is_file():
            pytest.skip(f"no console script next to {sys.executable}")
        return [str(SCRIPT)]
    return [sys.executable, "-m", "headcount"]


def _start(how: str, argv: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADCOUNT_CACHE": str(cwd / "cache")}
    env.pop("HEADCOUNT_DEBUG", None)
    return subprocess.Popen(_command(how) + [str(a) for a in argv], cwd=cwd, env=env, text=True,
                            stdout=kwargs.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **kwargs)


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the process ended before {what}: rc {proc.returncode}, {proc.stderr.read()}"
        assert time.monotonic() < end, f"no {what} after {timeout} s"
        time.sleep(0.005)


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


# -- Ctrl-C ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs /proc (Linux) to see the import begin")
@pytest.mark.parametrize("how", ["module", "script"])
def test_ctrl_c_while_torch_is_imported(how, world, tmp_path):
    """SIGINT as soon as torch's library is mapped (the command line is still importing): one line,
    exit 130, no traceback (before: a 30-line traceback of the import, or an abort in torch's C++)."""
    proc = _start(how, ["score", "--model", world["clf"], "--task", world["task"], "--out", tmp_path / "o"], tmp_path)
    try:
        _wait_for(proc, lambda: "libtorch" in _maps(proc.pid), "torch import")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines() == ["error: interrupted"] or (
        len(err.splitlines()) == 1 and err.startswith("error: interrupted")), err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["module", "script"])
def test_ctrl_c_during_the_command(how, world, tmp_path):
    """SIGINT once fine-tuning has taken its --out: the command's own message, as its last line
    (progress lines come first), exit 130, and the same command then resumes to the end."""
    out_dir = tmp_path / "o"
    argv = ["finetune", "--model", world["pre"], "--task", world["task"], *FT, "--epochs", "300", "--out", out_dir]
    proc = _start(how, argv, tmp_path)
    try:
        # once training runs (its first evaluation is recorded). A Ctrl-C sent 0.3 s after run.json,
        # while the Trainer was being built, was once lost in a fresh-clone CI run (the run trained
        # to the end); why is not pinned down, and the product gap is noted on the issue
        _wait_for(proc, lambda: (out_dir / "evaluations.json").is_file(), "training under way")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[-1].startswith("error: interrupted") and str(out_dir) in lines[-1], err
    assert [x for x in lines if x.startswith("error:")] == lines[-1:], err
    assert "Traceback" not in err, err
    assert not (out_dir / "metrics.json").exists()  # not finished, and not said to be


def test_the_entry_module_imports_nothing_heavy():
    """The Ctrl-C handling is in place before torch, transformers, pandas or typer load."""
    code = ("import sys, headcount.cli.entry; "
            "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'numpy', 'typer') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_console_script_and_module_use_the_entry():
    if SCRIPT.is_file():
        assert "headcount.cli.entry import main" in SCRIPT.read_text()
    main_py = Path(__file__).resolve().parents[2] / "src" / "headcount" / "__main__.py"
    assert "from headcount.cli.entry import" in main_py.read_text() and "headcount.cli.app" not in main_py.read_text()


# -- a reader that goes away ----------------------------------------------------------------------------
def test_closed_pipe_ends_quietly(tmp_path):
    """``headcount tasks | head -0``: no traceback, no "Exception ignored" (click ends a command
    whose output pipe closed with status 1; outside a command the entry ends with 141, as SIGPIPE)."""
    proc = _start("module", ["tasks"], tmp_path)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode in (1, 128 + signal.SIGPIPE), err
    assert err == "", err


def test_closed_pipe_outside_a_command():
    code = ("import headcount.cli.app as c\n"
            "def broken(argv=None):\n"
            "    raise BrokenPipeError(32, 'Broken pipe')\n"
            "c.main = broken\n"
            "from headcount.cli.entry import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, "")


# -- a full disk while the weights are written ------------------------------------------------------------
#: what safetensors 0.8 raises when the disk fills under it (a SafetensorError, not an OSError)
SAFETENSORS_FULL = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def _weights_disk_full(monkeypatch):
    import safetensors
    import transformers.modeling_utils

    def fail(*args, **kwargs):
        raise safetensors.SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", fail)


def _run(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".headcount.lock"}


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert "Traceback" not in err and "internal error" not in err, err
    return errors[0]


@pytest.mark.parametrize("command", ["shrink", "finetune"])
def test_full_disk_while_saving_weights(command, world, tmp_path, capsys, monkeypatch):
    """The weights fail to write as on a full disk: exit 2, one error line saying so (before: exit 1
    ``internal error: SafetensorError``); an earlier result is untouched, the failed --out holds no
    model, and once there is space the same command finishes."""
    mask = tmp_path / "mask.json"
    mask.write_text('{"heads": [[1, 0, 1, 1], [1, 1, 1, 0]], "mlps": [1, 1]}')

    def argv(out):
        if command == "shrink":
            return ["shrink", "--model", world["clf"], "--mask", mask, "--out", out]
        return ["finetune", "--model", world["pre"], "--task", world["task"], *FT, "--out", out]

    code, err = _run(argv(tmp_path / "earlier"), capsys)
    assert code == 0, err
    earlier = _digest(tmp_path / "earlier")
    assert any(name.endswith("model.safetensors") for name in earlier)

    _weights_disk_full(monkeypatch)
    code, err = _run(argv(tmp_path / "new"), capsys)
    line = _one_error_line(err)
    assert code == 2, err
    assert line.startswith("error: no space left on the device") and "kept" in line, line
    assert _digest(tmp_path / "earlier") == earlier
    assert not any(p.name == "model.safetensors" for p in (tmp_path / "new").rglob("*"))

    monkeypatch.undo()
    code, err = _run(argv(tmp_path / "new"), capsys)
    assert code == 0, err
    assert any(p.name == "model.safetensors" for p in (tmp_path / "new").rglob("*"))


def test_environment_errors_wrapped_by_libraries():
    """A full disk is recognised through a library's wrapper (as the cause, or named in the
    message); anything else stays a bug."""
    from headcount.cli.app import _environment_message

    full = OSError(errno.ENOSPC, "No space left on device", "/x/model.safetensors")
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as wrapped:
        assert _environment_message(wrapped) == "no space left on the device while writing /x/model.safetensors " \
                                                "(earlier results are kept)"
    assert "no space left" in _environment_message(RuntimeError(SAFETENSORS_FULL))
    assert _environment_message(RuntimeError("shape mismatch")) is None
    assert _environment_message(OSError(errno.ENOENT, "No such file or directory")) is None


def test_top_level_help_names_decoders_too(capsys):
    """``headcount --help`` says what the tool is for: encoders and decoders alike."""
    from cli_helpers import run_cli

    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "decoder" in " ".join(out.split()) and "KV" in out
