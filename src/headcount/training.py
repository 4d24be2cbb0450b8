"""Fine-tuning and retraining with masks, on the transformers ``Trainer``.

Built on ``Trainer`` so that what users expect keeps working: ``accelerate launch`` / torchrun on
several GPUs, bf16 mixed precision, checkpoints, experiment trackers (``report_to``). headcount adds:

- dynamic padding (pad to the longest example of the batch) and length-grouped batches, with a
  sampler seeded per epoch so that a resumed run sees exactly the batches an uninterrupted run sees;
- masks: a head/MLP :class:`~headcount.masks.Mask` applied to the *pre-trained* weights before
  training, physically (``mask_mode="prune"``, via :func:`~headcount.surgery.shrink`) or as gates
  fixed at 0 (``mask_mode="gate"``); a magnitude weight mask (see :mod:`headcount.magnitude`)
  applied with ``torch.nn.utils.prune`` hooks that stay on during training;
- one output folder per run: ``model/`` (the checkpoint), ``metrics.json`` (per-epoch validation
  metric, final metrics, time, tokens/s, parameters, mask summary), ``run.json`` (what the run is)
  and, while it runs, ``checkpoints/`` (Trainer checkpoints). Calling :func:`finetune` again with
  the same ``out_dir`` resumes from the newest *complete* checkpoint (one cut short by a kill
  or a full disk, without a readable ``trainer_state.json``, is discarded), or returns the
  finished run's metrics. The run's identity (``run.json``) holds content fingerprints of the
  model and the task's data files (:mod:`headcount.fingerprint`): edited data is another run.

Prasanna et al. (2020) hyper-parameters are the defaults: lr 2e-5, batch 32, 3 epochs, max length
128, no weight decay, no warmup, gradient clipping at 1.0.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from . import tasks
from .atomic import atomic_dir, atomic_write_json
from .device import pad_multiple, resolve_device
from .errors import HeadcountError
from .evaluation import evaluate_batches
from .fingerprint import model_fingerprint, task_fingerprint
from .gates import set_gates
from .launch import launch_rank
from .magnitude import (
    apply_weight_mask,
    load_weight_mask,
    mask_sparsity,
    remove_weight_mask,
)
from .masks import Mask
from .settings import (
    ACCUMULATION,
    BATCH_SIZE,
    EPOCHS,
    EXAMPLES,
    GRAD_NORM,
    LEARNING_RATE,
    MAX_LENGTH,
    SEED,
    STEPS,
    WARMUP,
    WEIGHT_DECAY,
    check_bounds,
)

MASK_MODES = ("prune", "gate")

#: TrainConfig fields that do not change what a run computes (left out of the run's identity)
_NOT_IDENTITY = {"save_steps", "keep_checkpoints", "report_to", "logging_steps", "use_cpu"}


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning hyper-parameters (defaults: Prasanna et al. 2020).

    Attributes:
        lr: peak learning rate (linear decay to 0).
        batch_size: examples per device and step.
        epochs: passes over the training split.
        max_length: tokens per example (longer ones are truncated).
        weight_decay: AdamW weight decay.
        warmup: linear warm-up; a fraction of the steps if < 1, else a number of steps.
        max_grad_norm: gradient clipping.
        eval_each_epoch: evaluate on the validation split after every epoch.
        bf16: bf16 mixed precision; None = on for GPUs that support it.
        group_by_length: batch examples of similar length together (less padding).
        max_train_examples: a subset of the training split (drawn with ``data_seed``).
        max_eval_examples: a subset of the validation split (drawn with ``data_seed``).
        eval_batch_size: examples per evaluation batch.
        max_steps: stop after this many optimizer steps (None = ``epochs`` decide).
        gradient_accumulation_steps: micro-batches per optimizer step.
        data_seed: the seed of the data subsets, fixed across training seeds so that runs with
            different seeds see the same examples.
        save_steps: a Trainer checkpoint every this many steps (what a resumed run restarts from).
        keep_checkpoints: keep ``checkpoints/`` after a run finishes (default: removed).
        report_to: experiment trackers (``"wandb"``, ``"tensorboard"``, ...); empty = none.
        logging_steps: training-loss log interval.
        use_cpu: train on the CPU even where a GPU is available.

    >>> TrainConfig(epochs=1, lr=1e-4).batch_size
    32
    """

    lr: float = 2e-5
    batch_size: int = 32
    epochs: float = 3
    max_length: int = 128
    weight_decay: float = 0.0
    warmup: float = 0.0
    max_grad_norm: float = 1.0
    eval_each_epoch: bool = True
    bf16: bool | None = None
    group_by_length: bool = True
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    eval_batch_size: int = 64
    max_steps: int | None = None
    gradient_accumulation_steps: int = 1
    data_seed: int = 0
    save_steps: int = 500
    keep_checkpoints: bool = False
    report_to: tuple[str, ...] = ()
    logging_steps: int = 50
    use_cpu: bool = False

    #: the sane range of each numeric field (:mod:`headcount.settings`): the command line and the
    #: study configs build a TrainConfig, so this one check is theirs too
    BOUNDS = {"lr": LEARNING_RATE, "batch_size": BATCH_SIZE, "epochs": EPOCHS, "max_length": MAX_LENGTH,
              "weight_decay": WEIGHT_DECAY, "warmup": WARMUP, "max_grad_norm": GRAD_NORM,
              "max_train_examples": EXAMPLES, "max_eval_examples": EXAMPLES, "eval_batch_size": BATCH_SIZE,
              "max_steps": STEPS, "gradient_accumulation_steps": ACCUMULATION, "data_seed": SEED,
              "save_steps": STEPS, "logging_steps": STEPS}

    def __post_init__(self):
        check_bounds(self, self.BOUNDS)
        object.__setattr__(self, "report_to", tuple(self.report_to))

    def identity(self) -> dict:
        """The fields that decide what a run computes (resuming requires them to match)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_IDENTITY}


# -- data --------------------------------------------------------------------------------------
class EncodedDataset(torch.utils.data.Dataset):
    """Encoded examples (``{"input_ids": [...], "token_type_ids": [...], "labels": ...}``) as a
    map-style dataset; ``lengths`` feeds the length-grouped sampler."""

    def __init__(self, encoded):
        self.examples = encoded
        lengths = getattr(encoded, "lengths", None)  # headcount.tasks.Encoded stores them
        self.lengths = ([int(x) for x in lengths] if lengths is not None
                        else [len(encoded[i]["input_ids"]) for i in range(len(encoded))])

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return self.examples[i]


class DynamicPadding:
    """Collate examples into a batch padded to its longest example (the same batch format as
    ``headcount.tasks.make_batches``): ``input_ids``, ``attention_mask``, ``token_type_ids`` (when
    the examples have them) ``[batch, seq]`` and ``labels`` ``[batch]``.

    Args:
        pad_token_id: the tokenizer's padding id.
        regression: float labels (else class ids).
        pad_to_multiple_of: round the padded length up (8 suits tensor cores on GPUs).

    >>> DynamicPadding(0)([{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [5], "labels": 0}])["attention_mask"]
    tensor([[1, 1, 1],
            [1, 0, 0]])
    """

    def __init__(self, pad_token_id: int = 0, regression: bool = False, pad_to_multiple_of: int | None = None):
        self.pad_token_id = int(pad_token_id)
        self.regression = regression
        self.multiple = pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        n = max(len(f["input_ids"]) for f in features)
        if self.multiple:
            n = -(-n // self.multiple) * self.multiple
        b = len(features)
        ids = torch.full((b, n), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((b, n), dtype=torch.long)
        types = torch.zeros((b, n), dtype=torch.long) if "token_type_ids" in features[0] else None
        for i, f in enumerate(features):
            k = len(f["input_ids"])
            ids[i, :k] = torch.as_tensor(f["input_ids"], dtype=torch.long)
            attention[i, :k] = 1
            if types is not None:
                types[i, :k] = torch.as_tensor(f["token_type_ids"], dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": attention}
        if types is not None:
            batch["token_type_ids"] = types
        if "labels" in features[0]:
            labels = [float(f["labels"]) if self.regression else int(f["labels"]) for f in features]
            batch["labels"] = torch.tensor(labels, dtype=torch.float32 if self.regression else torch.long)
        return batch


class LengthGroupedEpochSampler(torch.utils.data.Sampler):
    """Random order with examples of similar length batched together, seeded per epoch.

    Examples are grouped as transformers' ``LengthGroupedSampler`` does (random megabatches of
    50 batches, sorted by length), then the batches are shuffled (the longest first).

    The order of epoch ``e`` depends only on ``(seed, e)``, not on the global RNG: a run resumed
    mid-epoch from a checkpoint replays the same batches as an uninterrupted run.

    >>> s = LengthGroupedEpochSampler([3, 9, 4, 8], batch_size=2, seed=0)
    >>> sorted(s) == [0, 1, 2, 3]
    True
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self):
        return len(self.lengths)

    def __iter__(self):
        from transformers.trainer_pt_utils import get_length_grouped_indices

        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        # megabatches of 50 batches, each sorted by length, the longest batch first ...
        order = get_length_grouped_indices(self.lengths, self.batch_size, generator=g)
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        # ... then the batches in random order (the longest stays first: out-of-memory shows at once),
        # so that lengths do not drift from long to short within each megabatch
        rest = [batches[i] for i in (torch.randperm(len(batches) - 1, generator=g) + 1).tolist()]
        return iter([i for b in batches[:1] + rest for i in b])


