"""One writer per run folder, whatever happens, on the CPU:

1. a run resumed from another run's checkpoint never writes into a third run's folder;
2. two runs started at the same moment with the same --run_name: one runs, the other is refused in one line, and
   the winner's files are whole;
3. a folder in use by a live run (an orphan, a second `--resume auto`) is refused, and `--overwrite` cannot empty
   it either; the lock dies with its process, not with the DataLoader workers it forked;
4. a killed torchrun agent takes its workers with it (they would otherwise train on in the folder);
5. temporary files have names of their own, so two writers never rename each other's half-written file, and the
   next writer of the folder removes those a killed writer left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.config import Config, UsageError
from common.logger import LOCK, MARKER, claim_run_dir, write_atomically
from conftest import REPO, TINY, read_results, refuse_in_process, run_script

SINGLE, DIST = "single_gpu/train.py", "dist_parallel/train.py"


def launch(script: str, log_dir: Path, name: str, *flags) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, TINY), *map(str, flags), "--log_dir",
                             str(log_dir), "--run_name", name], cwd=REPO, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def finished_run(log_dir: Path, name: str) -> Path:
    """A run folder as a finished run leaves it, without training one: files whose bytes must not change."""
    run_dir = log_dir / name
    run_dir.mkdir(parents=True)
    for file in ("checkpoint.pt", "best.pt", "results.json"):
        (run_dir / file).write_bytes(f"{name}'s {file}".encode())
    return run_dir


def contents(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run_dir.iterdir() if path.name != LOCK}


# ---------------------------------------------------------------------------------------------------- 1. resume
def test_resuming_another_runs_checkpoint_into_an_existing_run_folder_is_refused(tmp_path):
    """`--resume runs/A/checkpoint.pt --run_name B` with B a finished, unrelated run: refused before anything is
    read or written (B used to be overwritten, exit 0)."""
    finished_run(tmp_path, "A")
    b = finished_run(tmp_path, "B")
    before = contents(b)
    done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "B", "--resume",
                             tmp_path / "A" / "checkpoint.pt")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [done.stderr.strip()]
    assert "belongs to another run" in done.stderr and "--run_name A" in done.stderr
    assert contents(b) == before


# ---------------------------------------------------------------------------------------------------- 2. a race
def test_two_runs_started_at_once_with_one_name_leave_one_whole_run(tmp_path):
    """Both used to exit 0 and say "results in ...", one run's checkpoint and results silently lost. Now the
    folder is created exclusively: whichever comes second (at the existence check or at creation) is refused in
    one line, and the folder holds one run's files, whole."""
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
    """Without --run_name the name is the mode, the date, the time to the second and the process: two runs
    started in the same second (one used to be refused, told to choose a name it never chose) each get a
    folder of their own and finish."""
    command = [sys.executable, str(REPO / SINGLE), *map(str, TINY), "--max_steps", "1", "--log_dir", str(tmp_path)]
    runs = [subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    outcomes = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    folders = sorted(path.name for path in tmp_path.iterdir())
    assert len(folders) == 2 and all(read_results(tmp_path / name)["summary"]["steps"] == 1 for name in folders)
    assert {name.rsplit("-", 1)[1] for name in folders} == {str(run.pid) for run in runs}


# ---------------------------------------------------------------------------------------------------- 3. the lock
# A live run's lock, taken the product's way, with a DataLoader worker forked after it: prints its pid and the
# worker's, then waits to be killed.
HOLDER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from common.config import Config
from common.logger import claim_run_dir
lock = claim_run_dir(__import__("pathlib").Path(sys.argv[2]), Config(resume="auto", run_name="busy"))
worker = os.fork()
if worker == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), worker, flush=True)
time.sleep(60)
"""


def test_a_folder_in_use_is_refused_and_the_lock_dies_with_its_process(tmp_path):
    """While a live process holds the run folder, `--resume auto` and `--overwrite` are refused in one line naming
    the holder's pid, and nothing in the folder changes. Killed (SIGKILL, the OOM killer), the holder's lock goes
    with it, though the DataLoader worker it forked lives on a few seconds more (torch's watchdog): a restart right
    away claims the folder, and --overwrite empties it."""
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    (run_dir / "events.out.tfevents.1").write_text("{}")  # a live run's first file
    (run_dir / MARKER).write_text("")  # a run's folder, which --overwrite may empty once nobody uses it
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO), str(run_dir)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    holder_pid, worker_pid = map(int, holder.stdout.readline().split())
    try:
        for flags in (["--resume", "auto"], ["--overwrite"]):
            done = refuse_in_process(SINGLE, *TINY, "--log_dir", tmp_path, "--run_name", "busy", *flags)
            assert done.returncode == 2, done.stderr
            assert error_lines(done.stderr) == [done.stderr.strip()]
            assert "in use by a run that is still running" in done.stderr and f"pid {holder_pid}" in done.stderr
            assert (run_dir / "events.out.tfevents.1").read_text() == "{}"
        holder.kill()
        holder.wait()
        assert _alive(worker_pid)  # the forked worker outlives its process for a while
        claim_run_dir(run_dir, Config(log_dir=str(tmp_path), run_name="busy", overwrite=True)).close()
    finally:
        holder.kill()
        os.kill(worker_pid, signal.SIGKILL)
    assert sorted(path.name for path in run_dir.iterdir()) == [LOCK, MARKER]  # emptied: lock and mark aside


def test_a_new_run_does_not_take_a_folder_created_a_moment_ago(tmp_path):
    run_dir = tmp_path / "new"
    first = claim_run_dir(run_dir, Config(log_dir=str(tmp_path), run_name="new"))
    try:
        with pytest.raises(UsageError, match="created by another run a moment ago"):
            claim_run_dir(run_dir, Config(log_dir=str(tmp_path), run_name="new"))
    finally:
        first.close()


# ---------------------------------------------------------------------------------------------------- 4. orphans
def test_a_killed_agent_takes_its_workers_with_it(tmp_path):
    """`kill -9` of the self-launch (torch's elastic agent, in this process): each worker sits in a session of its
    own, so nothing used to reach it and it trained on as an orphan. The parent-death signal ends it."""
    agent = launch(DIST, tmp_path, "orphans", "--nproc_per_node", "1", "--epochs", "50", "--log_interval", "1")
    for line in agent.stdout:
        if line.startswith("Epoch 1/"):
            break
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True,
                                                  text=True).stdout.split()]
    assert len(workers) == 1
    agent.kill()
    agent.communicate()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.05)
    alive = [pid for pid in workers if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "the workers outlived their launcher"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------- 5. temp files
def test_temporary_files_are_each_writers_own(tmp_path, monkeypatch):
    """Two writers of one file each write their own temporary file: the name carries the pid and a random part."""
    names = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: (names.append(Path(source).name),
                                                               real_replace(source, target)))
    for _ in range(2):
        write_atomically(tmp_path / "checkpoint.pt", lambda f: f.write(b"x"))
    assert len(set(names)) == 2 and all(str(os.getpid()) in name for name in names), names
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.pt"]
    (tmp_path / ".checkpoint.pt.12345.0badc0de.tmp").write_bytes(b"half a checkpoint")  # its writer was killed
    claim_run_dir(tmp_path, Config(log_dir=str(tmp_path.parent), run_name=tmp_path.name, resume="auto")).close()
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK, MARKER, "checkpoint.pt"]


# ---------------------------------------------------------------------------------------------------- 6. full disk
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmpfs):
    """The disk fills while the run writes its files (best.pt, a copy of the checkpoint, at the end of the first
    epoch): one line naming the file and the cause, exit 1, no traceback, no temporary file left, and the
    checkpoint written before it is whole (it used to end in a traceback from deep inside shutil)."""
    small_disk = tmpfs("size=320k")  # room for one checkpoint of TINY's model, not for a second file of it
    done = run_script(SINGLE, *TINY, "--epochs", "2", "--no_progress", "--log_dir", small_disk, "--run_name", "full",
                      env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "No space left on device" in errors[0], done.stderr
    assert str(small_disk / "full") in errors[0]
    run_dir = small_disk / "full"
    assert not list(run_dir.glob(".*.tmp"))
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"] == 8  # the first epoch's, whole
