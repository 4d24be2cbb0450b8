"""Study types (orchestration only: the maths lives in scoring, pruning, training, analysis).

A study type is found by ``study: <type>`` through its entry point in the group ``headcount.studies``
(``pyproject.toml``); its module calls ``register_study`` when loaded.
``jobs.py`` holds the job functions every study shares.
"""
