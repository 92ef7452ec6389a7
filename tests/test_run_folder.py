"""One writer per run folder, whatever happens, run the way a user meets it (runkit.py's own
tests/test_runkit.py holds the run folder's functions on their own):

1. a run resumed from another run's checkpoint never writes into a third run's folder;
2. two runs started at the same moment with the same --run_name: one runs, the other is refused in
   one line, and the winner's files are whole; without a --run_name both run;
3. a folder in use by a live run (an orphan, a second `--resume auto`) is refused by the train file,
   and `--overwrite` cannot empty it either; the lock dies with its process, not with the
   DataLoader workers it forked;
4. a killed torchrun agent takes its workers with it (they would otherwise train on in the folder);
5. a disk that fills up stops the run in one line, the last checkpoint whole, no half file left;
6. `--resume auto` never starts afresh over an earlier run's work (best.pt) when its checkpoint.pt
   is gone: one line that says what to do, exit 2, nothing written, in every mode; the run's own
   best.pt continues it.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import runkit
from conftest import (REPO, TINY, free_port, read_results, read_scalars, refuse_in_process,
                      run_script, running, train_in_process)

SINGLE, DIST, FSDP = "single_gpu/train.py", "dist_parallel/train.py", "fsdp/train.py"


def launch(script: str, log_dir: Path, name: str | None, *flags) -> subprocess.Popen:
    named = [] if name is None else ["--run_name", name]
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, TINY), *map(str, flags),
                             "--log_dir", str(log_dir), *named], cwd=REPO, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# what setup() prints without CUDA, before a refusal made after it: test_bad_input.py's to judge
CPU_WARNING = "warning: no CUDA GPU found: running on the CPU"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def one_error_line(stderr: str) -> bool:
    """Whether stderr is one "error: " line (the CPU warning aside), with no traceback."""
    lines = [line for line in stderr.splitlines() if line != CPU_WARNING]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr


def contents(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.iterdir() if path.name != runkit.LOCK}


def as_a_worker(patch: pytest.MonkeyPatch) -> None:
    """This process as the one worker of a process group started by hand (what torchrun sets)."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR":
                        "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        patch.setenv(name, value)
    patch.delenv("TORCHELASTIC_RUN_ID", raising=False)


# ---------------------------------------------------------------------------------------- 1. resume
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run of 3 steps, in a folder whose names a shell would split: its run folder."""
    log_dir = tmp_path_factory.mktemp("its runs")
    done = train_in_process(SINGLE, *TINY, "--max_steps", "3", "--log_dir", log_dir,
                            "--run_name", "first run")
    assert done.returncode == 0, done.stdout + done.stderr
    return log_dir / "first run"


def test_resuming_another_runs_checkpoint_into_an_existing_run_folder_is_refused(trained,
                                                                                 tmp_path):
    """`--resume <A>/checkpoint.pt --run_name B` with B another run's folder: refused before
    anything is written (B's checkpoint and results used to be replaced, exit 0); the line says how
    to continue in the checkpoint's own folder, quoted as a shell takes it."""
    other = tmp_path / "B"
    other.mkdir()
    (other / runkit.MARKER).write_text("")
    for name in ("checkpoint.pt", "best.pt", "results.json"):
        (other / name).write_text(f"B's {name}")
    before = contents(other)
    done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "B", "--resume",
                             trained / "checkpoint.pt")
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_error_line(done.stderr), done.stderr
    assert f"run folder {other} exists already" in done.stderr
    words = shlex.split(done.stderr.split(", or ", 1)[1].split(" to continue")[0])
    assert words == ["--run_name", "first run", "--log_dir", str(trained.parent)], done.stderr
    assert contents(other) == before


# ---------------------------------------------------------------------------------------- 2. a race
def test_two_runs_started_at_once_with_one_name_leave_one_whole_run(tmp_path):
    """The folder is created exclusively: whichever comes second (at the existence check or at
    creation) is refused in one line, and the folder holds one run's files, whole."""
    runs = [launch(SINGLE, tmp_path, "same", "--max_steps", "3") for _ in range(2)]
    outcomes = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], outcomes
    _, _, refused = next(outcome for outcome in outcomes if outcome[0] == 2)
    assert len(error_lines(refused)) == 1 and "run folder" in refused, refused
    assert read_results(tmp_path / "same")["summary"]["step"] == 3
    checkpoint = torch.load(tmp_path / "same" / "checkpoint.pt", weights_only=True)
    assert checkpoint["progress"]["step"] == 3
    assert not list((tmp_path / "same").glob(".*.tmp"))


def test_two_runs_started_at_once_without_a_name_both_run(tmp_path):
    """Without --run_name the name is the mode, the date, the time to the second and the process:
    two runs started in the same second each get a folder of their own and finish."""
    runs = [launch(SINGLE, tmp_path, None, "--max_steps", "1") for _ in range(2)]
    outcomes = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    folders = sorted(path.name for path in tmp_path.iterdir())
    assert len(folders) == 2 and all(read_results(tmp_path / name)["summary"]["step"] == 1
                                     for name in folders)
    assert {name.rsplit("-", 1)[1] for name in folders} == {str(run.pid) for run in runs}


