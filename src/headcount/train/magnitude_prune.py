"""Magnitude-pruning runs: a weight mask searched or drawn, then the retraining, in one resumable folder.

[`magnitude_prune`][headcount.train.magnitude_prune.magnitude_prune] dispatches on ``MagnitudeConfig.procedure``: [`prasanna_magnitude_prune`][headcount.train.magnitude_prune.prasanna_magnitude_prune]
(the paper's search on the fine-tuned weights, then one retraining from the pre-trained weights)
or [`iterative_magnitude_prune`][headcount.train.magnitude_prune.iterative_magnitude_prune] (IMP with rewinding); a control (``random`` / ``bad``) or a
given sparsity is one shot. The procedures themselves, their settings and the stop rule are in
[`headcount.train.magnitude_search`][headcount.train.magnitude_search].

Output folder (claimed before any work, so a kill leaves it resumable and headcount's):
``weight_mask.safetensors``, ``trace.csv`` (one row per step: sparsity, metric, passed),
``magnitude.json`` (the summary), ``run.json`` (the run's identity) and the retraining's
``model/`` and ``metrics.json``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from headcount.data.fingerprint import model_fingerprint, path_fingerprint, task_fingerprint
from headcount.data.tasks import encode
from headcount.importance.magnitude import (
    WeightMask,
    _param,
    check_sparsity,
    load_weight_mask,
    magnitude_mask,
    mask_sparsity,
    save_weight_mask,
    weight_targets,
)
from headcount.runtime.atomic import atomic_dir, atomic_write_json, atomic_write_text
from headcount.runtime.device import resolve_device
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json
from headcount.runtime.written import claim_run, remove_listed
from headcount.train import TrainConfig, evaluate, finetune, use_bf16
from headcount.train.config import _use_cpu
from headcount.train.data import _as_task
from headcount.train.magnitude_search import (
    MagnitudeConfig,
    _n_pruned,
    check_procedure,
    prasanna_magnitude_mask,
)


# -- files -------------------------------------------------------------------------------------------------
def _trace_csv(rows: list[dict], first: str = "round") -> str:
    buf = io.StringIO()
    cols = [first, "sparsity", "metric", "seconds", "pruned", "total", "passed"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c) for c in cols})
    return buf.getvalue()


def _read_summary(path: Path) -> dict:
    f = path / "magnitude.json"
    if not f.is_file():
        raise HeadcountError(f"{path} is not a finished magnitude run (no magnitude.json)")
    return read_json(f, "the magnitude summary", kind=dict)


def _identity(model_spec, task, seed, config: MagnitudeConfig, train, match) -> dict:
    """What decides a run's folder (``magnitude_run.json``): every setting that changes the result."""
    ident = {"model": str(model_spec), "model_fingerprint": model_fingerprint(model_spec),
             "task": task.name, "task_fingerprint": task_fingerprint(task),
             "seed": int(seed), "control": config.control,
             "variant": config.variant, "rate": config.rate, "schedule": config.schedule,
             "sparsity": config.sparsity, "rewind_step": config.rewind_step,
             "match": str(match) if match is not None else None,
             "match_fingerprint": (path_fingerprint(Path(match) / "weight_mask.safetensors")
                                   if match and (Path(match) / "weight_mask.safetensors").is_file() else None),
             "train": json.loads(json.dumps(train.identity())), "procedure": config.procedure,
             # at_cap is read by the paper's procedure only: recorded there
             **({"at_cap": config.at_cap} if config.procedure == "prasanna" else {})}
    return ident


def _open_run(out: Path, model_spec, task, seed, config: MagnitudeConfig, train, match, write: bool = True):
    """Both procedures' start: the task, the run's identity, its data loaded (bad data ends here,
    before any output) and ``out`` claimed. Returns ``(task, identity)``."""
    task = _as_task(task)
    identity = _identity(model_spec, task, seed, config, train, match)
    for split in (task.train_split, task.validation_split):
        task.load(split)
    _claim(out, identity, write=write)
    return task, identity


def _claim(out: Path, identity: dict, write: bool = True) -> None:
    """Refuse a folder holding another run; mark it as this run's (``magnitude_run.json``)."""
    claim_run(out, identity, "magnitude_run.json", what="magnitude run", write=write)


