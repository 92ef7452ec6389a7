"""compare.py's mistakes in one line: a mistake the user can fix (UsageError, exit 2), a file
system that refuses a write for a reason the user can mend (`file_system_problem`), Ctrl-C; and a
count said with its noun (`plural`). The comparison's own, as the train files have theirs in
runkit.py: neither side imports the other's."""
from __future__ import annotations

import contextlib
import errno
import os
import sys


class UsageError(Exception):
    """A mistake the user can fix: one line, exit status 2, no traceback."""


def plural(count: int, noun: str) -> str:
    """`count` and its noun, in the singular for one: "1 run", "2 runs", "4 processes"."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


# what a file system refuses for reasons a user can fix: what is wrong where the system's own words
# do not say it, and what to give instead
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
    errno.ENAMETOOLONG: ("", "give a shorter path"),
}


def file_system_problem(error: OSError) -> str | None:
    """What is wrong and what to give, for a file-system failure a user can fix (without the path);
    None for other OS errors, which keep their traceback."""
    if error.errno not in FILE_SYSTEM_ERRORS:
        return None
    why, advice = FILE_SYSTEM_ERRORS[error.errno]
    said = error.strerror or os.strerror(error.errno)
    return f"{said} ({why}): {advice}" if why else f"{said}: {advice}"


@contextlib.contextmanager
def user_errors():
    """A UsageError, a file system's refusal a user can mend, and Ctrl-C as one line and a non-zero
    exit status, without a traceback."""
    try:
        yield
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:
        problem = file_system_problem(error)
        if problem is None:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"error: {where}{problem}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
