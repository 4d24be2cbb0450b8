"""The lottery study (Prasanna, Rogers & Rumshisky 2020, "When BERT Plays the Lottery, All
Tickets Are Winning"): good, random and bad subnetworks, and what their heads attend to.

Per task and seed the study

1. fine-tunes the full model (``finetune``);
2. finds the *good* structured subnetwork by iterative pruning of heads and MLPs with the
   Prasanna schedule until the dev metric falls below ``threshold`` x the full model's
   (``prune``; importance and stop rule on the dev set, as the paper's code does);
3. evaluates the good subnetwork on the fine-tuned weights without retraining (``evaluate``:
   the mask as gates);
4. draws a *random* subnetwork (as many heads and MLPs, uniformly; or the paper's Bernoulli
   draw, ``random: bernoulli``) and a *bad* one (drawn from the pruned components, topped up
   with random good ones when the good set is larger: Prasanna's rule) and retrains good,
   random and bad from the **pre-trained** weights, physically pruned (``lottery.retrain``);
5. magnitude pruning (``lottery.magnitude``): iterative magnitude pruning (IMP, global L1 over
   the Prasanna weights) gives the good weight mask; random and bad masks at exactly the same
   sparsity; each retrained from the pre-trained weights;
6. classifies every head of the fine-tuned model into the five Kovaleva et al. (2019) pattern
   classes with the rule-based classifier on mean attention maps (``lottery.patterns``), and
   with a CNN trained on user-labelled maps when the config names them (``lottery.pattern-cnn``).

Across seeds, per task: super-survivors (components every seed keeps) with size-matched random
and bad controls, each retrained (``lottery.subnetwork`` + ``lottery.retrain``); mask stability
(Krippendorff's alpha, Cochran's Q, pairwise Jaccard; ``lottery.stability``). Across tasks: the
overlap of good subnetworks (``lottery.overlap``).

The maths lives elsewhere: :mod:`headcount.pruning` (the loop), :mod:`headcount.magnitude`
(IMP and its controls), :mod:`headcount.training` (retraining), :mod:`headcount.analysis`
(controls, stability, super-survivors, pattern classes). This module only wires them into jobs
and draws the report from saved results.

Composable: :func:`lottery_jobs` returns the jobs of a :class:`LotterySettings` under a name
prefix and :func:`lottery_sections` the report sections for them, so another study type (the
demo) can include a lottery part::

    class DemoConfig(StudyConfig):
        lottery: LotterySettings | None = None

    def expand(config):
        return [..., *lottery_jobs(config.lottery, prefix="lottery/")]
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..errors import HeadcountError
from ..runner import ConfigSection, Job, StudyConfig, register_study
from .jobs import step_messages

HERE = "headcount.studies.lottery"
JOBS = "headcount.studies.jobs"

#: Rows of the paper's main table, in order: (experiment, pruning kind).
EXPERIMENTS: tuple[tuple[str, str], ...] = (
    ("full", "none"),
    ("good pruned", "structured"),
    ("good retrained", "structured"),
    ("random retrained", "structured"),
    ("bad retrained", "structured"),
    ("magnitude good retrained", "magnitude"),
    ("magnitude random retrained", "magnitude"),
    ("magnitude bad retrained", "magnitude"),
)

#: Rows of the super-survivor table (retrained from the pre-trained weights).
SUPER_EXPERIMENTS: tuple[str, ...] = ("super-survivors retrained", "super random retrained", "super bad retrained")

_CONTROL_IDS = {"random": 1, "bad": 2}


# =============================================================================================
# config
# =============================================================================================
def _resolve_path(value: str, info: ValidationInfo) -> str:
    """A relative path that exists next to the config file becomes absolute; names stay names."""
    base = (info.context or {}).get("base_dir") if info is not None else None
    if base is None or not value or os.path.isabs(value):
        return value
    candidate = Path(base) / value
    return str(candidate.resolve()) if candidate.exists() else value


class TrainSettings(ConfigSection):
    """Fine-tuning / retraining hyper-parameters (:class:`headcount.training.TrainConfig`).

    Defaults are Prasanna et al.'s: lr 2e-5, batch 32, 3 epochs, max length 128, no weight
    decay, no warm-up, clipping at 1.0. ``max_train_examples`` / ``max_eval_examples`` take
    subsets (drawn with ``data_seed``, the same for every seed); the dev subset is also what
    pruning, the no-retraining evaluation and the pattern maps use.
    """

    lr: float = 2e-5
    batch_size: int = 32
    epochs: float = 3
    max_length: int = 128
    weight_decay: float = 0.0
    warmup: float = 0.0
    max_grad_norm: float = 1.0
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    eval_batch_size: int = 64
    max_steps: int | None = None
    gradient_accumulation_steps: int = 1
    data_seed: int = 0
    bf16: bool | None = None
    eval_each_epoch: bool = True
    save_steps: int = 500

    @model_validator(mode="after")
    def _valid(self):
        from ..training import TrainConfig

        try:
            TrainConfig(**self.model_dump())
        except HeadcountError as e:
            raise ValueError(str(e)) from None
        return self


class PruningSettings(ConfigSection):
    """Structured pruning to the good subnetwork (:func:`headcount.pruning.iterative_prune`).

    Attributes:
        threshold: keep the last mask whose dev metric is >= threshold x the full model's.
        step: fraction of the heads removed per step (with one MLP per step in the joint phase).
        step_of: ``total`` (Prasanna: int(0.1 x 144) = 14 heads a step) or ``remaining``.
        schedule: ``prasanna`` (joint heads+MLPs, then heads at half the step, then MLPs) or ``heads``.
        importance: which split the importance scores use: ``validation`` (the paper's code)
            or ``train``.
        max_examples: examples for importance (default: the dev subset ``train.max_eval_examples``).
        batch_size: importance batch size (the paper: 64).
        method: importance method (``gradient``: sum of |dL/dgate| per batch).
        normalize: ``layer+global`` (the paper: layer-wise L2 for heads, then global min-max).
        max_steps: optional cap on pruning steps.
    """

    threshold: float = Field(0.9, gt=0, le=1)
    step: float = Field(0.1, gt=0, lt=1)
    step_of: Literal["total", "remaining"] = "total"
    schedule: Literal["prasanna", "heads"] = "prasanna"
    importance: Literal["validation", "train"] = "validation"
    max_examples: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)
    method: Literal["gradient", "gradient-token"] = "gradient"
    normalize: Literal["none", "layer", "layer+global"] = "layer+global"
    max_steps: int | None = Field(None, ge=1)


class MagnitudeSettings(ConfigSection):
    """Magnitude pruning (:func:`headcount.magnitude.magnitude_prune`): IMP good, then random
    and bad masks at exactly the good mask's sparsity; all retrained from the pre-trained weights.

    Attributes:
        enabled: run the magnitude part.
        rounds: at most this many IMP rounds (each one retraining; the paper: 10).
        rate: fraction of the remaining weights pruned per round (the paper: 0.1).
        threshold: stop below threshold x the full model's metric.
        variant: ``prasanna`` (Q, K, V, O, intermediate and output weights + biases) or ``chen``.
        schedule: ``remaining`` (1 - (1 - rate)^k) or ``original`` (k x rate).
    """

    enabled: bool = True
    rounds: int = Field(10, ge=1)
    rate: float = Field(0.1, gt=0, lt=1)
    threshold: float = Field(0.9, ge=0)
    variant: Literal["prasanna", "chen"] = "prasanna"
    schedule: Literal["remaining", "original"] = "remaining"


class SuperSurvivorSettings(ConfigSection):
    """Super-survivors: heads and MLPs kept by the good subnetwork of every seed.

    Attributes:
        enabled: compute them (and the mask stability statistics).
        retrain: retrain the super-survivor subnetwork and its size-matched random (uniform)
            and bad controls from the pre-trained weights.
        seeds: training seeds of those retrainings (default: every seed of the study).
        draw_seed: seed of the random and bad draws.
    """

    enabled: bool = True
    retrain: bool = True
    seeds: list[int] | None = None
    draw_seed: int = 0


class PatternCNNSettings(ConfigSection):
    """The pattern CNN of Prasanna et al., trained on user-labelled maps (see ``headcount
    patterns train``): ``maps`` a .safetensors with ``maps`` [N, S, S], ``labels`` a .csv/.json."""

    maps: str
    labels: str
    epochs: int = Field(30, ge=1)
    seed: int = 0
    holdout: float = Field(0.2, ge=0, le=0.9)

    @field_validator("maps", "labels")
    @classmethod
    def _paths(cls, v: str, info: ValidationInfo) -> str:
        return _resolve_path(v, info)


class PatternSettings(ConfigSection):
    """Self-attention patterns of the fine-tuned full model, per head.

    Attributes:
        enabled: classify the heads.
        max_examples: dev examples whose attention maps are averaged.
        batch_size: examples per forward pass.
        max_length: tokens per example (default: ``train.max_length``).
        size: side of the fixed-size mean maps (:func:`headcount.analysis.patterns.mean_attention_maps`).
        cnn: optional labelled maps to train the CNN on; its labels are reported beside the rules'.
    """

    enabled: bool = True
    max_examples: int = Field(64, ge=1)
    batch_size: int = Field(16, ge=1)
    max_length: int | None = Field(None, ge=8)
    size: int = Field(32, ge=8)
    cnn: PatternCNNSettings | None = None


class LotterySettings(ConfigSection):
    """Everything a lottery study (or the lottery part of another study) needs.

    Attributes:
        model: the pre-trained model (hub id, local directory, or ``offline``).
        tasks: task names or task YAML paths (relative paths: next to the config file).
        seeds: training seeds; each gives its own fine-tuning, good subnetwork and controls.
        random: ``uniform`` (as many heads and MLPs as the good subnetwork, drawn uniformly) or
            ``bernoulli`` (the paper: each kept with p = the good subnetwork's kept fraction).
        train: :class:`TrainSettings`.
        pruning: :class:`PruningSettings`.
        magnitude: :class:`MagnitudeSettings`.
        super_survivors: :class:`SuperSurvivorSettings`.
        patterns: :class:`PatternSettings`.
        keep_models: keep the checkpoints of retrained subnetworks (default: only metrics; the
            fine-tuned full models are always kept, later jobs read them).

    >>> LotterySettings(tasks=["offline/movies"], seeds=[1, 2]).random
    'uniform'
    """

    model: str = "offline"
    tasks: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    random: Literal["uniform", "bernoulli"] = "uniform"
    train: TrainSettings = TrainSettings()
    pruning: PruningSettings = PruningSettings()
    magnitude: MagnitudeSettings = MagnitudeSettings()
    super_survivors: SuperSurvivorSettings = SuperSurvivorSettings()
    patterns: PatternSettings = PatternSettings()
    keep_models: bool = False

    @field_validator("model")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        return _resolve_path(v, info)

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: list[str], info: ValidationInfo) -> list[str]:
        from ..tasks import get_task

        out = [_resolve_path(t, info) for t in v]
        for t in out:
            try:
                get_task(t)
            except HeadcountError as e:
                raise ValueError(str(e)) from None
        names = [get_task(t).name for t in out]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks must be distinct (got {names})")
        return out

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct (got {v})")
        return v

    @model_validator(mode="after")
    def _super_seeds(self):
        s = self.super_survivors.seeds
        if s is not None and (not s or len(set(s)) != len(s)):
            raise ValueError("super_survivors.seeds must be a non-empty list of distinct seeds")
        return self


class LotteryConfig(StudyConfig, LotterySettings):
    """The ``study: lottery`` config: :class:`LotterySettings` plus ``study``, ``name``, ``description``.

    >>> LotteryConfig(study="lottery", tasks=["offline/movies"], seeds=[1]).model
    'offline'
    """


# =============================================================================================
# helpers shared by jobs and report
# =============================================================================================
def task_name(task: str) -> str:
    """The registered name of a task (its YAML ``name`` for a file), used in job names.

    >>> task_name("offline/movies")
    'offline/movies'
    """
    from ..tasks import get_task

    return get_task(task).name


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


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a finished directory by hard links (a plain copy across file systems)."""

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def _file_digest(path: str) -> str | None:
    p = Path(path)
    if not p.is_file():
        return None
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


# =============================================================================================
# job functions (the runner's signature: (params, inputs, workdir, progress) -> dict)
# =============================================================================================
def subnetwork_job(params, inputs, workdir: Path, progress) -> dict:
    """A head/MLP subnetwork derived from good masks; writes ``mask.json``.

    params: ``kind``: ``random`` or ``bad`` (a control of the upstream ``good`` mask, drawn
    separately for heads and MLPs with :func:`headcount.analysis.draw_controls`), or ``super``
    (the super-survivors: kept in every upstream mask, :func:`headcount.analysis.super_survivors`);
    ``mode``: ``uniform`` | ``bernoulli`` (random only); ``seed``: the draw seed.
    inputs: ``good`` (a job with ``mask.json``), or for ``super`` any number of them.

    >>> subnetwork_job({"kind": "super"}, {}, Path("."), None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.errors.HeadcountError: a super-survivor subnetwork needs at least one good mask
    """
    from ..analysis import draw_controls, super_survivors
    from ..masks import Mask

    kind = params["kind"]
    if kind == "super":
        masks = [Mask.load(r.path("mask.json")) for _, r in sorted(inputs.items())]
        if not masks:
            raise HeadcountError("a super-survivor subnetwork needs at least one good mask")
        heads = super_survivors(np.stack([m.heads.numpy() for m in masks]))
        mlps = super_survivors(np.stack([m.mlps.numpy() for m in masks]))
        meta = {"kind": "super", "n_masks": len(masks)}
    elif kind in ("random", "bad"):
        good = Mask.load(inputs["good"].path("mask.json"))
        mode = params.get("mode", "uniform")
        drawn = draw_controls({"heads": good.heads.numpy(), "mlps": good.mlps.numpy()}, kind,
                              seed=control_rng(int(params.get("seed", 0)), kind), mode=mode)
        heads, mlps = drawn["heads"], drawn["mlps"]
        meta = {"kind": kind, "mode": mode if kind == "random" else None, "seed": int(params.get("seed", 0)),
                "good_heads_kept": good.n_heads_kept, "good_mlps_kept": good.n_mlps_kept}
    else:
        raise HeadcountError(f"unknown subnetwork kind {kind!r}; use 'random', 'bad' or 'super'")
    mask = Mask(heads, mlps, {k: v for k, v in meta.items() if v is not None})
    mask.save(workdir / "mask.json")
    progress(1, 1, f"{kind}: {mask.n_heads_kept} heads, {mask.n_mlps_kept} MLPs")
    return {"mask": mask.to_dict(), "heads_kept": mask.n_heads_kept, "mlps_kept": mask.n_mlps_kept}


def retrain_job(params, inputs, workdir: Path, progress) -> dict:
    """Retrain a subnetwork from the pre-trained weights: :func:`headcount.studies.jobs.finetune_job`
    with an upstream ``mask`` (physically pruned) or ``weight_mask``; the checkpoint is removed
    afterwards unless ``params["keep_model"]`` (nothing downstream reads it).

    >>> retrain_job({"model": "offline", "task": "offline/movies", "seed": 1}, {"mask": good}, out, print)  # doctest: +SKIP
    {'final': {'score': 0.81, ...}, 'mask': {'heads_kept': 41, ...}, ...}
    """
    from .jobs import finetune_job

    params = dict(params)
    keep = bool(params.pop("keep_model", False))
    metrics = finetune_job(params, inputs, workdir, progress)
    if not keep:
        shutil.rmtree(workdir / "model", ignore_errors=True)
    return metrics


def magnitude_job(params, inputs, workdir: Path, progress) -> dict:
    """Magnitude pruning with retraining from the pre-trained weights (:func:`headcount.magnitude.magnitude_prune`).

    params: model (pre-trained), task, seed, train (TrainConfig fields), magnitude
    (MagnitudeConfig fields), control (``good`` | ``random`` | ``bad``), keep_models.
    inputs: ``full`` (the finished full fine-tuning of this seed, reused as IMP's round 0) for
    ``good``; ``match`` (the good magnitude job) for ``random`` and ``bad``, which prune once to
    exactly its sparsity, ranking the same fine-tuned weights.
    Writes ``weight_mask.safetensors``, ``trace.csv``, ``magnitude.json``, ``full/``, ``round_XX/``.

    >>> magnitude_job({"model": "offline", "task": "offline/movies", "control": "bad"},
    ...               {"match": good_magnitude}, out, print)["sparsity"]            # doctest: +SKIP
    0.3
    """
    from ..magnitude import MagnitudeConfig, magnitude_prune
    from ..training import TrainConfig

    cfg = MagnitudeConfig(**params.get("magnitude", {}), control=params.get("control", "good"))
    match = None
    if "match" in inputs:
        match = inputs["match"].dir
    elif "full" in inputs:  # IMP's round 0 is exactly the full fine-tuning job: reuse it
        full = inputs["full"]
        (workdir / "full").mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "metrics.json"):
            shutil.copy2(full.path(name), workdir / "full" / name)
        _link_tree(full.path("model"), workdir / "full" / "model")
    summary = magnitude_prune(params["model"], params["task"], config=cfg, train=TrainConfig(**params.get("train", {})),
                              seed=int(params.get("seed", 0)), out_dir=workdir, match=match,
                              progress=step_messages(progress))
    if not params.get("keep_models", False):
        for d in workdir.glob("round_*"):
            shutil.rmtree(d / "model", ignore_errors=True)
    return summary


def _special_ids(tokenizer) -> set[int]:
    """Ids of the tokens that open, separate and close sequences (not padding or unknown)."""
    ids = {getattr(tokenizer, f"{name}_token_id", None) for name in ("cls", "sep", "bos", "eos")}
    return {int(i) for i in ids if i is not None}


def patterns_job(params, inputs, workdir: Path, progress) -> dict:
    """Pattern class of every head of a (fine-tuned) model from its mean attention maps.

    Attention probabilities of dev examples (:func:`headcount.attention.attention_maps`, eval
    mode) are placed on a fixed ``size`` x ``size`` layout per example
    (:func:`headcount.analysis.patterns.resample_attention`) and averaged over the examples of the
    most common structure (e.g. ``[CLS] text [SEP]``) with
    :func:`headcount.analysis.patterns.mean_attention_maps`; each head's mean map is classified
    with the rule-based classifier, and with the CNN when an upstream ``cnn`` job is given.

    params: model / upstream ``model``, task, split, data (DataConfig fields), size.
    Writes ``maps.safetensors`` (``maps`` [n_layers, n_heads, size, size]) and ``patterns.json``.

    >>> patterns_job({"task": "offline/movies", "size": 32}, {"model": full}, out, print)["counts"]  # doctest: +SKIP
    {'vertical': 30, 'diagonal': 9, 'vertical+diagonal': 4, 'block': 0, 'heterogeneous': 29}
    """
    import torch
    from safetensors.torch import save_file

    from ..analysis.patterns import mean_attention_maps, predict_patterns, resample_attention
    from ..attention import attention_maps
    from ..io import atomic_path, atomic_write_json
    from ..pipeline import DataConfig, batches_for, load_for
    from ..tasks import get_task
    from .jobs import model_spec

    task = get_task(params["task"])
    data = DataConfig(**params.get("data", {}))
    size = int(params.get("size", 32))
    model, tokenizer, _ = load_for(model_spec(params, inputs), task, "task", seed=data.seed)
    model.eval()
    batches = batches_for(task, tokenizer, "task", data, split=params.get("split") or task.validation_split)
    specials = _special_ids(tokenizer)
    # one list of fixed-size maps per structure; a fixed-size map laid out again on the same
    # layout is unchanged, so mean_attention_maps averages these exactly as the raw maps
    by_structure: dict[tuple, list] = {}
    cells_of: dict[tuple, tuple] = {}
    n_seen = 0
    with torch.no_grad():
        for b, batch in enumerate(batches):
            feed = {k: v for k, v in batch.items() if k != "labels"}
            per_layer = attention_maps(model, **feed)  # per layer [batch, heads, seq, seq]
            if any(m.shape[1] != per_layer[0].shape[1] for m in per_layer):
                raise HeadcountError("pattern maps need every head present (classify the unpruned model)")
            att = torch.stack(per_layer, 1)  # [batch, layer, head, seq, seq]
            for i in range(att.shape[0]):
                n = int(batch["attention_mask"][i].sum())
                ids = batch["input_ids"][i, :n].tolist()
                sp = [p for p, t in enumerate(ids) if t in specials]
                a = att[i, :, :, :n, :n]
                a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
                try:
                    maps, cells, _, sig = resample_attention(a, sp, size)
                except HeadcountError:
                    continue  # a structure the map size cannot hold
                by_structure.setdefault(sig, []).append(maps)
                cells_of[sig] = cells
                n_seen += 1
            progress(b + 1, len(batches), "attention maps")
    if not by_structure:
        raise HeadcountError(f"no example of {task.name} fits a {size} x {size} map")
    sig = max(by_structure, key=lambda s: (len(by_structure[s]), s))
    chosen = by_structure[sig]
    mean = mean_attention_maps(chosen, [cells_of[sig]] * len(chosen), size=size)
    rules = mean.classify()
    with atomic_path(workdir / "maps.safetensors") as tmp:
        save_file({"maps": mean.maps.contiguous()}, str(tmp))
    out = {
        "task": task.name,
        "labels": rules.labels.tolist(),
        "counts": rules.counts(),
        "features": rules.to_dict()["features"],
        "structure": "/".join(sig),
        "special_cells": list(mean.special_positions),
        "n_examples": len(chosen),
        "n_other_structures": n_seen - len(chosen),
        "size": size,
    }
    if "cnn" in inputs:
        from ..analysis.patterns import load_pattern_cnn

        cnn = load_pattern_cnn(inputs["cnn"].path("cnn"))
        out["cnn_labels"] = predict_patterns(cnn, mean.maps).tolist()
    atomic_write_json(workdir / "patterns.json", out)
    return out


def pattern_cnn_job(params, inputs, workdir: Path, progress) -> dict:
    """Train the pattern CNN on user-labelled maps; writes ``cnn/`` (model.safetensors, config.json).

    params: maps, labels (paths), epochs, seed, holdout.

    >>> pattern_cnn_job({"maps": "maps.safetensors", "labels": "labels.csv"}, {}, out, print)  # doctest: +SKIP
    {'train_accuracy': 0.98, 'heldout_accuracy': 0.9, ...}
    """
    from ..analysis.patterns import load_labelled_maps, save_pattern_cnn, train_pattern_cnn

    x, y = load_labelled_maps(params["maps"], params["labels"])
    model, metrics = train_pattern_cnn(x, y, seed=int(params.get("seed", 0)), epochs=int(params.get("epochs", 30)),
                                       holdout=float(params.get("holdout", 0.2)))
    save_pattern_cnn(model, workdir / "cnn")
    progress(1, 1, f"CNN held-out accuracy {metrics['heldout_accuracy']}")
    return {**metrics, "size": int(x.shape[1])}


def _masks_of(inputs) -> tuple[list[str], np.ndarray, np.ndarray]:
    from ..masks import Mask

    names = sorted(inputs)
    masks = [Mask.load(inputs[n].path("mask.json")) for n in names]
    return names, np.stack([m.heads.numpy() for m in masks]), np.stack([m.mlps.numpy() for m in masks])


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


def stability_job(params, inputs, workdir: Path, progress) -> dict:
    """Stability of the good masks of one task across seeds (:func:`headcount.analysis.mask_stability`):
    Krippendorff's alpha, Cochran's Q, pairwise Jaccard, for heads, MLPs and both; how often
    each head/MLP survives; the super-survivors.

    inputs: one prune job (``mask.json``) per seed.

    >>> stability_job({}, {"s0": prune_seed1, "s1": prune_seed2}, out, print)["heads"]["krippendorff_alpha"]  # doctest: +SKIP
    0.21
    """
    from ..analysis import mask_stability, pairwise_jaccard, super_survivors

    names, heads, mlps = _masks_of(inputs)
    both = np.concatenate([heads.reshape(len(names), -1), mlps], axis=1)
    out = {
        "seeds": names,
        "heads": mask_stability(heads),
        "mlps": mask_stability(mlps),
        "all": mask_stability(both),
        "heads_pairwise_jaccard": pairwise_jaccard(heads),
        "head_survival": heads.mean(axis=0),
        "mlp_survival": mlps.mean(axis=0),
        "super_heads": super_survivors(heads),
        "super_mlps": super_survivors(mlps),
    }
    progress(1, 1, f"alpha {out['heads']['krippendorff_alpha']}")
    return _clean(out)


def _nanmean(values) -> float:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def overlap_job(params, inputs, workdir: Path, progress) -> dict:
    """Overlap of good subnetworks across tasks: mean Jaccard of kept heads (and MLPs) over all
    seed pairs of two tasks (:func:`headcount.analysis.jaccard`), and of their super-survivors.

    params: tasks (names, in order), seeds. inputs: ``t{i}-s{j}`` -> prune job of task i, seed j.

    >>> overlap_job({"tasks": ["a", "b"], "seeds": [1]}, {"t0-s0": pa, "t1-s0": pb}, out, print)["heads_jaccard"]  # doctest: +SKIP
    [[None, 0.42], [0.42, None]]
    """
    from ..analysis import jaccard, super_survivors
    from ..masks import Mask

    tasks, seeds = params["tasks"], params["seeds"]
    masks = {(i, j): Mask.load(inputs[f"t{i}-s{j}"].path("mask.json")) for i in range(len(tasks)) for j in range(len(seeds))}
    n = len(tasks)
    heads = np.full((n, n), math.nan)
    mlps = np.full((n, n), math.nan)
    sup = np.full((n, n), math.nan)
    supers = [super_survivors(np.stack([masks[i, j].heads.numpy() for j in range(len(seeds))])) for i in range(n)]
    for a in range(n):
        for b in range(n):
            pairs = [(s, t) for s in range(len(seeds)) for t in range(len(seeds)) if a != b or s != t]
            if not pairs:
                continue
            heads[a, b] = _nanmean([jaccard(masks[a, s].heads.numpy(), masks[b, t].heads.numpy()) for s, t in pairs])
            mlps[a, b] = _nanmean([jaccard(masks[a, s].mlps.numpy(), masks[b, t].mlps.numpy()) for s, t in pairs])
            sup[a, b] = jaccard(supers[a], supers[b])
    progress(1, 1, "overlap")
    return _clean({"tasks": tasks, "heads_jaccard": heads, "mlps_jaccard": mlps, "super_heads_jaccard": sup})


# =============================================================================================
# expand: config -> jobs
# =============================================================================================
def _train_params(s: LotterySettings) -> dict:
    return s.train.model_dump(mode="json")


def _eval_data(s: LotterySettings) -> dict:
    """The dev subset every evaluation uses: the one fine-tuning reports on."""
    return {"max_examples": s.train.max_eval_examples, "batch_size": s.train.eval_batch_size,
            "max_length": s.train.max_length, "seed": s.train.data_seed}


def _validation_split(task: str) -> str:
    from ..tasks import get_task

    return get_task(task).validation_split


def job_name(prefix: str, *parts) -> str:
    """The name of a lottery job: ``prefix`` + parts joined with ``/``.

    >>> job_name("lottery/", "prune", "offline/movies", "seed1")
    'lottery/prune/offline/movies/seed1'
    """
    return prefix + "/".join(str(p) for p in parts)


def lottery_jobs(settings: LotterySettings, prefix: str = "") -> list[Job]:
    """The jobs of a lottery study (or of the lottery part of another study).

    Names: ``{prefix}finetune/{task}/seed{s}``, ``{prefix}prune/...``, ``{prefix}good-pruned/...``,
    ``{prefix}subnetwork/{random|bad}/...``, ``{prefix}retrain/{good|random|bad}/...``,
    ``{prefix}magnitude/{good|random|bad}/...``, ``{prefix}patterns/...``,
    ``{prefix}subnetwork/{super|super-random|super-bad}/{task}``,
    ``{prefix}retrain/{super|super-random|super-bad}/{task}/seed{s}``,
    ``{prefix}stability/{task}``, ``{prefix}overlap``, ``{prefix}pattern-cnn``.
    The full fine-tuning, pruning and evaluation are the shared jobs of
    :mod:`headcount.studies.jobs` (same parameters, same keys: another study's identical
    fine-tuning is computed once).

    Args:
        settings: a :class:`LotterySettings` (a :class:`LotteryConfig` is one).
        prefix: prepended to every job name (e.g. ``"lottery/"`` inside a demo study).

    Returns:
        The jobs (their dependencies are included by the plan).

    >>> jobs = lottery_jobs(LotterySettings(tasks=["offline/movies"], seeds=[1], magnitude={"enabled": False},
    ...                                     patterns={"enabled": False}, super_survivors={"enabled": False}))
    >>> sorted(j.kind for j in jobs)[:3]
    ['evaluate', 'finetune', 'lottery.retrain']
    """
    s = settings
    train = _train_params(s)
    eval_data = _eval_data(s)
    jobs: list[Job] = []
    prunes: dict[tuple[int, int], Job] = {}
    cnn = None
    if s.patterns.enabled and s.patterns.cnn is not None:
        c = s.patterns.cnn
        cnn = Job(job_name(prefix, "pattern-cnn"), "lottery.pattern-cnn", f"{HERE}:pattern_cnn_job",
                  {"maps": c.maps, "labels": c.labels, "epochs": c.epochs, "seed": c.seed, "holdout": c.holdout,
                   "digests": [_file_digest(c.maps), _file_digest(c.labels)]})
        jobs.append(cnn)
    for ti, task in enumerate(s.tasks):
        tname = task_name(task)
        val = _validation_split(task)
        for si, seed in enumerate(s.seeds):
            tag = f"seed{seed}"
            full = Job(job_name(prefix, "finetune", tname, tag), "finetune", f"{JOBS}:finetune_job",
                       {"model": s.model, "task": task, "seed": seed, "train": train})
            p = s.pruning
            imp_data = {**eval_data, "batch_size": p.batch_size}
            if p.max_examples is not None:
                imp_data["max_examples"] = p.max_examples
            prune_params = {
                "task": task, "objective": "task", "method": p.method, "normalize": p.normalize,
                "prune": {"threshold": p.threshold, "step": p.step, "step_of": p.step_of, "schedule": p.schedule,
                          "max_steps": p.max_steps},
                "data": imp_data, "eval_data": eval_data,
                "importance_split": val if p.importance == "validation" else None, "stop_split": val,
            }
            prune = Job(job_name(prefix, "prune", tname, tag), "prune", f"{JOBS}:prune_job", prune_params,
                        deps={"model": full})
            prunes[ti, si] = prune
            good_pruned = Job(job_name(prefix, "good-pruned", tname, tag), "evaluate", f"{JOBS}:evaluate_job",
                              {"task": task, "objective": "task", "split": val, "data": eval_data},
                              deps={"model": full, "mask": prune})
            jobs += [full, prune, good_pruned]
            subnets = {"good": prune}
            for kind in ("random", "bad"):
                subnets[kind] = Job(job_name(prefix, "subnetwork", kind, tname, tag), "lottery.subnetwork",
                                    f"{HERE}:subnetwork_job",
                                    {"kind": kind, "seed": seed, **({"mode": s.random} if kind == "random" else {})},
                                    deps={"good": prune})
            for kind, mask_job in subnets.items():
                jobs.append(Job(job_name(prefix, "retrain", kind, tname, tag), "lottery.retrain", f"{HERE}:retrain_job",
                                {"model": s.model, "task": task, "seed": seed, "train": train, "mask_mode": "prune",
                                 "keep_model": s.keep_models},
                                deps={"mask": mask_job}))
            if s.magnitude.enabled:
                m = s.magnitude
                mag = {"rounds": m.rounds, "rate": m.rate, "threshold": m.threshold, "variant": m.variant,
                       "schedule": m.schedule}
                base = {"model": s.model, "task": task, "seed": seed, "train": train, "magnitude": mag,
                        "keep_models": s.keep_models}
                good = Job(job_name(prefix, "magnitude", "good", tname, tag), "lottery.magnitude",
                           f"{HERE}:magnitude_job", {**base, "control": "good"}, deps={"full": full})
                jobs.append(good)
                for kind in ("random", "bad"):
                    jobs.append(Job(job_name(prefix, "magnitude", kind, tname, tag), "lottery.magnitude",
                                    f"{HERE}:magnitude_job", {**base, "control": kind}, deps={"match": good}))
            if s.patterns.enabled:
                pt = s.patterns
                jobs.append(Job(job_name(prefix, "patterns", tname, tag), "lottery.patterns", f"{HERE}:patterns_job",
                                {"task": task, "split": val, "size": pt.size,
                                 "data": {"max_examples": pt.max_examples, "batch_size": pt.batch_size,
                                          "max_length": pt.max_length or s.train.max_length,
                                          "seed": s.train.data_seed}},
                                deps={"model": full, **({"cnn": cnn} if cnn is not None else {})}))
        if s.super_survivors.enabled:
            goods = {f"s{si}": prunes[ti, si] for si in range(len(s.seeds))}
            jobs.append(Job(job_name(prefix, "stability", tname), "lottery.stability", f"{HERE}:stability_job", {},
                            deps=goods))
            sup = Job(job_name(prefix, "subnetwork", "super", tname), "lottery.subnetwork", f"{HERE}:subnetwork_job",
                      {"kind": "super"}, deps=goods)
            masks = {"super": sup}
            for kind in ("random", "bad"):
                masks[f"super-{kind}"] = Job(
                    job_name(prefix, "subnetwork", f"super-{kind}", tname), "lottery.subnetwork",
                    f"{HERE}:subnetwork_job",
                    {"kind": kind, "seed": s.super_survivors.draw_seed, **({"mode": "uniform"} if kind == "random" else {})},
                    deps={"good": sup})
            jobs += list(masks.values())
            if s.super_survivors.retrain:
                for seed in s.super_survivors.seeds or s.seeds:
                    for kind, mask_job in masks.items():
                        jobs.append(Job(job_name(prefix, "retrain", kind, tname, f"seed{seed}"), "lottery.retrain",
                                        f"{HERE}:retrain_job",
                                        {"model": s.model, "task": task, "seed": seed, "train": train,
                                         "mask_mode": "prune", "keep_model": s.keep_models},
                                        deps={"mask": mask_job}))
    if len(s.tasks) > 1:
        deps = {f"t{ti}-s{si}": j for (ti, si), j in prunes.items()}
        jobs.append(Job(job_name(prefix, "overlap"), "lottery.overlap", f"{HERE}:overlap_job",
                        {"tasks": [task_name(t) for t in s.tasks], "seeds": list(s.seeds)}, deps=deps))
    return jobs


def expand(config: LotteryConfig) -> list[Job]:
    """``expand_fn`` of the ``lottery`` study type: :func:`lottery_jobs` without a prefix.

    >>> len(expand(LotteryConfig(study="lottery", tasks=["offline/movies"], seeds=[1, 2]))) > 10
    True
    """
    return lottery_jobs(config)


# =============================================================================================
# report: saved results -> tables and figures
# =============================================================================================
def _get(store, name):
    """A finished job's result, or None (a missing or unfinished job leaves a gap, not an error)."""
    try:
        return store.result(name) if store.has(name) else None
    except HeadcountError:
        return None


def _score(r) -> float:
    if r is None:
        return math.nan
    if "final" in r.result:  # a fine-tuning's metrics.json
        return float(r.result["final"].get("score", math.nan))
    if "score" in r.result:  # an evaluation
        return float(r.result["score"])
    if "metric" in r.result:  # a magnitude summary
        return float(r.result["metric"])
    return math.nan


def seed_scores(store, settings: LotterySettings, prefix: str = ""):
    """One row per (experiment, task, seed): score, metric, size of the subnetwork.

    Returns:
        A pandas DataFrame with columns experiment, pruning, task, seed, metric, score,
        heads_kept, mlps_kept, sparsity.

    >>> seed_scores(RunStore("runs/lottery-offline"), config).groupby("experiment")["score"].mean()  # doctest: +SKIP
    """
    import pandas as pd

    s = settings
    rows = []
    for task in s.tasks:
        tname = task_name(task)
        for seed in s.seeds:
            tag = f"seed{seed}"
            full = _get(store, job_name(prefix, "finetune", tname, tag))
            prune = _get(store, job_name(prefix, "prune", tname, tag))
            metric = full.result.get("metric") if full is not None else None
            good_mask = prune.result["mask"] if prune is not None else {}

            def row(experiment, pruning, r, heads=None, mlps=None, sparsity=None):
                rows.append({"experiment": experiment, "pruning": pruning, "task": tname, "seed": seed,
                             "metric": metric, "score": _score(r), "heads_kept": heads, "mlps_kept": mlps,
                             "sparsity": sparsity})

            row("full", "none", full)
            row("good pruned", "structured", _get(store, job_name(prefix, "good-pruned", tname, tag)),
                good_mask.get("n_heads_kept"), good_mask.get("n_mlps_kept"))
            for kind in ("good", "random", "bad"):
                r = _get(store, job_name(prefix, "retrain", kind, tname, tag))
                m = (r.result.get("mask") or {}) if r is not None else {}
                row(f"{kind} retrained", "structured", r, m.get("heads_kept"), m.get("mlps_kept"))
            if s.magnitude.enabled:
                for kind in ("good", "random", "bad"):
                    r = _get(store, job_name(prefix, "magnitude", kind, tname, tag))
                    row(f"magnitude {kind} retrained", "magnitude", r,
                        sparsity=r.result.get("sparsity") if r is not None else None)
            if s.super_survivors.enabled and s.super_survivors.retrain and seed in (s.super_survivors.seeds or s.seeds):
                for kind, label in zip(("super", "super-random", "super-bad"), SUPER_EXPERIMENTS):
                    r = _get(store, job_name(prefix, "retrain", kind, tname, tag))
                    m = (r.result.get("mask") or {}) if r is not None else {}
                    row(label, "structured", r, m.get("heads_kept"), m.get("mlps_kept"))
    return pd.DataFrame(rows, columns=["experiment", "pruning", "task", "seed", "metric", "score", "heads_kept",
                                       "mlps_kept", "sparsity"])


def summarize(scores, experiments=None):
    """Mean and sample std over seeds per (experiment, task), in the order of ``experiments``.

    Returns:
        A tidy DataFrame: experiment, pruning, task, metric, mean, std, n (seeds with a score),
        heads_kept / mlps_kept / sparsity means.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"experiment": ["full"] * 2, "pruning": ["none"] * 2, "task": ["t"] * 2, "seed": [1, 2],
    ...                    "metric": ["accuracy"] * 2, "score": [0.8, 0.9], "heads_kept": [None] * 2,
    ...                    "mlps_kept": [None] * 2, "sparsity": [None] * 2})
    >>> round(float(summarize(df)["std"][0]), 4)
    0.0707
    """
    import pandas as pd

    from ..analysis import seed_summary

    order = list(experiments or dict.fromkeys(scores["experiment"]))
    rows = []
    for exp in order:
        sub = scores[scores["experiment"] == exp]
        for task in dict.fromkeys(scores["task"]):
            t = sub[sub["task"] == task]
            if t.empty:
                continue
            st = seed_summary(t["score"].astype(float).to_numpy())

            def mean_of(col):
                v = pd.to_numeric(t[col], errors="coerce")
                return float(v.mean()) if v.notna().any() else math.nan

            rows.append({"experiment": exp, "pruning": t["pruning"].iloc[0], "task": task, "metric": t["metric"].iloc[0],
                         "mean": st["mean"], "std": st["std"], "n": st["n"], "heads_kept": mean_of("heads_kept"),
                         "mlps_kept": mean_of("mlps_kept"), "sparsity": mean_of("sparsity")})
    return pd.DataFrame(rows, columns=["experiment", "pruning", "task", "metric", "mean", "std", "n", "heads_kept",
                                       "mlps_kept", "sparsity"])


def wide_table(summary):
    """Experiments x tasks with ``mean ± std`` cells (the paper's layout).

    >>> import pandas as pd
    >>> wide_table(pd.DataFrame({"experiment": ["full"], "task": ["t"], "mean": [0.8], "std": [0.01]}))["t"][0]
    '0.800 ± 0.010'
    """
    import pandas as pd

    def cell(m, s):
        if m is None or not math.isfinite(m):
            return "-"
        return f"{m:.3f} ± {s:.3f}" if s is not None and math.isfinite(s) else f"{m:.3f}"

    tasks = list(dict.fromkeys(summary["task"]))
    rows = []
    for exp in dict.fromkeys(summary["experiment"]):
        sub = summary[summary["experiment"] == exp]
        row = {"experiment": exp}
        for t in tasks:
            r = sub[sub["task"] == t]
            row[t] = cell(float(r["mean"].iloc[0]), float(r["std"].iloc[0])) if len(r) else "-"
        rows.append(row)
    return pd.DataFrame(rows, columns=["experiment", *tasks])


def _bars(summary, experiments, title):
    from ..report import new_figure

    tasks = list(dict.fromkeys(summary["task"]))
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.6 * len(tasks)), 3.6))
    axes = np.atleast_1d(axes)
    colors = {"none": "#555555", "structured": "#4c72b0", "magnitude": "#dd8452"}
    for ax, task in zip(axes, tasks):
        sub = summary[summary["task"] == task].set_index("experiment")
        exps = [e for e in experiments if e in sub.index]
        means = [sub.loc[e, "mean"] for e in exps]
        stds = [0.0 if not math.isfinite(sub.loc[e, "std"]) else sub.loc[e, "std"] for e in exps]
        ax.bar(range(len(exps)), means, yerr=stds, capsize=3,
               color=[colors.get(sub.loc[e, "pruning"], "#8172b2") for e in exps])
        if "full" in sub.index and math.isfinite(sub.loc["full", "mean"]):
            ax.axhline(0.9 * sub.loc["full", "mean"], color="k", ls="--", lw=0.8, label="0.9 x full")
            ax.legend(fontsize=7, loc="lower left")
        ax.set_xticks(range(len(exps)))
        ax.set_xticklabels(exps, rotation=60, ha="right", fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel(str(sub["metric"].iloc[0]) if len(sub) else "")
    fig.suptitle(title, fontsize=10)
    return fig


def _survivor_figure(stab: dict[str, dict]):
    from ..report import new_figure

    tasks = list(stab)
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.8 * len(tasks)), 3.4))
    axes = np.atleast_1d(axes)
    im = None
    for ax, task in zip(axes, tasks):
        r = stab[task]
        surv = np.asarray(r["head_survival"], dtype=float)
        mlp = np.asarray(r["mlp_survival"], dtype=float)[:, None]
        grid = np.concatenate([surv, np.full_like(mlp, np.nan), mlp], axis=1)  # heads | gap | MLP
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        sup_h = np.asarray(r["super_heads"])
        for (l, h) in zip(*np.nonzero(sup_h)):
            ax.text(h, l, "*", ha="center", va="center", color="w", fontsize=8)
        for l in np.nonzero(np.asarray(r["super_mlps"]))[0]:
            ax.text(grid.shape[1] - 1, l, "*", ha="center", va="center", color="w", fontsize=8)
        n_heads = surv.shape[1]
        ax.set_xticks(list(range(n_heads)) + [n_heads + 1])
        ax.set_xticklabels([str(h) for h in range(n_heads)] + ["MLP"], fontsize=6)
        ax.set_yticks(range(surv.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{task}: kept in fraction of seeds", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=list(axes), shrink=0.8)
    return fig


def _overlap_figure(ov: dict):
    from ..report import new_figure

    tasks = ov["tasks"]
    fig, axes = new_figure(1, 2, size=(8.0, 3.6))
    for ax, key, title in ((axes[0], "heads_jaccard", "good heads (mean over seed pairs)"),
                           (axes[1], "super_heads_jaccard", "super-survivor heads")):
        m = np.array([[np.nan if v is None else v for v in row] for row in ov[key]], dtype=float)
        im = ax.imshow(m, vmin=0, vmax=1, cmap="magma")
        for i in range(len(tasks)):
            for j in range(len(tasks)):
                if math.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", color="c", fontsize=7)
        ax.set_xticks(range(len(tasks)))
        ax.set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(tasks)))
        ax.set_yticklabels(tasks, fontsize=7)
        ax.set_title(f"Jaccard: {title}", fontsize=8)
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    return fig


