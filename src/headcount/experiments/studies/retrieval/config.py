"""The ``retrieval`` study's settings (pydantic) and the parameters of its jobs.

Every setting is declared once: the needle-in-a-haystack generator's are
[`NiahSpec`][headcount.data.tasks.niah.NiahSpec]'s (their types and defaults read from it, checked by
building one), the scorers' options are their options classes' (``Scorer.options``:
[`RetrievalOptions`][headcount.importance.scorer_options.RetrievalOptions],
[`LongRangeOptions`][headcount.importance.scorer_options.LongRangeOptions]; their types, defaults and
checks read from them, as the held-out decoding lengths' range), the budgets' sizes are [`KVBudgetSettings`][headcount.kv.memory.KVBudgetSettings]',
their kinds the KV policies' names ([`headcount.kv.policies`][headcount.kv.policies]) and the statistics' defaults [`headcount.analysis.helpers`][headcount.analysis.helpers]'.
[`RetrievalConfig`][headcount.experiments.studies.retrieval.config.RetrievalConfig] is what a
``study: retrieval`` YAML holds; each job function validates its ``params`` into one of the
``*Params`` models at the end ([`job_params`][headcount.experiments.studies.jobs.job_params]).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from headcount.analysis.helpers import LEVEL, N_BOOT
from headcount.analysis.retrieval import RETRIEVAL_THRESHOLD
from headcount.data.tasks.niah import NiahSpec
from headcount.experiments.runner import ConfigSection, StudyConfig
from headcount.experiments.runner.config import model_ref
from headcount.experiments.runner.schema import fields_of, nonempty_model
from headcount.importance.scorer_options import MAX_NEW_TOKENS_RANGE
from headcount.importance.scoring import get_scorer
from headcount.kv.memory import CONTEXT, TOKENS, KVBudgetSettings, n_full_allowed
from headcount.kv.policies import get_policy, policy_names
from headcount.kv.policies.uniform import uniform_budget
from headcount.runtime.bounds import DRAWS, EXAMPLES, FRACTION, RESAMPLES, SEED
from headcount.runtime.errors import HeadcountError

#: the two scorers the study runs: Wu et al.'s retrieval score per query head, and the attention
#: mass outside a sink + recent window (per query head, and per KV head as ``kv_groups``)
SCORERS = ("retrieval", "long-range")
#: the units of the ablation: query heads ranked by retrieval score, KV heads by the budgets' ranking
UNITS = ("heads", "kv-groups")
#: the budgets of the curve by default: from the scores, the uniform sink + window (StreamingLLM), random
#: full heads; ``kinds`` takes any KV policy of the registry but ``full`` (the curve's reference, always run)
BUDGET_KINDS = ("scores", "uniform", "random")
#: the splits of the generated needle-in-a-haystack tasks (the offline data's)
Split = Literal["train", "validation", "test"]

#: the generator's parameters, in NiahSpec's order (a job's ``niah``: these and the split)
NIAH_FIELDS = tuple(f.name for f in fields(NiahSpec))
#: those the study varies itself (``seeds``, ``templates``, ``held_out``): not in ``niah:``
_VARIED = ("seed", "template")
_BUDGET = {f.name: f.default for f in fields(KVBudgetSettings)}


def _policy(kind: str) -> str:
    """A KV policy's name (the registry's: [`get_policy`][headcount.kv.policies.get_policy]), as pydantic reports it."""
    try:
        get_policy(kind)
    except HeadcountError as e:
        raise ValueError(str(e)) from None
    return kind


def _spec_error(build) -> None:
    """Surface a library check (a HeadcountError) as the ValueError pydantic reports with the key and line."""
    try:
        build()
    except HeadcountError as e:
        raise ValueError(str(e)) from None


def _haystack_ref(value: str, info: ValidationInfo) -> str:
    """``offline``, or a ``.txt`` file (one haystack text a line) made absolute, relative to the config's folder."""
    if value == "offline":
        return value
    base = (info.context or {}).get("base_dir") if info is not None else None
    p = Path(value).expanduser()
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    if not p.is_file():
        raise ValueError(f"haystack: {p} is not a file (one text a line), nor `offline`")
    return str(p.resolve())