def magnitude_prune(model_spec: str, task, *, config: MagnitudeConfig | None = None, train=None, seed: int = 0,
                    out_dir, match=None, progress: Callable[[str], None] | None = None,
                    callbacks: Sequence = ()) -> dict:
    """Magnitude pruning by ``config.procedure``; one shot when ``config.sparsity`` or ``match`` is given.

    ``"prasanna"``: [`prasanna_magnitude_prune`][headcount.train.magnitude_prune.prasanna_magnitude_prune]; ``"imp"``: [`iterative_magnitude_prune`][headcount.train.magnitude_prune.iterative_magnitude_prune].
    A one shot (the random and bad controls) ranks the full fine-tuned weights and retrains once
    from the pre-trained ones, for either procedure ([`iterative_magnitude_prune`][headcount.train.magnitude_prune.iterative_magnitude_prune] with one round).

    >>> r = magnitude_prune("offline", "offline/movies", out_dir="runs/mag")          # doctest: +SKIP
    >>> r["procedure"], r["sparsity"], r["metric"]                                    # doctest: +SKIP
    ('prasanna', 0.4095, 0.83)
    """
    config = config or MagnitudeConfig()
    check_procedure(config, match)
    if config.sparsity is None and match is None:
        if config.procedure == "prasanna":
            return prasanna_magnitude_prune(model_spec, task, config=config, train=train, seed=seed, out_dir=out_dir,
                                            progress=progress, callbacks=callbacks)
    return iterative_magnitude_prune(model_spec, task, config=config, train=train, seed=seed, out_dir=out_dir,
                                     match=match, progress=progress, callbacks=callbacks)


def _dev_evaluator(task, tokenizer, train):
    """``model -> dev metric`` on the dev subset fine-tuning reports on (same examples, same length)."""
    data = task.load(task.validation_split, max_examples=train.max_eval_examples, seed=train.data_seed)
    encoded = encode(data, tokenizer, max_length=train.max_length)
    # where and how fine-tuning evaluates: its device ($HEADCOUNT_DEVICE, else a GPU when there is one)
    device = "cpu" if _use_cpu(train) else resolve_device(None)
    precision = "bf16" if use_bf16(train) else "fp32"

    def run(model):
        return float(evaluate(model, encoded, tokenizer=tokenizer, metric=task.metric,
                              batch_size=train.eval_batch_size, device=device, precision=precision)["score"])

    return run


