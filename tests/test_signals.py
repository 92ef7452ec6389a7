"""Every stop signal, in every mode, ends a run the same way: at a point every rank agrees on, with
one line, the documented exit status (128 + the signal) and, when training, a checkpoint; and a
launcher that says in one line what happened to its workers.

1. --evaluate stops between two batches on SIGTERM or a first Ctrl-C (it used to evaluate to
   its end and exit 0): single_gpu and data_parallel in this process, dist_parallel and fsdp
   as two processes started by hand, the signal sent to rank 1 alone: every rank stops at the
   same batch, none waits for another;
2. SIGHUP (the terminal closed) and SIGUSR1 (SLURM's warning before a time limit) stop a
   run as SIGTERM does (they used to kill it, with no checkpoint): single_gpu on a terminal
   that hangs up, its DataLoader workers in the terminal's process group; the self-launch
   passing SIGUSR1 on to its workers;
3. a SIGTERM to one rank of two stops both with its exit status, and the self-launch's account of
   it is one clean stop (it used to say that another rank was signalled and that the workers
   failed); the self-launch's usage error exits 2 whatever torch's agent did to the other workers;
   a worker killed by a signal (TORCH_DISTRIBUTED_DEBUG=DETAIL makes DDP's constructor die of
   SIGSEGV on torch 2.14.1) is named with its signal; a stop before training began says so; its
   workers get 90 s to stop cleanly;
4. a stop at an epoch's last log window, where no step is left to train, keeps everything (it
   used to lose the epoch's evaluation, and at the run's end its results.json for good): the run
   checkpoints and exits 128 + the signal, saying what is owed, and the command it prints
   evaluates the epoch first, best.pt and results.json (the speed of the attempt that trained)
   then written as an unstopped run writes them; single_gpu as the issue ran it (--max_steps),
   single_gpu and data_parallel at an epoch's end, dist_parallel and fsdp on two processes;
5. an evaluation stopped by a signal suggests a command that evaluates (the same one with
   --overwrite), and the same command as it was is refused with a line that offers it.
"""
from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

from common.checkpoint import LAST, STOPPED, TRAINING, StopSignals, tell_self_launch, until_stopped
from common.launcher import failure_line, stop_line, tell_self_launch_stopped
from conftest import (REPO, TINY, free_port, read_results, refuse_in_process, run_script,
                      train_in_process)
from test_reliability import read_until, session_alive, start, wait_for

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# A test set of 512 synthetic images, global batch 32: 16 evaluation
# batches, on each rank of two as well.
EVALUATE = [*TINY, "--synthetic_size", "2560", "--no_progress"]
LONGER = [*TINY, "--synthetic_size", "512", "--epochs", "2", "--no_progress", "--log_interval", "2"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A model.pt of TINY's model, for --evaluate."""
    path = tmp_path_factory.mktemp("weights") / "model.pt"
    torch.manual_seed(0)
    from models import pyramidnet

    torch.save(pyramidnet(8, 12).state_dict(), path)
    return path


# ------------------------------------------------------------------------------------ 1. --evaluate
@pytest.mark.parametrize("script, name",
                         [("single_gpu/train.py", "SIGTERM"), ("data_parallel/train.py", "SIGINT")])
def test_evaluate_stops_between_two_batches(script, name, weights, tmp_path, monkeypatch, capsys):
    """The signal arrives during the second batch (sent by this process to itself, the run's
    handler installed): the evaluation stops before the third, with one line and 128 + the
    signal; no results are written."""
    import importlib

    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    real = module.evaluation_sums
    batches = []

    def signalled_at_the_second_batch(model, loader, device):
        def counted():
            for batch in loader:
                batches.append(1)
                if len(batches) == 2:
                    signal.raise_signal(getattr(signal, name))
                yield batch
        return real(model, counted(), device)

    monkeypatch.setattr(module, "evaluation_sums", signalled_at_the_second_batch)
    done = refuse_in_process(script, *EVALUATE, "--evaluate", weights, "--log_dir", tmp_path,
                             "--run_name", "ev")
    assert done.returncode == StopSignals.EXIT_CODES[name], done.stdout + done.stderr
    assert (f"stopped by {name} during the evaluation, after 2 of 16 "
            "batches: no results written" in done.stdout)
    assert len(batches) == 2 and "error" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "ev" / "results.json").exists()