# =============================================================================================
# settings (the YAML)
# =============================================================================================
class NiahSettings(create_model("NiahSpecFields", __base__=ConfigSection,
                                **{**fields_of(NiahSpec, [n for n in NIAH_FIELDS if n not in _VARIED]),
                                   "examples": (int, Field(20, **EXAMPLES.limits()))})):
    """The needle-in-a-haystack examples the scores are computed on: the generator's parameters
    ([`NiahSpec`][headcount.data.tasks.niah.NiahSpec]: their types and defaults) except ``seed`` and
    ``template``, which the study varies (``seeds``, ``templates``), and the split.

    Attributes:
        needle: ``passkey`` (default), ``digits`` or ``fact``.
        lengths: prompt lengths in the model's tokens (example i has ``lengths[i % len]``).
        depths: needle depths in [0, 1] (default: the reference's ten).
        examples: examples per haystack seed and template (the study's 20, not the generator's 100).
        digits: the pass key's / digit string's length (None: the needle's default).
        haystack: ``offline`` (the fetched offline texts) or a ``.txt`` file, one text a line.
        split: the haystack texts the scores are computed on.
    """

    split: Split = "train"

    @field_validator("haystack")
    @classmethod
    def _haystack(cls, v, info: ValidationInfo):
        return _haystack_ref(v, info)

    @model_validator(mode="after")
    def _valid(self):
        _spec_error(lambda: self.spec(0, "passkey"))
        return self

    def spec(self, seed: int, template: str, lengths=None, examples=None, depths=None) -> dict:
        """The [`NiahSpec`][headcount.data.tasks.niah.NiahSpec] fields of one task (checked), as job parameters."""
        given = {"template": template, "seed": int(seed), "lengths": list(lengths or self.lengths),
                 "depths": list(self.depths if depths is None else depths), "examples": int(examples or self.examples)}
        d = {n: given[n] if n in given else getattr(self, n) for n in NIAH_FIELDS}
        NiahSpec(**{**d, "lengths": tuple(d["lengths"]), "depths": tuple(d["depths"])})
        return d


class HeldOutSettings(ConfigSection):
    """The held-out haystacks of the ablation and the budget curve: another seed (none of
    ``seeds``) on another split of the haystack texts, so that no prompt was scored.

    Attributes:
        seed: the generator's seed (must not be one of the study's ``seeds``).
        split: the haystack texts (default ``validation``; the scores use ``niah.split``).
        template: the prompt template.
        examples: held-out examples (the same for every condition).
        depths: needle depths (None: ``niah.depths``).
    """

    seed: int = Field(1000, **SEED.limits())
    split: Split = "validation"
    template: str = "passkey"
    examples: int = Field(20, **EXAMPLES.limits())
    depths: tuple[float, ...] | None = None


def _options_fields() -> dict:
    """The fields of the scorers' options classes (``Scorer.options``), each scorer's in its order."""
    out: dict = {}
    for method in SCORERS:
        for name, spec in fields_of(get_scorer(method).options, OPTIONS[method]).items():
            out.setdefault(name, spec)
    return out


#: the options of each of the study's scorers: the fields of its options class (``Scorer.options``)
OPTIONS: dict[str, tuple[str, ...]] = {m: tuple(f.name for f in fields(get_scorer(m).options)) for m in SCORERS}


