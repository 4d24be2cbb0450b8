"""The pattern CNN of Prasanna et al. (2020): train on labelled maps, predict, save, load."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ...errors import HeadcountError
from ...io import atomic_path, atomic_write_json
from .features import CLASSES, MAP_SIZE, _check_square, _to_numpy
from .labels import label_ids

class PatternCNN(nn.Module):
    """Small CNN over fixed-size attention maps (Prasanna et al. 2020, after Kovaleva et al. 2019).

    Two blocks of 3x3 convolution + ReLU + 2x2 max-pooling, then a linear layer to the classes.
    Input maps are multiplied by their side S so that uniform attention reads 1.

    Args:
        size: side S of the input maps (divisible by 4).
        classes: class names, in output order.
        channels: channels of the two convolution blocks.

    >>> PatternCNN(size=16)(torch.rand(3, 16, 16)).shape
    torch.Size([3, 5])
    """

    def __init__(self, size: int = MAP_SIZE, classes: Sequence[str] = CLASSES, channels: Sequence[int] = (16, 32)):
        super().__init__()
        if size < 4 or size % 4:
            raise HeadcountError(f"PatternCNN needs a map size divisible by 4, got {size}")
        if len(channels) != 2:
            raise HeadcountError(f"PatternCNN takes two channel counts, got {list(channels)}")
        self.size = int(size)
        self.classes = tuple(classes)
        self.channels = tuple(int(c) for c in channels)
        c1, c2 = self.channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # [N, c1, S/2, S/2]
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [N, c2, S/4, S/4]
        )
        self.head = nn.Linear(c2 * (size // 4) ** 2, len(self.classes))

    def config(self) -> dict[str, object]:
        """The constructor arguments, JSON-ready."""
        return {"size": self.size, "classes": list(self.classes), "channels": list(self.channels)}

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_classes]`` for maps ``[N, S, S]`` (or ``[N, 1, S, S]``)."""
        x = maps if maps.ndim == 4 else maps.unsqueeze(1)  # [N, 1, S, S]
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


