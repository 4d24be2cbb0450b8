"""KV budgets: which key/value heads of a decoder keep the full cache and which a sink + window.

One concept per module, each importable on its own (this package imports none of them: the
cache pulls in transformers, the budget format needs nothing but the standard library):

- [`budget`][headcount.kv.budget]: the [`KVBudget`][headcount.kv.budget.KVBudget] value and
  ``budget.json`` (its format, checks and memory arithmetic);
- [`cache`][headcount.kv.cache]: the transformers cache and attention that apply a budget with
  real memory savings ([`apply_kv_budget`][headcount.kv.cache.apply_kv_budget]);
- [`memory`][headcount.kv.memory]: the memory target every policy works under
  ([`KVBudgetSettings`][headcount.kv.memory.KVBudgetSettings]) and how many full KV heads fit it;
- [`policy`][headcount.kv.policy] and [`policies`][headcount.kv.policies]: the ways to choose a
  budget (``full``, ``scores``, ``uniform``, ``random``), registered by name, one file each;
- [`measure`][headcount.kv.measure]: one budget measured on a decoder (the bytes its cache holds,
  needle accuracy, LM loss, speed): what ``headcount kv-eval`` and the retrieval study's curve run.

A KV head's score from its query heads' is [`kv_pool`][headcount.importance.scores.kv_pool]'s
(``headcount.importance.scores``: pruning whole groups pools the same way).

May import: ``headcount.importance``, ``headcount.data``, ``headcount.core``, ``headcount.runtime``.
"""
