"""The run lock (``headcount.runtime.lock``) when its file is removed between open and flock.

Three processes on one new folder: A creates the lock file, B opens it, A is refused later and
removes what it created (the lock file), C creates a new one. Without a check B and C would each
hold a lock on a different file, and both would run. The race is made deterministic here: the
flock call itself removes the file the first time, as A would between B's open and B's flock.
"""

from __future__ import annotations

import os

import pytest

from headcount.runtime import lock as lock_mod
from headcount.runtime.errors import HeadcountError


def test_a_lock_whose_file_was_removed_before_the_flock_takes_the_one_on_disk(tmp_path, monkeypatch):
    import fcntl

    real_flock, removed = fcntl.flock, []

    def flock(fd, op):
        if not removed and op & fcntl.LOCK_EX:
            os.unlink(tmp_path / lock_mod.LOCK_NAME)  # the other process's clean-up, at the worst moment
            removed.append(True)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    fd = lock_mod.lock_file(tmp_path)
    try:
        assert removed
        on_disk = os.stat(tmp_path / lock_mod.LOCK_NAME)
        assert (os.fstat(fd).st_ino, os.fstat(fd).st_dev) == (on_disk.st_ino, on_disk.st_dev)
        monkeypatch.setattr(fcntl, "flock", real_flock)
        with pytest.raises(HeadcountError, match="in use"):  # and it is the lock every other process sees
            lock_mod.lock_file(tmp_path)
    finally:
        lock_mod.unlock_file(fd)


def test_a_lock_file_that_keeps_vanishing_is_refused_in_one_line(tmp_path, monkeypatch):
    import fcntl

    real_flock = fcntl.flock

    def flock(fd, op):
        if op & fcntl.LOCK_EX:
            os.unlink(tmp_path / lock_mod.LOCK_NAME)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(HeadcountError, match="keeps being removed"):
        lock_mod.lock_file(tmp_path)