def _accuracy(model: PatternCNN, x: torch.Tensor, y: torch.Tensor) -> float | None:
    if len(y) == 0:
        return None
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def _fit(x_tr, y_tr, size, classes, channels, seed, epochs, batch_size, lr) -> tuple[PatternCNN, float]:
    """Adam + cross-entropy; torch's global RNG is seeded inside a fork, so callers are unaffected."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PatternCNN(size, classes, channels)
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()
        last = math.nan
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(y_tr), generator=gen)
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
    return model, last


def train_pattern_cnn(
    maps,
    labels,
    seed: int = 0,
    epochs: int = 30,
    classes: Sequence[str] = CLASSES,
    holdout: float = 0.2,
    batch_size: int = 32,
    lr: float = 3e-3,
    channels: Sequence[int] = (16, 32),
    num_threads: int | None = 1,
) -> tuple[PatternCNN, dict[str, object]]:
    """Train a :class:`PatternCNN` on labelled maps; deterministic for a seed (on CPU).

    A stratified ``holdout`` fraction of each class is kept out of training and reported.

    Args:
        maps: ``[N, S, S]`` array or tensor (S divisible by 4; rows need not sum to 1 but
            should for consistency with :func:`mean_attention_maps`).
        labels: ``[N]`` class names or ids (see :data:`CLASSES`).
        seed: seeds initialisation, the split and the batch order.
        epochs: passes over the training part.
        classes: class names (default the five Kovaleva classes).
        holdout: fraction of each class held out, in [0, 0.9].
        batch_size: mini-batch size.
        lr: Adam learning rate.
        channels: convolution channels.
        num_threads: torch intra-op threads while training (restored afterwards); the CNN is
            tiny, and one thread is fastest, especially on a busy machine. ``None``: leave as is.

    Returns:
        ``(model, metrics)`` with metrics ``{"train_accuracy", "heldout_accuracy" (None without a
        held-out part), "n_train", "n_heldout", "epochs", "seed", "final_loss", "classes",
        "confusion" (held-out, rows = true class)}``; the model is in eval mode.

    >>> from headcount.analysis.patterns import synthetic_attention_maps
    >>> s = synthetic_attention_maps(n_per_class=4, size=16, seed=0)
    >>> model, metrics = train_pattern_cnn(s.maps, s.labels, seed=0, epochs=1)
    >>> metrics["n_train"] + metrics["n_heldout"]
    20
    """
    x_all = torch.as_tensor(_to_numpy(maps), dtype=torch.float32)
    size = _check_square(x_all.numpy())
    if x_all.ndim != 3:
        raise HeadcountError(f"maps must be [N, S, S], got shape {tuple(x_all.shape)}")
    if not torch.isfinite(x_all).all():
        raise HeadcountError("maps contain NaN or infinite values")
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
    rng = np.random.default_rng(seed)
    tr, he = _split(y_np, holdout, rng)
    y_all = torch.as_tensor(y_np)
    x_tr, y_tr, x_he, y_he = x_all[tr], y_all[tr], x_all[he], y_all[he]
    threads_before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    try:
        model, last = _fit(x_tr, y_tr, size, classes, channels, seed, epochs, batch_size, lr)
    finally:
        torch.set_num_threads(threads_before)
    model.eval()
    confusion = np.zeros((len(classes), len(classes)), dtype=np.int64)
    if len(he):
        with torch.no_grad():
            pred = model(x_he).argmax(-1).numpy()
        np.add.at(confusion, (y_he.numpy(), pred), 1)
    metrics = {
        "train_accuracy": _accuracy(model, x_tr, y_tr),
        "heldout_accuracy": _accuracy(model, x_he, y_he),
        "n_train": int(len(tr)),
        "n_heldout": int(len(he)),
        "epochs": int(epochs),
        "seed": int(seed),
        "final_loss": float(last),
        "classes": list(classes),
        "confusion": confusion.tolist(),
    }
    return model, metrics


def predict_patterns(model: PatternCNN, maps, return_probs: bool = False):
    """Class names (and optionally probabilities) the CNN gives maps ``[..., S, S]``.

    Args:
        model: a trained :class:`PatternCNN`.
        maps: ``[..., S, S]`` with S = ``model.size``.
        return_probs: also return the softmax ``[..., n_classes]``.

    Returns:
        A str array shaped like the leading dims, or ``(labels, probs)``.

    >>> m = PatternCNN(size=16)
    >>> predict_patterns(m, torch.rand(2, 3, 16, 16)).shape
    (2, 3)
    """
    x = torch.as_tensor(_to_numpy(maps), dtype=torch.float32)
    size = _check_square(x.numpy())
    if size != model.size:
        raise HeadcountError(f"the CNN reads {model.size} x {model.size} maps, got {size} x {size}")
    lead = x.shape[:-2]
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(x.reshape(-1, size, size)), -1).numpy()
    names = np.asarray(model.classes)[probs.argmax(-1)].reshape(lead)
    return (names, probs.reshape(*lead, -1)) if return_probs else names


_CNN_FORMAT = "headcount-pattern-cnn"


def save_pattern_cnn(model: PatternCNN, directory) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (atomically, each file).

    Args:
        model: a :class:`PatternCNN`.
        directory: created if missing.

    Returns:
        The directory.

    >>> import tempfile
    >>> d = save_pattern_cnn(PatternCNN(size=16), tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'model.safetensors']
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(d / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": _CNN_FORMAT})
    atomic_write_json(d / "config.json", {"format": _CNN_FORMAT, "version": 1, **model.config()})
    return d


def load_pattern_cnn(directory) -> PatternCNN:
    """Load a CNN written by :func:`save_pattern_cnn` (eval mode).

    Args:
        directory: holds ``config.json`` and ``model.safetensors``.

    Returns:
        The :class:`PatternCNN`.

    >>> import tempfile
    >>> load_pattern_cnn(save_pattern_cnn(PatternCNN(size=16), tempfile.mkdtemp())).size
    16
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
        model = PatternCNN(int(cfg["size"]), list(cfg["classes"]), list(cfg["channels"]))
        model.load_state_dict(load_file(str(weights)))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HeadcountError(f"cannot load the pattern CNN in {d}: {str(e).splitlines()[0]}") from None
    return model.eval()
