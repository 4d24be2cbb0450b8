"""``weight_mask.safetensors`` is byte-identical for identical masks (issue 29: safetensors keeps
the metadata in a hash map, so every write ordered its keys anew and reruns differed in bytes and
in the SHA-256 the folder's record keeps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from headcount.importance.magnitude import load_weight_mask, save_weight_mask, weight_mask_meta

META = {"control": "good", "variant": "prasanna", "rate": 0.1, "seed": 3, "round": 2, "task": "t", "note": "é/\\\""}


def _mask():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.rand(4, 4, generator=g) > 0.5, "b.weight": torch.rand(3, generator=g) > 0.5}


def test_two_writes_give_identical_bytes(tmp_path):
    paths = [tmp_path / f"m{i}.safetensors" for i in range(6)]
    for p in paths:
        save_weight_mask(_mask(), p, meta=META)
    code = ("import sys, torch; from headcount.importance.magnitude import save_weight_mask; "
            "sys.path.insert(0, sys.argv[2]); from test_weight_mask_bytes import _mask, META; "
            "save_weight_mask(_mask(), sys.argv[1], meta=META)")
    other = tmp_path / "other.safetensors"
    subprocess.run([sys.executable, "-c", code, str(other), str(Path(__file__).parent)], check=True)
    data = {p.read_bytes() for p in [*paths, other]}
    assert len(data) == 1
    meta = weight_mask_meta(paths[0])
    assert {k: meta[k] for k in META} == META
    loaded = load_weight_mask(paths[0])
    assert all(torch.equal(loaded[k], v) for k, v in _mask().items())
