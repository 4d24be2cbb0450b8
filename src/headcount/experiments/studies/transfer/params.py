"""The parameters of each job of the transfer study (what [`plan`][headcount.experiments.studies.transfer.plan] writes and [`jobs`][headcount.experiments.studies.transfer.jobs] reads).

One pydantic model per job kind (``*Params``). They reuse the settings sections of
[`config`][headcount.experiments.studies.transfer.config] (a job's ``data`` *is* a [`DataSettings`][headcount.experiments.studies.transfer.config.DataSettings]) and declare no default of
their own, so a job never restates one; an unknown parameter is refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from headcount.experiments.runner import ConfigSection
from headcount.experiments.studies.transfer.config import (
    AfterHead,
    DataSettings,
    Method,
    Normalize,
    StatsSettings,
    TrainSettings,
    View,
)


class LayoutParams(ConfigSection):
    model: str


class MlmHeadParams(ConfigSection):
    """The MLM head of every MLM job (from ``MlmSettings``): texts, fit steps, subset, seed."""

    corpus: str
    steps: int
    max_texts: int
    seed: int
    after: AfterHead


class MlmScoreParams(ConfigSection):
    model: str
    task: str
    data: DataSettings
    method: Method
    mlm_head: MlmHeadParams
    #: ``lm``: a decoder's own next-token loss in MLM's place (stated only then: earlier keys stay)
    objective: Literal["mlm", "lm"] = "mlm"


class HeadFitParams(ConfigSection):
    model: str
    task: str
    seed: int
    train: TrainSettings


class MaskParams(ConfigSection):
    """``order: scores`` ranks by the upstream ``scores`` job; ``random`` draws with ``seed``."""

    level: float
    order: Literal["scores", "random"]
    view: View
    normalize: Normalize
    seed: int | None = None  # only for ``order: random``

    @model_validator(mode="after")
    def _seeded(self):
        if self.order == "random" and self.seed is None:
            raise ValueError("a random mask needs a seed")
        return self


class CurveParams(ConfigSection):
    """A prunability curve: ``task`` (the upstream ``model``), ``mlm`` (``model`` + ``mlm_head``) or
    ``embedding`` (``model``: its similarity structure, [`headcount.data.embedding.similarity_agreement`][headcount.data.embedding.similarity_agreement]).

    ``orders``: ``{order: {replicate: input name}}``, the score grids that rank the heads.
    """

    objective: Literal["task", "mlm", "embedding", "lm"]
    task: str
    eval: DataSettings
    levels: tuple[float, ...]
    normalize: Normalize
    views: tuple[View, ...]
    orders: dict[str, dict[str, str]]
    random_draws: int
    random_seed: int
    model: str | None = None  # mlm only: the pre-trained model
    mlm_head: MlmHeadParams | None = None  # mlm only

    @model_validator(mode="after")
    def _mlm(self):
        if self.objective == "mlm" and (self.model is None or self.mlm_head is None):
            raise ValueError("an MLM curve needs model and mlm_head")
        if self.objective in ("embedding", "lm") and self.model is None:
            raise ValueError(f"an {self.objective} curve needs model")
        return self


class PairParams(ConfigSection):
    """Two score grids compared (``a``, ``b``: input names) and what the rows say about them."""

    name: str
    comparison: str
    a: str
    b: str
    task: str | None
    task_b: str | None
    seed: int | None
    seed_b: int | None
    paired: bool


class GridParams(ConfigSection):
    # in the order of the params' sorted JSON keys: the columns of layer_mass.csv
    kind: str
    seed: int | None
    task: str


class CoherenceParams(ConfigSection):
    pairs: tuple[PairParams, ...]
    grids: dict[str, GridParams]
    stats: StatsSettings
    views: tuple[View, ...]
    #: how two-sided permutation p-values are computed ([`headcount.analysis.permutation_test`][headcount.analysis.permutation_test]):
    #: twice the smaller one-sided p, capped at 1. In the params so that the job's key changed with
    #: the rule (earlier runs counted |null| >= |observed|, one-sided in effect within layers)
    p_rule: Literal["twice-smaller-tail"] = "twice-smaller-tail"