class ScoringSettings(create_model("RetrievalScoreFields", __base__=ConfigSection, **_options_fields())):
    """The scorers' options: ``max_new_tokens``, ``success``, ``copies``, ``stop`` and ``rouge`` of
    ``retrieval`` (the reference's 50 tokens and ROUGE-1 > 0.5), ``sink``, ``window`` and
    ``kv_reduce`` of ``long-range`` (their options classes' types and defaults:
    [`RetrievalOptions`][headcount.importance.scorer_options.RetrievalOptions],
    [`LongRangeOptions`][headcount.importance.scorer_options.LongRangeOptions], which check them), and
    the bootstrap over examples of the retrieval interval.

    Attributes:
        n_boot: bootstrap resamples of the interval (0: none).
        level: its confidence level.
        threshold: the retrieval score above which a head is a retrieval head (the paper's 0.1).
    """

    n_boot: int = Field(N_BOOT, **RESAMPLES.limits())
    level: float = Field(LEVEL, gt=0, lt=1)
    threshold: float = Field(RETRIEVAL_THRESHOLD, ge=0, le=1)

    @model_validator(mode="after")
    def _valid(self):
        for method in SCORERS:
            _spec_error(lambda method=method: self.scorer_options(method))
        return self

    def scorer_options(self, method: str):
        """``method``'s options object (its ``Scorer.options``), checked."""
        return get_scorer(method).options_of({k: getattr(self, k) for k in OPTIONS[method]})

    def options(self, method: str) -> dict:
        """``method``'s options as a score job's ``options`` parameter (field -> value)."""
        return asdict(self.scorer_options(method))


def _fractions(v):
    if not v or any(not 0 < f <= 1 for f in v):
        raise ValueError("fractions must be in (0, 1]")
    return tuple(sorted({float(f) for f in v}))


class StabilitySettings(ConfigSection):
    """The agreement of the head sets across haystack seeds, templates and scorers.

    Attributes:
        fractions: the top-k fractions of the head sets (query heads by retrieval score and by
            long-range mass; KV heads by either); the first is the report's.
    """

    fractions: tuple[float, ...] = (0.05, 0.1)

    @field_validator("fractions")
    @classmethod
    def _f(cls, v):
        return _fractions(v)