class _FixedOrder(torch.utils.data.Sampler):
    def __init__(self, order):
        self.order = list(order)

    def __len__(self):
        return len(self.order)

    def __iter__(self):
        return iter(self.order)


# -- the Trainer -----------------------------------------------------------------------------------
def _trainer_class():
    from transformers import Trainer

    class HeadcountTrainer(Trainer):
        """``Trainer`` with a per-epoch-seeded length-grouped sampler and length-sorted evaluation."""

        headcount_group_by_length = True

        def _get_train_sampler(self, train_dataset=None):
            ds = train_dataset if train_dataset is not None else self.train_dataset
            if self.headcount_group_by_length and isinstance(ds, EncodedDataset):
                group = self.args.train_batch_size * self.args.gradient_accumulation_steps * max(1, self.args.world_size)
                return LengthGroupedEpochSampler(ds.lengths, group, seed=self.args.seed)
            return super()._get_train_sampler(train_dataset)

        def evaluate(self, *args, **kwargs):
            # Evaluation must not move the global RNG (its data loader draws a seed from it):
            # a run resumed from a checkpoint saved at an epoch's last step restores the RNG as
            # it was before the epoch-end evaluation, so the next epoch's dropout would differ.
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=devices):
                return super().evaluate(*args, **kwargs)

        def _track_num_input_tokens(self, inputs):
            # The base class adds `.item()` of a device tensor at every step: a host sync that
            # stalls a GPU. In one process, count on the device; the state gets the count only
            # when it is read (logging, evaluation, checkpoints, the end). Same numbers on CPU.
            if (self.args.world_size > 1 or self.args.include_num_input_tokens_seen != "non_padding"
                    or "attention_mask" not in inputs):
                return super()._track_num_input_tokens(inputs)
            n = inputs["attention_mask"].sum()
            pending = getattr(self, "_headcount_tokens", None)
            self._headcount_tokens = n if pending is None else pending + n

        def _headcount_flush_tokens(self):
            pending = getattr(self, "_headcount_tokens", None)
            if pending is not None:
                self.state.num_input_tokens_seen += int(pending)
                self._headcount_tokens = None

        def _maybe_log_save_evaluate(self, *args, **kwargs):
            c = self.control
            if c.should_log or c.should_save or c.should_evaluate or c.should_training_stop:
                self._headcount_flush_tokens()
            return super()._maybe_log_save_evaluate(*args, **kwargs)

        def _finalize_training(self, *args, **kwargs):
            self._headcount_flush_tokens()
            return super()._finalize_training(*args, **kwargs)

        def train(self, *args, **kwargs):
            try:
                return super().train(*args, **kwargs)
            finally:
                self._headcount_flush_tokens()

        def _get_eval_sampler(self, eval_dataset):
            if isinstance(eval_dataset, EncodedDataset) and self.args.world_size <= 1:
                # longest first: little padding, and an out-of-memory error shows up at once
                return _FixedOrder(sorted(range(len(eval_dataset)), key=lambda i: -eval_dataset.lengths[i]))
            return super()._get_eval_sampler(eval_dataset)

    return HeadcountTrainer


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


