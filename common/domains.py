"""The domain of every flag's value, and the check that holds a config to it: a number's bounds, a
choice's choices, and the checks of a string (a path, a folder a run writes into, a run name, a
rendezvous) or of a count this machine must hold (synthetic images; worker processes, which
depend on the batch too: worker_processes_refusal, a rule of the config). `flag`
(common/config.py) gives a field its domain; `check_domains`, which any frozen config dataclass
calls first thing in __post_init__, refuses the first value outside it in one line that names the
flag, the value and what to give instead."""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
import types
import typing
import unicodedata

from common.errors import NAME_MAX, PATH_MAX, UsageError

INT_MAX = 2**63 - 1  # torch's largest integer: a count above it reaches no tensor and no C++ call
# SyntheticCIFAR keeps its images as bytes, 3 x 32 x 32 each (it makes them a few at a time,
# common/data.py): a lower bound of the memory --synthetic_size asks for.
SYNTHETIC_BYTES_PER_IMAGE = 3 * 32 * 32
# the kernel's own views: nothing can be created there, not even by root
PSEUDO_FILESYSTEMS = ("/proc", "/sys")

BOUNDS = {"at_least": ("at least", operator.ge), "above": ("above", operator.gt),
          "at_most": ("at most", operator.le), "below": ("below", operator.lt)}


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say):
    what no allocation can exceed."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _shown(value) -> str:
    """A value as the error line shows it: numbers as typed, text quoted (an
    empty one visible), long ones cut."""
    text = (repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float)
            else str(value))
    return text if len(text) <= 80 else f"{text[:60]}... ({len(str(value))} characters)"


def gib(size: float) -> str:
    return f"{size / 2**30:,.3g} GiB" if math.isfinite(size) else "more GiB than a float counts"


def _path(value: str, room: int = 0) -> str | None:
    """What is wrong with `value` as a path, leaving `room` bytes under
    PATH_MAX for what goes below it."""
    if not value:
        return "a path, not empty (. is the current folder)"
    if "\0" in value:
        return "a path without a NUL character"
    try:
        names = [os.fsencode(name) for name in value.split("/")]
        length = len(os.fsencode(os.path.abspath(value)))
    except UnicodeEncodeError:
        return "a path the file system can encode"
    if any(len(name) > NAME_MAX for name in names):
        return f"a path whose every name is at most {NAME_MAX} bytes"
    if length + room > PATH_MAX:
        return f"a path of at most {PATH_MAX - room} bytes once made absolute"
    return None


def _folder(value: str) -> str | None:
    """A folder a run writes into: room below it for a run folder and a file in
    it, and no kernel file system."""
    wrong = _path(value, room=2 * (NAME_MAX + 1))
    if wrong:
        return wrong
    real = os.path.realpath(value)
    if any(real == root or real.startswith(root + "/") for root in PSEUDO_FILESYSTEMS):
        return (f"a folder outside {' and '.join(PSEUDO_FILESYSTEMS)} (the kernel's, where "
                "nothing can be written)")
    return None


def _file_or_auto(value: str) -> str | None:
    wrong = None if value == "auto" else _path(value)
    return wrong and f"auto, or {wrong}"


# Unicode's control characters (newline, tab, NUL, escape...) and line separators
CONTROL = ("Cc", "Zl", "Zp")


def _folder_name(value: str) -> str | None:
    """One name in a folder, as --run_name is: the run folder's own. Neither a path separator (/,
    nor Windows' \\, which a copy of the runs to Windows would split on) nor a control character (a
    newline, a tab, an escape): the name is printed in messages and in the commands they give to
    paste, each of which must stay one line."""
    plain = (value not in ("", ".", "..")
             and not any(separator in value for separator in ("/", "\\")))
    if not plain:
        return "a plain folder name (not empty, . or .., without / or \\)"
    control = next((character for character in value if unicodedata.category(character) in CONTROL),
                   None)
    if control is not None:
        return f"a folder name without control characters (this one has {control!r})"
    try:
        size = len(os.fsencode(value))
    except UnicodeEncodeError:
        return "a folder name the file system can store"
    return (None if size <= NAME_MAX
            else f"a folder name of at most {NAME_MAX} bytes (this one has {size})")


