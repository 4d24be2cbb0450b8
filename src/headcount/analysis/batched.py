"""The rows of an estimator that is not a sum over examples, and the estimator rebuilt on a resample.

The ``gradient`` scorer's grid is ``sum_b |G_b|`` (``accumulate: per-batch``; ``cumulative``:
``sum_b |G_1 + ... + G_b|``), ``G_b`` the gradient of batch b's mean loss, ``N_b`` label entries:
``G_b = sum_{i in b} u_i / N_b`` with ``u_i`` the gradient of example i's summed loss. A bootstrap
over the per-example proxy ``|u_i| / N_b`` (what ``Scores.per_example`` holds) resamples a sum the
estimator never computes: the proxy's replicates are far narrower than the estimator's own
sampling spread (a modelled setting, 270 heads, 256 examples, batches of 16: a pair's interval
covered 14% of the time; ``tests/analysis/test_interval_coverage.py``). [`BatchedRows`][headcount.analysis.batched.BatchedRows] keeps what
rebuilding the estimator takes: each example's signed part of its batch's gradient
(``u_i / N_b``), its batch and its label entries. A replicate resamples the examples, puts them in
a random order, cuts it into batches of the original sizes and recomputes ``sum_b |G_b|``: the
estimator itself on a resample (96% in the same setting).

Two grids whose examples were batched alike (the same examples in every batch: two fine-tuning
seeds scored on the same data) are rebuilt with one order, so their batches stay alike; grids
batched differently (an MLM grid and a task grid of the same texts) get independent orders.
Grouping by length is not reproduced: rebuilt batches are random groups of the resample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headcount.runtime.errors import HeadcountError

#: how batch gradients are accumulated (``headcount.importance.scores.ACCUMULATE``)
ACCUMULATIONS = ("per-batch", "cumulative")


@dataclass(frozen=True, eq=False)
class BatchedRows:
    """Per-example rows from which a grid ``sum_b |G_b|`` is rebuilt.

    Attributes:
        signed: ``[n, ...]`` each example's signed part of its batch's gradient (``u_i / N_b``):
            a batch's rows sum to ``G_b``.
        batch: ``[n]`` each row's batch (any ids; batches in increasing id = scoring order).
        labels: ``[n]`` each example's label entries (``N_b`` is their sum over the batch).
        accumulate: ``per-batch`` (``sum_b |G_b|``) or ``cumulative`` (``sum_b |G_1 + ... + G_b|``).

    >>> r = BatchedRows(np.array([[1.0], [-1.0], [2.0]]), np.array([0, 0, 1]), np.ones(3))
    >>> r.estimate().tolist()       # |1 - 1| + |2|
    [2.0]
    >>> r.rebuild(np.array([2, 2, 0])).tolist()   # u = signed x N_b = [2, -2, 2]; batches [2 2], [0]: |4 / 2| + |2 / 1|
    [4.0]
    """

    signed: np.ndarray
    batch: np.ndarray
    labels: np.ndarray
    accumulate: str = "per-batch"

    def __post_init__(self):
        signed = np.nan_to_num(np.asarray(self.signed, dtype=np.float64), nan=0.0)
        batch, labels = np.asarray(self.batch).ravel(), np.asarray(self.labels, dtype=np.float64).ravel()
        if signed.ndim < 1 or signed.shape[0] < 1 or not batch.shape[0] == labels.shape[0] == signed.shape[0]:
            raise HeadcountError(f"batched rows need one batch id and one label count per row: {signed.shape[0]} rows, "
                                 f"{batch.shape[0]} batch ids, {labels.shape[0]} label counts")
        if self.accumulate not in ACCUMULATIONS:
            raise HeadcountError(f"unknown accumulation {self.accumulate!r}; choose one of {', '.join(ACCUMULATIONS)}")
        # batches renumbered 0.. in their order; N_b; each example's summed-loss gradient u_i = signed_i N_b
        ids, batch = np.unique(batch, return_inverse=True)
        n_b = np.bincount(batch, weights=labels, minlength=ids.size)
        object.__setattr__(self, "signed", signed)
        object.__setattr__(self, "batch", batch)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "_u", signed.reshape(signed.shape[0], -1) * n_b[batch][:, None])  # [n, F]
        object.__setattr__(self, "_sizes", np.bincount(batch, minlength=ids.size))  # [n_batches]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.signed.shape

    @property
    def ndim(self) -> int:
        return self.signed.ndim

    def __len__(self) -> int:
        return self.signed.shape[0]

    def _accumulate(self, g: np.ndarray) -> np.ndarray:  # g [n_batches, F] batch gradients -> the grid
        if self.accumulate == "cumulative":
            g = g.cumsum(0)
        return np.abs(g).sum(0).reshape(self.signed.shape[1:])

    def estimate(self) -> np.ndarray:
        """The grid on the data as batched: ``sum_b |sum_{i in b} signed_i|`` (the scorer's)."""
        g = np.zeros((self._sizes.size, self._u.shape[1]))
        np.add.at(g, self.batch, self.signed.reshape(len(self), -1))
        return self._accumulate(g)

    def rebuild(self, index: np.ndarray) -> np.ndarray:
        """The estimator on the rows ``index`` (``[n]``, a resample, in batching order), cut into
        batches of the original sizes: ``G_b = sum u_i / sum N_i`` over each new batch."""
        index = np.asarray(index, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(self._sizes)[:-1]])
        num = np.add.reduceat(self._u[index], starts, axis=0)  # [n_batches, F]
        den = np.add.reduceat(self.labels[index], starts)  # [n_batches]
        g = np.divide(num, den[:, None], out=np.zeros_like(num), where=den[:, None] > 0)
        return self._accumulate(g)

    def take(self, order) -> "BatchedRows":
        """The same rows in another order (each keeps its batch): what pairing by example id does."""
        order = np.asarray(order, dtype=np.int64)
        return BatchedRows(self.signed[order], self.batch[order], self.labels[order], self.accumulate)

    def partition(self) -> bytes:
        """A key equal for rows batched alike (the same rows together, in the same batch order)."""
        _, first = np.unique(self.batch, return_index=True)
        rank = np.argsort(np.argsort(first))  # batches numbered by their first row
        return rank[self.batch].astype(np.int64).tobytes()


def batching_rng(rng: np.random.Generator, arrays) -> np.random.Generator | None:
    """A generator for the rebuilt batches' orders, split off ``rng`` only when some array is
    [`BatchedRows`][headcount.analysis.batched.BatchedRows] (so that a bootstrap of additive rows draws what it drew before)."""
    if not any(isinstance(a, BatchedRows) for a in arrays):
        return None
    return np.random.default_rng(int(rng.integers(2 ** 63)))


def rebuilt(rows: BatchedRows, counts: np.ndarray, orders: dict, key, rng: np.random.Generator) -> np.ndarray:
    """The grid of ``rows`` on a resample: ``counts`` ``[n]`` copies of each row, in a random order
    (``orders[key]``, drawn from ``rng`` on first use: the arrays of one resample that share a key
    share their batches), cut into batches of the original sizes."""
    if key not in orders:
        orders[key] = rng.permutation(len(rows))
    index = np.repeat(np.arange(len(rows)), np.asarray(counts, dtype=np.int64))
    return rows.rebuild(index[orders[key]])


__all__ = ["ACCUMULATIONS", "BatchedRows"]
