"""Executors: run the pending jobs of a plan and publish their results in the store ([`make_executor`][headcount.experiments.runner.executors.make_executor]).

- [`LocalExecutor`][headcount.experiments.runner.local.LocalExecutor] runs jobs one after another in this process, in plan (topological)
  order; each job writes straight into a temporary directory of the store. On a machine with
  several GPUs it keeps a device pool ([`headcount.runtime.device.pool_devices`][headcount.runtime.device.pool_devices]): up to one job per
  GPU at once, each in its own process that sees only its GPU (``CUDA_VISIBLE_DEVICES``).
- [`RayExecutor`][headcount.experiments.runner.ray_executor.RayExecutor] turns each job into a Ray task with its resources (CPUs, GPUs), on the
  cluster of ``address`` or ``$RAY_ADDRESS``, else on a local Ray instance it starts. It checks the
  cluster before anything is written (a node for every job; every node runs this headcount and sees
  the study's input files); tasks run in a scratch directory on their node and return the result
  dict, their files and their output as bytes; the driver alone writes the store, so the results
  are the same as with ``local`` and the run directory need not be shared. Inputs from earlier jobs
  are read in place when the node sees the run directory and otherwise fetched from the Ray object
  store.

Both show rich progress bars (jobs, with ETA; and the steps a long job reports) on stderr.
"""

from __future__ import annotations

from headcount.experiments.runner.execution import Executor
from headcount.experiments.runner.local import LocalExecutor
from headcount.experiments.runner.ray_executor import RayExecutor
from headcount.runtime.errors import HeadcountError


def make_executor(name: str | Executor = "local", address: str | None = None, **kwargs) -> Executor:
    """An executor by name (``local`` or ``ray``), or the given instance.

    >>> make_executor("local").name
    'local'
    """
    if isinstance(name, Executor):
        if kwargs:  # an executor made by the caller: its settings went to its constructor
            raise HeadcountError(f"{', '.join(sorted(kwargs))}: an executor instance was given; pass "
                                 "its settings to its constructor (RayExecutor(gpus_per_job=...))")
        return name
    if name == "local":
        if address:
            raise HeadcountError("--address is for the ray executor (add --executor ray)")
        if kwargs.get("gpus_per_job") is not None:
            raise HeadcountError("--gpus-per-job is for the ray executor (add --executor ray; the local executor "
                                 "runs one job per GPU)")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address=address, **kwargs)
    raise HeadcountError(f"unknown executor {name!r} (use local or ray)")


__all__ = ["make_executor"]
