"""The KV policies, registered by name: ``full``, ``random``, ``scores``, ``uniform`` and yours.

Every module of this package is one policy: it defines ``POLICY`` (a
[`Policy`][headcount.kv.policy.Policy]); importing the package imports them all in name order and
registers each, so a built-in policy is one file here (and its row in
``tests/core/test_kv_policies.py``). A policy of your own, in your code, is registered with
[`register_policy`][headcount.kv.policies.register_policy]; ``docs/extending.md`` has a worked
example. ``headcount kv-budget --policy``, ``headcount kv-eval``'s baselines and the retrieval
study's ``budgets.kinds`` ask this registry; nothing else compares policy names.

>>> from headcount.kv.memory import KVBudgetSettings
>>> from headcount.kv.policy import BudgetRequest
>>> make_budget("uniform", BudgetRequest(2, 4, 2, 16, KVBudgetSettings(memory=0.5, context=100, sink=4))).window[0]
(46, 46)
"""

from __future__ import annotations

import importlib
import pkgutil

from headcount.kv.budget import KVBudget
from headcount.kv.policy import BudgetRequest, Policy
from headcount.runtime.errors import HeadcountError

_REGISTRY: dict[str, Policy] = {}


def register_policy(policy: Policy, replace: bool = False) -> Policy:
    """Add ``policy`` to the registry (a second policy of the same name is refused unless ``replace``)."""
    if not isinstance(policy, Policy):
        raise HeadcountError(f"register_policy takes a Policy, not {type(policy).__name__}")
    if not policy.name or policy.name != policy.name.strip() or " " in policy.name:
        raise HeadcountError(f"a KV policy needs a name without spaces (got {policy.name!r})")
    if policy.name in _REGISTRY and not replace and _REGISTRY[policy.name] is not policy:
        raise HeadcountError(f"a KV policy named {policy.name!r} is already registered")
    _REGISTRY[policy.name] = policy
    return policy


def unregister_policy(name: str) -> None:
    """Remove a policy (tests, a plugin replacing one)."""
    _REGISTRY.pop(name, None)


def policy_names(**wanted) -> tuple[str, ...]:
    """Names of the registered policies (in registration order), optionally those whose attributes
    equal ``wanted`` (``policy_names(needs_scores=False)``)."""
    return tuple(n for n, p in _REGISTRY.items() if all(getattr(p, k) == v for k, v in wanted.items()))


def get_policy(name: str) -> Policy:
    """The policy called ``name``; one line naming the choices for an unknown one."""
    if name not in _REGISTRY:
        raise HeadcountError(f"unknown KV policy {name!r}; choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def make_budget(name: str, request: BudgetRequest) -> KVBudget:
    """The budget policy ``name`` makes for ``request``, after the checks every policy shares:
    scores given exactly when it ranks by them, and only options it declares."""
    policy = get_policy(name)
    if policy.needs_scores and request.kv_scores is None:
        raise HeadcountError(f"the KV policy {name!r} ranks KV heads by scores: give --scores scores.json")
    if not policy.needs_scores and request.kv_scores is not None:
        raise HeadcountError(f"the KV policy {name!r} chooses without scores: leave --scores out")
    unknown = sorted(k for k, v in request.options.items() if v is not None and k not in policy.options)
    if unknown:
        takes = ", ".join(policy.options) or "none"
        raise HeadcountError(f"the KV policy {name!r} takes no {', '.join(unknown)} (its options: {takes})")
    budget = policy.make(request)
    if not isinstance(budget, KVBudget):
        raise HeadcountError(f"the KV policy {name!r} returned a {type(budget).__name__}, not a KVBudget")
    return budget


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    register_policy(importlib.import_module(f"{__name__}.{_module}").POLICY)

__all__ = ["get_policy", "make_budget", "policy_names", "register_policy", "unregister_policy"]