def test_until_stopped_leaves_an_epoch_evaluation_alone():
    """Without signals (an epoch's evaluation, which its checkpoint
    follows) the loader is the loader."""
    loader = [1, 2, 3]
    assert until_stopped(loader, None) is loader


def by_hand(script: str, flags: list, tmp_path: Path, fault: dict, timeout: float = 120) -> list:
    """Two ranks of `script` started by hand (no launcher to clean up after them)
    under tests/fault_injection.py with `fault`'s variables; their (exit status,
    stdout, stderr), within `timeout`."""
    port = free_port()
    processes = []
    for rank in range(2):
        env = {**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1", "RANK": str(rank),
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **fault}
        processes.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fault_injection.py"), script, *map(str, flags),
             "--log_dir", str(tmp_path), "--run_name", "by_hand"], cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [process.communicate(timeout=timeout) for process in processes]
    return [(process.returncode, *output) for process, output in zip(processes, outputs)]


@pytest.mark.parametrize("script", ["dist_parallel/train.py", "fsdp/train.py"])
def test_evaluate_in_a_group_stops_every_rank_at_the_same_batch(script, weights, tmp_path):
    """SIGTERM to rank 1 alone during its third batch: the ranks vote before each batch, so
    both stop before the fourth and exit 143 together (fsdp's forward passes gather weights
    from every rank: a rank that went on alone would wait for the other until
    --dist_timeout); rank 0 says it once."""
    started = time.monotonic()
    ranks = by_hand(script, [*EVALUATE, "--evaluate", weights], tmp_path,
                    {"FAULT_RANK": "1", "FAULT_STEP": "3", "FAULT_SIGNAL": "SIGTERM"})
    assert time.monotonic() - started < 100
    assert [code for code, _, _ in ranks] == [143, 143], ranks
    said = [line for line in ranks[0][1].splitlines() if line.startswith("stopped by")]
    assert said == ["stopped by SIGTERM during the evaluation, after 3 of 16 batches: no results "
                    "written; to evaluate, run the same command with --overwrite"], ranks[0]
    assert "stopped" not in ranks[1][1] and "Traceback" not in ranks[0][2] + ranks[1][2]
    assert not (tmp_path / "by_hand" / "results.json").exists()


