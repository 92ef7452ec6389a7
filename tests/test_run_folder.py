"""One writer per run folder, whatever happens, on the CPU:

1. a run resumed from another run's checkpoint never writes into a third run's folder;
2. two runs started at the same moment with the same --run_name: one runs, the other is refused in
   one line, and the winner's files are whole;
3. a folder in use by a live run (an orphan, a second `--resume auto`) is refused,
   and `--overwrite` cannot empty it either; the lock dies with its process, not with
   the DataLoader workers it forked;
4. a killed torchrun agent takes its workers with it (they would otherwise train on in the folder);
5. temporary files have names of their own, so two writers never rename each other's half-written
   file, and the next writer of the folder removes those a killed writer left;
6. a disk that fills up stops the run in one line, the last checkpoint whole;
7. `--resume auto` never starts afresh over an earlier run's work (best.pt, model.pt, TensorBoard
   curves) when its checkpoint.pt is gone: one line that says what is there and what to do (resume
   from best.pt where these flags can), exit 2, nothing written; only a later attempt of the job
   that started the run afresh (an elastic restart, a SLURM requeue), whose earlier attempts died
   before their first checkpoint, starts afresh again.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.checkpoint import refuse_fresh_start
from common.config import Config, UsageError, parse_config
from common.logger import LOCK, MARKER, RunLogger, claim_run_dir, write_atomically
from conftest import (REPO, TINY, read_results, read_scalars, refuse_in_process, run_script,
                      running, train_in_process)

SINGLE, DIST, FSDP = "single_gpu/train.py", "dist_parallel/train.py", "fsdp/train.py"


def launch(script: str, log_dir: Path, name: str, *flags) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, TINY), *map(str, flags),
                             "--log_dir", str(log_dir), "--run_name", name], cwd=REPO, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def finished_run(log_dir: Path, name: str) -> Path:
    """A run folder as a finished run leaves it, without training one:
    files whose bytes must not change."""
    run_dir = log_dir / name
    run_dir.mkdir(parents=True)
    for file in ("checkpoint.pt", "best.pt", "results.json"):
        (run_dir / file).write_bytes(f"{name}'s {file}".encode())
    return run_dir


def contents(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.iterdir() if path.name != LOCK}


# ---------------------------------------------------------------------------------------- 1. resume
def test_resuming_another_runs_checkpoint_into_an_existing_run_folder_is_refused(tmp_path):
    """`--resume runs/A/checkpoint.pt --run_name B` with B a finished, unrelated run: refused before
    anything is read or written (B used to be overwritten, exit 0)."""
    finished_run(tmp_path, "A")
    b = finished_run(tmp_path, "B")
    before = contents(b)
    done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "B", "--resume",
                             tmp_path / "A" / "checkpoint.pt")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [done.stderr.strip()]
    assert "belongs to another run" in done.stderr and "--run_name A" in done.stderr
    assert contents(b) == before


# ---------------------------------------------------------------------------------------- 2. a race
def test_two_runs_started_at_once_with_one_name_leave_one_whole_run(tmp_path):
    """Both used to exit 0 and say "results in ...", one run's checkpoint and results silently lost.
    Now the folder is created exclusively: whichever comes second (at the existence check or at
    creation) is refused in one line, and the folder holds one run's files, whole."""
    runs = [launch(SINGLE, tmp_path, "same", "--max_steps", "3") for _ in range(2)]
    outcomes = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], outcomes
    _, _, refused = next(outcome for outcome in outcomes if outcome[0] == 2)
    assert len(error_lines(refused)) == 1 and "run folder" in refused, refused
    assert read_results(tmp_path / "same")["summary"]["steps"] == 3
    assert torch.load(tmp_path / "same" / "checkpoint.pt", weights_only=True)["step"] == 3
    assert not list((tmp_path / "same").glob(".*.tmp"))


def test_two_runs_started_at_once_without_a_name_both_run(tmp_path):
    """Without --run_name the name is the mode, the date, the time to the second and the process:
    two runs started in the same second (one used to be refused, told to choose a name it never
    chose) each get a folder of their own and finish."""
    command = [sys.executable, str(REPO / SINGLE), *map(str, TINY), "--max_steps", "1", "--log_dir",
               str(tmp_path)]
    runs = [subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
            for _ in range(2)]
    outcomes = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    folders = sorted(path.name for path in tmp_path.iterdir())
    assert len(folders) == 2 and all(read_results(tmp_path / name)["summary"]["steps"] == 1
                                     for name in folders)
    assert {name.rsplit("-", 1)[1] for name in folders} == {str(run.pid) for run in runs}