def prasanna_magnitude_prune(model_spec: str, task, *, config: MagnitudeConfig | None = None, train=None,
                             seed: int = 0, out_dir, progress: Callable[[str], None] | None = None,
                             callbacks: Sequence = ()) -> dict:
    """The paper's procedure end to end: fine-tune, search without retraining, retrain the kept mask once.

    1. ``out_dir/full``: the full model fine-tuned from ``model_spec`` (a finished folder is reused).
    2. [`prasanna_magnitude_mask`][headcount.train.magnitude_search.prasanna_magnitude_mask] on those fine-tuned weights, evaluated on the dev subset of
       ``train`` (``max_eval_examples``, ``data_seed``): ``trace.csv`` (step, sparsity, metric =
       the un-retrained dev metric, passed, ...), ``weight_mask.safetensors`` (the kept mask: at
       the cap, the step before the last unless ``config.at_cap="last"``).
    3. ``out_dir/retrain``: the kept mask retrained once from ``model_spec`` (the pre-trained
       weights, a new head with the same seed) -> the reported ``metric``.

    When no step passes: ``no_passing_mask: true``, ``metric``/``sparsity`` null, no mask file,
    nothing retrained. Resumable (each fine-tuning is a [`finetune`][headcount.train.finetune] folder).

    Returns:
        The summary written to ``magnitude.json``: procedure, full_metric (the full fine-tuning),
        full_unretrained (its search evaluation), step (kept; ``round`` too), stopped
        (``threshold`` | ``cap`` | ``exhausted``), unretrained_metric, metric (retrained),
        sparsity, pruned, total, no_passing_mask, trace, config (``at_cap`` among them), ...

    >>> r = prasanna_magnitude_prune("offline", "offline/movies", out_dir="runs/mag")   # doctest: +SKIP
    >>> r["step"], r["no_passing_mask"]                                                 # doctest: +SKIP
    (6, False)
    """
    # lazy: .models imports transformers (~0.7 s), and headcount --help loads this module
    from headcount.core.models import load_model, load_tokenizer

    config = replace(config or MagnitudeConfig(), procedure="prasanna")
    train = train or TrainConfig()
    out = Path(out_dir)
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    task, identity = _open_run(out, model_spec, task, seed, config, train, None)

    full_dir = out / "full"
    say("step 0: fine-tuning the full model")
    full = finetune(model_spec, task, seed=seed, config=train, out_dir=full_dir, progress=progress, callbacks=callbacks)
    model = load_model(str(full_dir / "model"), head=task.kind, num_labels=task.num_labels)
    found = prasanna_magnitude_mask(model, _dev_evaluator(task, load_tokenizer(str(full_dir / "model")), train),
                                    config=config, progress=progress)
    del model
    mask_file = out / "weight_mask.safetensors"
    atomic_write_text(out / "trace.csv", _trace_csv(found.trace, "step"))
    summary = {
        "model": str(model_spec), "task": task.name, "metric_name": task.metric, "seed": int(seed),
        "procedure": "prasanna", "control": "good", "variant": config.variant, "config": asdict(config),
        "full_metric": float(full["final"]["score"]), "full_unretrained": found.full_metric,
        "step": found.step, "round": found.step, "stopped": found.stopped, "no_passing_mask": found.no_passing_mask,
        "unretrained_metric": None if found.no_passing_mask else found.metric,
        "metric": None, "sparsity": None, "pruned": None, "total": found.trace[0]["total"],
        "rewind": "pre-trained", "match": None, "trace": found.trace,
    }
    if found.no_passing_mask:
        remove_listed(mask_file)  # an earlier run's mask is not this result (a user's file is refused)
        if found.stopped == "threshold":
            say(f"no step kept {task.metric} >= {config.threshold} x {found.full_metric:.4f} without retraining "
                "(step 1 failed): no mask, nothing retrained")
        else:
            say(f"kept step 0 (stopped: {found.stopped}): no mask, nothing retrained")
    else:
        save_weight_mask(found.mask, mask_file, meta={"step": found.step, "variant": config.variant, "control": "good",
                                                      "procedure": "prasanna", "model": str(model_spec),
                                                      "task": task.name})
        counts = mask_sparsity(found.mask)
        say(f"kept step {found.step}: sparsity {counts['sparsity']:.4f}; retraining once from {model_spec}")
        m = finetune(model_spec, task, weight_mask=found.mask, seed=seed, config=train, out_dir=out / "retrain",
                     progress=progress, callbacks=callbacks)
        summary.update(metric=float(m["final"]["score"]), sparsity=counts["sparsity"], pruned=counts["pruned"],
                       total=counts["total"])
    summary["seconds"] = round(time.perf_counter() - t_start, 3)
    atomic_write_json(out / "magnitude.json", summary)
    if not found.no_passing_mask:
        say(f"kept step {found.step}: sparsity {summary['sparsity']:.4f}, {task.metric} retrained "
            f"{summary['metric']:.4f} -> {out}")
    return summary


def _rewind_callback(step: int, path: Path, tokenizer_spec: str):
    # lazy: transformers and .models (which imports it) cost ~0.7 s; headcount --help loads this module
    from transformers import TrainerCallback

    from headcount.core.models import load_tokenizer
    from headcount.core.surgery import save_tokenizer

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == step and state.is_world_process_zero and not (path / "config.json").is_file():
                with atomic_dir(path) as tmp:
                    model.save_pretrained(tmp, safe_serialization=True)
                    save_tokenizer(load_tokenizer(tokenizer_spec), tmp)  # as every saved model's tokenizer

    return Snapshot()


def _skipped(out: Path, model_spec, task, seed, config: MagnitudeConfig, match: Path, say) -> dict:
    """A control matched to a run without a passing mask: nothing to match, nothing trained."""
    summary = {"model": str(model_spec), "task": task.name, "metric_name": task.metric, "seed": int(seed),
               "procedure": config.procedure, "control": config.control, "variant": config.variant,
               "config": asdict(config), "full_metric": None, "round": None, "metric": None, "sparsity": None,
               "pruned": None, "total": None, "no_passing_mask": True, "skipped": True, "match": str(match),
               "seconds": 0.0, "trace": []}
    remove_listed(out / "weight_mask.safetensors")
    atomic_write_text(out / "trace.csv", _trace_csv([]))
    atomic_write_json(out / "magnitude.json", summary)
    say(f"skipped: {match} kept no mask (no pruning step passed), so there is no sparsity to match")
    return summary


