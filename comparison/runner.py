"""Running the runs: each as its own subprocess, started as a user starts it, its output to logs/<name>.log, its
outcome read back from the results.json it wrote. compare.py runs its matrix one run at a time; compare.py
--verify runs independent runs two at a time on the CPU (`run_all`)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from common.config import REPO_ROOT
from comparison.matrix import Run, run_environment
from comparison.report import Outcome


def run_one(run: Run, argv: list[str], out: Path, cuda: bool, timeout: int, run_dir: Path | None = None,
            started=None) -> Outcome:
    """One run as its own subprocess (own process group, so a timeout can stop torchrun and its workers), its
    output to logs/<name>.log; then the results.json in `run_dir` (default runs/<name>), or the error it ended
    with. `started`, if given, is called with the child process (to stop it on Ctrl-C from another thread)."""
    log = out / "logs" / f"{run.name}.log"
    run_dir = run_dir or out / "runs" / run.name
    begun = time.monotonic()
    with open(log, "w") as stream:
        stream.write("$ " + shlex.join(argv) + "\n\n")  # the command, as a user would type it
        stream.flush()
        child = subprocess.Popen(argv, cwd=REPO_ROOT, env=run_environment(run, cuda), stdout=stream,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        if started:
            started(child)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(child, signal.SIGTERM)
            return Outcome(run, "failed", time.monotonic() - begun, f"stopped after --run_timeout {timeout} s",
                           log=log)
        except KeyboardInterrupt:
            stop(child, signal.SIGINT)  # the run checkpoints and exits, like a Ctrl-C of its own
            raise
    seconds = time.monotonic() - begun
    results = run_dir / "results.json"
    if code != 0:
        return Outcome(run, "failed", seconds, f"exit status {code}: {last_error(log)}", log=log)
    if not results.is_file():
        return Outcome(run, "failed", seconds, "finished without writing results.json", log=log)
    return Outcome(run, "ok", seconds, results=json.loads(results.read_text()), log=log)


def stop(child: subprocess.Popen, sig: int) -> None:
    """Signal the run's whole process group, give it a minute to checkpoint and exit, then kill what is left."""
    try:
        os.killpg(child.pid, sig)
        child.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        pass


def last_error(log: Path) -> str:
    """The run's own one-line error if it printed one, else the last line it wrote."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def run_all(tasks: list, launch, needs, at_once: int, skipped) -> dict:
    """Every task, `at_once` at a time, each once the tasks it `needs` have finished: {task: launch(task, started)}.
    A task whose needed task did not succeed is not launched: skipped(task, failed_task) is its outcome instead.
    On Ctrl-C every running child gets SIGINT (it checkpoints and exits) before KeyboardInterrupt goes on."""
    outcomes, running, children = {}, {}, []
    pending = list(tasks)
    with ThreadPoolExecutor(at_once) as pool:
        try:
            while pending or running:
                for task in list(pending):
                    if len(running) == at_once or not all(need in outcomes for need in needs(task)):
                        continue
                    pending.remove(task)
                    failed = next((need for need in needs(task) if outcomes[need].status != "ok"), None)
                    if failed is not None:
                        outcomes[task] = skipped(task, failed)
                    else:
                        running[pool.submit(launch, task, children.append)] = task
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    outcomes[running.pop(future)] = future.result()
        except KeyboardInterrupt:
            for child in children:
                if child.poll() is None:
                    stop(child, signal.SIGINT)
            raise
    return outcomes
