"""Study types (orchestration only: the maths lives in scoring, pruning, training, analysis).

A module here named ``<type>.py`` that calls ``register_study`` is found by ``study: <type>``.
``jobs.py`` holds the job functions every study shares.
"""
