"""Where and in which precision models run: the one device rule of every command, job and verb.

Device spec: ``auto`` (the GPU when there is one, else the CPU), ``cpu``, ``cuda`` (the current
CUDA device) or ``cuda:N``. Precision spec: ``auto`` (bf16 autocast on GPUs that support it,
fp32 elsewhere), ``fp32`` or ``bf16`` (autocast: weights stay fp32, matmuls run in bf16).

Where a spec comes from, first found wins:

1. the argument (``--device`` / ``--precision`` on the command line, ``device=`` in the API);
2. the environment: ``HEADCOUNT_DEVICE`` / ``HEADCOUNT_PRECISION`` (the study runner sets
   ``HEADCOUNT_DEVICE`` for each job from the config's ``device:`` and its device pool);
3. for the commands and study jobs, which load the model themselves (``load_for
   <headcount.importance.pipeline.load_for>``): ``auto``. For the library verbs (``hc.score``,
   ``evaluate_batches``), which are handed a model: the device the model is on.

The model goes to its device once ([`place`][headcount.runtime.device.place]); batches follow it ([`to_device`][headcount.runtime.device.to_device]); every
accumulator lives on that device and comes back to the CPU once, at the end.

Batches are re-packed before they reach the model ([`headcount.data.tasks.batching`][headcount.data.tasks.batching]): padded
lengths are rounded up to a multiple ([`pad_multiple`][headcount.runtime.device.pad_multiple]) so that kernels see few distinct
shapes, and consecutive batches are merged up to a token budget ([`default_tokens_per_batch`][headcount.runtime.device.default_tokens_per_batch])
so that a GPU gets enough work per launch. Both defaults for CUDA are judgement, not measurement
(see docs/gpus.md).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from headcount.runtime.errors import HeadcountError
from headcount.runtime.launch import launch_rank

ENV_DEVICE = "HEADCOUNT_DEVICE"
ENV_PRECISION = "HEADCOUNT_PRECISION"
PRECISIONS = ("auto", "fp32", "bf16")
DEVICE_HELP = "auto (the GPU when there is one) | cpu | cuda | cuda:N (default: $HEADCOUNT_DEVICE or auto)"
PRECISION_HELP = "auto (bf16 autocast on GPUs that support it, else fp32) | fp32 | bf16"
TOKENS_HELP = ("real+padding tokens per forward pass when scoring/evaluating (consecutive batches are "
               "merged up to it; results do not change); 0 = the batches as given; default per device")

#: padded lengths are rounded up to a multiple of this (CPU: 8; CUDA: 32, unmeasured)
PAD_MULTIPLE = {"cpu": 8, "cuda": 32}
#: default token budget of one scoring/evaluation forward pass (CPU: 32 x 128; CUDA: unmeasured)
TOKENS_PER_BATCH = {"cpu": 4096, "cuda": 65536}


def cuda_count() -> int:
    """Number of CUDA devices torch sees (0 without a CUDA build or a GPU)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _spec(spec: str | torch.device | None, env: str, default: str) -> str:
    if isinstance(spec, torch.device):
        return str(spec)
    spec = (spec or os.environ.get(env) or default).strip().lower()
    return spec


def resolve_device(spec: str | torch.device | None = None, *, n_cuda: int | None = None) -> torch.device:
    """The device a spec names, refusing one this machine does not have.

    Args:
        spec: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` | a ``torch.device``; None: ``$HEADCOUNT_DEVICE``,
            else ``auto``.
        n_cuda: CUDA devices to assume (tests); default: what torch sees.

    Raises:
        HeadcountError: an unknown spec, or a CUDA device that is not there.

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("auto", n_cuda=0)
    device(type='cpu')
    >>> resolve_device("cuda:1", n_cuda=2)
    device(type='cuda', index=1)
    >>> resolve_device("cuda:2", n_cuda=2)
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: device cuda:2 is not there: this machine has 2 CUDA device(s) (cuda:0..cuda:1)
    """
    text = _spec(spec, ENV_DEVICE, "auto")
    n = cuda_count() if n_cuda is None else n_cuda
    if text == "auto":
        return torch.device("cuda", _current(n)) if n else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text[5:] if text.startswith("cuda:") else None
        if index_text is not None and not (index_text.isascii() and index_text.isdigit()):  # not "cuda:²"
            raise HeadcountError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")
        if n == 0:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
            raise HeadcountError(f"device {text} is not there: no CUDA GPU on this machine "
                                 f"(torch {torch.__version__.split('+')[0]}, {build}); use --device cpu or auto")
        index = int(index_text) if index_text is not None else _current(n)
        if index >= n:
            raise HeadcountError(f"device {text} is not there: this machine has {n} CUDA device(s) "
                                 f"(cuda:0..cuda:{n - 1})")
        return torch.device("cuda", index)
    raise HeadcountError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")


