"""Fine-tuning data: encoded splits as datasets, dynamic padding, and the length-grouped sampler
seeded per epoch (a resumed run sees exactly the batches an uninterrupted run sees)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from headcount.data import tasks
from headcount.runtime.errors import HeadcountError
from headcount.train.config import TrainConfig


def _tasks():  # the tasks package (looked up late: tests replace its registry)
    return tasks


def _as_task(task):
    if isinstance(task, (str, Path)):
        return _tasks().get_task(str(task))
    if not hasattr(task, "load"):
        raise HeadcountError(f"not a task: {task!r}")
    return task


class EncodedDataset(torch.utils.data.Dataset):
    """Encoded examples (``{"input_ids": [...], "token_type_ids": [...], "labels": ...}``) as a
    map-style dataset; ``lengths`` feeds the length-grouped sampler."""

    def __init__(self, encoded):
        self.examples = encoded
        lengths = getattr(encoded, "lengths", None)  # headcount.data.tasks.Encoded stores them
        self.lengths = ([int(x) for x in lengths] if lengths is not None
                        else [len(encoded[i]["input_ids"]) for i in range(len(encoded))])

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return self.examples[i]


class DynamicPadding:
    """Collate examples into a batch padded to its longest example (the same batch format as
    ``headcount.data.tasks.make_batches``): ``input_ids``, ``attention_mask``, ``token_type_ids`` (when
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
