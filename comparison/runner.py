"""Running the runs: each as its own subprocess, started as a user starts it, its output to
logs/<name>.log, its outcome read back from the results.json it wrote. compare.py runs its matrix
one run at a time; compare.py --verify runs independent runs two at a time on the CPU. Both go
through `run_all`.

A run ends with compare.py, whatever ends compare.py:
- Ctrl-C, SIGTERM (a `timeout`, a scheduler, `kill`), SIGHUP (a closed terminal) and SIGUSR1
  (SLURM's warning before a time limit) raise `Stopped` in compare.py (`stop_signals`). `run_all`
  then tells every run under way to stop (SIGINT for Ctrl-C, SIGTERM otherwise: the run
  checkpoints and exits), and returns their outcomes as interrupted and the runs not yet started
  as not run.
- A kill -9 cannot be handled. Each run is armed before it starts with Linux's parent-death signal
  (`killed_with`). The kernel sends it
  when the THREAD that started the run ends, so every run is started by the main thread, which ends
  only with compare.py: `run_all` polls its runs instead of waiting for each in a thread of its own.
  torchrun's workers die with their agent.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from comparison.matrix import PlannedRun, run_environment
from comparison.report.outcome import Outcome
from comparison.train_files import REPO

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
STOP_GRACE_S = 60.0  # how long stopped runs get to checkpoint and exit before they are killed
POLL_S = 0.1  # how often run_all looks at its runs: nothing beside a run's seconds


# ------------------------------------------------------------------------------------------ signals
class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1) received by compare.py. A
    KeyboardInterrupt, which Python raises for Ctrl-C, so that whatever stops on Ctrl-C
    stops on the others the same way."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_of(interruption: KeyboardInterrupt) -> int:
    """The signal behind an interruption: Python's own KeyboardInterrupt is Ctrl-C's SIGINT."""
    return getattr(interruption, "signum", signal.SIGINT)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def _handlers(handler):
    """`handler` for every stop signal while the block runs, the previous handlers restored after.
    Only the main thread can set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def stop_signals():
    """While the block runs, SIGINT, SIGTERM, SIGHUP and SIGUSR1
    raise Stopped in the main thread."""
    def raise_stopped(signum, frame):
        raise Stopped(signum)

    return _handlers(raise_stopped)


@contextlib.contextmanager
def signals_deferred():
    """While the block runs (a report being written), a stop signal is only noted: the block gets
    the list of the signals received, to act on once it is done."""
    received = []
    with _handlers(lambda signum, frame: received.append(signum)):
        yield received


# ------------------------------------------------------------------------------------------ one run
def killed_with(parent: int):
    """A function that, called in a child of process `parent` between fork and exec, has Linux
    send the child SIGKILL when `parent` ends (precisely: the thread of it that started the child);
    a child whose parent ended already exits at once. None where there is no such signal (not
    Linux). ctypes' lookup is done here, so that the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


@dataclass
class Started:
    """A run under way: its process (the leader of its own process group), its log, its folder."""
    run: PlannedRun
    child: subprocess.Popen
    log: Path
    run_dir: Path
    begun: float

    def seconds(self) -> float:
        return time.monotonic() - self.begun

    def outcome(self, status: str, error: str | None = None, results=None) -> Outcome:
        return Outcome(self.run, status, self.seconds(), error, results=results, log=self.log,
                       run_dir=self.run_dir)

    def ended(self) -> Outcome:
        """The outcome of the run, which has exited: its results.json, or its error."""
        code = self.child.returncode
        if code != 0:
            return self.outcome("failed", f"exit status {code}: {last_error(self.log)}")
        try:
            results = json.loads((self.run_dir / "results.json").read_text())
        except FileNotFoundError:
            return self.outcome("failed", "finished without writing results.json")
        except (OSError, ValueError) as error:
            return self.outcome("failed", f"its results.json cannot be read: {error}")
        return self.outcome("ok", results=results)

    def interrupted(self, signum: int) -> Outcome:
        """The outcome of a run that compare.py stopped, stopped itself by `signum`."""
        code = self.child.returncode
        how = f"it exited with status {code}" if code >= 0 else f"{signal_name(-code)} ended it"
        return self.outcome("interrupted", f"compare.py was stopped by {signal_name(signum)} and "
                                           f"stopped the run; {how}")


def start(run: PlannedRun, argv: list[str], out: Path, cuda: bool,
          run_dir: Path | None = None) -> Started:
    """One run as its own subprocess, its output to logs/<name>.log after the command line; its
    run folder `run_dir` (default runs/<name>). In a session of its own: a stop reaches torchrun's
    workers through their agent, and a Ctrl-C in compare.py's terminal reaches compare.py alone.
    From the main thread only (see the module's docstring)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("runs start from the main thread: their parent-death signal watches it")
    log = out / "logs" / f"{run.name}.log"
    with open(log, "w") as stream:
        try:
            stream.write("$ " + shlex.join(argv) + "\n\n")  # the command, as a user would type it
            stream.flush()
        except OSError as error:  # a full disk: a failed write leaves the file's name out
            raise OSError(error.errno, error.strerror, str(log)) from None
        child = subprocess.Popen(argv, cwd=REPO, env=run_environment(run, cuda), stdout=stream,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=killed_with(os.getpid()))  # dies with compare.py
    return Started(run, child, log, run_dir or out / "runs" / run.name, time.monotonic())


def stop(children: list[subprocess.Popen], sig: int) -> None:
    """Signal each run's whole process group, give them STOP_GRACE_S together to checkpoint and
    exit, then kill what is left. Another stop signal meanwhile (a second Ctrl-C) kills them now."""
    for child in children:
        _signal_group(child, sig)
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        for child in children:
            child.wait(max(deadline - time.monotonic(), 0.0))
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        for child in children:
            _signal_group(child, signal.SIGKILL)
    for child in children:
        while child.returncode is None:
            with contextlib.suppress(KeyboardInterrupt):  # it was killed: gone in a moment
                child.wait()


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)