def _pattern_tables(store, settings, prefix):
    """(per-head table, distribution table) from the saved pattern jobs and masks."""
    import pandas as pd

    from ..analysis.patterns import CLASSES, pattern_distribution

    s = settings
    heads_rows, dist_rows = [], []
    for task in s.tasks:
        tname = task_name(task)
        sup = _get(store, job_name(prefix, "subnetwork", "super", tname)) if s.super_survivors.enabled else None
        sup_heads = np.asarray(sup.result["mask"]["heads"]) if sup is not None else None
        for seed in s.seeds:
            pt = _get(store, job_name(prefix, "patterns", tname, f"seed{seed}"))
            prune = _get(store, job_name(prefix, "prune", tname, f"seed{seed}"))
            if pt is None:
                continue
            for source in ("rules", "cnn"):
                key = "labels" if source == "rules" else "cnn_labels"
                if key not in pt.result:
                    continue
                labels = np.asarray(pt.result[key], dtype=str)
                groups = {"full model": None}
                if prune is not None:
                    groups["good subnetwork"] = np.asarray(prune.result["mask"]["heads"])
                if sup_heads is not None:
                    groups["super-survivors"] = sup_heads
                for group, mask in groups.items():
                    if mask is not None and mask.sum() == 0:
                        continue
                    for cls, frac in pattern_distribution(labels, mask).items():
                        dist_rows.append({"task": tname, "seed": seed, "classifier": source, "group": group,
                                          "pattern": cls, "fraction": frac})
            good = np.asarray(prune.result["mask"]["heads"]) if prune is not None else None
            labels = np.asarray(pt.result["labels"], dtype=str)
            feats = pt.result.get("features", {})
            for layer in range(labels.shape[0]):
                for head in range(labels.shape[1]):
                    r = {"task": tname, "seed": seed, "layer": layer, "head": head, "pattern": labels[layer, head],
                         "kept_good": int(good[layer, head]) if good is not None else None,
                         "super_survivor": int(sup_heads[layer, head]) if sup_heads is not None else None}
                    if "cnn_labels" in pt.result:
                        r["pattern_cnn"] = pt.result["cnn_labels"][layer][head]
                    for f, v in feats.items():
                        r[f] = v[layer][head]
                    heads_rows.append(r)
    dist = pd.DataFrame(dist_rows, columns=["task", "seed", "classifier", "group", "pattern", "fraction"])
    if not dist.empty:
        dist = (dist.groupby(["task", "classifier", "group", "pattern"], sort=False)["fraction"]
                .agg(mean="mean", std="std", n="count").reset_index())
        dist["pattern"] = pd.Categorical(dist["pattern"], CLASSES)
    return pd.DataFrame(heads_rows), dist


