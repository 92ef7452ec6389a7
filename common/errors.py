"""The two kinds of error a run ends with in one line, without a traceback (common/config.py's
user_errors says them): a mistake the user can fix, and a run that cannot go on. A leaf module:
every other one may import it (common/config.py gives them under its own name too)."""
from __future__ import annotations


class UsageError(Exception):
    """A mistake the user can fix: reported as one line, exit status 2, no traceback. In a process
    group every rank meets the same mistake, and one line per node says it (see user_errors); a
    mistake only some ranks can meet (a rank without a GPU, a rank that cannot reach the master) is
    `rank_specific` and said by each of them."""

    def __init__(self, message: str, rank_specific: bool = False):
        super().__init__(message)
        self.rank_specific = rank_specific


class RunError(Exception):
    """A run that cannot go on (a loss that turned NaN, a process group that broke): one line, exit
    status 1."""