def _make_progress_callback(progress: Callable[[str], None], metric: str):
    class Progress(_callback_base()):
        def on_train_begin(self, args, state, control, **kw):
            if state.global_step:
                progress(f"resuming at step {state.global_step}/{state.max_steps}")

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            if metrics and "eval_score" in metrics:
                progress(f"epoch {state.epoch:.2f} step {state.global_step}/{state.max_steps}: "
                         f"{metric} {metrics['eval_score']:.4f}")

    return Progress()


def _make_clock_callback(history_file: Path, seconds_before: float = 0.0):
    class Clock(_callback_base()):
        """Evaluation seconds during this call (for tokens/s), the training seconds so far saved in
        each checkpoint (``headcount_clock.json``: a resumed run's totals include the part before
        it), and every evaluation appended to ``history_file`` (a checkpoint saved at an epoch's
        last step predates that epoch's evaluation, so the Trainer state alone can lose it)."""

        def __init__(self):
            self.tokens0 = 0
            self.eval_seconds = 0.0
            self.t0 = time.perf_counter()

        def on_train_begin(self, args, state, control, **kw):
            self.tokens0 = int(state.num_input_tokens_seen or 0)
            self.t0 = time.perf_counter()

        def on_save(self, args, state, control, **kw):
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir() and state.is_world_process_zero:
                seconds = seconds_before + time.perf_counter() - self.t0 - self.eval_seconds
                atomic_write_json(ckpt / CLOCK_FILE, {"train_seconds": round(max(seconds, 0.0), 3)})

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            metrics = metrics or {}
            self.eval_seconds += float(metrics.get("eval_runtime", 0.0))
            if "eval_score" in metrics and state.is_world_process_zero:
                rows = _read_json(history_file) or []
                rows.append({"epoch": round(float(state.epoch or 0.0), 4), "step": int(state.global_step),
                             **_strip(metrics)})
                atomic_write_json(history_file, rows)

    return Clock()


