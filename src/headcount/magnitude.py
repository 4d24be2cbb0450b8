"""Magnitude pruning (global L1, unstructured) with ``torch.nn.utils.prune``, and iterative
magnitude pruning (IMP) with rewinding.

Which weights compete (``variant``), named relative to the bare encoder
(``adapter.base(model)``), so a mask fits the base model and any task model built on it:

- ``"prasanna"`` (Prasanna et al. 2020): per block, the per-head projections (query, key,
  value, ...) weights and biases, the attention output projection weight and bias, the
  feed-forward input weight and bias, the feed-forward output weight;
- ``"chen"`` (Chen et al. 2020): the same linears' weights only, plus the pooler's dense weight
  when the model has a pooler.

Which weights go (``control``): ``"good"`` the smallest magnitudes; ``"bad"`` the largest;
``"random"`` uniformly at random. All three prune exactly the same number of weights.

A weight mask is ``{name: bool tensor}`` with True = kept (as in ``mask.json``, 1 = kept); it
is applied with ``torch.nn.utils.prune.custom_from_mask`` (a forward pre-hook computes
``weight = weight_orig * weight_mask``), so it stays applied while training.
Files: ``weight_mask.safetensors`` (the bool tensors) and ``trace.csv`` (round, sparsity,
metric, seconds).

IMP (:func:`magnitude_prune`): fine-tune the full model; then each round prunes ``rate`` of the
remaining weights by magnitude of the last fine-tuned weights, rewinds to the pre-trained weights
(or to the full run's step ``rewind_step``), applies the mask and fine-tunes; it stops when the
metric drops below ``threshold`` x the full model's metric or after ``rounds`` rounds, and keeps
the last mask that passed.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import prune

from .errors import HeadcountError
from .io import atomic_path, atomic_write_json, atomic_write_text

VARIANTS = ("prasanna", "chen")
CONTROLS = ("good", "random", "bad")
SCHEDULES = ("remaining", "original")

WeightMask = dict  # {name relative to the base model: bool tensor, True = kept}


# -- which weights -------------------------------------------------------------------------------
def _pooler_linear(base: nn.Module) -> nn.Linear | None:
    """The pooler's dense layer, found generically: ``base.pooler`` is a Linear or has one as ``dense``."""
    pooler = getattr(base, "pooler", None)
    if isinstance(pooler, nn.Linear):
        return pooler
    dense = getattr(pooler, "dense", None) if isinstance(pooler, nn.Module) else None
    return dense if isinstance(dense, nn.Linear) else None


def weight_targets(model: nn.Module, variant: str = "prasanna") -> dict[str, tuple[nn.Module, str]]:
    """The parameters magnitude pruning ranks: ``{name: (module, "weight" | "bias")}``.

    Names are relative to the bare encoder (``adapter.base(model)``), in block order; a shared
    layer (ALBERT) appears once.

    >>> sorted(weight_targets(model, "chen"))[:1]          # doctest: +SKIP
    ['encoder.layer.0.attention.output.dense.weight']
    """
    from .arch import get_adapter

    if variant not in VARIANTS:
        raise HeadcountError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    adapter = get_adapter(model)
    base = adapter.base(model)
    names = {id(m): n for n, m in base.named_modules()}
    with_bias = variant == "prasanna"
    chosen: list[tuple[nn.Module, str]] = []
    for block in adapter.blocks(model):
        for lin in block.head_projections:
            chosen.append((lin, "weight"))
            if with_bias:
                chosen.append((lin, "bias"))
        for lin, bias in ((block.out_projection, True), (block.ffn_in, True), (block.ffn_out, False)):
            chosen.append((lin, "weight"))
            if with_bias and bias:
                chosen.append((lin, "bias"))
    if variant == "chen":
        pooler = _pooler_linear(base)
        if pooler is not None:
            chosen.append((pooler, "weight"))
    targets: dict[str, tuple[nn.Module, str]] = {}
    for module, attr in chosen:
        if id(module) not in names:
            raise HeadcountError("a prunable layer is not inside the base model (adapter problem)")
        if _param(module, attr) is None:
            continue  # no bias, or removed by surgery
        targets.setdefault(f"{names[id(module)]}.{attr}" if names[id(module)] else attr, (module, attr))
    return targets


def _param(module: nn.Module, attr: str) -> torch.Tensor | None:
    """The trainable tensor behind ``attr`` (``attr_orig`` when a prune hook is installed)."""
    p = getattr(module, attr + "_orig", None)
    return p if p is not None else getattr(module, attr, None)