def iterative_magnitude_prune(model_spec: str, task, *, config: MagnitudeConfig | None = None, train=None,
                              seed: int = 0, out_dir, match=None, progress: Callable[[str], None] | None = None,
                              callbacks: Sequence = ()) -> dict:
    """Iterative (or one-shot) magnitude pruning with retraining from rewound weights (IMP).

    Round 0 fine-tunes the full model (``out_dir/full``). Round k computes a mask from the
    weights fine-tuned in round k-1 (the full model for k = 1), at the round's sparsity and with
    the round's control rule, rewinds (loads ``model_spec`` again, or the full run's step
    ``rewind_step`` snapshot), applies the mask and fine-tunes (``out_dir/round_k``). A new
    classification head is re-initialised identically in every round (same seed). It stops when
    the retrained metric drops below ``threshold`` x the full model's or after ``rounds`` rounds.

    One shot (``config.sparsity`` set, or ``match`` = a finished run's folder whose final
    sparsity — and full fine-tuned weights — are reused): a single round at that sparsity; this is
    how random and bad controls are matched to a good run (of either procedure). A ``match``
    without a passing mask is skipped (``skipped: true``, nothing trained).

    When no round passes: ``no_passing_mask: true``, ``metric``/``sparsity`` null and no
    ``weight_mask.safetensors`` (earlier versions reported the full model at sparsity 0).

    Everything is resumable: each round is a [`finetune`][headcount.train.finetune] folder.

    Args:
        model_spec: the pre-trained model (the rewind target).
        task: task name, YAML path or object.
        config: [`MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig].
        train: [`TrainConfig`][headcount.train.TrainConfig] for every fine-tuning.
        seed: training seed (and the random control's).
        out_dir: output folder: ``weight_mask.safetensors`` (the last passing mask), ``trace.csv``,
            ``magnitude.json``, ``full/``, ``round_XX/``.
        match: a finished ``magnitude`` folder to match (one shot at its final sparsity).
        progress: one-line progress messages.
        callbacks: extra ``TrainerCallback`` objects for every fine-tuning.

    Returns:
        The summary written to ``magnitude.json``.

    >>> r = iterative_magnitude_prune("offline", "offline/movies", out_dir="runs/mag")   # doctest: +SKIP
    >>> r["sparsity"], r["metric"]                                                        # doctest: +SKIP
    (0.5695, 0.83)
    """
    # lazy: .models imports transformers (~0.7 s), and headcount --help loads this module
    from headcount.core.models import load_model

    config = config or MagnitudeConfig(procedure="imp")
    if config.sparsity is None and match is None:
        config = replace(config, procedure="imp")
    train = train or TrainConfig()
    out = Path(out_dir)
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    task, identity = _open_run(out, model_spec, task, seed, config, train, match, write=False)

    # -- the full model (round 0) -----------------------------------------------------------
    if match is not None:
        match = Path(match)
        summary = _read_summary(match)
        if summary.get("no_passing_mask"):
            _claim(out, identity)
            return _skipped(out, model_spec, task, seed, config, match, say)
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
        _claim(out, identity)  # the inputs are checked: the folder is this run's now
    else:
        _claim(out, identity)
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
    counts = mask_sparsity(final_mask) if final_mask is not None else {"sparsity": None, "pruned": None, "total": total}
    summary = {
        "model": str(model_spec),
        "task": task.name,
        "metric_name": task.metric,
        "seed": int(seed),
        "procedure": config.procedure,
        "control": config.control,
        "variant": config.variant,
        "config": asdict(config),
        "full_metric": full_score,
        "round": best["round"],
        "metric": best["metric"] if final_mask is not None else None,
        "sparsity": counts["sparsity"],
        "pruned": counts["pruned"],
        "total": counts["total"],
        "no_passing_mask": final_mask is None,
        "rewind": "pre-trained" if not config.rewind_step else f"step {config.rewind_step}",
        "match": str(match) if match is not None else None,
        "seconds": round(time.perf_counter() - t_start, 3),
        "trace": rows,
    }
    if final_mask is None:  # nothing passed: no mask (not the full model at sparsity 0)
        remove_listed(out / "weight_mask.safetensors")
    else:
        save_weight_mask(final_mask, out / "weight_mask.safetensors",
                         meta={"round": best["round"], "variant": config.variant, "control": config.control,
                               "model": str(model_spec), "task": task.name})
    atomic_write_text(out / "trace.csv", _trace_csv(rows))
    atomic_write_json(out / "magnitude.json", summary)
    if final_mask is None:
        say(f"no round kept {task.metric} >= {config.threshold} x {full_score:.4f}: no mask -> {out}")
    else:
        say(f"kept round {best['round']}: sparsity {counts['sparsity']:.4f}, {task.metric} {best['metric']:.4f} -> {out}")
    return summary


__all__ = ["prasanna_magnitude_prune", "iterative_magnitude_prune", "magnitude_prune"]