# -- helpers -----------------------------------------------------------------------------------------
def _tasks():
    return tasks


def _as_task(task):
    if isinstance(task, (str, Path)):
        return _tasks().get_task(str(task))
    if not hasattr(task, "load"):
        raise HeadcountError(f"not a task: {task!r}")
    return task


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


def _use_cpu(config: TrainConfig) -> bool:
    """Train on the CPU: asked for, or the device rule says so (``$HEADCOUNT_DEVICE=cpu``, no GPU)."""
    return bool(config.use_cpu or resolve_device(None).type == "cpu")


def use_bf16(config: TrainConfig) -> bool:
    """Whether a run with ``config`` trains in bf16 here (auto: GPUs that support it).

    >>> use_bf16(TrainConfig(use_cpu=True))
    False
    """
    if config.bf16 is not None:
        return bool(config.bf16)
    return bool(not _use_cpu(config) and torch.cuda.is_available() and torch.cuda.is_bf16_supported())


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
    """Load ``model_spec`` for ``task`` and apply the masks (what :func:`finetune` trains).

    Structured retraining: ``mask`` removes heads/MLPs from the weights as loaded (pre-trained
    weights for a pre-trained checkpoint). ``weight_mask`` (names -> bool, True = kept) installs
    ``torch.nn.utils.prune`` hooks. The random parts (a new classification head) are drawn
    from ``seed``.

    Returns:
        ``(model, tokenizer, info)``; ``info`` says where the head came from and what was masked.

    >>> model, tok, info = prepare_model("offline", "offline/movies", mask="mask.json")   # doctest: +SKIP
    """
    import transformers

    from .models import load_model, load_tokenizer
    from .surgery import count_parameters, shrink

    task = _as_task(task)
    mask = _as_mask(mask)
    if mask_mode not in MASK_MODES:
        raise HeadcountError(f"unknown mask mode {mask_mode!r}; choose one of {', '.join(MASK_MODES)}")
    from .pipeline import task_head

    info = task_head(model_spec, task)
    transformers.set_seed(seed)  # a new head's initialisation depends on the seed only
    model = load_model(model_spec, head=task.kind, num_labels=task.num_labels)
    if info["head"] == "new" and task.kind == "classification" and getattr(task, "labels", None):
        model.config.id2label = dict(enumerate(task.labels))
        model.config.label2id = {name: i for i, name in enumerate(task.labels)}
    tokenizer = load_tokenizer(model_spec)
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


def _datasets(task, tokenizer, config: TrainConfig):
    T = _tasks()
    train = task.load(task.train_split, max_examples=config.max_train_examples, seed=config.data_seed)
    dev = task.load(task.validation_split, max_examples=config.max_eval_examples, seed=config.data_seed)
    if len(train.texts) == 0:
        raise HeadcountError(f"task {task.name} has no training examples")
    if len(dev.texts) == 0:
        raise HeadcountError(f"task {task.name} has no validation examples")
    return (EncodedDataset(T.encode(train, tokenizer, max_length=config.max_length)),
            EncodedDataset(T.encode(dev, tokenizer, max_length=config.max_length)))


def _metrics_fn(task):
    T = _tasks()

    def compute(eval_pred):
        preds = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        preds = np.asarray(preds, dtype=np.float32)
        if preds.ndim == 2 and preds.shape[1] == 1:
            preds = preds[:, 0]
        return {k: float(v) for k, v in T.compute_metrics(task.metric, preds, np.asarray(eval_pred.label_ids)).items()}

    return compute


