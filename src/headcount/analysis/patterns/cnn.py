"""The pattern CNN of Prasanna et al. (2020): train on labelled maps, predict, save, load.

Two architectures ([`ARCHITECTURES`][headcount.analysis.patterns.cnn.ARCHITECTURES]):

- ``prasanna`` (default; their ``classify_attention_patterns.py``): six unpadded 3x3 convolutions
  with ReLU (16, 16 | max-pool 2 | 32, 32 | max-pool 2 | 64, 64 channels), a 1x1 convolution to 16
  channels, global average pooling and a 1x1 convolution to the class logits; Xavier-normal
  weights and zero biases; raw attention values as input. It reads maps of any side >= 32
  ([`PRASANNA_MIN_SIZE`][headcount.analysis.patterns.cnn.PRASANNA_MIN_SIZE]); per-example maps are centre-padded with zeros to one side
  ([`headcount.analysis.patterns.center_pad`][headcount.analysis.patterns.center_pad]), the largest training map's by default.
- ``small`` (headcount's earlier net, kept to reload CNNs saved before and for maps smaller than
  32 cells): two blocks of 3x3 convolution (padded) + ReLU + 2x2 max-pooling and a linear layer;
  inputs scaled by their side S so that uniform attention reads 1; torch's default initialisation.

The training recipe is the paper's: Adam (lr 1e-3), batch 64, 200 epochs, a stratified 20%
validation part, and the checkpoint of the best validation accuracy (the latest of equal ones).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from headcount.analysis.patterns.features import CLASSES, MAP_SIZE, _check_square, _to_numpy
from headcount.analysis.patterns.labels import label_ids
from headcount.analysis.patterns.layout import center_pad
from headcount.runtime.atomic import atomic_path, atomic_write_json
from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError

#: The CNN architectures: the paper's (default) and headcount's earlier small net.
ARCHITECTURES: tuple[str, ...] = ("prasanna", "small")
#: the side of an attention map (the pattern CNN's input)
MAP_SIDE = Bound(4, 4096, integer=True)
#: passes of the pattern CNN over its maps
CNN_EPOCHS = Bound(1, 10**4, integer=True)

#: Smallest map side the ``prasanna`` net reads: 32 -> 28 -> 14 -> 10 -> 5 -> 1 cells after its
#: unpadded convolutions and poolings. Smaller training maps are centre-padded up to it.
PRASANNA_MIN_SIZE: int = 32

#: Default channels per architecture: ``prasanna`` (block 1, block 2, block 3, 1x1 bottleneck);
#: ``small`` (block 1, block 2).
DEFAULT_CHANNELS: dict[str, tuple[int, ...]] = {"prasanna": (16, 32, 64, 16), "small": (16, 32)}


class PatternCNN(nn.Module):
    """CNN over attention maps, after Prasanna et al. (2020) (see the module text).

    Args:
        size: side S the maps are padded (``prasanna``) or resized (``small``) to; ``prasanna``:
            >= 32, ``small``: divisible by 4.
        classes: class names, in output order.
        channels: convolution channels (default [`DEFAULT_CHANNELS`][headcount.analysis.patterns.cnn.DEFAULT_CHANNELS] of the architecture).
        architecture: one of [`ARCHITECTURES`][headcount.analysis.patterns.cnn.ARCHITECTURES].

    >>> PatternCNN(size=32)(torch.rand(3, 32, 32)).shape
    torch.Size([3, 5])
    >>> PatternCNN(size=16, architecture="small")(torch.rand(3, 16, 16)).shape
    torch.Size([3, 5])
    """

    def __init__(self, size: int = MAP_SIZE, classes: Sequence[str] = CLASSES, channels: Sequence[int] | None = None,
                 architecture: str = "prasanna"):
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise HeadcountError(f"unknown CNN architecture {architecture!r}; use one of {', '.join(ARCHITECTURES)}")
        channels = DEFAULT_CHANNELS[architecture] if channels is None else tuple(int(c) for c in channels)
        if len(channels) != len(DEFAULT_CHANNELS[architecture]):
            raise HeadcountError(f"the {architecture} CNN takes {len(DEFAULT_CHANNELS[architecture])} channel counts, "
                                 f"got {list(channels)}")
        self.size = int(size)
        self.classes = tuple(classes)
        self.channels = tuple(channels)
        self.architecture = architecture
        k = len(self.classes)
        if architecture == "prasanna":
            if size < PRASANNA_MIN_SIZE:
                raise HeadcountError(f"the prasanna CNN needs maps of side >= {PRASANNA_MIN_SIZE}, got {size}")
            c1, c2, c3, c4 = self.channels
            self.net = nn.Sequential(
                nn.Conv2d(1, c1, 3), nn.ReLU(), nn.Conv2d(c1, c1, 3), nn.ReLU(), nn.MaxPool2d(2, 2),  # [N, c1, (S-4)/2, .]
                nn.Conv2d(c1, c2, 3), nn.ReLU(), nn.Conv2d(c2, c2, 3), nn.ReLU(), nn.MaxPool2d(2, 2),  # [N, c2, ., .]
                nn.Conv2d(c2, c3, 3), nn.ReLU(), nn.Conv2d(c3, c3, 3), nn.ReLU(),  # [N, c3, >=1, >=1]
                nn.Conv2d(c3, c4, 1), nn.AdaptiveAvgPool2d(1),  # [N, c4, 1, 1]
                nn.Conv2d(c4, k, 1),  # [N, k, 1, 1] logits
            )
            for m in self.net:  # their init_weights: Xavier-normal weights, zero biases
                if isinstance(m, nn.Conv2d):
                    nn.init.xavier_normal_(m.weight)
                    nn.init.zeros_(m.bias)
        else:
            if size < 4 or size % 4:
                raise HeadcountError(f"the small CNN needs a map size divisible by 4, got {size}")
            c1, c2 = self.channels
            self.features = nn.Sequential(
                nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # [N, c1, S/2, S/2]
                nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [N, c2, S/4, S/4]
            )
            self.head = nn.Linear(c2 * (size // 4) ** 2, k)

    def config(self) -> dict[str, object]:
        """The constructor arguments, JSON-ready."""
        return {"size": self.size, "classes": list(self.classes), "channels": list(self.channels),
                "architecture": self.architecture}

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_classes]`` for maps ``[N, S, S]`` (or ``[N, 1, S, S]``).

        ``prasanna``: any S >= 32 (fully convolutional); ``small``: S = ``size``.
        """
        x = maps if maps.ndim == 4 else maps.unsqueeze(1)  # [N, 1, S, S]
        if self.architecture == "prasanna":
            return self.net(x).flatten(1)
        x = self.features(x * self.size)
        return self.head(x.flatten(1))