# -------------------------------------------------------------------------------------- 3. the lock
# A live run's lock, taken the product's way, with a DataLoader worker forked after it: prints its
# pid and the worker's, then waits to be killed.
HOLDER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from common.config import Config
from common.logger import claim_run_dir
lock = claim_run_dir(__import__("pathlib").Path(sys.argv[2]),
                     Config(resume="auto", run_name="busy"))
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), worker, flush=True)
time.sleep(60)
"""


def test_a_folder_in_use_is_refused_and_the_lock_dies_with_its_process(tmp_path):
    """While a live process holds the run folder, `--resume auto` and `--overwrite` are
    refused in one line naming the holder's pid, and nothing in the folder changes. Killed
    (SIGKILL, the OOM killer), the holder's lock goes with it, though the DataLoader worker it
    forked lives on a few seconds more (torch's watchdog): a restart right away claims the
    folder, and --overwrite empties it."""
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    (run_dir / "events.out.tfevents.1").write_text("{}")  # a live run's first file
    # a run's folder, which --overwrite may empty once nobody uses it
    (run_dir / MARKER).write_text("")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO), str(run_dir)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    holder_pid, worker_pid = map(int, holder.stdout.readline().split())
    try:
        for flags in (["--resume", "auto"], ["--overwrite"]):
            done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "busy",
                                     *flags)
            assert done.returncode == 2, done.stderr
            assert error_lines(done.stderr) == [done.stderr.strip()]
            assert ("in use by a run that is still running" in done.stderr
                    and f"pid {holder_pid}" in done.stderr)
            assert (run_dir / "events.out.tfevents.1").read_text() == "{}"
        holder.kill()
        holder.wait()
        assert running(worker_pid)  # the forked worker outlives its process for a while
        claim_run_dir(run_dir,
                      Config(log_dir=str(tmp_path), run_name="busy", overwrite=True)).close()
    finally:
        holder.kill()
        os.kill(worker_pid, signal.SIGKILL)
    # emptied: lock and mark aside
    assert sorted(path.name for path in run_dir.iterdir()) == [LOCK, MARKER]


def test_a_new_run_does_not_take_a_folder_created_a_moment_ago(tmp_path):
    run_dir = tmp_path / "new"
    first = claim_run_dir(run_dir, Config(log_dir=str(tmp_path), run_name="new"))
    try:
        with pytest.raises(UsageError, match="created by another run a moment ago"):
            claim_run_dir(run_dir, Config(log_dir=str(tmp_path), run_name="new"))
    finally:
        first.close()


# --------------------------------------------------------------------------------------- 4. orphans
def test_a_killed_agent_takes_its_workers_with_it(tmp_path):
    """`kill -9` of the self-launch (torch's elastic agent, in this process): each worker
    sits in a session of its own, so nothing used to reach it and it trained on as an orphan.
    The parent-death signal ends it."""
    agent = launch(DIST, tmp_path, "orphans", "--nproc_per_node", "1", "--epochs", "50",
                   "--log_interval", "1")
    for line in agent.stdout:
        if line.startswith("Epoch 1/"):
            break
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(agent.pid)],
                                                  capture_output=True, text=True).stdout.split()]
    assert len(workers) == 1
    agent.kill()
    agent.communicate()
    deadline = time.monotonic() + 60  # a hang's stop: an orphan would train 50 epochs
    while time.monotonic() < deadline and any(running(pid) for pid in workers):
        time.sleep(0.05)
    alive = [pid for pid in workers if running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "the workers outlived their launcher"


# ------------------------------------------------------------------------------------ 5. temp files
def test_temporary_files_are_each_writers_own(tmp_path, monkeypatch):
    """Two writers of one file each write their own temporary file: the name
    carries the pid and a random part."""
    names = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: (names.append(Path(source).name),
                                                               real_replace(source, target)))
    for _ in range(2):
        write_atomically(tmp_path / "checkpoint.pt", lambda f: f.write(b"x"))
    assert len(set(names)) == 2 and all(str(os.getpid()) in name for name in names), names
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.pt"]
    # its writer was killed
    (tmp_path / ".checkpoint.pt.12345.0badc0de.tmp").write_bytes(b"half a checkpoint")
    cfg = Config(log_dir=str(tmp_path.parent), run_name=tmp_path.name, resume="auto")
    claim_run_dir(tmp_path, cfg).close()
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK, MARKER, "checkpoint.pt"]


# ------------------------------------------------------------------------------------- 6. full disk
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmpfs):
    """The disk fills while the run writes its files (best.pt, a copy of the checkpoint, at the
    end of the first epoch): one line naming the file and the cause, exit 1, no traceback, no
    temporary file left, and the checkpoint written before it is whole (it used to end in a
    traceback from deep inside shutil)."""
    # room for one checkpoint of TINY's model, not for a second file of it
    small_disk = tmpfs("size=320k")
    done = run_script(SINGLE, *TINY, "--epochs", "2", "--no_progress", "--log_dir", small_disk,
                      "--run_name", "full", env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0], done.stderr
    assert str(small_disk / "full") in errors[0]
    run_dir = small_disk / "full"
    assert not list(run_dir.glob(".*.tmp"))
    # the first epoch's, whole
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"] == 8


# -------------------------------------------------------------------------------- 7. no fresh start
TWO_EPOCHS = [*TINY, "--epochs", "2", "--log_interval", "2", "--no_progress"]  # 8 steps an epoch


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run of two epochs stopped by SIGTERM at step 10 (best.pt from the end of epoch 1, step 8;
    TensorBoard curves to step 10; no results.json), whose checkpoint.pt was then deleted."""
    log_dir = tmp_path_factory.mktemp("stopped")
    done = train_in_process(SINGLE, *TWO_EPOCHS, "--log_dir", log_dir, "--run_name", "run",
                            sigterm_at=10)
    assert done.returncode == 143, done.stdout + done.stderr
    (log_dir / "run" / "checkpoint.pt").unlink()
    return log_dir / "run"


def refused_afresh(run_dir: Path, script: str, *flags) -> str:
    """`--resume auto` of `run_dir` by `script` with TWO_EPOCHS and `flags`: refused in one line
    (returned), exit 2, and not a byte of the folder changed."""
    before = contents(run_dir)
    done = refuse_in_process(script, *TWO_EPOCHS, *flags, "--log_dir", run_dir.parent, "--run_name",
                             run_dir.name, "--resume", "auto")
    assert done.returncode == 2, done.stdout + done.stderr
    assert error_lines(done.stderr) == [done.stderr.strip()] and "Traceback" not in done.stderr
    assert contents(run_dir) == before
    return done.stderr


@pytest.mark.parametrize("script, flags", [(SINGLE, []), (DIST, ["--nproc_per_node", "2"]),
                                           (FSDP, ["--nproc_per_node", "2"])])
def test_a_stopped_run_without_its_checkpoint_is_never_started_afresh(stopped, script, flags):
    """It used to start again from step 0 silently and replace best.pt (nothing protected a
    run that had not finished). dist_parallel and fsdp refuse in their launcher, before any
    worker starts (or is restarted)."""
    said = refused_afresh(stopped, script, *flags)
    assert f"run folder {stopped} has no checkpoint.pt" in said
    assert "best.pt and TensorBoard curves to step 10 of an earlier run" in said
    assert (f"continue from best.pt (step 8) with --resume {stopped / 'best.pt'} in "
            "place of --resume auto" in said)
    assert "another --run_name" in said and "--overwrite in place of --resume auto" in said


def test_its_best_checkpoint_continues_it_as_the_refusal_says(stopped, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped, run_dir)
    done = train_in_process(SINGLE, *TWO_EPOCHS, "--log_dir", tmp_path, "--run_name", "run",
                            "--resume", run_dir / "best.pt")
    assert done.returncode == 0 and "resumed at step 8 " in done.stdout, done.stdout + done.stderr
    assert read_results(run_dir)["summary"]["steps"] == 16
    steps = [step for step, _ in read_scalars(run_dir)["train/loss"]]
    # the stopped attempt's curve to step 8, then this one's: never back
    assert steps == list(range(2, 17, 2))


def test_curves_alone_or_a_best_these_flags_cannot_resume_are_refused_too(stopped, tmp_path):
    curves_only = tmp_path / "curves"
    shutil.copytree(stopped, curves_only)
    (curves_only / "best.pt").unlink()
    said = refused_afresh(curves_only, SINGLE)
    assert ("has no checkpoint.pt to resume, but TensorBoard curves to "
            "step 10 of an earlier run" in said)
    assert "--resume " not in said.replace("--resume auto", "")  # nothing to continue from
    said = refused_afresh(stopped, SINGLE, "--seed", "7")  # best.pt was trained with --seed 0
    assert "best.pt and TensorBoard curves" in said and "continue from" not in said


ATTEMPT = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
           "TORCHELASTIC_RESTART_COUNT")


@pytest.mark.parametrize("first, now, afresh", [
    ({"TORCHELASTIC_RUN_ID": "r1"},
     {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "1"}, True),
    ({"SLURM_JOB_ID": "41"}, {"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "1"}, True),  # requeued
    ({"SLURM_JOB_ID": "41", "TORCHELASTIC_RUN_ID": "41", "TORCHELASTIC_RESTART_COUNT": "2"},
     {"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RUN_ID": "41"}, True),
    ({"TORCHELASTIC_RUN_ID": "r1"},
     {"TORCHELASTIC_RUN_ID": "r2", "TORCHELASTIC_RESTART_COUNT": "1"}, False),
    # run again by hand in the same allocation
    ({"SLURM_JOB_ID": "41"}, {"SLURM_JOB_ID": "41"}, False),
    ({"SLURM_JOB_ID": "41"}, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}, False),
    ({}, {}, False),  # by hand, twice
    # a run id given by hand (--rdzv_id exp1) to two launches: the
    # second's restart is not the first's
    ({"TORCHELASTIC_RUN_ID": "exp1", "agent": 100},
     {"TORCHELASTIC_RUN_ID": "exp1", "TORCHELASTIC_RESTART_COUNT": "1", "agent": 200}, False),
    ({}, {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "1"}, False),
])
def test_only_a_later_attempt_of_the_job_that_started_it_starts_afresh_again(tmp_path, monkeypatch,
                                                                             first, now, afresh):
    """An attempt that logged a window and died before its first checkpoint (kill -9, a node
    lost): the job's restart (torchrun --max-restarts, a SLURM requeue) starts afresh, as
    before; anything else is refused."""
    cfg = parse_config(Config,
                       [*TINY, "--log_dir", str(tmp_path), "--run_name", "run", "--resume", "auto"])

    # this process as a worker with `env` (its agent's pid as "agent")
    def attempt_of(env: dict) -> None:
        for name in ATTEMPT:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            if name == "agent":
                monkeypatch.setattr(os, "getppid", lambda pid=value: pid)
            else:
                monkeypatch.setenv(name, value)

    attempt_of(first)
    logger = RunLogger(tmp_path / "run", cfg, "single_gpu", world_size=1)
    logger.scalars(4, {"train/loss": 2.3})
    logger.close()
    attempt_of(now)
    if afresh:
        refuse_fresh_start(cfg, tmp_path / "run")
    else:
        with pytest.raises(UsageError, match="TensorBoard curves to step 4 of an earlier run"):
            refuse_fresh_start(cfg, tmp_path / "run")


def test_a_restart_after_a_resume_or_of_an_attempt_that_logged_nothing(tmp_path, monkeypatch):
    """A run resumed from a checkpoint has had one: its curves are refused to a fresh start
    even by its job's next attempt. An attempt that died before its first log window left
    only its config: nothing to keep."""
    cfg = parse_config(Config,
                       [*TINY, "--log_dir", str(tmp_path), "--run_name", "run", "--resume", "auto"])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    RunLogger(tmp_path / "run", cfg, "single_gpu", world_size=1).close()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    refuse_fresh_start(cfg, tmp_path / "run")  # config only
    # resumed at step 4
    logger = RunLogger(tmp_path / "run", cfg, "single_gpu", world_size=1, resumed_step=4)
    logger.scalars(6, {"train/loss": 2.3})
    logger.close()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with pytest.raises(UsageError, match="TensorBoard curves to step 6"):
        refuse_fresh_start(cfg, tmp_path / "run")