def _pattern_mix_figure(dist):
    from ..analysis.patterns import CLASSES
    from ..report import new_figure

    d = dist[dist["classifier"] == "rules"]
    tasks = list(dict.fromkeys(d["task"]))
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.4 * len(tasks)), 3.2))
    axes = np.atleast_1d(axes)
    colors = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#bbbbbb"]
    for ax, task in zip(axes, tasks):
        t = d[d["task"] == task]
        groups = list(dict.fromkeys(t["group"]))
        bottom = np.zeros(len(groups))
        for cls, color in zip(CLASSES, colors):
            vals = np.array([float(t[(t["group"] == g) & (t["pattern"] == cls)]["mean"].sum()) for g in groups])
            vals = np.nan_to_num(vals)
            ax.bar(range(len(groups)), vals, bottom=bottom, color=color, label=cls)
            bottom += vals
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("fraction of heads")
    axes[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _pattern_grid_figure(heads_table, settings):
    from matplotlib.colors import ListedColormap

    from ..analysis.patterns import CLASSES
    from ..report import new_figure

    tasks = list(dict.fromkeys(heads_table["task"]))
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.8 * len(tasks)), 3.4))
    axes = np.atleast_1d(axes)
    cmap = ListedColormap(["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#bbbbbb"])
    for ax, task in zip(axes, tasks):
        t = heads_table[heads_table["task"] == task]
        seed = t["seed"].iloc[0]
        t = t[t["seed"] == seed]
        n_layers, n_heads = int(t["layer"].max()) + 1, int(t["head"].max()) + 1
        grid = np.zeros((n_layers, n_heads))
        for _, r in t.iterrows():
            grid[int(r["layer"]), int(r["head"])] = CLASSES.index(r["pattern"])
            mark = "*" if r.get("super_survivor") == 1 else ("o" if r.get("kept_good") == 1 else "")
            if mark:
                ax.text(int(r["head"]), int(r["layer"]), mark, ha="center", va="center", color="w", fontsize=7)
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(CLASSES) - 0.5, aspect="auto")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.tick_params(labelsize=6)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{task} (seed {seed}); o good, * super-survivor", fontsize=7)
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(color=cmap(i), label=c) for i, c in enumerate(CLASSES)]
    axes[-1].legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _trace_figure(store, settings, prefix):
    from ..report import new_figure

    s = settings
    tasks = [task_name(t) for t in s.tasks]
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.6 * len(tasks)), 3.0))
    axes = np.atleast_1d(axes)
    for ax, tname in zip(axes, tasks):
        for seed in s.seeds:
            r = _get(store, job_name(prefix, "prune", tname, f"seed{seed}"))
            if r is None:
                continue
            tr = r.result["trace"]
            ax.plot([x["heads_kept"] for x in tr], [x["metric"] for x in tr], marker=".", lw=1, label=f"seed {seed}")
            ax.axhline(s.pruning.threshold * r.result["full_metric"], color="grey", ls=":", lw=0.6)
        ax.invert_xaxis()
        ax.set_xlabel("heads kept")
        ax.set_ylabel("dev metric")
        ax.set_title(tname, fontsize=9)
        ax.legend(fontsize=6)
    return fig