def _rendezvous(value: str) -> str | None:
    """torch's three rendezvous: env:// (MASTER_ADDR/PORT from the environment),
    tcp://HOST:PORT, file:///PATH."""
    scheme, separator, rest = value.partition("://")
    host, _, port = rest.partition("?")[0].rpartition(":")
    valid = {"env": bool(separator) and (not rest or rest.startswith("?")),
             "tcp": bool(host) and port.isdigit() and 0 < int(port) < 65536,
             "file": rest.startswith("/") and not _path(rest)}
    return None if valid.get(scheme) else "env://, tcp://HOST:PORT or file:///ABSOLUTE/PATH"


def _synthetic_images(size: int) -> str | None:
    memory = physical_memory()
    if memory is None or size * SYNTHETIC_BYTES_PER_IMAGE <= memory:
        return None
    return (f"at most {memory // SYNTHETIC_BYTES_PER_IMAGE} images on this machine "
            f"(generating them takes {SYNTHETIC_BYTES_PER_IMAGE // 1024} KiB each; it has "
            f"{gib(memory)} of memory)")


# DataLoader worker processes: a usable core runs one of them at a time, and past this many a core
# the others only wait for it (an -j 1000 meant as -j 10 forks a thousand processes, and the memory
# runs out before the first batch)
WORKERS_PER_CORE = 4
# The memory each --num_workers takes at the least: a worker of the training loader and one of the
# test loader, both kept between epochs (persistent_workers), measured as their own memory
# (smaps_rollup's Private_Clean + Private_Dirty) on CIFAR-sized images: 93 MiB for the training
# loader's, 13 MiB for the test loader's; and the batches each prepares ahead (prefetch_factor).
WORKER_PAIR_BYTES = 100 * 2**20
BATCHES_AHEAD = 2  # DataLoader's prefetch_factor, per worker