# ------------------------------------------------------------------------------- 2. SIGHUP, SIGUSR1
def test_a_closed_terminal_stops_single_gpu_with_a_checkpoint(tmp_path):
    """single_gpu on a terminal (a pseudo-terminal, its controlling one), the torchvision loader's
    workers in the terminal's process group: the terminal closes, the kernel sends SIGHUP to them
    all; the workers carry on, the run writes its stop checkpoint at the next log window, its
    lines (to a terminal that is gone) cannot make it fail, and it exits 128 + 1 (it used to die
    of SIGHUP, with no checkpoint)."""
    main, terminal = pty.openpty()

    def controlled_by_the_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    run = subprocess.Popen([sys.executable, str(REPO / "single_gpu/train.py"), *LONGER, "--loader",
                            "torchvision", "--num_workers", "2", "--log_dir", str(tmp_path),
                            "--run_name", "hup"],
                           cwd=REPO, env={**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1"},
                           stdin=terminal, stdout=terminal, stderr=terminal,
                           preexec_fn=controlled_by_the_terminal)
    os.close(terminal)
    seen = b""
    try:
        while b"[4/16]" not in seen:
            seen += os.read(main, 4096)  # OSError (EIO) if the run ended before it
    finally:
        # the terminal closes: the kernel hangs it up (writing to it fails with EIO)...
        os.close(main)
    os.killpg(run.pid, signal.SIGHUP)  # ...and the shell passes SIGHUP on to its foreground job
    assert run.wait(timeout=120) == 128 + signal.SIGHUP, seen.decode()
    state = torch.load(tmp_path / "hup" / LAST, weights_only=True)
    # at a log window, where the run stopped
    assert 4 <= state["step"] < 32 and state["step"] % 2 == 0
    wait_for(lambda: not session_alive(run.pid), 10, "the DataLoader workers to exit")


def test_sigusr1_to_the_self_launch_stops_every_worker_with_a_checkpoint(tmp_path):
    """SLURM's `--signal=USR1@T` warning, or `kill -USR1`, to `python dist_parallel/train.py`:
    torch's agent passes it on (it used to die of it, its workers with it), every rank stops at the
    next log window, rank 0 writes the checkpoint, and the self-launch exits 128 + 10."""
    launch = start(["dist_parallel/train.py", *LONGER, "--nproc_per_node", "2"], tmp_path, "usr1")
    before = read_until(launch, "Epoch 1/2 [4/16]")
    os.kill(launch.pid, signal.SIGUSR1)  # the launcher alone
    output = before + launch.communicate(timeout=120)[0]
    assert launch.returncode == 128 + signal.SIGUSR1, output
    assert "stopped by SIGUSR1: the workers stopped cleanly (step" in output, output
    assert 4 <= torch.load(tmp_path / "usr1" / LAST, weights_only=True)["step"] < 32


def test_the_stop_signals_and_their_exit_statuses():
    assert StopSignals.EXIT_CODES == {"SIGTERM": 143, "SIGINT": 130, "SIGHUP": 129, "SIGUSR1": 138}
    names = list(StopSignals.NAMES.values())
    one_hot = {name: [float(other == name) for other in names] for name in names}
    assert StopSignals.agreed([0, 0, 0, 0]) is None
    # a signal to one rank names the stop on all
    assert StopSignals.agreed(one_hot["SIGHUP"]) == "SIGHUP"
    assert StopSignals.agreed([1, 2, 0, 0]) == "SIGINT"  # the signal most ranks received


# ----------------------------------------------------------------------------------- 3. the account
def test_a_sigterm_to_one_rank_stops_every_rank_with_its_status(tmp_path):
    """SIGTERM to rank 1 alone, at its third step: both ranks stop at the next log window
    (step 4) and exit 143 (rank 0 used to exit 1 and say "stopped by a signal to another
    rank"); rank 0 writes the checkpoint."""
    ranks = by_hand("dist_parallel/train.py", [*TINY, "--no_progress"], tmp_path,
                    {"FAULT_RANK": "1", "FAULT_STEP": "3", "FAULT_SIGNAL": "SIGTERM"})
    assert [code for code, _, _ in ranks] == [143, 143], ranks
    assert f"stopped by SIGTERM at step 4; checkpoint {tmp_path / 'by_hand' / LAST}" in \
        ranks[0][1], ranks[0]
    assert torch.load(tmp_path / "by_hand" / LAST, weights_only=True)["step"] == 4


def test_a_stop_that_reached_one_worker_is_one_clean_stop(tmp_path):
    """The self-launch's account of the run above: the signalled worker exited 143, and rank 0,
    having reported its checkpoint, was ended by torch's agent in its teardown (-15), or exited 143
    too: one clean stop (it used to add "error: worker 1, 0 failed (exit code -15, 143)")."""
    (tmp_path / STOPPED).write_text("step 4, checkpoint X\ncontinue with --resume auto\n")
    clean = ("stopped by SIGTERM: the workers stopped cleanly (step 4, checkpoint X); "
             "continue with --resume auto", 143)
    assert failure_line({0: -signal.SIGTERM, 1: 143}, tmp_path) == clean
    assert failure_line({0: 143, 1: 143}, tmp_path) == clean


def test_a_usage_error_exits_2_whatever_the_agent_did_to_the_others(tmp_path):
    """Rank 0 refused the launch (exit 2) and torch's agent ended rank 1 with SIGTERM (-15): the
    self-launch exited 241 (256 - 15), where every usage error exits 2."""
    line, code = failure_line({0: 2, 1: -signal.SIGTERM}, tmp_path)
    assert code == 2 and line == "error: worker 0 failed (exit status 2); its message is above"


def test_a_worker_killed_by_a_signal_is_named_with_it(tmp_path, monkeypatch):
    """Both workers died of SIGSEGV, with nothing printed (TORCH_DISTRIBUTED_DEBUG=DETAIL in DDP's
    constructor on torch 2.14.1): the line names the signal, not a message "above" that is not
    there, and the exit status is 128 + 11 (it was 245: 256 - 11)."""
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    line, code = failure_line({0: -signal.SIGSEGV, 1: -signal.SIGSEGV}, tmp_path)
    assert code == 139
    assert line == \
        "error: workers 0, 1 were killed by SIGSEGV (signal 11), with no message of their own"
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL is set" in \
        failure_line({0: -signal.SIGSEGV}, tmp_path)[0]
    # one worker killed (out of memory, say), the other failing on the broken group: both said
    line, code = failure_line({0: 1, 1: -signal.SIGKILL}, tmp_path)
    assert code == 1
    assert line == ("error: worker 0 failed (exit status 1); its message is above; worker 1 was "
                    "killed by SIGKILL (signal 9)")


def test_a_stop_before_training_began_says_so(tmp_path):
    """A SIGTERM to the self-launch while its workers were still starting: no stop checkpoint, and
    none needed; the line used to speak of output above and a checkpoint that did not exist."""
    run_dir = tmp_path / "run"
    line, code = stop_line(signal.SIGTERM, tmp_path, run_dir)
    assert code == 143
    assert line == ("stopped by SIGTERM before training began (the workers were starting); nothing "
                    "to resume: run the command again")
    # rank 0 had claimed it: the same --run_name starts afresh in it with --resume auto
    run_dir.mkdir()
    assert stop_line(signal.SIGTERM, tmp_path, run_dir)[0].endswith(
        f"nothing to resume: run the command again, with --resume auto ({run_dir} exists)")
    # a resumed run stopped as it started: its checkpoint is as it was
    (run_dir / LAST).write_bytes(b"")
    assert f"its last checkpoint {run_dir / LAST} is as it was" in \
        stop_line(signal.SIGTERM, tmp_path, run_dir)[0]
    # rank 0 was training: no stop reported
    (tmp_path / TRAINING).write_text("listening for signals\n")
    line, code = stop_line(signal.SIGTERM, tmp_path, run_dir)
    assert code == 1 and line.startswith("error: stopped by SIGTERM, but the "
                                         "workers did not stop cleanly")
    (tmp_path / STOPPED).write_text("step 8, checkpoint X\ncontinue with --resume auto\n")
    assert stop_line(signal.SIGTERM, tmp_path, run_dir) == (
        "stopped by SIGTERM: the workers stopped cleanly (step 8, checkpoint X); "
        "continue with --resume auto", 143)


def test_rank_0_tells_the_self_launch_only_where_one_listens(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_MULTIGPU_STOP_REPORT", raising=False)
    tell_self_launch(STOPPED, "nothing")  # under torchrun: nothing written, nowhere
    monkeypatch.setenv("PYTORCH_MULTIGPU_STOP_REPORT", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    StopSignals().restore()  # rank 1 is not rank 0: it says nothing
    assert not (tmp_path / TRAINING).exists()
    monkeypatch.setenv("RANK", "0")
    StopSignals().restore()
    assert (tmp_path / TRAINING).exists()


def test_the_self_launch_gives_its_workers_time_to_stop_and_passes_sigusr1_on(monkeypatch):
    """torch's agent waits 30 s by itself for workers to reach their stop checkpoint after a signal
    (little on a loaded node: the next log window, the RNG states gathered, the checkpoint written
    and fsynced) and dies of SIGUSR1; the self-launch gives them 90 s, as slurm/*.sbatch does, and
    passes SIGUSR1 on. A value the user set is kept."""
    import torch.distributed.run

    from common.launcher import launch_workers

    seen = []
    monkeypatch.setattr(torch.distributed.run, "run", seen.append)
    for name in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT", "PET_SIGNALS_TO_HANDLE"):
        monkeypatch.delenv(name, raising=False)
    assert launch_workers("train.py", [], 2) == 0
    assert seen[0].shutdown_timeout == 90 and "SIGUSR1" in seen[0].signals_to_handle.split(",")
    # torch's agent reads it when the flag is unset
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "45")
    monkeypatch.setenv("PET_SIGNALS_TO_HANDLE", "SIGTERM")
    launch_workers("train.py", [], 2)
    assert seen[1].shutdown_timeout is None and seen[1].signals_to_handle == "SIGTERM"


def test_the_stop_report_names_the_run_to_resume(tmp_path, monkeypatch):
    """A self-launched run stopped by a signal: the line the self-launch prints quotes the run's
    name, which the next launch needs (a default name, a timestamp, is not chosen again: `--resume
    auto` alone would start a new run); it used to say only "continue with --resume auto"."""
    monkeypatch.setenv("PYTORCH_MULTIGPU_STOP_REPORT", str(tmp_path))
    tell_self_launch_stopped(4, tmp_path / "dist_parallel_2p 0101" / LAST)
    line, code = stop_line(signal.SIGTERM, tmp_path, None)
    assert code == 143
    assert line.endswith("continue with --resume auto --run_name 'dist_parallel_2p 0101'"), line
    tell_self_launch_stopped(4, None)  # --benchmark: no checkpoint
    line = stop_line(signal.SIGTERM, tmp_path, None)[0]
    assert line.endswith("a --benchmark run keeps no checkpoint"), line


# ------------------------------------------------------------------- 4. a stop in the last window
# The command: 40 steps an epoch, a log window at each, --max_steps 4 (timed from step 2)
LAST_WINDOW = ["--dataset", "synthetic", "--synthetic_size", "640", "-b", "16", "--epochs", "1",
               "--depth", "8", "--alpha", "12", "-p", "1", "--num_workers", "0", "--max_steps", "4",
               "--warmup_steps", "1", "--no_progress"]


def under_fault(script: str, flags: list, fault: dict) -> subprocess.CompletedProcess:
    """`python script flags...` in one process, under tests/fault_injection.py with `fault`'s
    variables (it is rank 0)."""
    return subprocess.run([sys.executable, str(REPO / "tests" / "fault_injection.py"), script,
                           *map(str, flags)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1",
                               "FAULT_RANK": "0", **fault}, timeout=120)


def continue_command(line: str) -> list[str]:
    """The flags a stop's line says to continue with: `continue with --resume auto --run_name X`."""
    return line.split("continue with ", 1)[1].split()


def test_a_stop_in_the_runs_last_window_leaves_its_evaluation_to_the_resume(tmp_path):
    """The issue's run: SIGTERM during step 4 of --max_steps 4, so the stop lands at the run's
    last log window. The run checkpoints and exits 143 saying that its evaluation and results are
    owed; the command it prints evaluates, writes results.json and best.pt and exits 0 (it used
    to say "this run has ended" and exit 0 with no results, ever), the speed figures those of the
    attempt that trained; run again, it has ended."""
    flags = [*LAST_WINDOW, "--log_dir", tmp_path, "--run_name", "run"]
    stopped = under_fault("single_gpu/train.py", flags,
                          {"FAULT_STEP": "4", "FAULT_SIGNAL": "SIGTERM"})
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    line, = [line for line in stopped.stdout.splitlines() if line.startswith("stopped by")]
    assert line.startswith("stopped by SIGTERM at step 4 (the training done, its evaluation and "
                           "results owed); checkpoint "), line
    run_dir = tmp_path / "run"
    assert torch.load(run_dir / LAST, weights_only=True)["end_owed"]
    assert not (run_dir / "results.json").exists()
    # the user pastes what the line says
    resumed = run_script("single_gpu/train.py", *flags[:-2], *continue_command(line))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "its training was done, its evaluation was not: evaluating it" in resumed.stdout
    assert "Epoch 1/1 test loss" in resumed.stdout and "results in" in resumed.stdout
    results = read_results(run_dir)
    summary = results["summary"]
    assert summary["steps"] == 4 and summary["best_epoch"] == 1 and summary["test_acc"] is not None
    assert (run_dir / "best.pt").exists() and results["resumed"]["attempts"] == 2
    # timed steps 2 to 4, in the attempt that trained them: the resume trained none
    assert summary["timed_steps"] == [2, 4] and summary["images_per_sec"] > 0
    again = refuse_in_process("single_gpu/train.py", *flags[:-2], *continue_command(line))
    assert again.returncode == 0 and "this run has ended" in again.stdout, again.stdout


@pytest.mark.parametrize("script, epochs", [("single_gpu/train.py", 1),
                                            ("data_parallel/train.py", 2)])
def test_a_stop_at_an_epochs_end_keeps_its_evaluation(script, epochs, tmp_path):
    """SIGTERM noted at the last window of epoch 1 (no --max_steps): of the run's last epoch
    (single_gpu), or of the first of two (data_parallel). The resume evaluates that epoch first, as
    the run would have, then trains on: the same test figures, best epoch and weights as the run
    that was not stopped (the stopped one used to skip the epoch's evaluation: never evaluated, its
    best.pt never written)."""
    flags = [*TINY, "--epochs", epochs, "--save_model", "--no_progress", "--log_dir", tmp_path]
    whole = train_in_process(script, *flags, "--run_name", "whole")
    stopped = train_in_process(script, *flags, "--run_name", "run", sigterm_at=8)
    assert whole.returncode == 0 and stopped.returncode == 143, stopped.stdout + stopped.stderr
    owed = ("the training done, its evaluation and results owed" if epochs == 1
            else "epoch 1 trained, its evaluation owed")
    assert f"stopped by SIGTERM at step 8 ({owed})" in stopped.stdout, stopped.stdout
    assert "test loss" not in stopped.stdout
    resumed = train_in_process(script, *flags, "--run_name", "run", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"Epoch 1/{epochs} test loss" in resumed.stdout
    ours, theirs = (read_results(tmp_path / name)["summary"] for name in ("run", "whole"))
    for figure in ("test_loss", "test_acc", "best_acc", "best_epoch", "steps", "train_loss"):
        assert ours[figure] == theirs[figure], figure
    assert (tmp_path / "run" / "best.pt").exists()
    ours, theirs = (torch.load(tmp_path / name / "model.pt", weights_only=True)
                    for name in ("run", "whole"))
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


@pytest.mark.parametrize("script", ["dist_parallel/train.py", "fsdp/train.py"])
def test_a_stop_in_a_groups_last_window_is_finished_by_the_resume(script, tmp_path):
    """Two processes started by hand, SIGTERM to rank 1 during step 8, the epoch's last: both stop
    at that window with exit 143 and rank 0 says the evaluation is owed; the self-launch's
    `--resume auto` evaluates, writes results.json (the two ranks' speed, gathered when they
    stopped) and best.pt."""
    ranks = by_hand(script, [*TINY, "--no_progress"], tmp_path,
                    {"FAULT_RANK": "1", "FAULT_STEP": "8", "FAULT_SIGNAL": "SIGTERM"})
    assert [code for code, _, _ in ranks] == [143, 143], ranks
    assert "(the training done, its evaluation and results owed)" in ranks[0][1], ranks[0]
    assert not (tmp_path / "by_hand" / "results.json").exists()
    resumed = run_script(script, *TINY, "--no_progress", "--nproc_per_node", 2, "--log_dir",
                         tmp_path, "--run_name", "by_hand", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "evaluating it" in resumed.stdout and "Epoch 1/1 test loss" in resumed.stdout
    results = read_results(tmp_path / "by_hand")
    assert results["world_size"] == 2 and results["summary"]["steps"] == 8
    assert results["summary"]["images_per_sec"] > 0 and results["summary"]["best_epoch"] == 1
    assert (tmp_path / "by_hand" / "best.pt").exists()


# ------------------------------------------------------------- 5. after a stop during --evaluate
def test_the_command_a_stopped_evaluation_suggests_evaluates(weights, tmp_path):
    """SIGTERM during --evaluate's third batch, into a named folder: the line says to run the same
    command with --overwrite, which evaluates; the same command as it was is refused with a line
    that offers --overwrite and not --resume auto, which --evaluate refuses (both used to be
    refused: "run it again" met the folder the stopped evaluation had made, and the refusal
    offered --resume auto)."""
    flags = [*EVALUATE, "--evaluate", weights, "--log_dir", tmp_path, "--run_name", "ev"]
    stopped = under_fault("single_gpu/train.py", flags,
                          {"FAULT_STEP": "3", "FAULT_SIGNAL": "SIGTERM"})
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    assert stopped.stdout.splitlines()[-1] == (
        "stopped by SIGTERM during the evaluation, after 3 of 16 batches: no results written; "
        "to evaluate, run the same command with --overwrite")
    again = refuse_in_process("single_gpu/train.py", *flags)
    assert again.returncode == 2 and "--overwrite" in again.stderr, again.stderr
    assert "--resume" not in again.stderr
    evaluated = train_in_process("single_gpu/train.py", *flags, "--overwrite")
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert read_results(tmp_path / "ev")["summary"]["test_images"] == 512