def test_a_folder_made_between_the_check_and_the_claim_is_refused(tmp_path, monkeypatch):
    """The race's other side: another run made the folder after this one looked for it."""
    folder = tmp_path / "new"
    folder.mkdir()
    for name in ("exists", "is_dir"):  # what this run saw when it looked
        real = getattr(Path, name)
        monkeypatch.setattr(Path, name, lambda path, real=real: path != folder and real(path))
    with pytest.raises(runkit.UsageError, match="made by another run a moment ago"):
        runkit.claim_run_folder(folder, None, False)


# -------------------------------------------------------------------------------------- 3. the lock
# A live run's lock, taken the train files' way, with a DataLoader worker forked after it: prints
# its pid and the worker's, then waits to be killed.
HOLDER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import runkit
runkit.claim_run_folder(Path(sys.argv[2]), "auto", False)
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), worker, flush=True)
time.sleep(60)
"""


def test_a_folder_in_use_is_refused_and_the_lock_dies_with_its_process(tmp_path):
    """While a live process holds the run folder, `--resume auto` and `--overwrite` are refused
    in one line naming the holder's pid, and nothing in the folder changes. Killed (SIGKILL, the
    OOM killer), the holder's lock goes with it, though the DataLoader worker it forked lives on
    (torch's watchdog gives it a few seconds): a restart right away claims the folder, and
    --overwrite empties it."""
    run_dir = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO), str(run_dir)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    holder_pid, worker_pid = map(int, holder.stdout.readline().split())
    try:
        (run_dir / "events.out.tfevents.1").write_text("{}")  # a live run's first file
        for flags in (["--resume", "auto"], ["--overwrite"]):
            done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "busy",
                                     *flags)
            assert done.returncode == 2, done.stderr
            assert one_error_line(done.stderr), done.stderr
            assert ("in use by a run still running" in done.stderr
                    and f"pid {holder_pid}" in done.stderr)
            assert (run_dir / "events.out.tfevents.1").read_text() == "{}"
        holder.kill()
        holder.wait()
        assert running(worker_pid)  # the forked worker outlives its process for a while
        runkit.claim_run_folder(run_dir, None, True)
        runkit._held.pop().close()
    finally:
        holder.kill()
        os.kill(worker_pid, signal.SIGKILL)
    assert sorted(path.name for path in run_dir.iterdir()) == sorted([runkit.LOCK, runkit.MARKER])


# --------------------------------------------------------------------------------------- 4. orphans
def test_a_killed_agent_takes_its_workers_with_it(tmp_path):
    """`kill -9` of the self-launch (torch's elastic agent, in this process): each worker sits in a
    session of its own, so nothing reaches it and it would train on as an orphan. The
    parent-death signal ends it."""
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


# ------------------------------------------------------------------------------------- 5. full disk
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmpfs):
    """The disk fills while the run writes best.pt, a copy of the checkpoint, at the end of the
    first epoch: one line naming that file and the cause, exit 1, no traceback, no half-written
    best.pt nor temporary file left, and the checkpoint written before it whole."""
    small_disk = tmpfs("size=320k")  # room for one checkpoint of TINY's model, not for a copy
    done = run_script(SINGLE, *TINY, "--epochs", "2", "--log_dir", small_disk, "--run_name",
                      "full")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0], done.stderr
    run_dir = small_disk / "full"
    assert str(run_dir / "best.pt") in errors[0], errors
    assert not list(run_dir.glob(".*.tmp")) and not (run_dir / "best.pt").exists()
    # the first epoch's, whole
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["step"] == 8


# -------------------------------------------------------------------------------- 6. no fresh start
TWO_EPOCHS = [*TINY, "--epochs", "2", "--log_interval", "2"]  # 8 steps an epoch


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


@pytest.mark.parametrize("script", [SINGLE, DIST, FSDP])
def test_a_stopped_run_without_its_checkpoint_is_never_started_afresh(stopped, script):
    """It used to start again from step 0 silently and replace best.pt. dist_parallel and fsdp: a
    worker of a group (rank 0 reads, its refusal ends every rank)."""
    before = contents(stopped)
    with pytest.MonkeyPatch.context() as patch:
        if script != SINGLE:
            as_a_worker(patch)
        done = refuse_in_process(script, *TWO_EPOCHS, "--log_dir", stopped.parent, "--run_name",
                                 stopped.name, "--resume", "auto")
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_error_line(done.stderr), done.stderr
    assert f"{stopped} has no checkpoint.pt but an earlier run's ['best.pt']" in done.stderr
    assert "another --run_name" in done.stderr and "--overwrite" in done.stderr
    assert contents(stopped) == before


def test_its_best_checkpoint_continues_it(stopped, tmp_path):
    """--resume <its folder>/best.pt: from step 8 on, in its own folder; TensorBoard's curve of
    the stopped attempt to step 8, then this one's, never back."""
    run_dir = tmp_path / "run"
    shutil.copytree(stopped, run_dir)
    done = train_in_process(SINGLE, *TWO_EPOCHS, "--log_dir", tmp_path, "--run_name", "run",
                            "--resume", run_dir / "best.pt")
    assert done.returncode == 0 and "resumed at step 8 " in done.stdout, done.stdout + done.stderr
    assert read_results(run_dir)["summary"]["step"] == 16
    assert [step for step, _ in read_scalars(run_dir)["train/loss"]] == list(range(2, 17, 2))