def usable_cores() -> int:
    """The cores this process may run on (its affinity: taskset, a SLURM or container cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def most_worker_processes(processes: int, batch_bytes: int) -> tuple[int, str, str]:
    """The most DataLoader workers per training process (--num_workers) this machine holds, with
    `processes` training processes on this node, each loading batches of `batch_bytes`: at most
    WORKERS_PER_CORE a usable core, what the memory holds (WORKER_PAIR_BYTES and the batches ahead,
    per --num_workers), and what this user may start. (The most, why, what else to give.)"""
    import resource

    cores, memory = usable_cores(), physical_memory()
    shared = f", shared by {processes} training processes" if processes > 1 else ""
    each = WORKER_PAIR_BYTES + 2 * BATCHES_AHEAD * batch_bytes
    limits = [(WORKERS_PER_CORE * cores // processes,
               f"{WORKERS_PER_CORE} per usable core: {cores} cores{shared}; past that they only "
               "wait for a core", "")]
    if memory is not None:
        limits.append((memory // each // processes,
                       f"each --num_workers is two workers, the training loader's and the test "
                       f"loader's, about {each / 2**20:,.0f} MiB with the batches they prepare "
                       f"ahead; {gib(memory)} of memory{shared}", ", a smaller --batch_size"))
    user_processes = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if user_processes != resource.RLIM_INFINITY:
        limits.append((user_processes // 2 // processes,
                       f"each --num_workers is two processes, and this user may start "
                       f"{user_processes} (ulimit -u){shared}", ""))
    return min(limits)


def worker_processes_refusal(workers: int, processes: int, batch_bytes: int) -> str | None:
    """What is wrong with `workers` DataLoader workers per training process (--num_workers) past
    most_worker_processes, or None where the machine holds them."""
    most, why, or_else = most_worker_processes(processes, batch_bytes)
    if workers <= most:
        return None
    return (f"--num_workers {workers} is more DataLoader worker processes than this machine can "
            f"hold: at most {most} per training process here ({why}); give fewer{or_else}, or "
            "leave --num_workers out to fit the machine")


CHECKS = {"folder": _folder, "file": _path, "file_or_auto": _file_or_auto, "name": _folder_name,
          "rendezvous": _rendezvous, "synthetic_images": _synthetic_images}


def _number(value, kind: type, domain: dict) -> str | None:
    """What to give instead of `value`, a number of type `kind` (int or
    float) with the bounds in `domain`."""
    noun = "a whole number" if kind is int else "a finite number"
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        return noun
    bounds = [(word, holds, domain[name]) for name, (word, holds) in BOUNDS.items()
              if name in domain]
    if (isinstance(value, float) and not math.isfinite(value)
            or not all(holds(value, b) for _, holds, b in bounds)):
        limits = " and ".join(f"{word} {_shown(bound)}" for word, _, bound in bounds)
        return f"{noun} {limits}".rstrip()
    if kind is int and value > INT_MAX:
        return f"a whole number at most {INT_MAX} (2**63 - 1, torch's largest)"
    return None


def _outside(value, kind: type, domain: dict, choices) -> str | None:
    """None when `value` (of a field, or an item of a tuple field, of type `kind`) lies in its
    domain, else what to give instead."""
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if choices is not None:
        return None if value in choices else f"one of {', '.join(map(str, choices))}"
    if kind in (int, float):
        wanted = _number(value, kind, domain)
    else:
        wanted = (None if isinstance(value, kind) else "text" if kind is str
                  else f"a {kind.__name__}")
    check = domain.get("check")
    if wanted is None and check is not None:
        wanted = (CHECKS[check] if isinstance(check, str) else check)(value)
    return wanted


@functools.cache
def _typed_fields(config_class: type) -> tuple:
    """(field, X, whether None is allowed, whether a tuple of X) for
    every field of `config_class`."""
    hints, typed = typing.get_type_hints(config_class), []
    for f in dataclasses.fields(config_class):
        hint = hints[f.name]
        optional = (typing.get_origin(hint) in (typing.Union, types.UnionType)
                    and type(None) in typing.get_args(hint))
        # X | None -> X
        kind = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
        many = typing.get_origin(kind) is tuple
        typed.append((f, typing.get_args(kind)[0] if many else kind, optional, many))
    return tuple(typed)


def _domain(f: dataclasses.Field) -> dict:
    """The field's domain, as its flag(...) gives it."""
    return f.metadata.get("domain", {})


def missing_domains(config_class: type) -> list[str]:
    """The fields of `config_class` that have no domain (see flag): a mistake the tests refuse."""
    return [f.name for f, kind, _, _ in _typed_fields(config_class)
            if kind is not bool and "choices" not in f.metadata and not _domain(f)]


def check_domains(config) -> None:
    """Refuse the first field of the frozen config dataclass `config` whose value lies outside its
    domain (see flag), in one line that names its flag, the value and what to give instead. Any
    config dataclass calls it first thing in __post_init__."""
    for f, kind, optional, many in _typed_fields(type(config)):
        value = getattr(config, f.name)
        if value is None and optional:
            continue
        if many and not (isinstance(value, tuple) and value):
            raise UsageError(f"--{f.name} must be one or more values, not {_shown(value)}")
        domain = _domain(f)
        for item in value if many else (value,):
            if many and item is None and optional:
                continue  # an item None: the run's default (compare.py's --amp)
            wanted = _outside(item, kind, domain, f.metadata.get("choices"))
            if wanted:
                raise UsageError(f"--{f.name} must be {wanted}, not {_shown(item)}")