def _training_args(out: Path, config: TrainConfig, seed: int):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.eval_batch_size,
        num_train_epochs=float(config.epochs),
        max_steps=config.max_steps or -1,
        learning_rate=config.lr,
        lr_scheduler_type="linear",
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup,
        max_grad_norm=config.max_grad_norm,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        eval_strategy="epoch" if config.eval_each_epoch else "no",
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=1,
        logging_strategy="steps",
        logging_steps=config.logging_steps,
        include_num_input_tokens_seen="non_padding",
        report_to=list(config.report_to) or "none",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        bf16=use_bf16(config),
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available() and not _use_cpu(config),
        use_cpu=_use_cpu(config),
        remove_unused_columns=False,
        label_names=["labels"],
        train_sampling_strategy="random",  # length grouping is HeadcountTrainer's own sampler
    )


def _strip(metrics: dict) -> dict:
    """Validation metrics without the ``eval_`` prefix and timing entries."""
    skip = {"runtime", "samples_per_second", "steps_per_second", "epoch", "step", "num_input_tokens_seen"}
    out = {}
    for k, v in metrics.items():
        k = k[5:] if k.startswith("eval_") else k
        if k not in skip and isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def _epochs(history: list[dict]) -> list[dict]:
    """One row per evaluated step (the latest wins: a replayed step gives the same values)."""
    by_step = {int(row["step"]): row for row in history}
    return [by_step[k] for k in sorted(by_step)]


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


CLOCK_FILE = "headcount_clock.json"


def last_complete_checkpoint(ckpt_dir: Path, discard: bool = True) -> str | None:
    """The newest complete Trainer checkpoint under ``ckpt_dir`` (None when there is none).

    ``Trainer`` writes ``trainer_state.json`` last, so a checkpoint without a readable one was
    cut short (a kill, a full disk); such partial checkpoints are removed when ``discard``.
    """
    if not ckpt_dir.is_dir():
        return None
    found = []
    for p in ckpt_dir.iterdir():
        name, _, step = p.name.partition("-")
        if p.is_dir() and name == "checkpoint" and step.isdigit():
            found.append((int(step), p))
    best = None
    for step, p in sorted(found, reverse=True):
        state = _read_json(p / "trainer_state.json")
        if best is None and isinstance(state, dict) and "global_step" in state:
            best = p
        elif best is None and discard:
            shutil.rmtree(p, ignore_errors=True)  # partial: never resumed from
    return str(best) if best is not None else None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _save_model(model, tokenizer, path: Path, extra: dict) -> None:
    from .surgery import RECORD, pruning_record, save_pruned, save_tokenizer

    gates = getattr(model, "headcount_fixed_gates", None)
    if gates is not None:  # gate mode: the fixed gates travel in the pruning record
        rec = dict(pruning_record(model) or {})
        rec["gates"] = {"heads": gates.heads.int().tolist(), "mlps": gates.mlps.int().tolist()}
        setattr(model.config, RECORD, rec)
    if pruning_record(model):
        save_pruned(model, path, tokenizer=tokenizer, extra=extra)
        return
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:  # without the padding/truncation of its last call: the same file every run
            save_tokenizer(tokenizer, tmp)