# -- masks ---------------------------------------------------------------------------------------------
class _LargestL1(prune.BasePruningMethod):
    """Prune the ``amount`` entries of LARGEST magnitude (the "bad" control)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float):
        self.amount = amount

    def compute_mask(self, t, default_mask):
        n = int(self.amount) if isinstance(self.amount, int) else int(round(self.amount * t.nelement()))
        if not 0 <= n <= t.nelement():
            raise HeadcountError(f"cannot prune {n} of {t.nelement()} weights")
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        if n:
            top = torch.topk(torch.abs(t).view(-1), k=n, largest=True)
            mask.view(-1)[top.indices] = 0
        return mask


_METHODS = {"good": prune.L1Unstructured, "random": prune.RandomUnstructured, "bad": _LargestL1}


def check_sparsity(sparsity: float, what: str = "sparsity") -> float:
    """Raise a one-line error unless ``0 <= sparsity < 1``.

    >>> check_sparsity(0.5)
    0.5
    """
    try:
        s = float(sparsity)
    except (TypeError, ValueError):
        raise HeadcountError(f"{what} must be a number in [0, 1), got {sparsity!r}") from None
    if not 0.0 <= s < 1.0:
        raise HeadcountError(f"{what} must be in [0, 1), got {sparsity}")
    return s


def magnitude_mask(model: nn.Module, sparsity: float, *, variant: str = "prasanna", control: str = "good",
                   current: WeightMask | None = None, seed: int = 0) -> WeightMask:
    """A global unstructured weight mask at exactly ``round(sparsity * total)`` pruned weights.

    Ranks the current weights of ``model`` (fine-tuned, usually) over all :func:`weight_targets`
    at once with ``torch.nn.utils.prune.global_unstructured``. Weights pruned in ``current`` (or by
    hooks already on ``model``) stay pruned; the new ones are chosen among the rest. ``model``
    itself is not changed.

    Args:
        model: the model whose magnitudes rank the weights.
        sparsity: the fraction of target weights pruned in the result, in [0, 1).
        variant: ``"prasanna"`` or ``"chen"`` (see :func:`weight_targets`).
        control: ``"good"`` (smallest first), ``"bad"`` (largest first), ``"random"``.
        current: a mask the result must contain (IMP's previous round).
        seed: the random control's seed.

    Returns:
        ``{name: bool tensor}`` (True = kept) on the CPU.

    >>> m = magnitude_mask(model, 0.5, control="bad")        # doctest: +SKIP
    >>> mask_sparsity(m)["sparsity"]                         # doctest: +SKIP
    0.5
    """
    sparsity = check_sparsity(sparsity)
    if control not in CONTROLS:
        raise HeadcountError(f"unknown control {control!r}; choose one of {', '.join(CONTROLS)}")
    targets = weight_targets(model, variant)
    if current is not None:
        _check_names(current, targets)
    holders, pairs = {}, []
    for name, (module, attr) in targets.items():
        h = nn.Module()  # a stand-in holding the tensor (shared storage): model stays untouched
        h.register_parameter("w", nn.Parameter(_param(module, attr).detach(), requires_grad=False))
        keep = torch.ones_like(h.w, dtype=torch.bool)
        hook_mask = getattr(module, attr + "_mask", None)
        if hook_mask is not None:
            keep &= hook_mask.detach().bool()
        if current is not None:
            keep &= current[name].to(keep.device).bool()
        if not bool(keep.all()):
            prune.custom_from_mask(h, "w", keep)
        holders[name] = h
        pairs.append((h, "w"))
    total = sum(h.w.numel() for h in holders.values())
    already = sum(int((~_keep(h)).sum()) for h in holders.values())
    wanted = int(round(sparsity * total))
    if wanted < already:
        raise HeadcountError(f"sparsity {sparsity} is below the current mask's {already / total:.4f}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        prune.global_unstructured(pairs, pruning_method=_METHODS[control], amount=wanted - already)
    return {name: _keep(h).cpu() for name, h in holders.items()}


def _keep(holder: nn.Module) -> torch.Tensor:
    m = getattr(holder, "w_mask", None)
    return torch.ones_like(holder.w, dtype=torch.bool) if m is None else m.bool()


def _check_names(mask: WeightMask, targets: dict) -> None:
    missing = [n for n in targets if n not in mask]
    extra = [n for n in mask if n not in targets]
    if extra or missing:
        which = f"{extra[0]!r} is not a prunable weight of this model" if extra else f"it lacks {missing[0]!r}"
        raise HeadcountError(f"the weight mask does not fit this model: {which}")
    for name, (module, attr) in targets.items():
        shape = tuple(_param(module, attr).shape)
        if tuple(mask[name].shape) != shape:
            raise HeadcountError(
                f"the weight mask is for another model shape: {name} is {list(mask[name].shape)}, the model has {list(shape)}"
            )


def _all_named(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Every variant's targets (a mask names a subset of them)."""
    out = {}
    for v in VARIANTS:
        out.update(weight_targets(model, v))
    return out


def apply_weight_mask(model: nn.Module, mask: WeightMask) -> nn.Module:
    """Install ``mask`` on ``model`` with ``torch.nn.utils.prune.custom_from_mask`` (in place).

    The hooks keep the pruned weights at zero during training (their gradient is zero too).
    A second mask on the same weights multiplies with the first.

    Raises:
        HeadcountError: a name the model lacks, or a shape that differs (another model shape).

    >>> apply_weight_mask(model, load_weight_mask("runs/mag/weight_mask.safetensors"))   # doctest: +SKIP
    """
    targets = _all_named(model)
    for name, keep in mask.items():
        if name not in targets:
            raise HeadcountError(f"the weight mask does not fit this model: {name!r} is not a prunable weight of it")
        module, attr = targets[name]
        p = _param(module, attr)
        if tuple(keep.shape) != tuple(p.shape):
            raise HeadcountError(
                f"the weight mask is for another model shape: {name} is {list(keep.shape)}, the model has {list(p.shape)}"
            )
    for name, keep in mask.items():
        module, attr = targets[name]
        prune.custom_from_mask(module, attr, keep.to(device=_param(module, attr).device, dtype=torch.bool))
    return model


def remove_weight_mask(model: nn.Module) -> nn.Module:
    """Make installed masks permanent (``prune.remove``): pruned weights become plain zeros.

    >>> remove_weight_mask(apply_weight_mask(model, mask)).save_pretrained("pruned/")   # doctest: +SKIP
    """
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
    return model


def weight_mask_of(model: nn.Module) -> WeightMask:
    """The masks installed on ``model`` (``{name: bool}``; empty when none).

    >>> weight_mask_of(apply_weight_mask(model, mask)).keys() == mask.keys()     # doctest: +SKIP
    True
    """
    targets = _all_named(model)
    return {n: getattr(m, a + "_mask").detach().bool().cpu() for n, (m, a) in targets.items()
            if getattr(m, a + "_mask", None) is not None}


def mask_sparsity(mask: WeightMask) -> dict:
    """Exact counts: ``{"pruned": int, "total": int, "sparsity": pruned / total}``.

    >>> mask_sparsity({"w": torch.tensor([True, False, False, True])})
    {'pruned': 2, 'total': 4, 'sparsity': 0.5}
    """
    total = sum(int(m.numel()) for m in mask.values())
    pruned = sum(int((~m.bool()).sum()) for m in mask.values())
    return {"pruned": pruned, "total": total, "sparsity": pruned / total if total else 0.0}


def model_sparsity(model: nn.Module, variant: str = "prasanna") -> dict:
    """Exact zeros among ``model``'s target weights (as the forward pass sees them).

    >>> model_sparsity(load_model("runs/mag/round_03/model"))["sparsity"]      # doctest: +SKIP
    0.271
    """
    targets = weight_targets(model, variant)
    total = pruned = 0
    for module, attr in targets.values():
        w = getattr(module, attr)
        total += w.numel()
        pruned += int((w == 0).sum())
    return {"pruned": pruned, "total": total, "sparsity": pruned / total if total else 0.0}


def save_weight_mask(mask: WeightMask, path, meta: dict | None = None) -> Path:
    """Write ``mask`` as ``safetensors`` (bool tensors; ``meta`` in the header), atomically.

    >>> save_weight_mask(mask, "weight_mask.safetensors", meta={"control": "good"})   # doctest: +SKIP
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {k: v.detach().bool().contiguous().cpu() for k, v in mask.items()}
    header = {k: json.dumps(v) for k, v in {**mask_sparsity(mask), **(meta or {})}.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)
    return path


def load_weight_mask(path) -> WeightMask:
    """Read a ``weight_mask.safetensors`` (a folder holding one works too).

    >>> mask = load_weight_mask("runs/mag")                  # doctest: +SKIP
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / "weight_mask.safetensors"
    if not path.is_file():
        raise HeadcountError(f"weight mask not found: {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise HeadcountError(f"{path} is not a weight mask: {e}") from None
    if not tensors or any(t.dtype != torch.bool for t in tensors.values()):
        raise HeadcountError(f"{path} is not a weight mask (expected bool tensors)")
    return tensors


def weight_mask_meta(path) -> dict:
    """The metadata stored with a weight mask (sparsity, variant, control, ...).

    >>> weight_mask_meta("runs/mag")["control"]              # doctest: +SKIP
    'good'
    """
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        path = path / "weight_mask.safetensors"
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


# -- the loop -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MagnitudeConfig:
    """Iterative magnitude pruning settings (defaults: Prasanna et al. 2020).

    Attributes:
        rounds: at most this many pruning rounds.
        threshold: stop when the metric < threshold x the full model's metric.
        rate: the fraction pruned per round (``schedule="remaining"``: of the remaining weights).
        control: ``"good"``, ``"random"`` or ``"bad"``: how each round chooses.
        variant: ``"prasanna"`` or ``"chen"``: which weights compete.
        schedule: ``"remaining"`` (round k reaches 1 - (1 - rate)^k) or ``"original"`` (k x rate,
            Chen et al.'s 10%, 20%, ... 90%).
        sparsity: one shot instead of rounds: prune to exactly this sparsity, retrain once.
        rewind_step: 0 = rewind to the pre-trained weights; N > 0 = to the full fine-tuning run's
            weights after N steps (early-checkpoint rewinding).

    >>> MagnitudeConfig(rounds=3).rate
    0.1
    """

    rounds: int = 10
    threshold: float = 0.9
    rate: float = 0.1
    control: str = "good"
    variant: str = "prasanna"
    schedule: str = "remaining"
    sparsity: float | None = None
    rewind_step: int = 0

    def __post_init__(self):
        if self.rounds < 1:
            raise HeadcountError(f"rounds must be at least 1, got {self.rounds}")
        if not 0.0 < float(self.rate) < 1.0:
            raise HeadcountError(f"rate must be in (0, 1), got {self.rate}")
        if not self.threshold >= 0:
            raise HeadcountError(f"threshold must be >= 0, got {self.threshold}")
        if self.control not in CONTROLS:
            raise HeadcountError(f"unknown control {self.control!r}; choose one of {', '.join(CONTROLS)}")
        if self.variant not in VARIANTS:
            raise HeadcountError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.schedule not in SCHEDULES:
            raise HeadcountError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.sparsity is not None:
            check_sparsity(self.sparsity)
        if self.rewind_step < 0:
            raise HeadcountError(f"rewind step must be >= 0, got {self.rewind_step}")


def _rewind_callback(step: int, path: Path, tokenizer_spec: str):
    from transformers import TrainerCallback

    from .io import atomic_dir
    from .models import load_tokenizer

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == step and state.is_world_process_zero and not (path / "config.json").is_file():
                with atomic_dir(path) as tmp:
                    model.save_pretrained(tmp, safe_serialization=True)
                    load_tokenizer(tokenizer_spec).save_pretrained(tmp)

    return Snapshot()


def _n_pruned(k: int, total: int, previous: int, config: MagnitudeConfig) -> int:
    if config.schedule == "original":
        return min(total, int(round(k * config.rate * total)))
    return previous + int(round(config.rate * (total - previous)))


def _trace_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    cols = ["round", "sparsity", "metric", "seconds", "pruned", "total", "passed"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c) for c in cols})
    return buf.getvalue()


