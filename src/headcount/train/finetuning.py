"""The fine-tuning verb: a model prepared with its mask (structured, physical or gated; or a magnitude
weight mask), trained, evaluated and saved into one folder per run (``model/``, ``metrics.json``,
``run.json``; resumed from its newest complete checkpoint)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from headcount.core.gates import set_gates
from headcount.core.masks import Mask
from headcount.data.fingerprint import model_fingerprint, task_fingerprint
from headcount.importance.magnitude import (
    apply_weight_mask,
    load_weight_mask,
    mask_sparsity,
    remove_weight_mask,
)
from headcount.runtime.atomic import atomic_dir, atomic_write_json
from headcount.runtime.device import pad_multiple
from headcount.runtime.errors import HeadcountError
from headcount.runtime.written import claim_run, claim_under, forget_under, owned_check, record_written, remove_listed
from headcount.runtime.launch import launch_rank
from headcount.train.config import MASK_MODES, TrainConfig
from headcount.train.data import DynamicPadding, _as_task, _datasets
from headcount.train.trainer import (
    CHECKPOINT_FILES,
    CLOCK_FILE,
    _epochs,
    _make_clock_callback,
    _make_progress_callback,
    _metrics_fn,
    _read_json,
    _strip,
    _trainer_class,
    _training_args,
    last_complete_checkpoint,
    remove_checkpoint,
)


def _as_mask(mask) -> Mask | None:
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, dict):
        return Mask.from_dict(mask)
    return Mask.load(mask)


def _digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().to(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def mask_summary(mask: Mask | None, mode: str | None = None) -> dict | None:
    """A short description of a head/MLP mask for ``metrics.json``.

    >>> mask_summary(Mask.full(2, 4).without_heads([(0, 1)]), "prune")["heads_kept"]
    7
    """
    if mask is None:
        return None
    n_layers, n_heads = mask.shape
    return {"mode": mode, "heads_kept": mask.n_heads_kept, "heads_total": n_layers * n_heads,
            "mlps_kept": mask.n_mlps_kept, "mlps_total": n_layers,
            "heads": mask.to_dict()["heads"], "mlps": mask.to_dict()["mlps"]}


def prepare_model(model_spec: str, task, *, mask=None, mask_mode: str = "prune", weight_mask=None, seed: int = 0):
    """Load ``model_spec`` for ``task`` and apply the masks (what [`finetune`][headcount.train.finetuning.finetune] trains).

    Structured retraining: ``mask`` removes heads/MLPs from the weights as loaded (pre-trained
    weights for a pre-trained checkpoint). ``weight_mask`` (names -> bool, True = kept) installs
    ``torch.nn.utils.prune`` hooks. The random parts (a new classification head) are drawn
    from ``seed``.

    Returns:
        ``(model, tokenizer, info)``; ``info`` says where the head came from and what was masked.

    >>> model, tok, info = prepare_model("offline", "offline/movies", mask="mask.json")   # doctest: +SKIP
    """
    import transformers

    from headcount.core.models import load_model, load_tokenizer, pad_for_classification
    from headcount.core.surgery import count_parameters, shrink

    task = _as_task(task)
    mask = _as_mask(mask)
    if mask_mode not in MASK_MODES:
        raise HeadcountError(f"unknown mask mode {mask_mode!r}; choose one of {', '.join(MASK_MODES)}")
    from headcount.importance.pipeline import task_head

    info = task_head(model_spec, task)
    transformers.set_seed(seed)  # a new head's initialisation depends on the seed only
    model = load_model(model_spec, head=task.kind, num_labels=task.num_labels)
    if info["head"] == "new" and task.kind == "classification" and getattr(task, "labels", None):
        model.config.id2label = dict(enumerate(task.labels))
        model.config.label2id = {name: i for i, name in enumerate(task.labels)}
    tokenizer = load_tokenizer(model_spec)
    pad_for_classification(model, tokenizer)  # a decoder's classifier finds its last token by the padding id
    info["n_params_before"] = count_parameters(model)
    if mask is not None:
        mask.check_model(model)
        if mask_mode == "prune":
            shrink(model, mask)
        else:
            set_gates(model, heads=mask.heads, mlps=mask.mlps)
            model.headcount_fixed_gates = mask  # recorded into the checkpoint when it is saved
    info["mask"] = mask_summary(mask, mask_mode if mask is not None else None)
    if weight_mask is not None:
        wm = weight_mask if isinstance(weight_mask, dict) else load_weight_mask(weight_mask)
        apply_weight_mask(model, wm)
        info["weight_mask"] = {**mask_sparsity(wm), "digest": _digest(wm)}
    info["n_params"] = count_parameters(model)
    return model, tokenizer, info


def _identity(model_spec, task, seed, config, mask, mask_mode, weight_mask_digest) -> dict:
    return {
        "model": str(model_spec),
        # the contents, not only the names: a rewritten checkpoint or edited CSV is another run
        "model_fingerprint": model_fingerprint(model_spec),
        "task": task.name,
        "task_fingerprint": task_fingerprint(task),
        "seed": int(seed),
        "config": json.loads(json.dumps(config.identity())),
        "mask": None if mask is None else {"mode": mask_mode, "heads": mask.to_dict()["heads"], "mlps": mask.to_dict()["mlps"]},
        "weight_mask": weight_mask_digest,
    }


def _rank0_session(args) -> str:
    """Rank 0's session token on every rank (the temporary folder every rank saves a checkpoint
    into is named for it, and --out's record lists rank 0's session only)."""
    from headcount.runtime.atomic import SESSION

    if int(getattr(args, "world_size", 1)) > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        box = [SESSION]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]
    return SESSION


def _save_model(model, tokenizer, path: Path, extra: dict) -> None:
    from headcount.core.surgery import RECORD, pruning_record, save_pruned, save_tokenizer

    gates = getattr(model, "headcount_fixed_gates", None)
    if gates is not None:  # gate mode: the fixed gates travel in the pruning record
        rec = dict(pruning_record(model) or {})
        rec["gates"] = {"heads": gates.heads.int().tolist(), "mlps": gates.mlps.int().tolist()}
        setattr(model.config, RECORD, rec)
    owned = owned_check(path)  # an earlier model/ is replaced only where its record says each file is headcount's
    if pruning_record(model):
        save_pruned(model, path, tokenizer=tokenizer, extra=extra, owned=owned)
    else:
        tmp = None
        try:
            with atomic_dir(path, owned=owned) as tmp:
                # claimed: a run killed while saving leaves a temporary folder the next run empties of these only
                claim_under(tmp, CHECKPOINT_FILES)
                model.save_pretrained(tmp, safe_serialization=True)
                if tokenizer is not None:  # without the padding/truncation of its last call: the same file every run
                    save_tokenizer(tokenizer, tmp)
        finally:
            if tmp is not None:
                forget_under(tmp)
    record_written(path)  # listed file by file in --out's record


def finetune(model_spec: str, task, *, mask=None, mask_mode: str = "prune", weight_mask=None, seed: int = 0,
             config: TrainConfig | None = None, out_dir, progress: Callable[[str], None] | None = None,
             callbacks: Sequence = ()) -> dict:
    """Fine-tune ``model_spec`` on ``task``; write ``out_dir/model/`` and ``out_dir/metrics.json``.

    Structured retraining = pass ``mask``: it is applied to the weights as loaded (the
    pre-trained ones) before training; ``mask_mode="prune"`` removes the heads/MLPs physically
    (the checkpoint is a pruned one, see [`load_pruned`][headcount.core.surgery.load_pruned]), ``"gate"`` keeps
    the shapes and holds the gates at 0 (recorded in the checkpoint, restored on load).
    Magnitude retraining = pass ``weight_mask`` (names -> bool, or a ``weight_mask.safetensors``).

    A run interrupted mid-training resumes from its last Trainer checkpoint when called again with
    the same ``out_dir``; a finished run returns its metrics without training again. The same
    ``seed`` gives identical metrics on CPU.

    Args:
        model_spec: hub id, local checkpoint directory, or ``"offline"``.
        task: a task name, task YAML path, or a ``headcount.data.tasks.Task``.
        mask: a [`Mask`][headcount.core.masks.Mask], its dict, or a ``mask.json`` path.
        mask_mode: ``"prune"`` (physical) or ``"gate"`` (fixed gates).
        weight_mask: a magnitude mask (see ``headcount.importance.magnitude``) or its file.
        seed: seeds the head initialisation, data order and dropout.
        config: hyper-parameters (default ``TrainConfig``).
        out_dir: the run's folder.
        progress: called with one-line progress messages.
        callbacks: extra ``transformers.TrainerCallback`` objects.

    Returns:
        The contents of ``metrics.json``: ``final`` (validation metrics of the final model, with
        ``score`` the task's metric), ``epochs`` (one row per evaluation), ``train_seconds``,
        ``tokens_per_s``, ``n_params``, ``mask``, ``head``, ...

    Raises:
        HeadcountError: a mask for another model shape, a fine-tuned classifier with another label
            count, or an ``out_dir`` that holds a different run.

    Examples:
        >>> m = finetune("offline", "offline/movies", seed=1, out_dir="runs/ft")     # doctest: +SKIP
        >>> m["final"]["score"]                                                       # doctest: +SKIP
        0.84
    """
    config = config or TrainConfig()
    out = Path(out_dir)
    progress = progress or (lambda msg: None)
    if mask_mode not in MASK_MODES:
        raise HeadcountError(f"unknown mask mode {mask_mode!r}; choose one of {', '.join(MASK_MODES)}")
    task = _as_task(task)
    mask = _as_mask(mask)

    if weight_mask is not None and not isinstance(weight_mask, dict):
        weight_mask = load_weight_mask(weight_mask)
    identity = _identity(model_spec, task, seed, config, mask, mask_mode,
                         None if weight_mask is None else _digest(weight_mask))

    # -- a finished run, or one to resume? ------------------------------------------------------
    previous = claim_run(out, identity, "run.json", write=False, unreadable_is_fresh=True)
    done = _read_json(out / "metrics.json")
    if previous == identity and done is not None and (out / "model" / "config.json").is_file():
        progress(f"{out} is finished: {task.metric} {done['final'].get('score', float('nan')):.4f}")
        return done
    model, tokenizer, info = prepare_model(model_spec, task, mask=mask, mask_mode=mask_mode,
                                           weight_mask=weight_mask, seed=seed)
    # under torchrun / accelerate launch every rank trains, rank 0 alone writes out_dir (the
    # Trainer saves checkpoints from rank 0 too): the other ranks only read it
    writer = launch_rank()[0] == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    resume = last_complete_checkpoint(ckpt_dir)
    before = (_read_json(Path(resume) / CLOCK_FILE) or {}) if resume else {}

    train_ds, eval_ds = _datasets(task, tokenizer, config)
    if writer:
        # the inputs are checked: the folder is this run's now
        claim_run(out, identity, "run.json", unreadable_is_fresh=True)
    if info.get("head_note"):
        progress(info["head_note"])
    args = _training_args(out, config, seed)
    history = out / "evaluations.json"
    if resume is None and writer:
        remove_listed(history)  # a fresh start: earlier evaluations do not count (a user's file there is refused)
    clock = _make_clock_callback(history, float(before.get("train_seconds", 0.0)))
    cbs = [clock, _make_progress_callback(progress, task.metric), *callbacks]
    Trainer = _trainer_class()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer = Trainer(
        model=model,
        args=args,
        data_collator=DynamicPadding(pad, regression=task.kind == "regression",
                                     # GPUs: few shapes, kernels reused. Not on the CPU: a new padded
                                     # length draws dropout masks of another shape, so rounding there
                                     # would change earlier CPU runs' results for no speed gain
                                     pad_to_multiple_of=None if args.device.type == "cpu" else pad_multiple(args.device)),
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        compute_metrics=_metrics_fn(task),
        callbacks=cbs,
    )
    trainer.headcount_group_by_length = config.group_by_length
    trainer.headcount_clock = clock
    trainer.headcount_session = _rank0_session(args)
    if resume:  # what the next checkpoint will hold (claimed before it is saved)
        trainer._headcount_saved = tuple(p.name for p in Path(resume).iterdir() if p.is_file())
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # progress goes through `progress`, not print()
    trainer.remove_callback(ProgressCallback)
    progress(f"training on {args.device}, {'bf16 mixed precision' if args.bf16 else 'fp32'}")
    if resume:
        progress(f"resuming from {Path(resume).name}")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    wall = time.perf_counter() - t0
    state = trainer.state
    # several ranks: every rank reads the history rank 0 wrote, and all take the same branch below
    # (trainer.evaluate() is collective: a rank calling it alone would wait for ever)
    trainer.accelerator.wait_for_everyone()
    # the whole run's training time and tokens: a resumed run adds the part before the checkpoint
    train_seconds = max(float(before.get("train_seconds", 0.0)) + wall - clock.eval_seconds, 1e-9)
    evals = _epochs(_read_json(history) or [])
    if evals and evals[-1]["step"] == state.global_step:
        final = {k: v for k, v in evals[-1].items() if k not in ("epoch", "step")}
    else:
        final = _strip(trainer.evaluate())
    tokens = int(state.num_input_tokens_seen or 0)
    model = trainer.model
    trainer.accelerator.wait_for_everyone()  # everyone has read the history before rank 0 removes it

    metrics = {
        "task": task.name,
        "metric": task.metric,
        "model": str(model_spec),
        "seed": int(seed),
        "final": final,
        "epochs": evals,
        "train_seconds": round(train_seconds, 3),
        "wall_seconds": round(wall, 3),
        "train_tokens": tokens,
        "tokens_per_s": round(tokens / train_seconds, 1),
        "steps": int(state.global_step),
        "resumed_from": Path(resume).name if resume else None,
        "n_train": len(train_ds),
        "n_eval": len(eval_ds),
        "n_params": info["n_params"],
        "n_params_before": info["n_params_before"],
        "head": info["head"],
        "head_note": info.get("head_note"),
        "mask": info["mask"],
        "weight_mask": info.get("weight_mask"),
        "bf16": bool(args.bf16),
        "precision": "bf16" if args.bf16 else "fp32",
        "device": str(args.device),
        "world_size": int(args.world_size),
        "config": json.loads(json.dumps(asdict(config))),
    }
    if trainer.is_world_process_zero():
        if info.get("weight_mask") is not None:
            remove_weight_mask(model)  # bake the zeros into the weights: a plain checkpoint
        _save_model(model, tokenizer, out / "model",
                    extra={"task": task.name, "seed": int(seed), "final": final})
        atomic_write_json(out / "metrics.json", metrics)
        if not config.keep_checkpoints:
            remove_checkpoint(ckpt_dir)  # headcount's files only: a user's note in checkpoints/ stays
        remove_listed(history, refuse=False)  # now in metrics.json (a file the user saved there meanwhile stays)
    progress(f"{task.name}: {task.metric} {final.get('score', float('nan')):.4f} "
             f"({train_seconds:.1f} s, {metrics['tokens_per_s']:.0f} tokens/s) -> {out}")
    return metrics