def _tag(prefix: str, default: str = "lottery") -> str:
    t = re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix).strip("-_.")
    return t or default


def lottery_sections(store, settings: LotterySettings, prefix: str = "", tag: str | None = None) -> list:
    """The report sections of a lottery study (or of the lottery part of another study).

    Tables (``results/<tag>_*.csv``): ``main`` (tidy: experiment, pruning, task, metric, mean,
    std, n, sizes), ``main_wide`` (the paper's layout, ``mean ± std``), ``seeds`` (every score),
    ``super_survivors``, ``stability``, ``overlap``, ``patterns``, ``pattern_heads``.
    Figures: scores with error bars, pruning traces, survivor heatmaps, overlap across tasks,
    pattern mix (full vs good vs super-survivors), per-head pattern grid.

    Args:
        store: the run's :class:`~headcount.runner.RunStore`.
        settings: the :class:`LotterySettings` the jobs came from.
        prefix: the job-name prefix given to :func:`lottery_jobs`.
        tag: prefix of table and figure names (default: from ``prefix``, else ``lottery``).

    Returns:
        A list of :class:`~headcount.report.Section`.

    >>> lottery_sections(store, config)[0].title           # doctest: +SKIP
    'Good, random and bad subnetworks'
    """
    import pandas as pd

    from ..report import Section

    s = settings
    tag = tag or _tag(prefix)
    scores = seed_scores(store, s, prefix)
    main_names = [e for e, _ in EXPERIMENTS if s.magnitude.enabled or not e.startswith("magnitude")]
    main = summarize(scores[scores["experiment"].isin(main_names)], main_names)
    sections = []
    text = (
        "Per task and seed: the full model fine-tuned; the good structured subnetwork (iterative pruning of heads "
        f"and MLPs, {s.pruning.schedule} schedule, stop below {s.pruning.threshold} x the full model's dev metric) "
        "evaluated on the fine-tuned weights without retraining (good pruned); good, random "
        f"({s.random}) and bad (drawn from the pruned components, topped up with good ones: Prasanna's rule) "
        "subnetworks retrained from the pre-trained weights; magnitude pruning (IMP) good, random and bad masks at "
        f"the same sparsity, retrained from the pre-trained weights. Mean ± sample std over {len(s.seeds)} seed(s) "
        f"({', '.join(map(str, s.seeds))}); dev subsets of {s.train.max_eval_examples or 'all'} examples."
    )
    sections.append(Section(
        "Good, random and bad subnetworks", text,
        figures={f"{tag}_scores": _bars(main, main_names, "dev metric, mean ± std over seeds"),
                 f"{tag}_prune_trace": _trace_figure(store, s, prefix)},
        tables=[_table(f"{tag}_main_wide", wide_table(main), "The paper's main table: mean ± std over seeds."),
                _table(f"{tag}_main", main, "Tidy main table (also the sizes: heads/MLPs kept, weight sparsity)."),
                _table(f"{tag}_seeds", scores, "Every score, per seed.")],
    ))
    if s.super_survivors.enabled:
        stab = {task_name(t): _get(store, job_name(prefix, "stability", task_name(t))) for t in s.tasks}
        stab = {k: v.result for k, v in stab.items() if v is not None}
        rows = []
        for tname, r in stab.items():
            n_super = {"heads": int(np.sum(r["super_heads"])), "mlps": int(np.sum(r["super_mlps"]))}
            n_super["all"] = n_super["heads"] + n_super["mlps"]
            for comp in ("heads", "mlps", "all"):
                st = r[comp]
                rows.append({"task": tname, "components": comp, "krippendorff_alpha": st["krippendorff_alpha"],
                             "cochran_q": st["cochran_q"], "cochran_df": st["cochran_df"], "cochran_p": st["cochran_p"],
                             "mean_pairwise_jaccard": st["mean_pairwise_jaccard"],
                             "kept_per_seed": " ".join(map(str, st["kept_per_seed"])),
                             "super_survivors": n_super[comp]})
        stability = pd.DataFrame(rows)
        sup = summarize(scores[scores["experiment"].isin(SUPER_EXPERIMENTS)], list(SUPER_EXPERIMENTS))
        figures = {f"{tag}_survivors": _survivor_figure(stab)} if stab else {}
        if not sup.empty:
            figures[f"{tag}_super_scores"] = _bars(pd.concat([main[main["experiment"] == "full"], sup]),
                                                   ["full", *SUPER_EXPERIMENTS], "super-survivors, retrained")
        sections.append(Section(
            "Stability across seeds and super-survivors",
            "How often each head and MLP survives across seeds (super-survivors, kept by every seed, marked *); "
            "agreement of the good masks across seeds (Krippendorff's alpha, nominal; Cochran's Q: do the seeds "
            "keep different proportions; mean pairwise Jaccard). Super-survivor subnetworks and size-matched "
            "random (uniform) and bad controls, retrained from the pre-trained weights.",
            figures=figures,
            tables=[_table(f"{tag}_stability", stability, "Mask stability across seeds."),
                    _table(f"{tag}_super_survivors", wide_table(sup) if not sup.empty else sup,
                           "Super-survivors and their controls, retrained: mean ± std over seeds."),
                    _table(f"{tag}_super_survivors_tidy", sup, "Tidy super-survivor table.")],
        ))
    if len(s.tasks) > 1:
        ov = _get(store, job_name(prefix, "overlap"))
        if ov is not None:
            tasks = ov.result["tasks"]
            rows = [{"task_a": a, "task_b": b, "heads_jaccard": ov.result["heads_jaccard"][i][j],
                     "mlps_jaccard": ov.result["mlps_jaccard"][i][j],
                     "super_heads_jaccard": ov.result["super_heads_jaccard"][i][j]}
                    for i, a in enumerate(tasks) for j, b in enumerate(tasks)]
            sections.append(Section(
                "Overlap of good subnetworks across tasks",
                "Jaccard index of the kept heads of two tasks' good subnetworks, averaged over all seed pairs "
                "(the diagonal: across seeds of one task), and of their super-survivors.",
                figures={f"{tag}_overlap": _overlap_figure(ov.result)},
                tables=[_table(f"{tag}_overlap", pd.DataFrame(rows), "Overlap across tasks.")],
            ))
    if s.patterns.enabled:
        heads_table, dist = _pattern_tables(store, s, prefix)
        if not heads_table.empty:
            sections.append(Section(
                "Self-attention patterns",
                "Each head of the fine-tuned full model classified (Kovaleva et al. 2019 classes) by the rule-based "
                "classifier on its mean attention map over dev examples (headcount.analysis.patterns: mass on the "
                "special-token columns, on the diagonal band, within the query's segment, entropy)"
                + (", and by the CNN trained on the labelled maps of the config" if s.patterns.cnn else "")
                + ". Pattern mix of all heads vs the heads of the good subnetworks vs the super-survivors "
                "(mean over seeds).",
                figures={f"{tag}_pattern_mix": _pattern_mix_figure(dist),
                         f"{tag}_pattern_grid": _pattern_grid_figure(heads_table, s)},
                tables=[_table(f"{tag}_patterns", dist, "Pattern distributions (fraction of heads, mean/std over seeds)."),
                        _table(f"{tag}_pattern_heads", heads_table, "Per-head pattern class and features.")],
            ))
    return sections


