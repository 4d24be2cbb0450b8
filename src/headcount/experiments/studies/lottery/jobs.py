"""The job functions of the lottery study (the runner's signature: ``(params, inputs, workdir,
progress) -> dict``). Orchestration only: each validates its params ([`config`][headcount.experiments.studies.lottery.config]), loads
what it needs, calls the maths (``headcount.analysis``, ``headcount.importance.magnitude``,
``headcount.train``) and writes its files.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from headcount.analysis import draw_controls, super_controls, super_survivors
from headcount.analysis.patterns import (
    CLASSES,
    commonest_structure_maps,
    load_labelled_maps,
    load_pattern_cnn,
    predict_pattern_ids,
    save_pattern_cnn,
    train_pattern_cnn,
)
from headcount.analysis.subnetworks import cross_task_overlap, seed_stability
from headcount.core.attention import attention_maps
from headcount.core.masks import Mask
from headcount.data.tasks import get_task
from headcount.experiments.studies.jobs import finetune_job, job_params, job_task, model_spec, step_messages
from headcount.experiments.studies.lottery.config import (
    MagnitudeParams,
    OverlapParams,
    PatternCNNParams,
    PatternsParams,
    RetrainParams,
    SubnetworkParams,
)
from headcount.importance.pipeline import DataConfig, batches_for, load_for
from headcount.runtime.atomic import atomic_path, atomic_write_json
from headcount.runtime.device import model_device, resolve_device, to_device
from headcount.runtime.errors import HeadcountError
from headcount.train.magnitude_prune import magnitude_prune

_CONTROL_IDS = {"random": 1, "bad": 2}


def control_rng(seed: int, kind: str) -> np.random.Generator:
    """The generator a random or bad subnetwork of training seed ``seed`` is drawn with.

    Seeded by ``(seed, kind)`` so that the random and the bad draw of one seed are independent
    and every draw is reproducible.

    >>> int(control_rng(1, "bad").integers(100)) == int(control_rng(1, "bad").integers(100))
    True
    """
    if kind not in _CONTROL_IDS:
        raise HeadcountError(f"unknown control {kind!r}; use 'random' or 'bad'")
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, _CONTROL_IDS[kind]])


def super_random_rng(draw_seed: int, retrain_seed: int) -> np.random.Generator:
    """The generator of the reference super-survivor random control (the middlings) of retraining
    seed ``retrain_seed`` (``super_survivors.random_draws: per-seed``): the authors'
    ``compute_super_masks.py`` draws the middlings again in its loop over the seeds, from one
    Python ``random`` stream; here one numpy generator per (draw seed, retraining seed), so that a
    seed's draw does not depend on which other seeds are retrained.

    >>> a, b = super_random_rng(0, 1), super_random_rng(0, 2)
    >>> int(a.integers(1 << 30)) != int(b.integers(1 << 30))
    True
    """
    return np.random.default_rng([int(draw_seed) & 0xFFFFFFFF, _CONTROL_IDS["random"], int(retrain_seed) & 0xFFFFFFFF])


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a finished directory by hard links (a plain copy across file systems)."""

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def _clean(obj):
    """JSON-safe: NaN/inf -> None, numpy -> Python."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _masks_of(inputs, names) -> tuple[np.ndarray, np.ndarray]:
    """(heads [n, n_layers, n_heads], mlps [n, n_layers]) of the ``mask.json`` of the named inputs."""
    masks = [Mask.load(inputs[n].path("mask.json")) for n in names]
    return np.stack([m.heads.numpy() for m in masks]), np.stack([m.mlps.numpy() for m in masks])


def _kv_unit(inputs, names) -> int | None:
    """Key/value heads per layer when every named input's mask was pruned in whole KV groups
    (``unit: kv-groups``): its controls are then drawn in whole groups. None otherwise."""
    masks = [Mask.load(inputs[n].path("mask.json")) for n in names]
    whole = masks and all(m.meta.get("unit") == "kv-groups" and m.n_kv_heads for m in masks)
    return masks[0].n_kv_heads if whole else None


def _to_groups(heads: np.ndarray, n_kv: int) -> np.ndarray:
    """A whole-group head grid ``[..., n_heads]`` as its groups ``[..., n_kv]`` (a group is kept
    when its heads are)."""
    return heads.reshape(*heads.shape[:-1], n_kv, -1).min(-1)


def _to_heads(groups: np.ndarray, n_heads: int) -> np.ndarray:
    return np.repeat(groups, n_heads // groups.shape[-1], axis=-1)


def subnetwork_job(params, inputs, workdir: Path, progress) -> dict:
    """A head/MLP subnetwork derived from good masks; writes ``mask.json``.

    params ([`SubnetworkParams`][headcount.experiments.studies.lottery.config.SubnetworkParams]): ``kind``: ``random`` or ``bad`` (a control of
    the upstream ``good`` mask, drawn separately for heads and MLPs with
    [`headcount.analysis.draw_controls`][headcount.analysis.draw_controls]), or ``super`` (the super-survivors: kept in every
    upstream mask, [`headcount.analysis.super_survivors`][headcount.analysis.super_survivors]); ``mode``: ``uniform`` |
    ``bernoulli`` (random only); ``seed``: the draw seed; ``controls: reference`` (random or
    bad): a control of the super-survivors of all upstream masks, drawn as the authors' code
    ([`headcount.analysis.super_controls`][headcount.analysis.super_controls]: bad from the components pruned in every mask,
    random from the middlings around that bad control, which it rebuilds from the bad draw's
    generator, so it is the ``bad`` job's of the same seed); ``draw`` (random, reference): the
    retraining seed whose middlings these are ([`super_random_rng`][headcount.experiments.studies.lottery.jobs.super_random_rng]; unset: one draw per task).
    inputs: ``good`` (a job with ``mask.json``), or for ``super`` and ``controls: reference``
    any number of them (one per seed). Good masks pruned in whole key/value groups (``unit:
    kv-groups``, decoders) get controls drawn in whole groups, and the masks written say so.

    >>> subnetwork_job({"kind": "super"}, {}, Path("."), None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: a super-survivor subnetwork needs at least one good mask
    """
    p = job_params(SubnetworkParams, params)
    n_kv = None  # the controls of a KV-group mask state their groups too
    if p.kind == "super":
        if not inputs:
            raise HeadcountError("a super-survivor subnetwork needs at least one good mask")
        heads, mlps = _masks_of(inputs, sorted(inputs))
        heads, mlps = super_survivors(heads), super_survivors(mlps)  # of whole KV groups: whole groups
        n_kv = _kv_unit(inputs, sorted(inputs))
        meta = {"kind": "super", "n_masks": len(inputs), "unit": "kv-groups" if n_kv else None}
    elif p.controls == "reference":  # a control of the super-survivors, drawn as the authors' code
        if not inputs:
            raise HeadcountError(f"a reference super-survivor {p.kind} control needs at least one good mask")
        heads, mlps = _masks_of(inputs, sorted(inputs))
        n_kv = _kv_unit(inputs, sorted(inputs))
        units = heads if n_kv is None else _to_groups(heads, n_kv)
        # random is drawn around the bad control: rebuilt from the bad job's own generator; the
        # middlings of retraining seed p.draw (random_draws: per-seed) from that seed's generator
        rng = super_random_rng(p.seed, p.draw) if p.kind == "random" and p.draw is not None else control_rng(p.seed, p.kind)
        drawn = super_controls({"heads": units, "mlps": mlps}, p.kind, seed=rng,
                               **({"bad_seed": control_rng(p.seed, "bad")} if p.kind == "random" else {}))
        meta = {"kind": p.kind, "controls": "reference", "mode": p.mode if p.kind == "random" else None,
                "seed": p.seed, "draw": p.draw, "n_masks": len(inputs), "good_heads_kept": int(super_survivors(heads).sum()),
                "good_mlps_kept": int(super_survivors(mlps).sum()), "unit": "kv-groups" if n_kv else None}
        n_heads, heads, mlps = heads.shape[-1], drawn["heads"], drawn["mlps"]
        if n_kv:
            heads = _to_heads(heads, n_heads)
    else:
        good = Mask.load(inputs["good"].path("mask.json"))
        n_kv = _kv_unit(inputs, ["good"])  # a good mask of whole KV groups: controls drawn in whole groups
        units = good.heads.numpy() if n_kv is None else _to_groups(good.heads.numpy(), n_kv)
        drawn = draw_controls({"heads": units, "mlps": good.mlps.numpy()}, p.kind,
                              seed=control_rng(p.seed, p.kind), **({"mode": p.mode} if p.kind == "random" else {}))
        heads, mlps = drawn["heads"], drawn["mlps"]
        if n_kv:
            heads = _to_heads(heads, good.heads.shape[1])
        meta = {"kind": p.kind, "mode": p.mode if p.kind == "random" else None, "seed": p.seed,
                "good_heads_kept": good.n_heads_kept, "good_mlps_kept": good.n_mlps_kept,
                "unit": "kv-groups" if n_kv else None}
    mask = Mask(heads, mlps, {k: v for k, v in meta.items() if v is not None}, n_kv_heads=n_kv)
    mask.save(workdir / "mask.json")
    progress(1, 1, f"{p.kind}: {mask.n_heads_kept} heads, {mask.n_mlps_kept} MLPs")
    out = {"mask": mask.to_dict(), "heads_kept": mask.n_heads_kept, "mlps_kept": mask.n_mlps_kept}
    if mask.n_heads_kept == 0 and mask.n_mlps_kept == 0:  # retrained, it predicts a constant: often a NaN metric
        out["empty"] = True
        msg = ("warning: the super-survivor subnetwork is empty: no head or MLP is kept by every seed"
               if p.kind == "super" else
               f"warning: the {p.kind} subnetwork (seed {p.seed}) was drawn empty: 0 heads and 0 MLPs "
               f"(the good mask keeps {meta['good_heads_kept']} heads, {meta['good_mlps_kept']} MLPs)")
        warnings.warn(msg[len("warning: "):], RuntimeWarning, stacklevel=2)
        progress(1, 1, msg)
    return out


def retrain_job(params, inputs, workdir: Path, progress) -> dict:
    """Retrain a subnetwork from the pre-trained weights: [`headcount.experiments.studies.jobs.finetune_job`][headcount.experiments.studies.jobs.finetune_job]
    with an upstream ``mask`` (physically pruned) or ``weight_mask``; the checkpoint is removed
    afterwards unless ``params["keep_model"]`` (nothing downstream reads it).

    >>> retrain_job({"model": "offline", "task": "offline/movies", "seed": 1}, {"mask": good}, out, print)  # doctest: +SKIP
    {'final': {'score': 0.81, ...}, 'mask': {'heads_kept': 41, ...}, ...}
    """
    p = job_params(RetrainParams, params)
    metrics = finetune_job({k: v for k, v in params.items() if k != "keep_model"}, inputs, workdir, progress)
    if not p.keep_model:
        shutil.rmtree(workdir / "model", ignore_errors=True)
    return metrics


def magnitude_job(params, inputs, workdir: Path, progress) -> dict:
    """Magnitude pruning with retraining from the pre-trained weights
    ([`headcount.train.magnitude_prune.magnitude_prune`][headcount.train.magnitude_prune.magnitude_prune], by ``magnitude.procedure``).

    params ([`MagnitudeParams`][headcount.experiments.studies.lottery.config.MagnitudeParams]): model (pre-trained), task, seed, train,
    magnitude, control (``good`` | ``random`` | ``bad``), keep_models, metric (the study's metric
    where it is not the task's: stop rule and score).
    inputs: ``full`` (the finished full fine-tuning of this seed: the weights the paper's search
    prunes without retraining, or IMP's round 0) for ``good``; ``match`` (the good magnitude job)
    for ``random`` and ``bad``, which prune once to exactly its sparsity, ranking the same
    fine-tuned weights. When the good job kept no mask (``no_passing_mask``), a control is
    skipped: ``skipped: true``, nothing trained.
    Writes ``weight_mask.safetensors``, ``trace.csv``, ``magnitude.json``, ``full/``, and
    ``retrain/`` (prasanna) or ``round_XX/`` (imp, controls).

    >>> magnitude_job({"model": "offline", "task": "offline/movies", "control": "bad"},
    ...               {"match": good_magnitude}, out, print)["sparsity"]            # doctest: +SKIP
    0.3
    """
    p = job_params(MagnitudeParams, params)
    match = None
    if "match" in inputs:
        match = inputs["match"].dir
    elif "full" in inputs:  # IMP's round 0 is exactly the full fine-tuning job: reuse it
        full = inputs["full"]
        (workdir / "full").mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "metrics.json"):
            shutil.copy2(full.path(name), workdir / "full" / name)
        _link_tree(full.path("model"), workdir / "full" / "model")
    summary = magnitude_prune(p.model, job_task(params), config=p.magnitude.config(p.control), train=p.train.config(),
                              seed=p.seed, out_dir=workdir, match=match, progress=step_messages(progress))
    if not p.keep_models:
        for d in [*workdir.glob("round_*"), workdir / "retrain"]:
            shutil.rmtree(d / "model", ignore_errors=True)
    return summary


def _special_ids(tokenizer) -> set[int]:
    """Ids of the tokens that open, separate and close sequences (not padding or unknown)."""
    ids = {getattr(tokenizer, f"{name}_token_id", None) for name in ("cls", "sep", "bos", "eos")}
    return {int(i) for i in ids if i is not None}


def patterns_job(params, inputs, workdir: Path, progress) -> dict:
    """Pattern classes of the heads of a (fine-tuned) model, in two views.

    Attention probabilities of dev examples ([`headcount.core.attention.attention_maps`][headcount.core.attention.attention_maps], eval
    mode, on the model's device).

    1. Rule classifier on per-head mean maps (headcount): averaged per head over the examples of
       the most common structure (e.g. ``[CLS] text [SEP]``) on a fixed ``size`` x ``size`` layout
       ([`headcount.analysis.patterns.commonest_structure_maps`][headcount.analysis.patterns.commonest_structure_maps]); result keys ``labels``
       ``[n_layers, n_heads]``, ``counts`` (heads), ``features``.
    2. CNN on per-example maps (Prasanna et al.), when an upstream ``cnn`` job is given: every
       example's map of every head, centre-padded with zeros to the CNN's side (longer inputs
       cropped to their first ``cnn_size`` tokens, counted in ``cnn_n_cropped``), classified on
       the model's device; ``cnn_example_ids`` ``[n_examples, n_layers, n_heads]`` (ids into
       ``cnn_classes``) and ``cnn_counts`` over examples x heads.

    params ([`PatternsParams`][headcount.experiments.studies.lottery.config.PatternsParams]): task, split, data, size; inputs: ``model``, ``cnn``.
    Writes ``maps.safetensors`` (``maps`` [n_layers, n_heads, size, size]) and ``patterns.json``.

    >>> patterns_job({"task": "offline/movies", "size": 32}, {"model": full}, out, print)["counts"]  # doctest: +SKIP
    {'vertical': 30, 'diagonal': 9, 'vertical+diagonal': 4, 'block': 0, 'heterogeneous': 29}
    """
    p = job_params(PatternsParams, params)
    task = get_task(p.task)
    data = DataConfig(**p.data)
    model, tokenizer, _ = load_for(model_spec(params, inputs), task, "task", seed=data.seed)
    model.eval()
    batches = batches_for(task, tokenizer, "task", data, split=p.split or task.validation_split)
    specials = _special_ids(tokenizer)
    dev = model_device(model)  # the maps are computed, and the CNN run, where the model is
    cnn = load_pattern_cnn(inputs["cnn"].path("cnn")).to(dev) if "cnn" in inputs else None
    cnn_ids: list[torch.Tensor] = []  # per example [layer, head] class ids (Prasanna et al.'s counting)
    n_cropped = 0

    def examples():  # (attention [layer, head, n, n], special positions) per example, padding cut
        nonlocal n_cropped
        with torch.no_grad():
            for b, batch in enumerate(batches):
                feed = to_device({k: v for k, v in batch.items() if k != "labels"}, dev)
                per_layer = attention_maps(model, **feed)  # per layer [batch, heads, seq, seq], on dev
                if any(m.shape[1] != per_layer[0].shape[1] for m in per_layer):
                    raise HeadcountError("pattern maps need every head present (classify the unpruned model)")
                att = torch.stack(per_layer, 1)  # [batch, layer, head, seq, seq]
                for i in range(att.shape[0]):
                    n = int(batch["attention_mask"][i].sum())
                    ids = batch["input_ids"][i, :n].tolist()
                    one = att[i, :, :, :n, :n]  # [layer, head, n, n]
                    if cnn is not None:  # each head's map of this example, centre-padded to the CNN's side
                        cnn_ids.append(predict_pattern_ids(cnn, one).cpu())
                        n_cropped += n > cnn.size
                    yield one, [q for q, t in enumerate(ids) if t in specials]
                progress(b + 1, len(batches), "attention maps")

    try:
        common = commonest_structure_maps(examples(), p.size)
    except HeadcountError as e:
        raise HeadcountError(f"{task.name}: {e}") from None
    mean = common.maps
    rules = mean.classify()
    with atomic_path(workdir / "maps.safetensors") as tmp:
        save_file({"maps": mean.maps.contiguous()}, str(tmp))
    out = {
        "task": task.name,
        "labels": rules.labels.tolist(),
        "counts": rules.counts(),
        "features": rules.to_dict()["features"],
        "structure": "/".join(common.structure),
        "special_cells": list(mean.special_positions),
        "n_examples": mean.n_examples,
        "n_other_structures": common.n_other,
        "size": p.size,
    }
    if cnn is not None:
        per_example = torch.stack(cnn_ids)  # [examples, layer, head], all examples of every structure
        names = np.asarray(cnn.classes)[per_example.numpy()]
        out.update({
            "cnn_example_ids": per_example.tolist(),
            "cnn_classes": list(cnn.classes),
            "cnn_counts": {c: int((names == c).sum()) for c in CLASSES},
            "cnn_n_examples": int(per_example.shape[0]),
            "cnn_n_cropped": int(n_cropped),
            "cnn_size": cnn.size,
            "cnn_architecture": cnn.architecture,
        })
    atomic_write_json(workdir / "patterns.json", out)
    return out


def pattern_cnn_job(params, inputs, workdir: Path, progress) -> dict:
    """Train the pattern CNN on user-labelled maps; writes ``cnn/`` (model.safetensors, config.json).

    params ([`PatternCNNParams`][headcount.experiments.studies.lottery.config.PatternCNNParams]): maps, labels (paths), epochs, seed, holdout, batch_size,
    lr, architecture, size, digests. Trains on the job's device (``$HEADCOUNT_DEVICE``, else auto).

    >>> pattern_cnn_job({"maps": "maps.safetensors", "labels": "labels.csv"}, {}, out, print)  # doctest: +SKIP
    {'train_accuracy': 0.98, 'heldout_accuracy': 0.9, ...}
    """
    p = job_params(PatternCNNParams, params)
    x, y = load_labelled_maps(p.maps, p.labels)
    model, metrics = train_pattern_cnn(x, y, seed=p.seed, epochs=p.epochs, holdout=p.holdout, batch_size=p.batch_size,
                                       lr=p.lr, architecture=p.architecture, size=p.size, device=resolve_device(None))
    save_pattern_cnn(model, workdir / "cnn")
    progress(1, 1, f"CNN held-out accuracy {metrics['heldout_accuracy']}")
    return {**metrics, "input_size": int(x.shape[1])}


def stability_job(params, inputs, workdir: Path, progress) -> dict:
    """Stability of the good masks of one task across seeds
    ([`headcount.analysis.subnetworks.seed_stability`][headcount.analysis.subnetworks.seed_stability]): Krippendorff's alpha, Cochran's Q,
    pairwise Jaccard, for heads, MLPs and both; how often each head/MLP survives; the super-survivors.

    inputs: one prune job (``mask.json``) per seed.

    >>> stability_job({}, {"s0": prune_seed1, "s1": prune_seed2}, out, print)["heads"]["krippendorff_alpha"]  # doctest: +SKIP
    0.21
    """
    names = sorted(inputs)
    out = {"seeds": names, **seed_stability(*_masks_of(inputs, names))}
    progress(1, 1, f"alpha {out['heads']['krippendorff_alpha']}")
    return _clean(out)


def overlap_job(params, inputs, workdir: Path, progress) -> dict:
    """Overlap of good subnetworks across tasks ([`headcount.analysis.subnetworks.cross_task_overlap`][headcount.analysis.subnetworks.cross_task_overlap]):
    mean Jaccard of kept heads (and MLPs) over all seed pairs of two tasks, and of their super-survivors.

    params ([`OverlapParams`][headcount.experiments.studies.lottery.config.OverlapParams]): tasks (names, in order), seeds.
    inputs: ``t{i}-s{j}`` -> prune job of task i, seed j.

    >>> overlap_job({"tasks": ["a", "b"], "seeds": [1]}, {"t0-s0": pa, "t1-s0": pb}, out, print)["heads_jaccard"]  # doctest: +SKIP
    [[None, 0.42], [0.42, None]]
    """
    p = job_params(OverlapParams, params)
    per_task = [_masks_of(inputs, [f"t{i}-s{j}" for j in range(len(p.seeds))]) for i in range(len(p.tasks))]
    ov = cross_task_overlap(np.stack([h for h, _ in per_task]), np.stack([m for _, m in per_task]))
    progress(1, 1, "overlap")
    return _clean({"tasks": p.tasks, **ov})
