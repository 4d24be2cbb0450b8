"""headcount's ``Trainer``: the subclass (its sampler, evaluation), the callbacks (progress, the clock
that counts a resumed run's time), the training arguments, and finding the newest complete checkpoint."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from headcount.runtime.atomic import SESSION, TMP_PREFIX
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json
from headcount.runtime.written import claim_under, move_listed, remove_written, write_listed_json
from headcount.train.config import TrainConfig, _use_cpu, use_bf16
from headcount.train.data import EncodedDataset, LengthGroupedEpochSampler, _FixedOrder, _tasks


def _trainer_class():
    from transformers import Trainer

    class HeadcountTrainer(Trainer):
        """``Trainer`` with a per-epoch-seeded length-grouped sampler and length-sorted evaluation."""

        headcount_group_by_length = True
        #: rank 0's session (every rank saves into the same temporary folder); None: this process's
        headcount_session = None
        #: the Clock callback whose training seconds go into each checkpoint (None: no clock file)
        headcount_clock = None
        _headcount_save_dir = None
        _headcount_saved: tuple[str, ...] = ()

        def _get_output_dir(self, trial):
            return self._headcount_save_dir or super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            # Saved into a temporary folder named for rank 0's session, with the claims of the files
            # it will hold in --out's record; then, every rank's files written, moved into place file
            # by file under names listed first, trainer_state.json (what makes it complete) last. A
            # kill leaves either the temporary folder (the next run removes what was claimed) or a
            # checkpoint whose files are all listed: a user's file saved into it is never removed.
            run_dir = Path(super()._get_output_dir(trial))
            name = f"checkpoint-{self.state.global_step}"
            tmp = run_dir / f"{TMP_PREFIX}{self.headcount_session or SESSION}.{name}.save"
            zero = self.is_world_process_zero()
            if zero:
                world = max(1, self.args.world_size)
                claim_under(tmp / name, sorted({*CHECKPOINT_FILES, *self._headcount_saved,
                                                *(f"rng_state_{i}.pth" for i in range(world))}))
            self._headcount_save_dir = str(tmp)
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self._headcount_save_dir = None
            if zero and self.headcount_clock is not None:
                (tmp / name / CLOCK_FILE).write_text(json.dumps({"train_seconds": self.headcount_clock.seconds()}) + "\n")
            self.accelerator.wait_for_everyone()  # every rank's rng_state_N.pth is in the folder
            if zero:
                self._headcount_saved = tuple(move_listed(tmp / name, run_dir / name, last=("trainer_state.json",)))
                try:
                    tmp.rmdir()
                except OSError:
                    pass
                for old in run_dir.glob("checkpoint-*"):  # keep the newest one (save_total_limit=1)
                    step = old.name.partition("-")[2]
                    if old.is_dir() and not old.is_symlink() and step.isdigit() and int(step) < self.state.global_step:
                        remove_checkpoint(old)
            self.accelerator.wait_for_everyone()

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
    from headcount.runtime.progress import LinesTo
    from headcount.runtime.progress import Progress as StepProgress

    class Progress(_callback_base()):
        """The evaluations' lines, and steps done / total with a rate and an ETA (the rate-limited
        lines of ``headcount.runtime.progress``) through ``progress``."""

        bar = None

        def on_train_begin(self, args, state, control, **kw):
            if state.global_step:
                progress(f"resuming at step {state.global_step}/{state.max_steps}")
            self.start_step = state.global_step
            self.bar = StepProgress(state.max_steps - state.global_step, "training", unit="steps",
                                    stream=LinesTo(progress), terminal=False)

        def on_step_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.update(state.global_step - self.start_step)

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.close()

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

        def seconds(self) -> float:
            """The training seconds so far (what HeadcountTrainer writes into each checkpoint)."""
            return round(max(seconds_before + time.perf_counter() - self.t0 - self.eval_seconds, 0.0), 3)

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            metrics = metrics or {}
            self.eval_seconds += float(metrics.get("eval_runtime", 0.0))
            if "eval_score" in metrics and state.is_world_process_zero:
                rows = _read_json(history_file) or []
                rows.append({"epoch": round(float(state.epoch or 0.0), 4), "step": int(state.global_step),
                             **_strip(metrics)})
                write_listed_json(history_file, rows)  # listed after each write: a user's file there is refused

    return Clock()


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
        save_total_limit=None,  # the Clock callback keeps the newest checkpoint, removing only headcount's files
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


CLOCK_FILE = "headcount_clock.json"
#: what a Trainer checkpoint of headcount holds (claimed before each save; the names of the last
#: save are added): a run killed while saving leaves these, which the next run removes
CHECKPOINT_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "trainer_state.json",
    CLOCK_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "spiece.model", "sentencepiece.bpe.model",
)


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
            remove_checkpoint(p)  # partial: never resumed from
    return str(best) if best is not None else None


def remove_checkpoint(path: Path) -> None:
    """Remove a checkpoint folder: inside a command's ``--out``, only the files its record lists
    ([`headcount.runtime.written.remove_written`][headcount.runtime.written.remove_written]; a user's file stays, with its folders), and so in a
    study job's folder, which the local executor opens as such a guard
    ([`headcount.experiments.runner.jobfiles.job_guard`][headcount.experiments.runner.jobfiles.job_guard]); a library caller's own folder goes whole."""
    if not remove_written(path):
        shutil.rmtree(path, ignore_errors=True)


def _read_json(path: Path):
    try:
        return parse_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, HeadcountError):  # HeadcountError: huge or deep
        return None
