"""The base models of study configs: [`StudyConfig`][headcount.experiments.runner.schema.StudyConfig] (a whole config) and [`ConfigSection`][headcount.experiments.runner.schema.ConfigSection]
(a nested part). Frozen, unknown keys forbidden, negative seeds refused.

Kept apart from [`headcount.experiments.runner.config`][headcount.experiments.runner.config] (which reads YAML files and looks their study
type up in the registry) because the registry checks a type's model against [`StudyConfig`][headcount.experiments.runner.schema.StudyConfig]:
config -> registry -> schema, no cycle.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from headcount.runtime.device import PRECISIONS

#: settings that are seeds, wherever a study type declares them: negative ones are refused here,
#: once for every study type (a seed of -1 would otherwise reach torch/numpy, which differ on it)
SEED_FIELDS = frozenset({"seed", "seeds", "data_seed", "seed_offset"})


def _check_seeds(value: Any, info: ValidationInfo) -> Any:
    if info.field_name in SEED_FIELDS:
        values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"a seed must be >= 0, got {v}")
    return value


class StudyConfig(BaseModel):
    """Base class of every study type's config model: frozen, unknown keys forbidden.

    Subclass it and add the type's fields (nested models should use ``frozen=True`` and
    ``extra="forbid"`` too; [`ConfigSection`][headcount.experiments.runner.schema.ConfigSection] does).

    Attributes:
        study: the study type (``transfer``, ``lottery``, or ``module:type``).
        name: a title for the report (defaults to the file name).
        description: free text shown at the top of the report.
        device: where the jobs run models: ``auto`` (the GPUs when there are any: one job per
            GPU at once), ``cpu``, ``cuda`` or ``cuda:N`` (see ``headcount.runtime.device``); the
            ``--device`` of ``headcount study`` overrides it. Not part of the config's identity:
            a run can be resumed on another machine.
        precision: ``auto`` (bf16 autocast on GPUs that support it, else fp32), ``fp32`` or
            ``bf16``; each job runs with ``HEADCOUNT_PRECISION`` set to it (unset: the
            environment's, else auto). Not part of the config's identity either, like ``device``.

    >>> class Toy(StudyConfig):
    ...     steps: int = 3
    >>> Toy(study="toy", steps=4).steps
    4
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    study: str
    name: str = ""
    description: str = ""
    device: str = "auto"
    precision: str = "auto"

    @field_validator("device")
    @classmethod
    def _device_spec(cls, value: str) -> str:
        value = value.strip().lower()
        if value not in ("auto", "cpu", "cuda") and not (value.startswith("cuda:") and value[5:].isdigit()):
            raise ValueError("device must be auto, cpu, cuda or cuda:N")
        return value

    @field_validator("precision")
    @classmethod
    def _precision_spec(cls, value: str) -> str:
        value = value.strip().lower()
        if value not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}")
        return value

    _nonnegative_seeds = field_validator("*")(_check_seeds)


class ConfigSection(BaseModel):
    """Base class for nested parts of a config: frozen, unknown keys forbidden.

    >>> class Seeds(ConfigSection):
    ...     seeds: tuple[int, ...] = (1, 2)
    >>> Seeds().seeds
    (1, 2)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    _nonnegative_seeds = field_validator("*")(_check_seeds)


def nonempty_model(value: Any) -> Any:
    """Refuse an empty ``model:`` in a study config (``Path("")`` is ``.``: it would otherwise
    resolve to the config's folder); other values pass through unchanged.

    >>> nonempty_model("offline")
    'offline'
    """
    if isinstance(value, str) and not value.strip():
        raise ValueError("model must not be empty (use 'offline' for the packaged default model)")
    return value


def fields_of(source: type, names: Sequence[str], *, optional: bool = False) -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of some fields of a dataclass or pydantic model.

    For ``pydantic.create_model``: a config section that exposes a library config's fields
    takes their types and defaults from that config instead of restating them. ``optional``:
    each field may be left unset (``type | None``, default None), to mean "the library's default".

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Lib:
    ...     lr: float = 2e-5
    >>> fields_of(Lib, ["lr"]), fields_of(Lib, ["lr"], optional=True)
    ({'lr': (<class 'float'>, 2e-05)}, {'lr': (typing.Optional[float], None)})
    """
    hints = typing.get_type_hints(source)
    if dataclasses.is_dataclass(source):
        defaults = {f.name: f.default for f in dataclasses.fields(source)}
    else:
        defaults = {n: f.default for n, f in source.model_fields.items()}
    if optional:
        return {n: (typing.Optional[hints[n]], None) for n in names}
    return {n: (hints[n], defaults[n]) for n in names}