# an exception a worker raised, as torchrun prefixes its lines: "[rank1]: RuntimeError: ..."
RANK_RAISED = re.compile(r"\[rank\d+\]: [\w.]*(Error|Exception|Interrupt)\b")


def last_error(log: Path) -> str:
    """The run's own one-line error if it printed one; else the first exception a worker raised
    (torchrun's summary after it, framed in rules, says only that the launch failed); else the last
    line it wrote that is not a rule of '=' or '-'."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    raised = [line for line in lines if RANK_RAISED.match(line)]
    if raised:
        return raised[0]
    return ([line for line in lines if line.strip("=-")] or ["no output"])[-1]


# ----------------------------------------------------------------------------------------- the runs
def run_all(tasks: list, begin, needs, at_once: int, not_run, timeout: int,
            finished=None) -> tuple[dict, int | None]:
    """Every task, `at_once` at a time, each once the tasks it `needs` have finished:
    ({task: outcome}, None), or with the signal that stopped compare.py in place of None.
    - begin(task): starts the task's run (start());
    - not_run(task, why): the outcome of a task that does not start, because a task it needs did not
      succeed or because compare.py was stopped;
    - finished(task, outcome): each outcome as it comes (a progress line).
    A run past `timeout` seconds is stopped and fails. Whatever else ends run_all (a full disk)
    stops every run first."""
    outcomes, running, pending = {}, {}, list(tasks)
    try:
        while pending or running:
            for task in list(pending):
                if len(running) == at_once or not all(need in outcomes for need in needs(task)):
                    continue
                pending.remove(task)
                failed = next((need for need in needs(task) if outcomes[need].status != "ok"), None)
                if failed is not None:
                    outcomes[task] = not_run(task, f"needs {failed.name}, which did not succeed")
                else:
                    running[task] = begin(task)
            ended = {task: _outcome(started, timeout) for task, started in running.items()}
            ended = {task: outcome for task, outcome in ended.items() if outcome is not None}
            for task, outcome in ended.items():
                del running[task]
                outcomes[task] = outcome
                if finished:
                    finished(task, outcome)
            if running and not ended:
                time.sleep(POLL_S)
    except KeyboardInterrupt as interruption:
        signum = signal_of(interruption)
        ended = {task: started.ended() for task, started in running.items()
                 if started.child.poll() is not None}  # those that ended by themselves
        stopped = {task: started for task, started in running.items() if task not in ended}
        # SIGHUP and SIGUSR1 as SIGTERM: a run checkpoints and exits on each, and says SIGTERM
        stop([started.child for started in stopped.values()],
             signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        ended |= {task: started.interrupted(signum) for task, started in stopped.items()}
        for task, outcome in ended.items():
            outcomes[task] = outcome
            if finished:
                finished(task, outcome)
        why = f"compare.py was stopped by {signal_name(signum)} before it started"
        outcomes |= {task: not_run(task, why) for task in tasks if task not in outcomes}
        return outcomes, signum
    except BaseException:
        stop([started.child for started in running.values()], signal.SIGTERM)
        raise
    return outcomes, None


def _outcome(started: Started, timeout: int) -> Outcome | None:
    """The run's outcome once it has exited, or is stopped past `timeout` seconds; None while it
    runs."""
    if started.child.poll() is not None:
        return started.ended()
    if started.seconds() <= timeout:
        return None
    stop([started.child], signal.SIGTERM)
    return started.outcome("failed", f"stopped after --run_timeout {timeout} s")