class AblationSettings(ConfigSection):
    """The causal test ([`ablation_test`][headcount.analysis.ablation.ablation_test]) on held-out haystacks.

    Attributes:
        enabled: run it.
        units: ``heads`` (query heads by the pooled retrieval score, ties broken by the pooled
            long-range mass) and/or ``kv-groups`` (KV heads by the budgets' ranking).
        fraction: the share of units gated off (the paper's top 5%; at most half: the random sets
            are drawn from the units outside the top set).
        draws: K random sets of as many units; the test ranks the top set among them, p =
            (1 + #{random sets at least as harmful}) / (1 + K), so p >= 1 / (1 + K): 19 reaches 0.05.
        seed: the draws' seed.
        mask: ``remove`` (the heads' outputs zeroed in prefill and decoding: removing them) or
            ``reference`` (Wu et al.'s: their queries zeroed while decoding only).
        theirs: also report Wu et al.'s protocol (a fresh random set per example), labelled theirs.
        length: the held-out prompts' length (None: the first of ``niah.lengths``).
        max_new_tokens: greedy decoding length (the answer and a little more).
    """

    enabled: bool = True
    units: tuple[Literal["heads", "kv-groups"], ...] = UNITS
    fraction: float = Field(0.05, gt=FRACTION.low, le=0.5)
    draws: int = Field(19, ge=1, le=DRAWS.high)
    seed: int = Field(0, **SEED.limits())
    mask: Literal["remove", "reference"] = "remove"
    theirs: bool = True
    length: int | None = None
    max_new_tokens: int = Field(16, **MAX_NEW_TOKENS_RANGE.limits())

    @field_validator("units")
    @classmethod
    def _units(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("units: heads and/or kv-groups, without repeats")
        return v


class BudgetSettings(ConfigSection):
    """The budget curve: KV budgets under memory targets, evaluated at the context length.

    Attributes:
        enabled: run it.
        memory: memory targets (fractions of the full KV cache at ``context`` tokens).
        context: the prompt length of the held-out needles and of the LM texts.
        sink / window: the streaming KV heads' sizes ([`KVBudgetSettings`][headcount.kv.memory.KVBudgetSettings]'
            defaults, DuoAttention's 64 + 256); the uniform baseline keeps ``sink`` and the widest
            window the target allows.
        ranking: the scores the budgets (and the KV-group ablation) rank KV heads by:
            ``retrieval`` (default: the pooled retrieval score, the max over each group's query
            heads, ties, mostly at 0, broken by the pooled long-range mass) or ``long-range`` (the
            pooled attention mass outside the scorer's sink + window, its ``kv_groups``).
        kinds: which budgets, by KV policy name: ``scores``, ``uniform`` (StreamingLLM), ``random``
            (as many full KV heads as ``scores``, chosen at random), or another registered policy.
        random_draws: random budgets per target.
        dtype: the cache element type the budgets' stated bytes assume (measured bytes are what
            the run's cache holds).
        max_new_tokens: greedy decoding length of the held-out needles.
        lm_texts: texts of ``context`` tokens for the LM loss (the haystack texts of ``lm_split``,
            joined in a seeded order: ordinary text, no needle).
        lm_split: their split.
    """

    enabled: bool = True
    memory: tuple[float, ...] = (0.25, 0.5, 0.75)
    context: int = Field(_BUDGET["context"], **CONTEXT.limits())
    sink: int = Field(_BUDGET["sink"], **TOKENS.limits())
    window: int = Field(_BUDGET["window"], **TOKENS.limits())
    ranking: Literal["retrieval", "long-range"] = "retrieval"
    kinds: tuple[str, ...] = BUDGET_KINDS
    random_draws: int = Field(1, ge=1, le=DRAWS.high)
    dtype: str = _BUDGET["dtype"]
    max_new_tokens: int = Field(16, **MAX_NEW_TOKENS_RANGE.limits())
    lm_texts: int = Field(4, ge=1, le=10_000)
    lm_split: Split = "validation"

    @field_validator("memory")
    @classmethod
    def _memory(cls, v):
        if not v or any(not 0 < m < 1 for m in v):
            raise ValueError("memory targets must be fractions in (0, 1) of the full cache")
        return tuple(sorted({float(m) for m in v}))

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v):
        others = ", ".join(n for n in policy_names() if n not in ("scores", "full"))
        if "scores" not in v or len(set(v)) != len(v) or "full" in v:
            raise ValueError(f"kinds: scores (the budgets the curve is for) and any of {others}, without repeats "
                             "(full, the reference, is always run)")
        for kind in v:
            _policy(kind)
        return v

    @model_validator(mode="after")
    def _valid(self):
        for m in self.memory:  # a target below the streaming heads' sink + window: refused now, not in a job
            try:  # the arithmetic is in fractions of the cache: any model shape checks it
                s = self.settings(m)
                n_full_allowed(1, 1, 1, 1, s)
                if "uniform" in self.kinds:
                    uniform_budget(1, 1, 1, 1, s)
            except HeadcountError as e:
                raise ValueError(f"budgets.memory {m:g}: {e}") from None
        return self

    def settings(self, memory: float) -> KVBudgetSettings:
        return KVBudgetSettings(memory=memory, context=self.context, sink=self.sink, window=self.window,
                                dtype=self.dtype)