def _current(n: int) -> int:
    try:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):  # a fake count in tests
        return 0


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast is worth it here: GPUs with bf16 support (Ampere and later)."""
    if device.type != "cuda":
        return False
    try:
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported())
    except (RuntimeError, AssertionError):
        return False


def resolve_precision(spec: str | None, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"`` for a spec on ``device``.

    ``auto``: bf16 on a GPU that supports it, fp32 elsewhere. ``bf16`` on the CPU is allowed
    (CPU autocast; slow on most CPUs, used by the tests). None: ``$HEADCOUNT_PRECISION``, else auto.

    >>> resolve_precision("auto", torch.device("cpu"))
    'fp32'
    >>> resolve_precision("bf16", torch.device("cpu"))
    'bf16'
    """
    text = _spec(spec, ENV_PRECISION, "auto")
    if text not in PRECISIONS:
        raise HeadcountError(f"unknown precision {text!r}; choose one of {', '.join(PRECISIONS)}")
    if text == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    if text == "bf16" and device.type == "cuda" and not bf16_supported(device):
        raise HeadcountError(f"{device_name(device)} does not support bf16; use --precision fp32")
    return text


def autocast(device: torch.device, precision: str):
    """The context a forward pass runs in: bf16 autocast, or nothing for fp32.

    >>> with autocast(torch.device("cpu"), "fp32"):
    ...     pass
    """
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def pad_multiple(device: torch.device) -> int:
    """Padded lengths are rounded up to this multiple (8 on the CPU, 32 on CUDA; see docs/gpus.md).

    >>> pad_multiple(torch.device("cpu"))
    8
    """
    return PAD_MULTIPLE.get(device.type, 8)


def default_tokens_per_batch(device: torch.device) -> int:
    """Token budget of one scoring/evaluation forward pass on ``device``.

    >>> default_tokens_per_batch(torch.device("cpu"))
    4096
    """
    return TOKENS_PER_BATCH.get(device.type, TOKENS_PER_BATCH["cpu"])


def model_device(model) -> torch.device:
    """The device of a model's first parameter (CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def place(model, device: str | torch.device | None = None) -> torch.device:
    """Move ``model`` to ``device`` (in place, once: nothing happens when it is there already).

    ``device=None``: ``$HEADCOUNT_DEVICE`` when set, else the model stays where it is.
    """
    if device is None and not os.environ.get(ENV_DEVICE):
        return model_device(model)
    target = resolve_device(device)
    if model_device(model) != target:
        model.to(target)
    return target


def device_name(device: torch.device) -> str:
    """``"cpu"`` or the GPU's name (``"NVIDIA H200"``)."""
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError):
            return str(device)
    return "cpu"


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch's tensors on ``device`` (copies start without waiting where the source allows)."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@dataclass(frozen=True)
class Runtime:
    """Where and how a verb runs: device, precision, padding multiple and token budget.

    >>> rt = Runtime(torch.device("cpu"), "fp32", 8, 4096)
    >>> rt.meta()["device"], rt.meta()["precision"]
    ('cpu', 'fp32')
    """

    device: torch.device
    precision: str
    pad_multiple: int
    tokens_per_batch: int

    def autocast(self):
        return autocast(self.device, self.precision)

    def place(self, model) -> "Runtime":
        """Move ``model`` to this device (in place, once); this runtime."""
        if model_device(model) != self.device:
            model.to(self.device)
        return self

    def with_budget(self, tokens_per_batch: int) -> "Runtime":
        """This runtime with another token budget (0: the batches as given, no merging or rounding)."""
        return _settle(self.device, self.precision, tokens_per_batch)

    def meta(self) -> dict:
        """What results record: ``device``, ``device_name``, ``precision``, ``tokens_per_batch``."""
        return {"device": str(self.device), "device_name": device_name(self.device), "precision": self.precision,
                "tokens_per_batch": self.tokens_per_batch}

    def describe(self) -> str:
        """One line for the user: ``device cuda:0 (NVIDIA H200), bf16 autocast``."""
        name = device_name(self.device)
        where = str(self.device) + (f" ({name})" if name != "cpu" else "")
        return f"device {where}, {'bf16 autocast' if self.precision == 'bf16' else 'fp32'}"


def _settle(dev: torch.device, precision: str | None, tokens_per_batch: int | None) -> Runtime:
    if tokens_per_batch is not None and tokens_per_batch < 0:
        raise HeadcountError(f"--tokens-per-batch must be >= 0, got {tokens_per_batch}")
    budget = default_tokens_per_batch(dev) if tokens_per_batch is None else int(tokens_per_batch)
    return Runtime(dev, resolve_precision(precision, dev), pad_multiple(dev) if budget else 1, budget)


def resolve_runtime(device: str | torch.device | None = None, precision: str | None = None,
                    tokens_per_batch: int | None = None) -> Runtime:
    """The ``Runtime`` of a command's or job's specs, resolved once, before any work (an
    unavailable device or precision: one ``error:`` line, exit 2); the verbs it is handed
    (``device=rt``) use it as it is. None: ``$HEADCOUNT_DEVICE`` / ``$HEADCOUNT_PRECISION``, else auto.

    >>> resolve_runtime("cpu", "fp32", 0)
    Runtime(device=device(type='cpu'), precision='fp32', pad_multiple=1, tokens_per_batch=0)
    """
    return _settle(resolve_device(device), precision, tokens_per_batch)