def magnitude_prune(model_spec: str, task, *, config: MagnitudeConfig | None = None, train=None, seed: int = 0,
                    out_dir, match=None, progress: Callable[[str], None] | None = None,
                    callbacks: Sequence = ()) -> dict:
    """Iterative (or one-shot) magnitude pruning with retraining from rewound weights.

    Round 0 fine-tunes the full model (``out_dir/full``). Round k computes a mask from the
    weights fine-tuned in round k-1 (the full model for k = 1), at the round's sparsity and with
    the round's control rule, rewinds (loads ``model_spec`` again, or the full run's step
    ``rewind_step`` snapshot), applies the mask and fine-tunes (``out_dir/round_k``). A new
    classification head is re-initialised identically in every round (same seed).

    One shot (``config.sparsity`` set, or ``match`` = a finished run's folder whose final
    sparsity — and full fine-tuned weights — are reused): a single round at that sparsity; this is
    how random and bad controls are matched to a good run.

    Everything is resumable: each round is a :func:`~headcount.training.finetune` folder.

    Args:
        model_spec: the pre-trained model (the rewind target).
        task: task name, YAML path or object.
        config: :class:`MagnitudeConfig`.
        train: :class:`~headcount.training.TrainConfig` for every fine-tuning.
        seed: training seed (and the random control's).
        out_dir: output folder: ``weight_mask.safetensors`` (the last passing mask), ``trace.csv``,
            ``magnitude.json``, ``full/``, ``round_XX/``.
        match: a finished ``magnitude`` folder to match (one shot at its final sparsity).
        progress: one-line progress messages.
        callbacks: extra ``TrainerCallback`` objects for every fine-tuning.

    Returns:
        The summary written to ``magnitude.json``.

    >>> r = magnitude_prune("offline", "offline/movies", out_dir="runs/mag")         # doctest: +SKIP
    >>> r["sparsity"], r["metric"]                                                    # doctest: +SKIP
    (0.5695, 0.83)
    """
    from .models import load_model
    from .training import TrainConfig, _as_task, finetune

    config = config or MagnitudeConfig()
    train = train or TrainConfig()
    out = Path(out_dir)
    say = progress or (lambda msg: None)
    task = _as_task(task)
    t_start = time.perf_counter()

    from .fingerprint import model_fingerprint, path_fingerprint, task_fingerprint

    identity = {"model": str(model_spec), "model_fingerprint": model_fingerprint(model_spec),
                "task": task.name, "task_fingerprint": task_fingerprint(task),
                "seed": int(seed), "control": config.control,
                "variant": config.variant, "rate": config.rate, "schedule": config.schedule,
                "sparsity": config.sparsity, "rewind_step": config.rewind_step,
                "match": str(match) if match is not None else None,
                "match_fingerprint": path_fingerprint(Path(match) / "weight_mask.safetensors") if match else None,
                "train": json.loads(json.dumps(train.identity()))}
    for split in (task.train_split, task.validation_split):  # bad data ends here, before any output
        task.load(split)
    previous_run = out / "magnitude_run.json"
    if previous_run.is_file():
        try:
            old = json.loads(previous_run.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise HeadcountError(f"{previous_run} is unreadable or corrupt; use another --out or delete it") from None
        if old != identity:
            diff = sorted(k for k in identity if old.get(k) != identity.get(k))
            raise HeadcountError(f"{out} holds a different magnitude run (different {', '.join(diff)}); "
                                 "use another --out or delete it")

    # -- the full model (round 0) -----------------------------------------------------------
    if match is not None:
        match = Path(match)
        summary = _read_summary(match)
        if summary.get("sparsity") is None:
            raise HeadcountError(f"{match}/magnitude.json has no final sparsity")
        full_dir = match / "full"
        if not (full_dir / "metrics.json").is_file():
            raise HeadcountError(f"{match} has no finished full fine-tuning ({full_dir})")
        try:
            config = replace(config, sparsity=check_sparsity(summary["sparsity"], f"{match}/magnitude.json sparsity"),
                             variant=summary.get("variant", config.variant))
            full = json.loads((full_dir / "metrics.json").read_text(encoding="utf-8"))
            float(full["final"]["score"])
        except (OSError, ValueError, KeyError, TypeError):
            raise HeadcountError(f"{match} is not a valid finished magnitude run ({full_dir / 'metrics.json'})") from None
        if not previous_run.is_file():  # the inputs are checked: the folder is this run's now
            atomic_write_json(previous_run, identity)
    else:
        if not previous_run.is_file():
            atomic_write_json(previous_run, identity)
        full_dir = out / "full"
        cbs = list(callbacks)
        if config.rewind_step:
            cbs.append(_rewind_callback(config.rewind_step, full_dir / "rewind", model_spec))
        say("round 0: fine-tuning the full model")
        full = finetune(model_spec, task, seed=seed, config=train, out_dir=full_dir, progress=progress, callbacks=cbs)
    start_spec = str(full_dir / "rewind") if config.rewind_step else model_spec
    if config.rewind_step and not (Path(start_spec) / "config.json").is_file():
        raise HeadcountError(f"rewind step {config.rewind_step} is beyond the full run ({full['steps']} steps)")
    full_score = float(full["final"]["score"])
    rows = [{"round": 0, "sparsity": 0.0, "metric": full_score, "seconds": full.get("wall_seconds"),
             "pruned": 0, "total": None, "passed": True}]

    source = full_dir / "model"  # whose magnitudes rank the weights
    current: WeightMask | None = None
    best = {"round": 0, "mask": None, "metric": full_score}
    n_rounds = 1 if config.sparsity is not None else config.rounds
    previous = 0
    total = None
    for k in range(1, n_rounds + 1):
        round_dir = out / f"round_{k:02d}"
        mask_file = round_dir / "weight_mask.safetensors"
        if mask_file.is_file():
            mask = load_weight_mask(mask_file)
        else:
            trained = load_model(str(source), head=task.kind, num_labels=task.num_labels)
            total = sum(_param(m, a).numel() for m, a in weight_targets(trained, config.variant).values())
            n = (int(round(config.sparsity * total)) if config.sparsity is not None
                 else _n_pruned(k, total, previous, config))
            if n >= total:
                break
            mask = magnitude_mask(trained, n / total, variant=config.variant, control=config.control,
                                  current=current, seed=seed)
            del trained
            save_weight_mask(mask, mask_file, meta={"round": k, "variant": config.variant,
                                                    "control": config.control, "model": str(model_spec)})
        counts = mask_sparsity(mask)
        total = counts["total"]
        say(f"round {k}: sparsity {counts['sparsity']:.4f} ({config.control}), retraining from {start_spec}")
        m = finetune(start_spec, task, weight_mask=mask, seed=seed, config=train, out_dir=round_dir,
                     progress=progress, callbacks=callbacks)
        score = float(m["final"]["score"])
        passed = score >= config.threshold * full_score
        rows.append({"round": k, "sparsity": counts["sparsity"], "metric": score,
                     "seconds": m.get("wall_seconds"),
                     "pruned": counts["pruned"], "total": total, "passed": passed})
        say(f"round {k}: {task.metric} {score:.4f} vs {config.threshold} x {full_score:.4f} -> "
            f"{'pass' if passed else 'stop'}")
        if config.sparsity is None and not passed:
            break
        if passed or config.sparsity is not None:
            best = {"round": k, "mask": mask, "metric": score}
        current = mask
        previous = counts["pruned"]
        source = round_dir / "model"
    rows[0]["total"] = total

    final_mask = best["mask"]
    if final_mask is None:  # nothing passed: the full model (no weight pruned)
        trained = load_model(str(full_dir / "model"), head=task.kind, num_labels=task.num_labels)
        final_mask = {n: torch.ones(_param(m, a).shape, dtype=torch.bool)
                      for n, (m, a) in weight_targets(trained, config.variant).items()}
    counts = mask_sparsity(final_mask)
    summary = {
        "model": str(model_spec),
        "task": task.name,
        "metric_name": task.metric,
        "seed": int(seed),
        "control": config.control,
        "variant": config.variant,
        "config": asdict(config),
        "full_metric": full_score,
        "round": best["round"],
        "metric": best["metric"],
        "sparsity": counts["sparsity"],
        "pruned": counts["pruned"],
        "total": counts["total"],
        "rewind": "pre-trained" if not config.rewind_step else f"step {config.rewind_step}",
        "match": str(match) if match is not None else None,
        "seconds": round(time.perf_counter() - t_start, 3),
        "trace": rows,
    }
    save_weight_mask(final_mask, out / "weight_mask.safetensors",
                     meta={"round": best["round"], "variant": config.variant, "control": config.control,
                           "model": str(model_spec), "task": task.name})
    atomic_write_text(out / "trace.csv", _trace_csv(rows))
    atomic_write_json(out / "magnitude.json", summary)
    say(f"kept round {best['round']}: sparsity {counts['sparsity']:.4f}, {task.metric} {best['metric']:.4f} -> {out}")
    return summary


def _read_summary(path: Path) -> dict:
    f = path / "magnitude.json"
    if not f.is_file():
        raise HeadcountError(f"{path} is not a finished magnitude run (no magnitude.json)")
    try:
        summary = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise HeadcountError(f"{f} is unreadable or corrupt (not JSON)") from None
    if not isinstance(summary, dict):
        raise HeadcountError(f"{f} is not a magnitude summary")
    return summary


__all__ = ["VARIANTS", "CONTROLS", "MagnitudeConfig", "weight_targets", "magnitude_mask", "apply_weight_mask",
           "remove_weight_mask", "weight_mask_of", "mask_sparsity", "model_sparsity", "save_weight_mask",
           "load_weight_mask", "weight_mask_meta", "check_sparsity", "magnitude_prune"]
