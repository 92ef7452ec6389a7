"""The errors a run ends with in one line, without a traceback, and the one place that says them
(`user_errors`): a mistake the user can fix (UsageError), a run that cannot go on (RunError), a file
system that refuses a read or a write for a reason the user can mend (FILE_SYSTEM_ERRORS), and
Ctrl-C; and a count in a message said with its noun, one in the singular (`plural`). A leaf module:
every other one may import it (common/config.py gives UsageError and RunError under its own name
too)."""
from __future__ import annotations

import contextlib
import errno
import os
import sys


# the longest name and path the file system takes, in bytes: past them it refuses with ENAMETOOLONG
# (FILE_SYSTEM_ERRORS), and the path flags are held within them (common/domains.py)
def _path_limit(name: str, default: int) -> int:
    try:
        return os.pathconf("/", name)
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no such limit
        return default


NAME_MAX, PATH_MAX = _path_limit("PC_NAME_MAX", 255), _path_limit("PC_PATH_MAX", 4096)


def plural(count: int, noun: str) -> str:
    """`count` and its noun, in the singular for one, as a message says them: "1 image",
    "2 images", "4 processes", "1 usable core"."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


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


def says_group_errors() -> bool:
    """Whether this process prints a mistake that every process of its launch meets. A worker
    started by torch's launcher (torchrun, or a train.py starting its own workers) prints it
    if it is its node's first process (LOCAL_RANK 0): once per node, where each node may meet
    a mistake of its own (a file missing there). Every other process prints it: it was
    started by hand, in a shell of its own, whatever RANK or LOCAL_RANK its environment
    happens to hold (inside a job, say)."""
    # torch's agent sets it in every worker
    started_by_launcher = "TORCHELASTIC_RUN_ID" in os.environ
    return not started_by_launcher or os.environ.get("LOCAL_RANK", "0") == "0"


# What a file system refuses for reasons a user can fix, each with what is wrong where the
# system's own words do not say it, and what to give instead: it is full, read-only, not
# theirs, failing, or the path is wrong.
FILE_SYSTEM_ERRORS = {
    errno.ENOSPC: ("", "free some space there, or give a folder on another disk"),
    errno.EDQUOT: ("", "free some of your quota there, or give a folder on another disk"),
    errno.EFBIG: ("the file system there takes no file this large",
                  "give a folder on another file system"),
    errno.EROFS: ("", "give a folder on a file system that can be written"),
    errno.EACCES: ("this user may not read or write there",
                   "give a path this user can use, or change its permissions"),
    errno.EPERM: ("this user may not read or write there",
                  "give a path this user can use, or change its permissions"),
    errno.EIO: ("the disk or the network file system failed",
                "check it, or give a folder on another disk"),
    errno.ELOOP: ("a symbolic link on the path leads round in a loop",
                  "mend the link, or give a path without it"),
    errno.ENOTDIR: ("a part of the path that must be a folder is a file",
                    "give a path whose every part but the last is a folder"),
    errno.EISDIR: ("a folder stands where a file is to be read or written",
                   "move that folder away, or give the path of a file"),
    errno.ENAMETOOLONG: ("", f"give a shorter path (at most {NAME_MAX} bytes a name, "
                             f"{PATH_MAX} in all)"),
}


def file_system_problem(error: OSError) -> str | None:
    """What is wrong and what to give, for a file-system failure a user can fix (without the path),
    or None for other OS errors, which are bugs or the network's and keep their traceback."""
    if error.errno not in FILE_SYSTEM_ERRORS:
        return None
    why, advice = FILE_SYSTEM_ERRORS[error.errno]
    said = error.strerror or os.strerror(error.errno)
    return f"{said} ({why}): {advice}" if why else f"{said}: {advice}"


def file_system_error(error: OSError) -> str | None:
    """The one line for a file-system failure, naming the path where the
    error does (file_system_problem)."""
    problem = file_system_problem(error)
    if problem is None:
        return None
    return f"{error.filename}: {problem}" if error.filename else problem


@contextlib.contextmanager
def user_errors():
    """Turn the user's mistakes, a file system that refuses a write, and Ctrl-C into one line
    and a non-zero exit instead of a traceback. A usage error every process meets is said once
    per node (says_group_errors); one that only this process meets (`rank_specific`) is said by
    it; every process still exits 2."""
    try:
        yield
    except UsageError as error:
        if error.rank_specific or says_group_errors():
            print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as error:
        line = file_system_error(error)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
