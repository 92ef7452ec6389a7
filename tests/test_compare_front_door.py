"""compare.py loses none of a user's work, whatever ends it and wherever --out is:

1. SIGTERM (a `timeout`, a scheduler, `kill`) stops compare.py as Ctrl-C does: the run under way is
   told to stop, the report marks it interrupted (with its log) and the runs never started as not
   run, the exit status is 128 + the signal, and no process of the run is left. A kill -9 of
   compare.py takes its runs with it, torchrun's agent and workers too (Linux's parent-death signal,
   armed in each run before it starts).
3. Runs that end before a step is timed (no more steps than --warmup_steps): the progress line and
   the report's row say so, no traceback.
4. --verify refuses in one line what it cannot check (no halfway point, no check left by --modes),
   stops one epoch at its real halfway point, and a bad OMP_NUM_THREADS gives each run one
   thread.
5. An --out that cannot be written (under a file, through a symbolic link loop, on a read-only or
   full file system) is refused in one line before any run starts.
2 (--overwrite) and 5 with a disk that fills during the runs: tests/test_compare.py, beside the
comparison they reuse.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compare
from comparison import matrix, train_files
from comparison.runner import Stopped, stop_signals
from comparison.verify import Verification
from conftest import REPO, running

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

# A --benchmark run that would train for minutes: every test here stops it long before its end.
LONG = ["--benchmark_steps", "100000"]


def start_compare(out: Path, *flags) -> subprocess.Popen:
    """`python compare.py --out OUT flags...` in the background, as a user starts it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(REPO / "compare.py"), "--out", str(out), *map(str, flags)]
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def training(log: Path) -> bool:
    """Whether the run that writes this log has ended a log window: it is past its start-up."""
    return log.is_file() and "Epoch 1/" in log.read_text(errors="replace")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie has ended: it only waits to be reaped)."""
    return [pid for pid in pids if running(pid)]


def end_all(process: subprocess.Popen, pids: list[int]) -> None:
    """Whatever a failed test left running is killed, so that no orphan trains on."""
    for pid in alive(pids):
        os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
        process.communicate()


# ------------------------------------------------------------------------------------- 1. signals
def test_sigterm_stops_the_run_and_the_report_marks_it_interrupted(tmp_path):
    out = tmp_path / "out"
    log = out / "logs" / "01-single_gpu-1cpu-r1.log"
    compare_py = start_compare(out, "--modes", "single_gpu", "data_parallel", *LONG)
    run_pids = []
    try:
        wait_for(lambda: training(log), 60, "the first run to train")
        run_pids = descendants(compare_py.pid)
        assert run_pids, "the run is compare.py's child"
        compare_py.send_signal(signal.SIGTERM)
        output, _ = compare_py.communicate(timeout=90)
        assert compare_py.returncode == 128 + signal.SIGTERM, output
        wait_for(lambda: not alive(run_pids), 10, "the run's processes to end")
    finally:
        end_all(compare_py, run_pids)
    assert "Traceback" not in output, output
    assert "wrote report.md" in output and "interrupted by SIGTERM" in output, output
    report = (out / "report.md").read_text()
    assert "`01-single_gpu-1cpu-r1`: interrupted after" in report
    assert "(log: `logs/01-single_gpu-1cpu-r1.log`)" in report
    assert "`02-data_parallel-1cpu-r1`: not run — compare.py was stopped by SIGTERM" in report
    assert "stopped by SIGTERM at step" in log.read_text()  # told to stop, not killed
    rows = (out / "results.csv").read_text().splitlines()[1:]
    assert [row.split(",")[8] for row in rows] == ["interrupted", "not run"]


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1])
def test_sighup_and_sigusr1_stop_compare_as_sigterm_does(signum):
    """A closed terminal (SIGHUP) or SLURM's warning before a time limit (SIGUSR1, which a train
    script takes as a stop): each raises what SIGTERM and Ctrl-C raise (the path tested above)."""
    before = signal.getsignal(signum)
    with pytest.raises(Stopped) as stopped, stop_signals():
        signal.raise_signal(signum)  # handled before it returns
    assert stopped.value.signum == signum
    assert signal.getsignal(signum) == before  # given back as compare.main ends


def test_kill_9_of_compare_takes_torchrun_and_its_workers_with_it(tmp_path):
    out = tmp_path / "out"
    log = out / "logs" / "01-dist_parallel-2cpu-gloo-r1.log"
    compare_py = start_compare(out, "--modes", "dist_parallel", *LONG)
    run_pids = []
    try:
        wait_for(lambda: training(log), 90, "the workers to train")
        run_pids = descendants(compare_py.pid)
        assert len(run_pids) >= 3, "torchrun's agent and its two workers"
        compare_py.kill()
        compare_py.wait()
        wait_for(lambda: not alive(run_pids), 20, "the agent and workers to die with compare.py")
    finally:
        end_all(compare_py, run_pids)


# ---------------------------------------------------------------------------- 3. no timed steps
def test_a_run_without_timed_steps_is_reported_as_such(tmp_path, capsys):
    """One epoch of 64 images at batch 32: 2 steps, both warm-up steps (3 on the CPU by default),
    so nothing is timed. The progress line and the report's row say so; exit 0 (the run
    succeeded)."""
    out = tmp_path / "out"
    code = compare.main(["--out", str(out), "--modes", "single_gpu", "--epochs", "1",
                         "--dataset", "synthetic", "--synthetic_size", "64"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    assert "ok, no timed steps" in printed.out and "Traceback" not in printed.err
    report = (out / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| single_gpu |"))
    assert row.endswith("| 1 ok, no timed steps |"), row
    assert "*no timed steps*:" in report and "fewer `--warmup_steps`" in report


# ------------------------------------------------------------------------------------ 4. --verify
@pytest.mark.parametrize("argv, message", [
    (["--modes", "single_gpu"], "--verify --modes single_gpu leaves no check to run"),
    (["--modes", "data_parallel"], "--verify --modes data_parallel leaves no check to run"),
    (["--epochs", "1", "--synthetic_size", "40"], "is 1 step: it has no halfway point"),
])
def test_a_verification_with_nothing_to_check_is_refused(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        compare.main(["--verify", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_one_epoch_is_stopped_at_its_real_halfway_point(tmp_path):
    """--epochs 1: 266 images over 2 processes of 16 images each is 8 steps, not --max_steps' 24:
    the first half stops at step 4, and check 5 looks for the resume there."""
    configured = compare.configure(["--verify", "--epochs", "1", "--modes", "dist_parallel"])
    verification = Verification(*configured, tmp_path)
    first_half = verification.argv(verification.settings[0].groups["dist_parallel"].first_half)
    assert first_half[1] == str(REPO / "dist_parallel" / "train.py")  # python, the script, flags
    assert train_files.parse("dist_parallel", first_half[2:]).max_steps == 4  # as the run reads it
    assert "stopped at step 4 and resumed" in verification.check_5("dist_parallel")


@pytest.mark.parametrize("threads, given", [("0", "1"), ("-2", "1"), ("two", "1"), ("3", "3")])
def test_a_bad_omp_num_threads_gives_each_run_one_thread(threads, given, tmp_path, monkeypatch):
    """torch ignores an OMP_NUM_THREADS that is not a positive whole number (libgomp warns) and
    takes every core. compare.py gives its runs one thread each then, as where it is unset, so
    that a process still stands in for a GPU; a whole number is kept."""
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    configured = compare.configure(["--verify", "--modes", "dist_parallel", "--max_steps", "2"])
    verification = Verification(*configured, tmp_path)
    trained = verification.settings[0].groups["dist_parallel"].trained
    assert matrix.run_environment(trained.run, cuda=False)["OMP_NUM_THREADS"] == given


# --------------------------------------------------------------------------------------- 5. --out
def refused_out(out: Path, capsys) -> str:
    """compare.main with this --out: refused before any run, in one line."""
    with pytest.raises(SystemExit) as exit_:
        compare.main(["--out", str(out), "--modes", "single_gpu"])
    err = capsys.readouterr().err
    assert exit_.value.code != 0 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: cannot write --out {out}"), err
    return err


def test_an_out_under_a_file_or_through_a_symlink_loop_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert "Not a directory" in refused_out(tmp_path / "file" / "out", capsys)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert "Too many levels of symbolic links" in refused_out(tmp_path / "loop" / "out", capsys)


def test_a_read_only_or_full_out_is_refused_before_any_run(tmpfs, capsys):
    read_only = tmpfs("size=1m,ro")
    assert "Read-only file system" in refused_out(read_only / "out", capsys)
    full = tmpfs("size=64k")
    (full / "filler").write_bytes(b"\0" * 64 * 1024)
    assert "No space left on device" in refused_out(full / "out", capsys)
    assert not (full / "out").exists()  # nothing half made left behind