# -- the verbs ---------------------------------------------------------------------------------------
def finetune(model_spec: str, task, *, mask=None, mask_mode: str = "prune", weight_mask=None, seed: int = 0,
             config: TrainConfig | None = None, out_dir, progress: Callable[[str], None] | None = None,
             callbacks: Sequence = ()) -> dict:
    """Fine-tune ``model_spec`` on ``task``; write ``out_dir/model/`` and ``out_dir/metrics.json``.

    Structured retraining = pass ``mask``: it is applied to the weights as loaded (the
    pre-trained ones) before training; ``mask_mode="prune"`` removes the heads/MLPs physically
    (the checkpoint is a pruned one, see :func:`~headcount.surgery.load_pruned`), ``"gate"`` keeps
    the shapes and holds the gates at 0 (recorded in the checkpoint, restored on load).
    Magnitude retraining = pass ``weight_mask`` (names -> bool, or a ``weight_mask.safetensors``).

    A run interrupted mid-training resumes from its last Trainer checkpoint when called again with
    the same ``out_dir``; a finished run returns its metrics without training again. The same
    ``seed`` gives identical metrics on CPU.

    Args:
        model_spec: hub id, local checkpoint directory, or ``"offline"``.
        task: a task name, task YAML path, or a :class:`headcount.tasks.Task`.
        mask: a :class:`~headcount.masks.Mask`, its dict, or a ``mask.json`` path.
        mask_mode: ``"prune"`` (physical) or ``"gate"`` (fixed gates).
        weight_mask: a magnitude mask (see :mod:`headcount.magnitude`) or its file.
        seed: seeds the head initialisation, data order and dropout.
        config: hyper-parameters (default :class:`TrainConfig`).
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
    previous = _read_json(out / "run.json")
    if previous is not None and previous != identity:
        diff = sorted(k for k in identity if previous.get(k) != identity.get(k))
        raise HeadcountError(f"{out} holds a different run (different {', '.join(diff)}); use another --out or delete it")
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
        atomic_write_json(out / "run.json", identity)  # the inputs are checked: the folder is this run's now
    if info.get("head_note"):
        progress(info["head_note"])
    args = _training_args(out, config, seed)
    history = out / "evaluations.json"
    if resume is None and writer:
        history.unlink(missing_ok=True)  # a fresh start: earlier evaluations do not count
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
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        history.unlink(missing_ok=True)  # now in metrics.json
    progress(f"{task.name}: {task.metric} {final.get('score', float('nan')):.4f} "
             f"({train_seconds:.1f} s, {metrics['tokens_per_s']:.0f} tokens/s) -> {out}")
    return metrics


def evaluate(model, task_or_data, *, tokenizer=None, split: str | None = None, metric: str | None = None,
             batch_size: int = 64, max_length: int = 128, max_examples: int | None = None, seed: int = 0,
             mask: Mask | None = None, device=None, precision=None, tokens_per_batch: int | None = None) -> dict:
    """Validation metrics of ``model`` (no gradient, dynamic padding, batches grouped by length).

    Args:
        model: a model that returns ``loss`` and ``logits`` for batches with ``labels``.
        task_or_data: a task (name, YAML path or object: its ``split``, default the validation
            split, is loaded), a ``TaskData`` (encoded with ``tokenizer``), an encoded split
            (``headcount.tasks.encode`` output; ``metric`` needed), or a list of prepared batches.
        tokenizer: needed for a task or ``TaskData``; default: loaded from ``model.name_or_path``.
        split: which split of a task.
        metric: the metric name (default: the task's).
        batch_size: examples per batch.
        max_length: tokens per example.
        max_examples: a subset of the split, drawn with ``seed``.
        seed: the subset's seed.
        mask: a head/MLP mask applied as gates during the evaluation.
        device / precision / tokens_per_batch: where and how it runs (:mod:`headcount.device`;
            default: where the model is, auto precision, the device's token budget).

    Returns:
        ``{"score": primary metric, "loss": mean loss, ...metric parts, "n_examples": n}``.

    >>> evaluate(model, "offline/movies", tokenizer=tok)["score"]      # doctest: +SKIP
    0.84
    """
    T = _tasks()
    if isinstance(task_or_data, list) and task_or_data and isinstance(task_or_data[0], dict) \
            and torch.is_tensor(task_or_data[0].get("input_ids")):
        batches = task_or_data
    else:
        encoded = task_or_data
        if isinstance(task_or_data, (str, Path)) or hasattr(task_or_data, "load"):
            task = _as_task(task_or_data)
            encoded = task.load(split or task.validation_split, max_examples=max_examples, seed=seed)
        if hasattr(encoded, "texts") and hasattr(encoded, "task"):  # TaskData
            metric = metric or encoded.task.metric
            if tokenizer is None:
                from .models import load_tokenizer

                tokenizer = load_tokenizer(getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", ""))
            encoded = T.encode(encoded, tokenizer, max_length=max_length)
        pad = 0
        if tokenizer is not None and tokenizer.pad_token_id is not None:
            pad = tokenizer.pad_token_id
        batches = T.make_batches(encoded, batch_size, shuffle=False, group_by_length=True, pad_token_id=pad)
    if metric is None:
        raise HeadcountError("evaluate() needs metric= for encoded data or prepared batches")
    return evaluate_batches(model, batches, metric, mask=mask, device=device, precision=precision,
                            tokens_per_batch=tokens_per_batch)


__all__ = ["TrainConfig", "finetune", "evaluate", "prepare_model", "DynamicPadding", "LengthGroupedEpochSampler",
           "EncodedDataset", "mask_summary", "use_bf16", "MASK_MODES"]