class RetrievalSettings(ConfigSection):
    """Everything a retrieval part needs (the ``retrieval`` study config without ``study:``).

    Attributes:
        model: a decoder: hub id, checkpoint directory or ``offline-decoder``.
        niah: the scored examples (see [`NiahSettings`][headcount.experiments.studies.retrieval.config.NiahSettings]).
        templates: prompt templates scored (``passkey``, ``book``, ``book-chat``).
        seeds: haystack seeds scored (each a different set of haystacks and needles).
        held_out: the haystacks of the ablation and the budget curve.
        scoring / stability / ablation / budgets: see their sections.
    """

    model: str = "offline-decoder"
    niah: NiahSettings = NiahSettings()
    templates: tuple[str, ...] = ("passkey", "book")
    seeds: tuple[int, ...] = (1, 2, 3)
    held_out: HeldOutSettings = HeldOutSettings()
    scoring: ScoringSettings = ScoringSettings()
    stability: StabilitySettings = StabilitySettings()
    ablation: AblationSettings = AblationSettings()
    budgets: BudgetSettings = BudgetSettings()

    @field_validator("model")
    @classmethod
    def _model(cls, v, info: ValidationInfo):
        v = nonempty_model(v)
        base = (info.context or {}).get("base_dir") if info is not None else None
        if isinstance(v, str) and base is not None and not Path(v).is_absolute() and (Path(base) / v).is_dir():
            v = str((Path(base) / v).resolve())  # a checkpoint next to the config
        return model_ref(v)

    @field_validator("templates")
    @classmethod
    def _templates(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("templates: at least one, without repeats")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("seeds must be a non-empty list without repeats")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        for t in (*self.templates, self.held_out.template):
            _spec_error(lambda t=t: self.niah.spec(0, t))
        if self.held_out.seed in self.seeds:
            raise ValueError(f"held_out.seed {self.held_out.seed} is one of the scored seeds: held-out haystacks "
                             "need a seed no score was computed on")
        return self

    @property
    def ablation_length(self) -> int:
        return self.ablation.length or self.niah.lengths[0]


class RetrievalConfig(StudyConfig, RetrievalSettings):
    """The ``study: retrieval`` config: [`RetrievalSettings`][headcount.experiments.studies.retrieval.config.RetrievalSettings] plus name and description.

    >>> c = RetrievalConfig(study="retrieval", seeds=[1, 2], templates=["passkey"])
    >>> c.niah.needle, c.budgets.memory, c.ablation.fraction
    ('passkey', (0.25, 0.5, 0.75), 0.05)
    """


# =============================================================================================
# job parameters
# =============================================================================================
class NiahParams(create_model("NiahSpecParams", __base__=ConfigSection,
                              **{n: (kind, ...) for n, (kind, _) in fields_of(NiahSpec, NIAH_FIELDS).items()})):
    """One generated task: [`NiahSpec`][headcount.data.tasks.niah.NiahSpec]'s fields (every one given) and the split."""

    split: Split

    def spec(self) -> NiahSpec:
        return NiahSpec(**self.model_dump(exclude={"split"}))


class ScoreParams(ConfigSection):
    """``retrieval.score``: one scorer on one (template, haystack seed)."""

    model: str
    method: Literal["retrieval", "long-range"]
    niah: NiahParams
    options: dict
    n_boot: int
    level: float
    threshold: float


class PoolParams(ConfigSection):
    """``retrieval.pool``: the scores of every (template, seed) of one scorer as one grid."""

    method: Literal["retrieval", "long-range"]
    runs: list[str]
    n_boot: int
    level: float
    threshold: float


class StabilityParams(ConfigSection):
    """``retrieval.stability``: which inputs are which run (``runs``: input name -> template, seed, method)."""

    runs: dict[str, dict]
    fractions: tuple[float, ...]
    memory: tuple[float, ...]
    context: int
    sink: int
    window: int
    dtype: str
    ranking: Literal["long-range", "retrieval"]


class AblationParams(ConfigSection):
    """``retrieval.ablation``: one unit's test on the held-out haystacks."""

    model: str
    unit: Literal["heads", "kv-groups"]
    ranking: Literal["retrieval", "long-range"]
    niah: NiahParams
    fraction: float
    draws: int
    seed: int
    mask: Literal["remove", "reference"]
    theirs: bool
    max_new_tokens: int


class BudgetParams(ConfigSection):
    """``retrieval.budget``: one budget (``kind``: a KV policy's name, full, scores, uniform or random) at a
    memory target (None: full)."""

    kind: str
    memory: float | None
    context: int
    sink: int
    window: int
    dtype: str
    ranking: Literal["long-range", "retrieval"] | None
    seed: int | None

    @field_validator("kind")
    @classmethod
    def _kind(cls, v):
        return _policy(v)


class CurveParams(ConfigSection):
    """``retrieval.curve``: the upstream budget's bytes, needle accuracy and LM loss at the context length."""

    model: str
    niah: NiahParams
    max_new_tokens: int
    lm_texts: int
    lm_split: Split
    lm_seed: int


__all__ = ["BUDGET_KINDS", "NIAH_FIELDS", "OPTIONS", "SCORERS", "UNITS", "AblationParams", "AblationSettings", "BudgetParams",
           "BudgetSettings", "CurveParams", "HeldOutSettings", "NiahParams", "NiahSettings", "PoolParams",
           "RetrievalConfig", "RetrievalSettings", "ScoreParams", "ScoringSettings", "StabilityParams",
           "StabilitySettings"]