def _split(labels: np.ndarray, holdout: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split: floor(holdout * n_c) examples of each class are held out."""
    train, held = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(math.floor(holdout * idx.size))
        held.extend(idx[:k].tolist())
        train.extend(idx[k:].tolist())
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(held, dtype=np.int64))


def _predict_ids(model: PatternCNN, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Argmax class ids ``[N]`` of maps ``[N, S, S]`` (eval mode, no grad, in slices)."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(x[s:s + batch_size]).argmax(-1) for s in range(0, len(x), batch_size)]) \
            if len(x) else torch.zeros(0, dtype=torch.long, device=x.device)


def _accuracy(model: PatternCNN, x: torch.Tensor, y: torch.Tensor) -> float | None:
    if len(y) == 0:
        return None
    return float((_predict_ids(model, x) == y).float().mean())


def _validation_accuracy(model: PatternCNN, x: torch.Tensor, y: torch.Tensor) -> float | None:
    """The held-out accuracy [`_fit`][headcount.analysis.patterns.cnn._fit] reads after each epoch to choose the checkpoint (a seam:
    tests replace it with a scripted sequence, so the choice is tested without a real trajectory)."""
    return _accuracy(model, x, y)


def _fit(x_tr, y_tr, x_he, y_he, build, seed, epochs, batch_size, lr, device) -> tuple[PatternCNN, float, list[float]]:
    """Adam + cross-entropy; with a held-out part, the weights of the epoch with the best held-out
    accuracy (the latest of equal ones, as their ``acc_val >= best_val_acc``) are kept.
    torch's global RNG is seeded inside a fork, so callers are unaffected.
    Returns (model, last epoch's mean training loss, held-out accuracy after each epoch)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = build().to(device)
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()
        last, best, best_state, history = math.nan, -1.0, None, []
        for epoch in range(1, epochs + 1):
            model.train()
            order = torch.randperm(len(y_tr), generator=gen).to(device)
            total, count = 0.0, 0
            for s in range(0, len(order), batch_size):
                b = order[s:s + batch_size]
                opt.zero_grad()
                loss = loss_fn(model(x_tr[b]), y_tr[b])
                loss.backward()
                opt.step()
                total += loss.item() * len(b)
                count += len(b)
            last = total / max(count, 1)
            if len(y_he):
                acc = _validation_accuracy(model, x_he, y_he)
                history.append(acc)
                if acc >= best:
                    best = acc
                    best_state = copy.deepcopy(model.state_dict())
        if best_state is not None:
            model.load_state_dict(best_state)
    return model, last, history


def _stack_maps(maps, size: int | None, architecture: str) -> torch.Tensor:
    """Labelled maps as one float32 tensor ``[N, T, T]``: an ``[N, S, S]`` array, or a list of
    ``[L_i, L_i]`` maps of varying sides, centre-padded with zeros (cropped when longer) to T =
    ``size``, by default the largest side (``prasanna``: at least [`PRASANNA_MIN_SIZE`][headcount.analysis.patterns.cnn.PRASANNA_MIN_SIZE])."""
    if isinstance(maps, (list, tuple)):
        items = [_to_numpy(m) for m in maps]
        if not items:
            raise HeadcountError("no maps to train on")
        for k, m in enumerate(items):
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 1:
                raise HeadcountError(f"map {k} must be square [L, L], got shape {tuple(m.shape)}")
        largest = max(m.shape[0] for m in items)
    else:
        arr = _to_numpy(maps)
        if arr.ndim != 3:
            raise HeadcountError(f"maps must be [N, S, S], got shape {tuple(arr.shape)}")
        _check_square(arr)
        items, largest = [arr], int(arr.shape[-1])
    for m in items:
        if not np.all(np.isfinite(m)):
            raise HeadcountError("maps contain NaN or infinite values")
    if size is None:
        size = max(largest, PRASANNA_MIN_SIZE) if architecture == "prasanna" else largest
    if isinstance(maps, (list, tuple)):
        return torch.as_tensor(np.stack([center_pad(m, size) for m in items]), dtype=torch.float32)
    return torch.as_tensor(center_pad(items[0], size), dtype=torch.float32)


def train_pattern_cnn(
    maps,
    labels,
    seed: int = 0,
    epochs: int = 200,
    classes: Sequence[str] = CLASSES,
    holdout: float = 0.2,
    batch_size: int = 64,
    lr: float = 1e-3,
    channels: Sequence[int] | None = None,
    num_threads: int | None = 1,
    architecture: str = "prasanna",
    size: int | None = None,
    device: str | torch.device | None = "cpu",
) -> tuple[PatternCNN, dict[str, object]]:
    """Train a [`PatternCNN`][headcount.analysis.patterns.cnn.PatternCNN] on labelled maps with Prasanna et al.'s recipe (defaults).

    A stratified ``holdout`` fraction of each class is kept out of training; the returned weights
    are those of the epoch with the best held-out accuracy (the last epoch's without a held-out
    part). Deterministic for a seed on the CPU.

    Args:
        maps: ``[N, S, S]`` array or tensor, or a list of N per-example maps ``[L_i, L_i]`` of
            varying sides. All are centre-padded with zeros to ``size``
            ([`center_pad`][headcount.analysis.patterns.center_pad]; longer maps are cropped to their
            top-left ``size`` x ``size`` corner, as their ``pad_image``).
        labels: ``[N]`` class names or ids (see [`CLASSES`][headcount.analysis.patterns.cnn.CLASSES]).
        seed: seeds initialisation, the split and the batch order.
        epochs: passes over the training part (the paper: 200).
        classes: class names (default the five Kovaleva classes).
        holdout: fraction of each class held out (validation and checkpoint choice), in [0, 0.9].
        batch_size: mini-batch size (the paper: 64).
        lr: Adam learning rate (the paper: 1e-3).
        channels: convolution channels (default: the architecture's, [`DEFAULT_CHANNELS`][headcount.analysis.patterns.cnn.DEFAULT_CHANNELS]).
        num_threads: torch intra-op threads while training on the CPU (restored afterwards); the
            CNN is small, and one thread is fastest on a busy machine. ``None``: leave as is.
        architecture: ``prasanna`` (the paper's net) or ``small`` (see the module text).
        size: side the maps are padded to; default the largest map's (``prasanna``: at least 32;
            ``small``: needs a side divisible by 4).
        device: where to train (a [`headcount.runtime.device.resolve_device`][headcount.runtime.device.resolve_device] spec); default the CPU
            (deterministic); None = ``$HEADCOUNT_DEVICE``, else the GPU when there is one. The model
            comes back on the CPU.

    Returns:
        ``(model, metrics)`` with metrics ``{"train_accuracy", "heldout_accuracy" (None without a
        held-out part), "n_train", "n_heldout", "epochs", "best_epoch" (1-based; None without a
        held-out part), "heldout_history" (held-out accuracy after each epoch), "seed", "final_loss",
        "classes", "confusion" (held-out, rows = true class), "architecture", "size",
        "batch_size", "lr"}``, accuracies of the returned weights; the model is in eval mode.

    >>> from headcount.analysis.patterns import synthetic_attention_maps
    >>> s = synthetic_attention_maps(n_per_class=4, size=16, seed=0)
    >>> model, metrics = train_pattern_cnn(s.maps, s.labels, seed=0, epochs=1)
    >>> metrics["n_train"] + metrics["n_heldout"], model.size
    (20, 32)
    """
    from headcount.runtime.device import resolve_device

    if architecture not in ARCHITECTURES:
        raise HeadcountError(f"unknown CNN architecture {architecture!r}; use one of {', '.join(ARCHITECTURES)}")
    if size is not None and architecture == "prasanna" and size < PRASANNA_MIN_SIZE:
        raise HeadcountError(f"the prasanna CNN needs a size >= {PRASANNA_MIN_SIZE}, got {size}")
    x_all = _stack_maps(maps, size, architecture)  # [N, T, T]
    size = int(x_all.shape[-1])
    if architecture == "small" and size % 4:
        raise HeadcountError(f"the small CNN needs maps with a side divisible by 4 (e.g. 32), got {size}")
    y_np = label_ids(labels, classes)
    if y_np.shape[0] != x_all.shape[0]:
        raise HeadcountError(f"{x_all.shape[0]} maps but {y_np.shape[0]} labels")
    if x_all.shape[0] < 2:
        raise HeadcountError("need at least 2 labelled maps to train")
    if epochs < 1:
        raise HeadcountError(f"epochs must be >= 1, got {epochs}")
    if not 0 <= holdout <= 0.9:
        raise HeadcountError(f"holdout must be in [0, 0.9], got {holdout}")
    if batch_size < 1:
        raise HeadcountError(f"batch_size must be >= 1, got {batch_size}")
    if not lr > 0:
        raise HeadcountError(f"lr must be > 0, got {lr}")
    dev = resolve_device(device)
    rng = np.random.default_rng(seed)
    tr, he = _split(y_np, holdout, rng)
    y_all = torch.as_tensor(y_np)
    x_tr, y_tr = x_all[tr].to(dev), y_all[tr].to(dev)
    x_he, y_he = x_all[he].to(dev), y_all[he].to(dev)
    threads_before = torch.get_num_threads()
    if num_threads is not None and dev.type == "cpu":
        torch.set_num_threads(int(num_threads))
    try:
        model, last, history = _fit(x_tr, y_tr, x_he, y_he, lambda: PatternCNN(size, classes, channels, architecture),
                                       seed, epochs, batch_size, lr, dev)
        confusion = np.zeros((len(classes), len(classes)), dtype=np.int64)
        if len(he):
            np.add.at(confusion, (y_he.cpu().numpy(), _predict_ids(model, x_he).cpu().numpy()), 1)
        train_acc, held_acc = _accuracy(model, x_tr, y_tr), _accuracy(model, x_he, y_he)
    finally:
        torch.set_num_threads(threads_before)
    model = model.cpu().eval()
    metrics = {
        "train_accuracy": train_acc,
        "heldout_accuracy": held_acc,
        "n_train": int(len(tr)),
        "n_heldout": int(len(he)),
        "epochs": int(epochs),
        "best_epoch": (len(history) - history[::-1].index(max(history))) if history else None,
        "heldout_history": history,
        "seed": int(seed),
        "final_loss": float(last),
        "classes": list(classes),
        "confusion": confusion.tolist(),
        "architecture": architecture,
        "size": size,
        "batch_size": int(batch_size),
        "lr": float(lr),
    }
    return model, metrics


def _model_input(model: PatternCNN, maps) -> torch.Tensor:
    """Maps ``[..., S, S]`` (tensor on any device or array) as float32 ``[..., T, T]`` on the CNN's
    device: centre-padded or cropped to T = ``model.size`` (``prasanna``), S = T required (``small``)."""
    device = next(model.parameters()).device
    x = maps.detach() if isinstance(maps, torch.Tensor) else torch.as_tensor(_to_numpy(maps))
    x = x.to(device=device, dtype=torch.float32)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2] or x.shape[-1] < 1:
        raise HeadcountError(f"maps must be square [..., S, S], got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise HeadcountError("maps contain NaN or infinite values")
    size = int(x.shape[-1])
    if size != model.size:
        if model.architecture != "prasanna":
            raise HeadcountError(f"the CNN reads {model.size} x {model.size} maps, got {size} x {size}")
        x = center_pad(x, model.size)
    return x


def predict_pattern_ids(model: PatternCNN, maps, batch_size: int = 256) -> torch.Tensor:
    """Class ids (into ``model.classes``) the CNN gives maps ``[..., S, S]``, on the CNN's device.

    The ``prasanna`` net reads each map centre-padded with zeros to ``model.size`` (longer maps:
    their top-left ``size`` x ``size`` corner, as the paper's ``pad_image``).

    Returns:
        A long tensor shaped like the leading dims, on the CNN's device.

    >>> predict_pattern_ids(PatternCNN(size=32), torch.rand(2, 3, 20, 20)).shape
    torch.Size([2, 3])
    """
    x = _model_input(model, maps)
    lead = x.shape[:-2]
    return _predict_ids(model, x.reshape(-1, model.size, model.size), batch_size).reshape(lead)


def predict_patterns(model: PatternCNN, maps, return_probs: bool = False):
    """Class names (and optionally probabilities) the CNN gives maps ``[..., S, S]``.

    Args:
        model: a trained [`PatternCNN`][headcount.analysis.patterns.cnn.PatternCNN] (it runs on its own device).
        maps: ``[..., S, S]``; ``prasanna``: any S (centre-padded or cropped to ``model.size``);
            ``small``: S = ``model.size``.
        return_probs: also return the softmax ``[..., n_classes]``.

    Returns:
        A str array shaped like the leading dims, or ``(labels, probs)``.

    >>> m = PatternCNN(size=32)
    >>> predict_patterns(m, torch.rand(2, 3, 32, 32)).shape
    (2, 3)
    """
    x = _model_input(model, maps)
    lead = x.shape[:-2]
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(x.reshape(-1, model.size, model.size)), -1).cpu().numpy()
    names = np.asarray(model.classes)[probs.argmax(-1)].reshape(lead)
    return (names, probs.reshape(*lead, -1)) if return_probs else names


_CNN_FORMAT = "headcount-pattern-cnn"


def save_pattern_cnn(model: PatternCNN, directory) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (atomically, each file).

    Args:
        model: a [`PatternCNN`][headcount.analysis.patterns.cnn.PatternCNN].
        directory: created if missing.

    Returns:
        The directory.

    >>> import tempfile
    >>> d = save_pattern_cnn(PatternCNN(size=32), tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'model.safetensors']
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(d / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": _CNN_FORMAT})
    atomic_write_json(d / "config.json", {"format": _CNN_FORMAT, "version": 2, **model.config()})
    return d


def load_pattern_cnn(directory) -> PatternCNN:
    """Load a CNN written by [`save_pattern_cnn`][headcount.analysis.patterns.cnn.save_pattern_cnn] (eval mode, on the CPU).

    Configs without an ``architecture`` (written before the paper's net was the default) are ``small``.

    Args:
        directory: holds ``config.json`` and ``model.safetensors``.

    Returns:
        The [`PatternCNN`][headcount.analysis.patterns.cnn.PatternCNN].

    >>> import tempfile
    >>> load_pattern_cnn(save_pattern_cnn(PatternCNN(size=32), tempfile.mkdtemp())).size
    32
    """
    d = Path(directory)
    cfg_path, weights = d / "config.json", d / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise HeadcountError(f"{d} is not a pattern CNN directory (needs config.json and model.safetensors)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HeadcountError(f"cannot read {cfg_path}: {e}") from None
    if not isinstance(cfg, dict) or cfg.get("format") != _CNN_FORMAT:
        raise HeadcountError(f"{cfg_path} is not a pattern CNN config (format != {_CNN_FORMAT!r})")
    try:
        model = PatternCNN(int(cfg["size"]), list(cfg["classes"]), list(cfg["channels"]),
                           str(cfg.get("architecture", "small")))
        model.load_state_dict(load_file(str(weights)))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HeadcountError(f"cannot load the pattern CNN in {d}: {str(e).splitlines()[0]}") from None
    return model.eval()
