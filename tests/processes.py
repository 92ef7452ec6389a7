"""Running the train files the ways a user does, for the tests of the training path: as a process
(`python <mode>/train.py`, torchrun, `--nproc_per_node`), in the background to signal or kill,
ranks started by hand, and inside this process (a train.py's main() as its `__main__` block calls
it, for the runs that need no process of their own: the same code without ~3 s of start-up)."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import runkit
from conftest import MODES, REPO, TINY, free_port  # noqa: F401 (TINY, MODES: the tests' too)
# one intra-op thread a process: the suite runs a file a core, and bit-for-bit comparisons must
# not hang on the thread count (it changes the order of a convolution's sums)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@functools.cache
def train_file(mode: str):
    """<mode>/train.py imported by its path, as compare.py and benchmarks/ import it (nothing
    runs: its module only puts the repository and models/ on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"{mode}_train", REPO / mode / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process(mode: str, *argv, stop_at: int | None = None,
               signal_name: str = "SIGTERM") -> subprocess.CompletedProcess:
    """`python <mode>/train.py argv...` run inside this process as its `__main__` block runs it
    (main() under runkit.one_line_errors), output captured; dist_parallel and fsdp as the one
    process of a group, as `torchrun --nproc_per_node 1` starts it (its variables set, its group
    destroyed after). With
    `stop_at`, `signal_name` is noted at the log window of that step as the run's handler notes a
    signal: the run stops there (the signals themselves are sent to real processes elsewhere). The
    run folder's lock is let go after, as the process's end lets it go."""
    module = train_file(mode)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        if mode in ("dist_parallel", "fsdp"):
            for name, value in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0),
                                ("LOCAL_WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1"),
                                ("MASTER_PORT", free_port())):
                patch.setenv(name, str(value))
            stack.callback(destroy_group)
        if stop_at is not None:
            real = module.log_window

            def signalled_then_logged(run, epoch):
                if run.progress["step"] == stop_at:
                    run.signals.received = signal_name
                real(run, epoch)

            patch.setattr(module, "log_window", signalled_then_logged)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            with runkit.one_line_errors():
                code = module.main([str(arg) for arg in argv])
        except SystemExit as exit_:
            code = exit_.code
        finally:
            while runkit._held:  # the lock a process holds until it ends
                runkit._held.pop().close()
    return subprocess.CompletedProcess([mode, *map(str, argv)], code or 0, out.getvalue(),
                                       err.getvalue())


def destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def torchrun(processes: int, mode: str) -> list[str]:
    """The command line of `torchrun --standalone --nproc_per_node N <mode>/train.py`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(processes), str(REPO / mode / "train.py")]


def run(command: list, *flags, timeout: float = 300, env=None,
        cwd=REPO) -> subprocess.CompletedProcess:
    """`command flags...` to its end, from the repository (or `cwd`), output captured."""
    return subprocess.run([*map(str, command), *map(str, flags)], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **ONE_THREAD, **(env or {})})


def script(mode: str) -> list[str]:
    """The command line of `python <mode>/train.py`."""
    return [sys.executable, str(REPO / mode / "train.py")]


def start(command: list, *flags, env=None) -> subprocess.Popen:
    """`command flags...` in the background, in a session of its own (its whole tree can be found
    and signalled), its output and errors in one pipe."""
    return subprocess.Popen([*map(str, command), *map(str, flags)], cwd=REPO, text=True,
                            env={**os.environ, **ONE_THREAD, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def read_until(process: subprocess.Popen, text: str) -> str:
    """The process's output up to the first line that holds `text`."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return "".join(lines)
    pytest.fail(f"the run ended before it printed {text!r}:\n{''.join(lines)}")


def finish(process: subprocess.Popen, timeout: float = 240, before: str = "") -> tuple[int, str]:
    """(exit status, everything it printed); a process that does not end is killed, and fails."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the run did not end within {timeout} s:\n{before}{output}")
    return process.returncode, before + output


def by_hand(mode: str, flags: list, log_dir: Path, name: str, fault: dict,
            processes: int = 2, timeout: float = 180) -> list[tuple[int, str, str]]:
    """`processes` ranks of <mode>/train.py started by hand, as a scheduler starts them (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no launcher to clean up after them), under
    tests/fault_injection.py with `fault`'s variables: each rank's (exit status, output, errors)."""
    port, ranks = free_port(), []
    for rank in range(processes):
        env = {**os.environ, **ONE_THREAD, "RANK": str(rank), "WORLD_SIZE": str(processes),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **fault}
        ranks.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fault_injection.py"),
             str(REPO / mode / "train.py"), *map(str, flags), "--log_dir", str(log_dir),
             "--run_name", name], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE))
    try:
        outputs = [rank.communicate(timeout=timeout) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return [(rank.returncode, *output) for rank, output in zip(ranks, outputs)]


def under_fault(mode: str, flags: list, fault: dict) -> subprocess.Popen:
    """`python <mode>/train.py flags...` in the background under tests/fault_injection.py (one
    process: rank 0), as start() starts it."""
    return start([sys.executable, REPO / "tests" / "fault_injection.py", REPO / mode / "train.py"],
                 *flags, env={"FAULT_RANK": "0", **fault})


def parents() -> dict[int, tuple[int, int, str]]:
    """{pid: (parent, session, state)} of every process, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0])
        except (ValueError, OSError, IndexError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`."""
    table, found, frontier = parents(), [], [pid]
    while frontier:
        frontier = [child for child, (parent, _, state) in table.items()
                    if parent in frontier and state != "Z"]
        found += frontier
    return found


def session_alive(session: int) -> list[int]:
    """The live processes of the session `session` (a launch and all it started)."""
    return [pid for pid, (_, sid, state) in parents().items() if sid == session and state != "Z"]


def wait_for(condition, timeout: float, what: str) -> None:
    """Until `condition()`; `timeout` only stops a hang (no test asserts a time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def continue_flags(line: str) -> list[str]:
    """The flags a stop's line says to go on with: `continue with --resume auto --run_name X`."""
    return line.split("continue with ", 1)[1].split()