def _table(name, df, caption):
    from ..report import ReportTable

    return ReportTable(name, df, caption)


def lottery_summary(store, settings: LotterySettings, prefix: str = "") -> str:
    """One paragraph with the headline numbers (good/random/bad retrained vs full, per task).

    >>> lottery_summary(RunStore("runs/lottery-offline"), config)  # doctest: +SKIP
    'Mean dev metric over seeds. offline/movies: full 0.803, good pruned 0.760, ...'
    """
    scores = seed_scores(store, settings, prefix)
    main = summarize(scores)
    parts = []
    for task in dict.fromkeys(main["task"]):
        t = main[main["task"] == task].set_index("experiment")["mean"]
        picks = [(k, t.get(k)) for k in ("full", "good pruned", "good retrained", "random retrained", "bad retrained")]
        if settings.magnitude.enabled:
            picks.append(("magnitude good retrained", t.get("magnitude good retrained")))
        parts.append(f"{task}: " + ", ".join(f"{k} {v:.3f}" for k, v in picks if v is not None and math.isfinite(v)))
    return "Mean dev metric over seeds. " + "; ".join(parts) + "."


def report(store, config: LotteryConfig):
    """``report_fn`` of the ``lottery`` study type: :func:`lottery_summary` and :func:`lottery_sections`.

    >>> report(RunStore("runs/lottery-offline"), config).sections[0].title  # doctest: +SKIP
    'Good, random and bad subnetworks'
    """
    from ..report import ReportContent

    return ReportContent(summary=lottery_summary(store, config), sections=lottery_sections(store, config))


register_study("lottery", LotteryConfig, expand, report,
               description="good / random / bad subnetworks, super-survivors and attention patterns (Prasanna et al. 2020)")