def runtime(model, device: str | torch.device | Runtime | None = None, precision: str | None = None,
            tokens_per_batch: int | None = None) -> Runtime:
    """Place ``model`` (see [`place`][headcount.runtime.device.place]) and settle precision, padding multiple and token budget.

    ``device`` a ``Runtime`` ([`resolve_runtime`][headcount.runtime.device.resolve_runtime]): the model goes to its device and it is
    used as it is (``precision`` is then ignored; ``tokens_per_batch``, when given, replaces its budget).
    ``tokens_per_batch``: None = the device's default; 0 = batches as given (no merging, no rounding).
    """
    if isinstance(device, Runtime):
        return (device if tokens_per_batch is None else device.with_budget(tokens_per_batch)).place(model)
    return _settle(place(model, device), precision, tokens_per_batch)


def trainer_settings(device: str | None = None, precision: str | None = None) -> dict:
    """``TrainConfig`` fields (``use_cpu``, ``bf16``) for a device and precision spec.

    The ``transformers`` Trainer picks its own GPU (``cuda:0``, or every visible GPU wrapped in
    ``DataParallel``), so ``cuda:N`` is honoured by making GPU N the only one this process sees
    (``CUDA_VISIBLE_DEVICES``); that works while CUDA is not initialised yet in the process (a
    command line or a job process), and is refused otherwise.

    >>> trainer_settings("cpu", "auto")
    {'use_cpu': True, 'bf16': None}
    """
    text = _spec(device, ENV_DEVICE, "auto")
    if text.startswith("cuda:") and launch_rank()[1] > 1:
        raise HeadcountError(f"--device {text} under torchrun / accelerate launch: each process trains on the GPU "
                             "of its LOCAL_RANK; use --device cuda (or auto)")
    if text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit() and text != "cuda:0":
        n = int(text[5:])
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
        if torch.cuda.is_initialized():
            resolve_device(text)  # not there: one line
            raise HeadcountError(f"--device {text}: CUDA is already initialised in this process; "
                                 f"set CUDA_VISIBLE_DEVICES={n if ids is None else ids[n]} and use --device cuda:0")
        if ids is not None and n >= len(ids):
            raise HeadcountError(f"device {text} is not there: CUDA_VISIBLE_DEVICES={visible} shows {len(ids)} GPU(s)")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(n) if ids is None else ids[n]
        if cuda_count() == 0:
            raise HeadcountError(f"device {text} is not there on this machine")
        text = "cuda:0"
    dev = resolve_device(text)
    prec_spec = _spec(precision, ENV_PRECISION, "auto")
    prec = resolve_precision(prec_spec, dev)
    return {"use_cpu": dev.type == "cpu", "bf16": None if prec_spec == "auto" else prec == "bf16"}


# -- several GPUs: the device pool of a study ---------------------------------------------------------
def pool_devices(spec: str | None = None, n_cuda: int | None = None) -> list[str]:
    """The devices a study spreads its jobs over: one job at a time per entry.

    ``auto`` / ``cuda``: every GPU (none: ``["cpu"]``); ``cuda:N``: that one; ``cpu``: ``["cpu"]``.

    >>> pool_devices("auto", n_cuda=0), pool_devices("auto", n_cuda=3), pool_devices("cuda:1", n_cuda=3)
    (['cpu'], ['cuda:0', 'cuda:1', 'cuda:2'], ['cuda:1'])
    """
    text = _spec(spec, ENV_DEVICE, "auto")
    n = cuda_count() if n_cuda is None else n_cuda
    if text in ("auto", "cuda"):
        if n == 0:
            resolve_device(text, n_cuda=0)  # "cuda" without a GPU: refused; "auto": the CPU
            return ["cpu"]
        return [f"cuda:{i}" for i in range(n)]
    return [str(resolve_device(text, n_cuda=n))]


def job_environment(device: str) -> dict[str, str]:
    """Environment of a job pinned to one pool device.

    A GPU job sees only its GPU (``CUDA_VISIBLE_DEVICES``), so the Trainer neither wraps the
    model in ``DataParallel`` nor touches the other GPUs; inside, it is ``cuda:0``.

    >>> job_environment("cuda:3")
    {'CUDA_VISIBLE_DEVICES': '3', 'HEADCOUNT_DEVICE': 'cuda:0'}
    >>> job_environment("cpu")
    {'HEADCOUNT_DEVICE': 'cpu'}
    """
    if device.startswith("cuda:"):
        return {"CUDA_VISIBLE_DEVICES": device[5:], ENV_DEVICE: "cuda:0"}
    return {ENV_DEVICE: device}


__all__ = ["resolve_device", "resolve_precision", "autocast", "place", "runtime", "Runtime", "to_device",
           "model_device", "device_name", "pad_multiple", "default_tokens_per_batch", "pool_devices",
           "job_environment", "resolve_runtime", "ENV_DEVICE", "ENV_PRECISION", "PRECISIONS"]
