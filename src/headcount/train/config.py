"""The fine-tuning settings (``TrainConfig``: Prasanna et al.'s hyper-parameters by default) and
where they run (CPU, bf16)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from headcount.runtime.bounds import BATCH_SIZE, EXAMPLES, LEARNING_RATE, MAX_LENGTH, SEED, STEPS, Bound, check_bounds
from headcount.runtime.device import resolve_device

#: passes over the training split (a fraction is a part of one)
EPOCHS = Bound(0, 1000, low_open=True)
#: warm-up: a fraction of the steps if < 1, else a number of steps
WARMUP = Bound(0, 10**9)
#: micro-batches per optimizer step
ACCUMULATION = Bound(1, 65536, integer=True)
#: AdamW weight decay
WEIGHT_DECAY = Bound(0, 1)
#: gradient clipping (0: none)
GRAD_NORM = Bound(0, 10**6)

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

    #: the sane range of each numeric field ([`headcount.runtime.bounds`][headcount.runtime.bounds], training's own above): the command line and the
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
